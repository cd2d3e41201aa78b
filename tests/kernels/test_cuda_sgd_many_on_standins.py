"""The optimizer step of a layer's parameters in one launch (cuda.sgd_update_many, the
executor's per-step update_many) trained on CudaDevice over the stand-ins: the bits of the
per-tensor kernels, for every SGD variant, with the step guard, eagerly and replayed as a tape
and as a CUDA graph; each layer's pointer table made once, never inside a capture."""
from __future__ import annotations

import numpy as np
import pytest

import neuron as nn
from neuron.errors import NonFiniteUpdateError
from neuron.executor import Executor
from neuron.kernels import cuda, pointer_tables

from test_cuda_on_standins import GRAPHS, replays_bit_identically
from test_cuda_on_standins import rerun_graphs  # noqa: F401 (a fixture, requested by name)

ARENA = 64 << 20


def _fused_launches() -> int:
    from cuda_standins.cupy_arrays import _RawFunction
    return sum(n for name, n in _RawFunction.launches.items() if "sgd_many" in name)


def _train(optimizer, steps=3, replay="off", ex_out=None):
    from neuron.devices.cuda import CudaDevice
    g = GRAPHS["resnet_cifar8"]()
    rng = np.random.default_rng(0)
    dev = CudaDevice(ARENA, headroom_bytes=0)
    try:
        ex = Executor(g, 4, device=dev, seed=1, optimizer=optimizer, replay=replay)
        losses = [ex.train_step(rng.standard_normal((4, 3, 16, 16)).astype(np.float32),
                                rng.integers(0, 10, 4)) for _ in range(steps)]
        if ex_out is not None:
            ex_out.append(ex)
        return losses, ex.state_dict()
    finally:
        dev.close()


def _multi_tensor_steps(ex) -> int:
    return sum(1 for s in ex.steps if s.phase == "B" and len(s.updates) > 1)


@pytest.mark.parametrize("opt", [{"momentum": 0.9}, {"momentum": 0.9, "nesterov": True},
                                 {"momentum": 0.9, "weight_decay": 5e-4},
                                 {"momentum": 0.0, "weight_decay": 1e-4}, {"momentum": 0.0}],
                         ids=["momentum", "nesterov", "weight_decay", "plain_wd", "plain"])
def test_per_layer_steps_give_the_per_tensor_bits(gpu_kernels, monkeypatch, opt):
    runs = {}
    for per_layer in (False, True):
        monkeypatch.setattr(cuda, "sgd_per_layer", per_layer)
        before, exs = _fused_launches(), []
        runs[per_layer] = _train(nn.SGD(lr=0.05, **opt), ex_out=exs)
        launches = _fused_launches() - before
        # each layer with several tensors (BN's two, the classifier's) once per step
        assert launches == (3 * _multi_tensor_steps(exs[0]) if per_layer else 0)
    (l0, s0), (l1, s1) = runs[False], runs[True]
    assert l0 == l1
    assert s0.keys() == s1.keys()
    assert all(s0[k].tobytes() == s1[k].tobytes() for k in s0)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_nonfinite_per_layer_update_sets_the_flag_and_is_undone(gpu_kernels):
    """A huge momentum buffer in a BN layer (two tensors: the fused launch) overflows its
    update: the step is refused whole and every state bit is as before."""
    from neuron.devices.cuda import CudaDevice
    dev = CudaDevice(ARENA, headroom_bytes=0)
    try:
        ex = Executor(GRAPHS["resnet_cifar8"](), 4, device=dev, seed=1,
                      optimizer=nn.SGD(lr=10.0, momentum=0.9))
        rng = np.random.default_rng(3)
        x, y = rng.standard_normal((4, 3, 16, 16)).astype(np.float32), rng.integers(0, 10, 4)
        bad = ex.state_dict()
        bad["momentum:bn1.bias"][:] = 3e38
        ex.load_state_dict(bad)
        before = _fused_launches()
        with pytest.raises(NonFiniteUpdateError, match="undone"):
            ex.train_step(x, y)
        assert _fused_launches() > before
        after = ex.state_dict()
        assert all(bad[k].tobytes() == after[k].tobytes() for k in bad)
        assert ex.iteration == 0
        ex.load_state_dict({**bad, "momentum:bn1.bias": np.zeros_like(bad["bn1.bias"])})
        assert np.isfinite(ex.train_step(x, y)) and ex.iteration == 1
    finally:
        dev.close()


def test_replays_are_bit_identical_and_upload_no_table(gpu_kernels, rerun_graphs, monkeypatch):
    """Eager, tape and graph runs give the same bits; the recorded eager iterations made every
    table, so replays (the graph's capture included) upload none and launch the fused kernel."""
    tables = pointer_tables.TABLES
    uploads = []
    real = tables.table

    def counted(values):
        n = tables.uploads
        t = real(values)
        uploads.append((tables.uploads > n, _capturing()))
        return t
    monkeypatch.setattr(tables, "table", counted)
    runs = replays_bit_identically("resnet_cifar8", ARENA)
    assert not any(capturing for made, capturing in uploads if made)
    assert tables.refused == 0                  # no table was asked for in a capture and missed
    for mode in ("tape", "graph"):
        ops = runs[mode][2]._replay.tape.ops
        assert sum(getattr(fn, "__name__", "") == "sgd_update_many" for fn, *_ in ops) == \
            _multi_tensor_steps(runs[mode][2])
    graph = runs["graph"][2]._replay.graph
    kws = [kw for fn, args, kw, _ in graph._capturable_ops()
           if getattr(fn, "__name__", "") == "sgd_update_many"]
    assert kws and all(kw["neg_lr_buffer"] is not None for kw in kws)


def _capturing() -> bool:
    from neuron.kernels.cuda_helpers import _cp
    return _cp().cuda.get_current_stream().is_capturing()


def test_each_layers_table_is_uploaded_once_across_iterations(gpu_kernels):
    tables = pointer_tables.TABLES
    start, exs = tables.uploads, []
    _train(nn.SGD(lr=0.05, momentum=0.9), steps=1, ex_out=exs)
    first = tables.uploads - start
    # one per layer with several tensors, and the step guard's one for the BatchNorm
    # statistics it checks in one launch (undo.py)
    assert first == _multi_tensor_steps(exs[0]) + 1
    tables.clear()
    _train(nn.SGD(lr=0.05, momentum=0.9), steps=5)
    assert tables.uploads == first                  # the same addresses every iteration


def test_a_table_is_never_made_inside_a_capture(gpu_kernels):
    """Asked for while the stream captures, a missing table is refused (the caller updates
    tensor by tensor): a copy there would become a graph node reading host memory."""
    from cuda_standins.runtime import _Cuda
    tables = pointer_tables.TABLES
    stream = _Cuda.Stream()
    with stream:
        stream.begin_capture()
        try:
            assert tables.table((1, 2, 3)) is None and tables.uploads == 0
        finally:
            stream.end_capture()
        assert tables.table((1, 2, 3)) is not None and tables.uploads == 1
        stream.begin_capture()
        try:
            assert tables.table((1, 2, 3)) is not None     # made before: found
        finally:
            stream.end_capture()
    assert tables.refused == 1


@pytest.mark.parametrize("value, on", [("0", False), ("off", False), ("1", True), (None, True)])
def test_the_environment_sets_the_per_layer_switch_at_import(value, on):
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "NEURON_SGD_PER_LAYER"}
    if value is not None:
        env["NEURON_SGD_PER_LAYER"] = value
    code = "import neuron.kernels.cuda as K; print(K.sgd_per_layer)"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(on)
