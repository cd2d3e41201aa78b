"""GPU: the tape and the CUDA graph replay the planned iteration with the bits of eager
execution (tests/test_tape.py and tests/devices/test_cuda_graph.py check the same on the CPU and the
stand-ins; here CUDA's own stream capture runs), and a replayed iteration costs the host little.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

# bits equal to eager's need deterministic algorithms: eager itself is not bit-reproducible
# otherwise (two eager runs differed in the 8th digit on the H200, 2026-11-27)
pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("deterministic_kernels")]


def _with_dropout():
    import neuron as nn
    x = nn.Input((3, 16, 16), name="data")
    h = nn.ReLU(name="r1")(nn.Conv2d(8, 3, padding=1, name="c1")(x))
    h = nn.Dropout(0.5, name="drop")(nn.Linear(32, name="fc1")(h))
    return nn.Graph(x, nn.Linear(10, name="fc2")(h))


def _train(replay, steps=6, lr_schedule=False, graph=None, **kw):
    import neuron as nn
    from neuron.executor import Executor
    from neuron.models import build_model
    g = graph() if graph is not None else build_model("resnet_cifar", depth=8,
                                                       in_shape=(3, 16, 16))
    rng = np.random.default_rng(0)
    ex = Executor(g, 8, device="cuda", seed=1, replay=replay,
                  optimizer=nn.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4), **kw)
    losses = []
    for i in range(steps):
        if lr_schedule:
            ex.optimizer.lr = 0.05 / (1 + i)
        losses.append(ex.train_step(rng.standard_normal((8, 3, 16, 16)).astype(np.float32),
                                    rng.integers(0, 10, 8)))
    return losses, ex.state_dict(), ex


@pytest.mark.parametrize("mode", ["tape", "graph"])
@pytest.mark.parametrize("kw", [{}, {"lr_schedule": True}, {"chunks": 2},
                                {"graph": _with_dropout}],
                         ids=["plain", "lr_schedule", "chunks", "dropout"])
def test_replay_gives_the_bits_of_eager_execution_on_the_gpu(mode, kw):
    l_off, s_off, _ = _train("off", **kw)
    l_rep, s_rep, ex = _train(mode, **kw)
    assert l_rep == l_off
    assert all(s_off[k].tobytes() == s_rep[k].tobytes() for k in s_off)
    r = ex.replay
    assert r["eager_because"] is None and r["tape_because"] is None, r
    assert r["ran"] == mode and r["replayed_iterations"] >= 3, r


def test_a_dropout_network_is_captured_once():
    _, _, ex = _train("graph", graph=_with_dropout)
    assert ex.replay["ran"] == "graph" and ex.replay["graph_captures"] == 1, ex.replay


def test_a_nonfinite_image_in_a_graph_step_is_named_and_undone():
    from neuron.errors import DataError
    _, _, ex = _train("graph")
    before = ex.state_dict()
    x = np.random.default_rng(3).standard_normal((8, 3, 16, 16)).astype(np.float32)
    x[5, 1, 2, 3] = np.nan
    with pytest.raises(DataError, match="NaN or infinity"):
        ex.train_step(x, np.zeros(8, np.int64))
    after = ex.state_dict()
    assert all(before[k].tobytes() == after[k].tobytes() for k in before)
    assert ex.replay["ran"] == "graph"


def test_replay_under_a_budget_moves_what_eager_moves():
    from neuron.models import build_model
    from neuron.plan import plan
    g = build_model("resnet_cifar", depth=8, in_shape=(3, 16, 16))
    budget = int(plan(g, 8, policy="liveness", search_min=False)["peak_bytes"] * 0.5)
    kw = {"planner": "superneurons", "offload_params": True, "budget": budget}
    l_off, s_off, off = _train("off", **kw)
    l_rep, s_rep, ex = _train("graph", **kw)
    assert l_rep == l_off
    assert all(s_off[k].tobytes() == s_rep[k].tobytes() for k in s_off)
    assert ex.pool.counters() == off.pool.counters()
    assert ex.replay["eager_because"] is None, ex.replay


def test_replay_under_a_budget_is_timed_with_neuron_overlap(monkeypatch):
    """NEURON_OVERLAP=1: a graph replay keeps the copy/compute timeline (its timing events are
    event record nodes of the graph, recorded by every launch), with eager's bits; each
    measured launch shows the bytes the eager iterations move and positive times."""
    from neuron.models import build_model
    from neuron.plan import plan
    monkeypatch.setenv("NEURON_OVERLAP", "1")
    g = build_model("resnet_cifar", depth=8, in_shape=(3, 16, 16))
    budget = int(plan(g, 8, policy="liveness", search_min=False)["peak_bytes"] * 0.5)
    kw = {"planner": "superneurons", "offload_params": True, "budget": budget}
    l_off, s_off, off = _train("off", **kw)
    eager = off.pool.overlap.report()["iterations"][-1]
    l_rep, s_rep, ex = _train("graph", steps=8, **kw)
    assert l_rep[:6] == l_off
    assert ex.replay["ran"] == "graph" and ex.replay["replayed_iterations"] >= 4, ex.replay
    rep = ex.pool.overlap.report()["iterations"]
    assert len(rep) >= 3
    for it in rep[-3:]:                 # launches only
        assert it["h2d_bytes"] == eager["h2d_bytes"] > 0
        assert it["d2h_bytes"] == eager["d2h_bytes"] > 0
        assert it["compute_ms"] > 0 and it["h2d_ms"] > 0 and it["d2h_ms"] > 0
    print("graph launches, overlap:", [{k: round(v, 3) for k, v in it.items()
                                        if isinstance(v, float)} for it in rep[-3:]])


def test_host_time_of_a_replayed_iteration():
    """Prints the host's time per iteration for each mode (the kit gates the 1 ms target on
    ResNet-50; this only checks that graph replay costs the host less than eager)."""
    import cupy as cp
    host = {}
    for mode in ("off", "tape", "graph"):
        _, _, ex = _train(mode, steps=4)
        x = np.zeros((8, 3, 16, 16), np.float32)
        y = np.zeros(8, np.int64)
        cp.cuda.Device().synchronize()
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            ex.train_step(x, y)
            times.append(time.perf_counter() - t0)
        host[mode] = min(times)
    print({k: f"{v * 1e3:.2f} ms" for k, v in host.items()})
    assert host["graph"] < host["off"]


@pytest.mark.parametrize("chunks", [None, 2])
def test_replay_and_eager_loss_left_on_the_device_has_the_bits_of_a_loss_read_at_once(
        monkeypatch, chunks):
    """CudaDevice.loss_on_device: the loss read once the step is issued gives the bits of the
    loss read at the loss layer (layers/loss.py), eager and replayed."""
    from neuron.devices.cuda import CudaDevice
    kw = {"chunks": chunks} if chunks else {}
    monkeypatch.setattr(CudaDevice, "loss_on_device", False)
    l_read, s_read, _ = _train("off", **kw)
    monkeypatch.setattr(CudaDevice, "loss_on_device", True)
    for mode in ("off", "graph"):
        l_dev, s_dev, ex = _train(mode, **kw)
        assert l_dev == l_read, mode
        assert all(s_read[k].tobytes() == s_dev[k].tobytes() for k in s_read), mode
    assert ex.replay["ran"] == "graph", ex.replay
