"""GPU: --layout nhwc on CudaDevice (channels-last maps, NHWC filters) against the CPU
reference at nchw from the same weights and data, every precision; the CUDA graph of an nhwc
step replaying eager's bits. tests/kernels/test_cuda_layout_on_standins.py checks the wiring on
the stand-ins; here cuDNN picks NHWC algorithms of its own (tensor cores at bf16/fp16), so the
tolerances are those of tests/gpu/test_cuda_layers.py (fp32) and test_cuda_mixed.py (2-byte)."""
from __future__ import annotations

import numpy as np
import pytest
from gpu_steps import (BATCH, lrn_net, run_steps, worst_update_difference,
                       worst_updates_text)

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("deterministic_kernels")]

#: the largest relative norm of a parameter's update difference after one step, GPU vs CPU
TOL = {"fp32": 1e-3, "tf32": 2e-2, "bf16": 0.05, "fp16": 0.02}


def _run(device, layout, precision="fp32", replay="off", steps=1, model="resnet_cifar",
         depth=8):
    return run_steps(device, precision, replay, steps, layout, model, depth)


_worst = worst_update_difference


@pytest.mark.parametrize("model,depth", [("resnet_cifar", 8), ("densenet_cifar", 10)])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_an_nhwc_step_on_the_gpu_matches_the_cpu_at_nchw(model, depth, precision):
    if precision != "fp32":
        pytest.importorskip("ml_dtypes")
    gpu = _run("cuda", "nhwc", precision, model=model, depth=depth)
    cpu = _run("cpu", "nchw", precision, model=model, depth=depth)
    for k in cpu[1]:
        np.testing.assert_array_equal(gpu[1][k], cpu[1][k], err_msg=k)    # same start
    np.testing.assert_allclose(gpu[0], cpu[0], rtol=1e-2 if precision != "fp32" else 1e-4)
    worst = _worst(gpu, cpu)
    print(f"{model} {precision} nhwc: worst update difference GPU vs CPU {worst:.3g}")
    assert worst < TOL[precision], worst_updates_text(gpu, cpu)


def test_lrn_and_pooling_at_nhwc_on_the_gpu_match_the_cpu_at_nchw():
    import neuron as nn
    from neuron.executor import Executor
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, 3, 16, 16)).astype(np.float32)
    y = rng.integers(0, 10, BATCH)
    out = {}
    for device, layout in (("cuda", "nhwc"), ("cpu", "nchw")):
        ex = Executor(lrn_net(), BATCH, device=device, seed=1, layout=layout, replay="off",
                      optimizer=nn.SGD(lr=0.05, momentum=0.9))
        before = ex.state_dict()
        loss = ex.train_step(x, y)
        out[device] = ([loss], before, ex.state_dict(), ex)
    np.testing.assert_allclose(out["cuda"][0], out["cpu"][0], rtol=1e-4)
    assert _worst(out["cuda"], out["cpu"]) < TOL["fp32"]


def test_the_graph_of_an_nhwc_step_gives_eager_bits():
    eager = _run("cuda", "nhwc", "bf16" if _have_ml_dtypes() else "fp32", steps=4)
    graph = _run("cuda", "nhwc", "bf16" if _have_ml_dtypes() else "fp32", replay="graph",
                 steps=4)
    assert graph[3].replay["ran"] == "graph"
    assert eager[0] == graph[0]
    for k in eager[2]:
        np.testing.assert_array_equal(eager[2][k], graph[2][k], err_msg=k)


def _have_ml_dtypes() -> bool:
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        return False
    return True
