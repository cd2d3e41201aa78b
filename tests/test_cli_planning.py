"""`neuron profile`, `neuron plan --time`, `--planner` (issue 12)."""
from __future__ import annotations

import json

from neuron.cli import main


def _last_json(capsys):
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_plan_time_json_has_the_contract_keys(capsys):
    rc = main(["plan", "resnet_cifar", "--depth", "8", "--batch", "4", "--time", "--json",
               "--no-min-budget", "--cost-device", "h200"])
    r = _last_json(capsys)
    assert rc == 0
    assert r["simulated_time_s"] > 0 and r["unlimited_time_s"] > 0
    assert r["overhead_pct"] >= 0 and r["cost_device"] == "h200"
    assert r["cost_source"] == "analytic"


def test_plan_with_a_planner_and_a_profile(tmp_path, capsys):
    prof = tmp_path / "p.json"
    assert main(["profile", "resnet_cifar", "--depth", "8", "--batch", "2", "--image-size", "8",
                 "--repeat", "1", "-o", str(prof)]) == 0
    capsys.readouterr()
    # the profile's geometry is 8x8 inputs: planning the 32x32 network with it is refused
    rc = main(["plan", "resnet_cifar", "--depth", "8", "--batch", "2", "--time",
               "--profile", str(prof), "--no-min-budget"])
    assert rc == 2 and "no entry for step" in capsys.readouterr().err
    rc = main(["plan", "resnet_cifar", "--depth", "8", "--batch", "2", "--planner", "vdnn",
               "--time", "--json", "--no-min-budget"])
    r = _last_json(capsys)
    assert rc == 0 and r["planner"] == "vdnn" and r["tensor_decisions"]["swap"] > 0
    assert r["bytes_moved"] == r["offload_bytes"] + r["prefetch_bytes"] > 0


def test_unknown_planner_is_an_error_listing_the_names(capsys):
    rc = main(["plan", "resnet_cifar", "--depth", "8", "--planner", "nope"])
    err = capsys.readouterr().err
    assert rc == 2 and "unknown planner 'nope'" in err and "checkmate" in err


def test_plan_time_reports_the_codec_stream_with_compress(capsys):
    args = ["plan", "resnet_cifar", "--depth", "8", "--batch", "4", "--planner", "vdnn",
            "--time", "--no-min-budget"]
    assert main(args) == 0
    assert "codec" not in capsys.readouterr().out
    assert main(args + ["--compress", "2"]) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("codec")]
    assert len(line) == 1 and "ms on its own stream" in line[0]
    assert float(line[0].split()[1]) > 0
