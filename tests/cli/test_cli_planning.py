"""`neuron profile`, `neuron plan --time`, `--planner` (issue 12)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from neuron.cli.main import main


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


def _planner_of(command, *args):
    from neuron.cli.main import build_parser
    from neuron.cli.planning import resolve_planner
    a = build_parser().parse_args([command, "resnet_cifar", "--depth", "8", *args])
    resolve_planner(a, command)
    return a.planner


def test_a_budgeted_superneurons_run_gets_the_superneurons_planner_by_default():
    budget = ("--budget", "2MiB")
    for command in ("plan", "memory", "train"):
        assert _planner_of(command, *budget) == "superneurons", command
        assert _planner_of(command) is None, command            # no budget
        assert _planner_of(command, *budget, "--planner", "none") is None
        assert _planner_of(command, *budget, "--planner", "capuchin") == "capuchin"
        assert _planner_of(command, *budget, "--policy", "liveness") is None
    # deepest and widest plan at every probe: they keep the policy
    assert _planner_of("widest", *budget) is None


def _policy_of(command, *args):
    from neuron.cli.main import build_parser
    from neuron.cli.planning import resolve_planner
    a = build_parser().parse_args([command, "resnet_cifar", "--depth", "8", *args])
    resolve_planner(a, command)
    return a.policy


def test_train_policy_is_liveness_without_a_budget_and_superneurons_under_one():
    assert _policy_of("train") == "liveness"
    assert _policy_of("train", "--budget", "2MiB") == "superneurons"
    assert _policy_of("train", "--budget", "2MiB", "--policy", "liveness") == "liveness"
    assert _policy_of("train", "--policy", "recompute") == "recompute"
    assert _policy_of("plan") == "superneurons"


def test_train_in_a_budget_liveness_cannot_fit_trains_by_default(capsys):
    """`train --budget` below liveness's minimum: the default plans and trains; an explicit
    --policy liveness fails naming both minimums."""
    args = ["train", "resnet_cifar", "--depth", "8", "--batch", "8", "--budget", "3MiB",
            "--iters", "2", "--device", "cpu", "--no-progress", "--json"]
    assert main(args) == 0
    r = _last_json(capsys)
    assert r["planner"] == "superneurons" and r["peak_bytes"] <= 3 << 20
    assert r["iterations"] == 2 and np.isfinite(r["final_loss"])
    assert main(args + ["--policy", "liveness"]) == 2        # a budget too small: usage
    err = capsys.readouterr().err
    assert "the smallest budget in which policy liveness completes" in err
    assert "policy superneurons (the default under --budget) completes one in" in err


def test_default_planner_in_plan_and_none_with_compress_is_a_usage_error(capsys):
    args = ["plan", "resnet_cifar", "--depth", "8", "--batch", "4", "--budget", "2MiB",
            "--no-min-budget", "--json"]
    assert main(args) == 0
    r = _last_json(capsys)
    assert r["planner"] == "superneurons" and r["fits"]
    assert main(args + ["--planner", "none"]) == 0
    assert "planner" not in _last_json(capsys)
    assert main(args + ["--planner", "none", "--compress", "2"]) == 2
    assert "--compress plans with a planner" in capsys.readouterr().err


def test_a_planner_whose_parameters_exceed_the_budget_reports_like_the_policy(capsys):
    """Not an exception: does not fit, and the minimum budget, as the policy's plan says."""
    for planner in ("none", "superneurons", "capuchin"):
        assert main(["plan", "resnet_cifar", "--depth", "8", "--batch", "4", "--budget",
                     "64KiB", "--planner", planner, "--json"]) == 1
        r = _last_json(capsys)
        assert not r["fits"] and "parameters and optimizer state do not fit" in r["error"]
        assert r["min_budget_bytes"] > 64 * 1024, planner


def test_the_no_budget_figures_do_not_move_with_the_budget(capsys):
    """Peak (unbounded arena), minimum budget and the bounds are those of the plan for no
    budget, with the default planner under --budget as without it."""
    args = ["plan", "resnet_cifar", "--depth", "8", "--batch", "4", "--json"]
    assert main(args) == 0
    free = _last_json(capsys)
    assert main(args + ["--budget", "2MiB"]) == 0
    tight = _last_json(capsys)
    assert tight["planner"] == "superneurons" and tight["offload_bytes"] > 0
    for key in ("unbounded_peak_bytes", "min_budget_bytes", "lower_bound_bytes",
                "ideal_bound_bytes"):
        assert tight[key] == free[key], key


def _spy(monkeypatch, module, name, calls):
    real = getattr(module, name)

    def spy(*a, **kw):
        calls.append((name, kw, real(*a, **kw)))
    monkeypatch.setattr(module, name, spy)


@pytest.mark.parametrize("budget", [None, "2MiB"])
def test_time_and_plot_do_what_their_help_says(budget, monkeypatch, tmp_path, capsys):
    """--time alone times the iteration (a planner's cost model under --budget does not);
    --plot draws per step, or against simulated time with --time, each with the budget and
    the forward/backward boundary."""
    pytest.importorskip("matplotlib")
    import neuron.memory.clock_plot as clock_plot
    import neuron.views.report as report
    calls = []
    _spy(monkeypatch, report, "plot_recording", calls)
    _spy(monkeypatch, clock_plot, "plot_timeline", calls)
    base = ["plan", "resnet_cifar", "--depth", "8", "--batch", "4", "--no-min-budget", "--json"]
    base += ["--budget", budget] if budget else []
    want_budget = 2 << 20 if budget else None
    for timed in (False, True):
        png = tmp_path / f"{timed}.png"
        assert main(base + ["--plot", str(png)] + (["--time"] if timed else [])) == 0
        out = capsys.readouterr().out
        r = json.loads(out.strip().splitlines()[-1])
        assert ("simulated iteration" in out) == timed
        assert ("simulated_time_s" in r) == timed and "timeline" not in r
        (name, kw, marks), = calls
        calls.clear()
        assert name == ("plot_timeline" if timed else "plot_recording")
        assert kw["budget"] == marks["budget"] == want_budget
        assert (marks["backward_starts_ms"] if timed else marks["backward_starts"]) > 0
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_says_so_when_the_iteration_does_not_fit(tmp_path, capsys):
    png = tmp_path / "none.png"
    assert main(["plan", "resnet_cifar", "--depth", "8", "--batch", "4", "--no-min-budget",
                 "--budget", "64KiB", "--plot", str(png)]) == 1
    assert "--plot: nothing drawn, the iteration does not fit the budget" in \
        capsys.readouterr().out and not png.exists()
