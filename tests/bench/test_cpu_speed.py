"""bench/cpu_speed.py: its JSON contract on a tiny run, and the replay modes it times with and
without the Executor's ``replay`` parameter."""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def test_replay_modes_follow_the_executor_signature():
    from bench.cpu_speed import replay_modes

    class Old:
        def __init__(self, graph, batch, *, device="cpu"):
            pass

    class New:
        def __init__(self, graph, batch, *, device="cpu", replay="graph"):
            pass

    modes, supported, note = replay_modes(Old, ["off", "tape"])
    assert (modes, supported) == (["off"], False) and "off,tape" in note
    assert replay_modes(New, ["off", "tape"]) == (["off", "tape"], True, None)


def test_tiny_run_writes_both_figures_and_the_ratio(tmp_path):
    name = str(tmp_path / "speed")          # absolute: written there, not in bench/results
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "cpu_speed.py"),
                        "--depth", "8", "--batch", "4", "--threads", "1", "--warmup", "0",
                        "--rounds", "2", "--iters", "1", "--name", name],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    d = json.load(open(name + ".json"))
    assert d["threads"]["torch"] == 1 and d["threads"]["requested"] == 1
    assert d["batch"] == 4 and d["input_shape"] == [1, 8, 8]
    assert d["replay"]["measured"] == list(d["neuron"])
    for side in list(d["neuron"].values()) + [d["pytorch"]]:
        assert side["img_per_s"] > 0 and len(side["runs_img_per_s"]) == 2
        assert side["cpu_ms_per_step"] > 0
    best = d["neuron"][d["neuron_mode"]]
    assert d["neuron_over_pytorch"] == best["over_pytorch"]
    assert abs(best["img_per_s"] / d["pytorch_img_per_s"] - d["neuron_over_pytorch"]) < 1e-2
    assert d["target_met"] == (d["neuron_over_pytorch"] >= 0.8)
    assert best["over_pytorch_paired_median"] > 0
    assert "load_average_at_start" in d["provenance"]
    assert "neuron / PyTorch" in open(name + ".md").read()
