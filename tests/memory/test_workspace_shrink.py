"""Convolution workspaces that shrink: a conv step whose preferred workspace does not fit in
one free block runs with none, with the same bits (the CPU kernels work on fixed sub-blocks of
samples and sum dW over them in batch order whatever the workspace). The baseline policy shares
one workspace, the largest any step asks for (the papers' baseline)."""
from __future__ import annotations

import numpy as np

import neuron as nn
from neuron.executor import Executor
from neuron.kernels import numpy_ref as K
from neuron.models import build_model
from neuron.plan import plan


def test_conv_kernels_bit_identical_without_workspace(monkeypatch):
    monkeypatch.setattr(K, "CONV_CHUNK_BYTES", 3 * 9 * 36 * 4 * 2)     # sub-blocks of 2
    rng = np.random.default_rng(0)
    x = rng.standard_normal((7, 3, 6, 6)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    dy = rng.standard_normal((7, 4, 6, 6)).astype(np.float32)
    out = []
    for ws in (np.empty(K.conv2d_workspace_bytes(x.shape, w.shape, 1, 1, 1, 1, 4), np.uint8),
               None):
        y = np.empty_like(dy)
        K.conv2d_forward(x, w, None, y, 1, 1, 1, 1, ws)
        dx, dw = np.empty_like(x), np.empty_like(w)
        K.conv2d_backward(x, w, dy, dx, dw, None, 1, 1, 1, 1, ws)
        out.append((y, dx, dw))
    for a, b in zip(*out):
        assert np.array_equal(a, b)


def _train(graph, batch, budget, steps=3):
    ex = Executor(graph, batch, policy="liveness", budget=budget, seed=5,
                  optimizer=nn.SGD(lr=0.05, momentum=0.9))
    rng = np.random.default_rng(7)
    for _ in range(steps):
        x = rng.standard_normal((batch, *graph.inputs[0].shape)).astype(np.float32)
        ex.train_step(x, rng.integers(0, 10, batch))
    return ex


def test_tight_budget_shrinks_workspaces_with_the_same_parameters(monkeypatch):
    # small sub-blocks (one or two samples) so that a conv step loops over several of them
    monkeypatch.setattr(K, "CONV_CHUNK_BYTES", 16 << 10)
    graph = build_model("resnet_cifar", depth=8, in_shape=(3, 8, 8))
    batch = 4
    p = plan(graph, batch, policy="liveness")
    tight = p["min_budget_bytes"]
    assert tight < p["unbounded_peak_bytes"]            # below the peak with workspaces
    free_ws = {(s["step"], s["phase"]): s["workspace_bytes"] for s in p["steps"]}
    t = plan(graph, batch, policy="liveness", budget=tight)
    assert t["fits"]
    shrunk = [s for s in t["steps"] if s["workspace_bytes"] == 0
              and free_ws[(s["step"], s["phase"])] > 0]
    assert shrunk, "no conv step ran without its workspace"
    a, b = _train(graph, batch, None), _train(graph, batch, tight)
    assert b.pool.high_water <= tight
    pa, pb = a.state_dict(), b.state_dict()
    assert pa.keys() == pb.keys()
    for k in pa:
        assert np.array_equal(pa[k], pb[k]), k


def test_baseline_shares_one_workspace():
    graph = build_model("resnet_cifar", depth=8, in_shape=(3, 16, 16))
    ex = Executor(graph, 4, device="virtual", policy="baseline")
    r = ex.simulate(None)
    largest = max(s.workspace_bytes for s in ex.steps)
    per_step = sum(s.workspace_bytes for s in ex.steps if s.workspace_bytes)
    held = r["bytes_by_kind_at_peak"]["workspace"]
    assert largest > 0 and per_step > 2 * largest
    assert largest <= held < largest + ex.block         # one buffer, rounded to the heap block
