"""bench/gpu/bnrelu_kernels.py on the CPU: the script end to end with the NumPy kernels (fused
and unfused agree to the bit there), and its per-shape measurement with the GPU kernel module
on the CUDA stand-ins (the arguments it passes are the ones the kernels take)."""
import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_script_runs_on_the_cpu(tmp_path):
    r = subprocess.run([sys.executable, "-m", "bench.gpu.bnrelu_kernels", "--out",
                        str(tmp_path), "--device", "cpu", "--smoke"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.load(open(tmp_path / "bnrelu_kernels.json"))
    assert d["ran"] and d["smoke"] and d["rows"]
    assert sum(row["pairs"] for row in d["rows"]) == 4          # resnet_cifar-8's pairs
    for row in d["rows"]:
        assert row["y_max_rel_diff"] == 0 and row["dx_max_rel_diff"] == 0
        assert all(row[k] > 0 for k in ("unfused_fwd_ms", "fused_fwd_ms", "fused_bwd_ms"))
    assert d["target_met"] == (d["fused_ms_per_step"] < d["unfused_ms_per_step"])


def test_one_shape_with_the_gpu_module_on_the_standins(gpu_kernels, cuda_standins):
    from bench.gpu.bnrelu_kernels import _timer, one_shape
    r = one_shape(gpu_kernels, cuda_standins.CupyStandIn(), (4, 8, 6, 6), 2, _timer("cpu"))
    assert r["y_max_rel_diff"] < 1e-5 and r["dx_max_rel_diff"] < 1e-4
    assert r["dgamma_max_rel_diff"] < 1e-4
    assert np.isfinite(r["fused_bwd_ms"])
