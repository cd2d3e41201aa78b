"""--layout nhwc (memory/layout.py) on the CPU: channels-last arena views, the same planned
bytes, and training that matches nchw.

Equality. The kernels index logically, so the layouts compute the same values; only reductions
over a strided array (NumPy sums BN statistics, bias gradients and global pooling in memory
order) may round differently. A net whose every reduction is a copy followed by a matmul over
the same contiguous buffers (convolutions without bias, ReLU, max pooling, linear layers: the
VGG-like net here) is bit-identical; resnet_cifar and densenet_cifar (BN, concatenation) agree
to float32 summation order: losses to 1e-6 and every state tensor (parameters, momentum, BN
statistics) to 1e-5 in relative norm after 3 steps."""
from __future__ import annotations

import numpy as np
import pytest

import neuron as nn
from neuron.checkpoint import load_checkpoint, save_checkpoint
from neuron.devices import CpuDevice
from neuron.executor import Executor
from neuron.kernels.channels_last import channels_last_strides
from neuron.memory.layout import get_layout
from neuron.models import build_model
from neuron.plan import plan

BATCH = 4


def vgg_like():
    """Bias-free convolutions, ReLU, max pooling and a flatten into two linear layers: every
    reduction is a matmul over copied buffers, so nhwc gives nchw's bits."""
    x = nn.Input((3, 16, 16), name="data")
    h = nn.ReLU(name="r1")(nn.Conv2d(8, 3, padding=1, bias=False, name="c1")(x))
    h = nn.ReLU(name="r2")(nn.Conv2d(8, 3, padding=1, bias=False, name="c2")(h))
    h = nn.MaxPool2d(2, 2, name="p1")(h)
    h = nn.ReLU(name="r3")(nn.Conv2d(16, 3, padding=1, bias=False, name="c3")(h))
    h = nn.MaxPool2d(2, 2, name="p2")(h)
    h = nn.ReLU(name="r4")(nn.Linear(32, bias=False, name="fc1")(h))
    return nn.Graph(x, nn.Linear(10, bias=False, name="fc2")(h))


GRAPHS = {
    "resnet_cifar8": lambda: build_model("resnet_cifar", depth=8, in_shape=(3, 16, 16)),
    "densenet_cifar10": lambda: build_model("densenet_cifar", depth=10, in_shape=(3, 16, 16)),
    "vgg_like": vgg_like,
}


def _data(steps, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((BATCH, 3, 16, 16)).astype(np.float32),
             rng.integers(0, 10, BATCH)) for _ in range(steps)]


def _train(graph, layout, steps=3, **kw):
    ex = Executor(GRAPHS[graph](), BATCH, device="cpu", seed=1, layout=layout,
                  optimizer=nn.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4), **kw)
    losses = [ex.train_step(x, y) for x, y in _data(steps)]
    return losses, ex.state_dict(), ex


@pytest.mark.parametrize("graph", list(GRAPHS))
def test_nhwc_trains_like_nchw(graph):
    (la, sa, _), (lb, sb, _) = _train(graph, "nhwc"), _train(graph, "nchw")
    assert sa.keys() == sb.keys()
    if graph == "vgg_like":
        assert la == lb
        for k in sa:
            np.testing.assert_array_equal(sa[k], sb[k], err_msg=k)
    else:
        np.testing.assert_allclose(la, lb, rtol=1e-6)
        for k in sa:
            err = np.linalg.norm(sa[k] - sb[k]) / max(np.linalg.norm(sb[k]), 1e-30)
            assert err < 1e-5, (k, err)


def test_the_views_are_channels_last_and_the_rest_c_ordered():
    ex = Executor(GRAPHS["resnet_cifar8"](), BATCH, device="cpu", layout="nhwc")
    ex.train_step(*_data(1)[0])
    maps = [t for t in ex.schedule.registry.tensors if len(t.shape) == 4]
    assert any(t.kind.value == "activation" for t in maps) and \
        any(t.kind.value == "param" for t in maps)
    for t in maps:
        assert t.channels_last, t
    for t in ex.state_tensors:          # resident: parameters and optimizer state
        v = ex.pool.view(t)
        if len(t.shape) == 4:
            assert v.strides == channels_last_strides(t.shape, 4), t
            assert v.base is not None and v.transpose(0, 2, 3, 1).flags.c_contiguous
        else:
            assert v.flags.c_contiguous, t
    data = ex.schedule.act[id(ex.train_graph.inputs[0])]
    assert data.channels_last
    # nchw: nothing is marked
    ex = Executor(GRAPHS["resnet_cifar8"](), BATCH, device="cpu")
    assert not any(t.channels_last for t in ex.schedule.registry.tensors)


@pytest.mark.parametrize("graph", list(GRAPHS))
def test_planned_bytes_are_the_same(graph):
    a = plan(GRAPHS[graph](), 8, policy="superneurons", layout="nhwc")
    b = plan(GRAPHS[graph](), 8, policy="superneurons", layout="nchw")
    for k in ("peak_bytes", "min_budget_bytes", "lower_bound_bytes", "bytes_by_kind"):
        assert a[k] == b[k], k
    assert a["layout"] == "nhwc" and b["layout"] == "nchw"


def test_the_tape_replays_nhwc_bit_identically():
    (la, sa, ea), (lb, sb, _) = (_train("densenet_cifar10", "nhwc", steps=4, replay="tape"),
                                 _train("densenet_cifar10", "nhwc", steps=4, replay="off"))
    assert ea.replay["replayed_iterations"] >= 1
    assert la == lb
    for k in sa:
        np.testing.assert_array_equal(sa[k], sb[k], err_msg=k)


def test_a_checkpoint_saved_at_nhwc_loads_at_nchw_with_the_same_logits(tmp_path):
    """State dicts hold NCHW-order (K, C, R, S) arrays in either layout."""
    _, state, ex = _train("resnet_cifar8", "nhwc", steps=2)
    x, y = _data(1, seed=5)[0]
    ex.evaluate(x, y)
    logits = ex.last_logits.copy()
    path = tmp_path / "nhwc.npz"
    save_checkpoint(path, state, {"layout": "nhwc"})
    arrays, _ = load_checkpoint(path)
    other = Executor(GRAPHS["resnet_cifar8"](), BATCH, device="cpu", seed=7, layout="nchw",
                     optimizer=nn.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4))
    other.load_state_dict(arrays)
    for k, v in other.state_dict().items():
        np.testing.assert_array_equal(v, state[k], err_msg=k)
    other.evaluate(x, y)
    np.testing.assert_allclose(other.last_logits, logits, rtol=1e-5, atol=1e-6)


def test_a_flatten_gives_nchw_feature_order():
    """The first linear layer's weights mean the same features in both layouts: the same
    initial weights give the same logits (a flatten in storage order would permute them)."""
    outs = []
    for layout in ("nchw", "nhwc"):
        ex = Executor(vgg_like(), BATCH, device="cpu", seed=3, layout=layout)
        x, y = _data(1)[0]
        ex.evaluate(x, y)
        outs.append(ex.last_logits.copy())
    np.testing.assert_array_equal(outs[0], outs[1])


def test_a_linear_after_a_channels_last_map_flattens_in_its_planned_workspace(monkeypatch):
    """At nhwc, fc1 reads a channels-last (16, 4, 4) map: its NCHW-order flatten is a copy,
    planned as the step's workspace (forward the map's bytes, backward also its gradient's)
    and made in the arena, not in a temporary; the pool's peak is the planned one and
    training has nchw's bits."""
    from neuron.kernels import numpy_ref
    seen = []
    real = numpy_ref.linear_forward

    def linear_forward(x, *a, **kw):
        seen.append(x)
        return real(x, *a, **kw)
    monkeypatch.setattr(numpy_ref, "linear_forward", linear_forward)
    ws = {}
    for layout in ("nchw", "nhwc"):
        ex = Executor(vgg_like(), BATCH, device="cpu", seed=1, layout=layout)
        ws[layout] = {s.name: s.workspace_bytes for s in ex.steps if s.layer.name == "fc1"}
    n = BATCH * 16 * 4 * 4 * 4
    assert ws["nchw"] == {"F9:fc1": 0, "B17:fc1": 0}
    assert ws["nhwc"] == {"F9:fc1": n, "B17:fc1": 2 * n}
    seen.clear()
    (la, sa, ea), (lb, sb, _) = _train("vgg_like", "nhwc"), _train("vgg_like", "nchw")
    fc1 = [x for x in seen[:len(seen) // 2] if x.shape[1] == 16 * 4 * 4]   # nhwc's calls
    assert fc1 and all(np.shares_memory(x, ea.device.buffer) for x in fc1)
    assert ea.pool.high_water == ea.planned["peak_bytes"]
    assert la == lb
    for k in sa:
        np.testing.assert_array_equal(sa[k], sb[k], err_msg=k)


def test_offloaded_parameters_at_nhwc():
    """Parameters placed on the host and brought back (their bytes in storage order)."""
    kw = dict(offload_params=True, policy="superneurons")
    (la, sa, _), (lb, sb, _) = (_train("vgg_like", "nhwc", **kw), _train("vgg_like", "nchw", **kw))
    assert la == lb
    for k in sa:
        np.testing.assert_array_equal(sa[k], sb[k], err_msg=k)


def test_a_network_without_4d_maps_just_runs():
    x = nn.Input((12,), name="data")
    g = nn.Graph(x, nn.Linear(10, name="fc2")(nn.ReLU(name="r")(nn.Linear(16, name="fc1")(x))))
    ex = Executor(g, BATCH, device="cpu", layout="nhwc")
    rng = np.random.default_rng(0)
    loss = ex.train_step(rng.standard_normal((BATCH, 12)).astype(np.float32),
                         rng.integers(0, 10, BATCH))
    assert np.isfinite(loss)
    assert not any(t.channels_last for t in ex.schedule.registry.tensors)


def test_a_bad_layout_is_one_clear_error():
    with pytest.raises(ValueError, match="layout must be one of nchw, nhwc, got 'nwhc'"):
        Executor(vgg_like(), BATCH, device="cpu", layout="nwhc")
    assert get_layout(None) == "nchw" and get_layout("NHWC") == "nhwc"


def test_compressed_swaps_at_nhwc():
    """FreeLunch's codecs (memory/compressed_swap.py) encode and decode a map's raw storage:
    at nhwc the first step is the exact one's (backward reads the decoded maps only), the
    second close, and runs repeat bit for bit."""
    def run(planner):
        ex = Executor(GRAPHS["resnet_cifar8"](), BATCH, device="cpu", seed=3, planner=planner,
                      layout="nhwc", optimizer=nn.SGD(lr=0.05, momentum=0.9))
        return [ex.train_step(x, y) for x, y in _data(2)], ex
    exact, _ = run("vdnn")
    a, ex = run("vdnn:compress=2")
    b, _ = run("vdnn:compress=2")
    assert ex.pool.codecs and ex.pool.offload_bytes > 0
    assert a == b and a[0] == exact[0]
    assert abs(a[1] - exact[1]) < 0.05 * abs(exact[1])
