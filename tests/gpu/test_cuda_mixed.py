"""GPU: bf16 and fp16 mixed precision on CudaDevice against the CPU reference (neuron/precision/mixed_cpu.py)
from the same weights and data, and the CUDA graph of a bf16 step replaying eager's bits.
tests/kernels/test_cuda_mixed_on_standins.py checks the same code path on the CPU stand-ins,
where both sides sum in numpy_ref's order; here cuDNN's and cuBLAS's own summation order (and
tensor cores) flips a low-type rounding here and there, so GPU_TOL is looser, and still below
what one convolution computing from its float32 masters gives (0.25 / 0.14 on the stand-ins:
the negative check below must exceed it here too)."""
from __future__ import annotations

import numpy as np
import pytest
from gpu_steps import BATCH, run_steps, worst_update_difference, worst_updates_text

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("deterministic_kernels")]

pytest.importorskip("ml_dtypes")

#: the largest relative norm of a parameter's update difference after one step, GPU vs CPU
GPU_TOL = {"bf16": 0.05, "fp16": 0.02}


def _run(device, precision, replay="off", steps=1):
    return run_steps(device, precision, replay, steps)


_worst = worst_update_difference


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_mixed_step_on_the_gpu_matches_the_cpu_reference(precision, monkeypatch):
    gpu = _run("cuda", precision)
    cpu = _run("cpu", precision)
    np.testing.assert_allclose(gpu[0], cpu[0], rtol=1e-2)
    worst = _worst(gpu, cpu)
    print(f"{precision}: worst update difference GPU vs CPU reference {worst:.3g}")
    assert worst < GPU_TOL[precision], worst_updates_text(gpu, cpu)
    from neuron.precision import Precision
    real = Precision.casts_params
    monkeypatch.setattr(Precision, "casts_params",
                        lambda self, layer: real(self, layer) and layer.name != "conv1")
    wrong = _run("cpu", precision)
    assert _worst(gpu, wrong) > GPU_TOL[precision]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_the_graph_of_a_mixed_step_gives_the_tapes_bits(precision):
    tape = _run("cuda", precision, replay="tape", steps=5)
    graph = _run("cuda", precision, replay="graph", steps=5)
    assert graph[0] == tape[0]
    assert all(tape[2][k].tobytes() == graph[2][k].tobytes() for k in tape[2])
    assert graph[3].replay["ran"] == "graph" and graph[3].replay["eager_because"] is None
    assert tape[3].replay["ran"] == "tape"


def test_fp16_loss_scaling_skips_an_overflowing_step_on_the_gpu():
    import neuron as nn
    from neuron.executor import Executor
    from neuron.models import build_model
    ex = Executor(build_model("resnet_cifar", depth=8, in_shape=(3, 16, 16)), BATCH,
                  device="cuda", seed=1, precision="fp16", optimizer=nn.SGD(lr=0.05))
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((BATCH, 3, 16, 16)).astype(np.float32), rng.integers(0, 10, BATCH)
    ex.loss_scaler.scale = 2.0 ** 40
    before = ex.state_dict()
    ex.train_step(x, y)
    after = ex.state_dict()
    assert ex.loss_scaler.skipped == 1 and ex.loss_scaler.scale == 2.0 ** 39
    assert all(before[k].tobytes() == after[k].tobytes() for k in before if ":" not in k)
