"""cuDNN's backend engine plans (neuron/kernels/cudnn_engines.py) and their place in the
convolution choice (conv_algos.py), on the CPU.

- The real library, where installed (no GPU needed): every operation descriptor the module
  builds is accepted by cuDNN's own checks (finalized), and a wrong shape is refused.
- The notes filter: what PyTorch leaves out, neuron leaves out.
- On the CUDA stand-ins: a plan measured faster than the legacy algorithms runs (and gives
  numpy_ref's numbers), a slower one does not, calls that add into their output never run a
  plan, an engine failure leaves the legacy algorithms running and says why, and the tape
  replays a network running plans bit for bit.
The GPU side (plans really built, timed, captured) is tests/gpu/test_cudnn_engines.py.
"""
from __future__ import annotations

import numpy as np
import pytest

import neuron as nn
from neuron.devices import CpuDevice
from neuron.executor import Executor
from neuron.kernels import cudnn as dnn
from neuron.kernels import cudnn_api as api
from neuron.kernels import cudnn_engines
from neuron.models import build_model


def _library_or_skip():
    if not dnn.available():
        pytest.skip("libcudnn.so.9 not installed")
    try:
        cudnn_engines._tensor(1, (1, 1, 1, 1), np.float32)
    except api.CudnnError as e:     # e.g. its engine libraries need the CUDA driver
        pytest.skip(f"cuDNN's backend cannot finalize here: {e}")


GEOMETRIES = [  # x, w, y, padding, stride, dilation, dtype
    ((8, 16, 32, 32), (32, 16, 3, 3), (8, 32, 16, 16), (1, 1), (2, 2), (1, 1), np.float32),
    ((8, 16, 32, 32), (32, 4, 3, 3), (8, 32, 32, 32), (1, 1), (1, 1), (1, 1), np.float32),
    ((2, 16, 32, 32), (32, 16, 3, 3), (2, 32, 28, 28), (0, 0), (1, 1), (2, 2), np.float64),
    ((4, 64, 14, 14), (256, 64, 1, 1), (4, 256, 14, 14), (0, 0), (1, 1), (1, 1), np.float16),
]


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("kind", ["fwd", "bwd_data", "bwd_filter"])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: "x".join(map(str, g[0])))
def test_the_real_library_accepts_every_operation_descriptor(kind, geometry, layout):
    _library_or_skip()
    op, keep = cudnn_engines.conv_operation(kind, *geometry, layout=layout)
    assert op.ptr.value and len(keep) == 4


def test_channels_last_strides_are_the_storage_order():
    shape = (2, 3, 4, 5)                        # N, C, H, W stored N, H, W, C
    a = np.empty((2, 4, 5, 3)).transpose(0, 3, 1, 2)
    assert cudnn_engines.packed_strides(shape, "nhwc") == tuple(s // 8 for s in a.strides)
    assert cudnn_engines.packed_strides(shape) == (60, 20, 5, 1)


def test_the_real_library_refuses_an_output_of_the_wrong_size():
    _library_or_skip()
    x, w, y, *rest = GEOMETRIES[0]
    with pytest.raises(api.CudnnError, match="cudnnBackendFinalize"):
        cudnn_engines.conv_operation("fwd", x, w, (8, 32, 15, 16), *rest)


def test_the_real_library_builds_a_variant_pack():
    _library_or_skip()
    cudnn_engines._packs.clear()
    a = cudnn_engines._variant_pack((4096, 8192, 16384), 65536)
    assert cudnn_engines._variant_pack((4096, 8192, 16384), 65536) is a     # cached
    assert cudnn_engines._variant_pack((4096, 8192, 16384), 0) is not a


def test_engines_are_filtered_by_their_notes_as_pytorch_filters_them():
    ok = cudnn_engines.allowed
    tc, down = api.CUDNN_NUMERICAL_NOTE_TENSOR_CORE, api.CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS
    nondet = api.CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC
    reduced = api.CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION
    compiled = api.CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION
    assert ok((), (), np.float32, False, False)
    assert not ok((tc,), (), np.float32, False, False)      # TF32 off: no tensor cores
    assert ok((tc,), (), np.float32, True, False)
    assert ok((tc,), (), np.float16, False, False)
    assert not ok((down,), (), np.float32, True, False)
    assert not ok((reduced,), (), np.float16, False, False)
    assert not ok((nondet,), (), np.float32, False, True)
    assert ok((nondet,), (), np.float32, False, False)
    assert not ok((), (compiled,), np.float32, False, False)


# ----------------------------------------------------------------------------------------------
# on the CUDA stand-ins
# ----------------------------------------------------------------------------------------------

def _OnStandIns(arena):
    from cuda_standins import CudaKernelsOnCpu
    return CudaKernelsOnCpu(arena)


def _train(device, steps=3, **kw):
    g = build_model("resnet_cifar", depth=8, in_shape=(3, 16, 16))
    rng = np.random.default_rng(0)
    ex = Executor(g, 4, device=device, seed=1, optimizer=nn.SGD(lr=0.05, momentum=0.9), **kw)
    losses = [ex.train_step(rng.standard_normal((4, 3, 16, 16)).astype(np.float32),
                            rng.integers(0, 10, 4)) for _ in range(steps)]
    return losses, ex.state_dict()


def _calls():
    from neuron.kernels import conv_algos
    return conv_algos.dnn.calls


def _close(a, b):
    np.testing.assert_allclose(a[0], b[0], rtol=2e-5)
    for k in a[1]:
        np.testing.assert_allclose(a[1][k], b[1][k], rtol=2e-4, atol=2e-6, err_msg=k)


def test_a_plan_measured_faster_runs_and_gives_numpy_refs_numbers(gpu_kernels):
    from neuron.kernels import conv_algos
    got = _train(_OnStandIns(64 << 20))
    ran = {kind for what, kind in _calls() if what == "plan"}
    assert ran == {"fwd", "bwd_data", "bwd_filter"}
    chosen = {r.algo_name for r in conv_algos.conv_algo_trace}
    assert any(name.startswith("engine") for name in chosen), chosen
    # the report sets the two sets' fastest side by side, by the one clock
    rows = [r for r in conv_algos.choice_report() if r["kind"] == "fwd"]
    assert rows and all((r["engine_fastest_ms"], r["legacy_fastest_ms"]) == (0.005, 0.02)
                        for r in rows), rows
    _close(got, _train(CpuDevice(64 << 20)))


def test_plans_run_on_channels_last_operands(gpu_kernels):
    """--layout nhwc: the plans are built in the storage order and read the operands there."""
    got = _train(_OnStandIns(64 << 20), layout="nhwc")
    assert {kind for what, kind in _calls() if what == "plan"} == {"fwd", "bwd_data",
                                                                   "bwd_filter"}
    want = _train(CpuDevice(64 << 20))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    for k in want[1]:
        np.testing.assert_allclose(got[1][k], want[1][k], rtol=1e-3, atol=1e-5, err_msg=k)


def test_a_plan_measured_slower_than_the_legacy_algorithm_does_not_run(gpu_kernels,
                                                                        monkeypatch):
    from neuron.kernels import conv_algos
    monkeypatch.setattr(conv_algos.dnn, "engine_time", 1.0)
    _train(_OnStandIns(64 << 20), steps=2)
    timed_only = [c for c in _calls() if c[0] == "plan"]
    # the plans ran while being timed (once per measurement), never as the step's kernel
    assert len(timed_only) == len([c for c in _calls() if c[0] == "plans"])
    assert not any(r.algo_name.startswith("engine") for r in conv_algos.conv_algo_trace)
    # FindEx's rows were timed again by the plans' clock: like is compared with like
    legacy = [p for perfs, _ in conv_algos._measured.values() for p in perfs
              if getattr(p, "plan", None) is None]
    assert legacy and {p.time for p in legacy} == {conv_algos.dnn.legacy_time}


def test_calls_adding_into_their_output_never_run_a_plan(gpu_kernels):
    from neuron.kernels import conv_algos
    _train(_OnStandIns(64 << 20), steps=2, chunks=2)    # chunks add gradients into dw
    accumulating = [r for r in conv_algos.conv_algo_trace if r.kind == "bwd_filter"]
    assert accumulating
    # a later chunk's bwd_filter adds into dw (beta = 1): a legacy algorithm, never a plan
    assert any(not r.algo_name.startswith("engine") for r in accumulating)


def test_an_engine_failure_leaves_the_legacy_algorithms_running_and_says_why(gpu_kernels,
                                                                            monkeypatch):
    from neuron.kernels import conv_algos
    monkeypatch.setattr(conv_algos.dnn, "engine_failure",
                        api.CudnnError(3000, "cudnnBackendFinalize"))
    got = _train(_OnStandIns(64 << 20), steps=2)
    assert conv_algos.engine_skips
    assert all("cudnnBackendFinalize" in why for why in conv_algos.engine_skips.values())
    assert not any(r.algo_name.startswith("engine") for r in conv_algos.conv_algo_trace)
    _close(got, _train(CpuDevice(64 << 20), steps=2))


def test_switching_engines_off_runs_the_legacy_algorithms_only(gpu_kernels, monkeypatch):
    from neuron.kernels import cuda
    monkeypatch.setattr(cuda, "conv_engines", False)
    _train(_OnStandIns(64 << 20), steps=1)
    assert not [c for c in _calls() if c[0] in ("plan", "plans")]


@pytest.mark.parametrize("value, on", [("0", False), ("off", False), ("1", True), (None, True)])
def test_the_environment_sets_the_engines_switch_at_import(value, on):
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "NEURON_CONV_ENGINES"}
    if value is not None:
        env["NEURON_CONV_ENGINES"] = value
    r = subprocess.run([sys.executable, "-c", "import neuron.kernels.cuda as K; "
                        "print(K.conv_engines)"], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(on)


def test_the_tape_replays_a_network_running_plans_bit_for_bit(gpu_kernels):
    eager = _train(_OnStandIns(64 << 20), steps=4, replay="off")
    taped = _train(_OnStandIns(64 << 20), steps=4, replay="tape")
    assert [c for c in _calls() if c[0] == "plan"]
    assert eager[0] == taped[0]
    for k in eager[1]:
        np.testing.assert_array_equal(eager[1][k], taped[1][k], err_msg=k)
