"""MaxPool2d / AvgPool2d: arguments, shapes, and ceil_mode against torch through the Executor
on the CPU device (forward: the loss and logits; backward: the gradients of a convolution in
front of the pool, read off one plain SGD step)."""
import numpy as np
import pytest

import neuron as nn
from neuron.errors import GraphError, ShapeError
from neuron.kernels.numpy_pool import pool_out_hw

# (H, W, kernel, stride, padding); the ceil-mode output differs from the floor-mode one in
# at least one dimension, except where noted
GEOMETRIES = [
    (8, 8, 3, 2, 0),                 # 3 -> 4; the last window is clipped at the input's edge
    (8, 9, 3, 2, 1),                 # H 4 -> 5 (a window past the padded edge), W 5 either way
    (7, 9, 2, 2, 0),                 # kernel 2 stride 2 on odd sizes
    (5, 8, (2, 3), 2, (1, 0)),       # H: the 4th window would start in the right padding, so
                                     # torch drops it (3 either way); W 3 -> 4
    (8, 8, 3, 3, 1),                 # dropped the same way in both dimensions: 3 either way
]


def _net(kind, geo, ceil):
    h, w, k, s, p = geo
    x = nn.Input((2, h, w), name="data")
    c = nn.Conv2d(3, 3, padding=1, name="c")(x)
    pool = (nn.MaxPool2d if kind == "max" else nn.AvgPool2d)(k, s, p, ceil_mode=ceil, name="p")
    return nn.Graph(x, nn.Linear(5, name="fc")(pool(c)))


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("geo", GEOMETRIES)
def test_ceil_mode_matches_torch_through_the_executor(kind, geo):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    h, w, k, s, p = geo
    g = _net(kind, geo, ceil=True)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 2, h, w)).astype(np.float32)
    y = rng.integers(0, 5, 4)
    ex = nn.Executor(g, 4, optimizer=nn.SGD(lr=1.0, momentum=0.0), seed=2)
    before = ex.state_dict()
    ex.evaluate(x, y)
    logits = ex.last_logits.copy()
    loss = ex.train_step(x, y)
    after = ex.state_dict()

    P = {n: torch.tensor(before[n], requires_grad=True) for n in after if ":" not in n}
    a = F.conv2d(torch.tensor(x), P["c.weight"], P["c.bias"], padding=1)
    pooled = F.max_pool2d(a, k, s, p, ceil_mode=True) if kind == "max" else \
        F.avg_pool2d(a, k, s, p, ceil_mode=True, count_include_pad=True)
    assert tuple(pooled.shape[1:]) == g.layers["p"].outputs[0].shape
    t_logits = F.linear(pooled.flatten(1), P["fc.weight"], P["fc.bias"])
    t_loss = F.cross_entropy(t_logits, torch.tensor(y))
    t_loss.backward()
    np.testing.assert_allclose(logits, t_logits.detach().numpy(), rtol=1e-5, atol=1e-5)
    assert loss == pytest.approx(t_loss.item(), rel=1e-5)
    for n, t in P.items():              # lr 1, no momentum: the step is minus the gradient
        np.testing.assert_allclose(before[n] - after[n], t.grad.numpy(), rtol=1e-4, atol=1e-5,
                                   err_msg=n)


def test_output_shapes_follow_torch():
    torch = pytest.importorskip("torch")
    differ = 0
    for h, w, k, s, p in GEOMETRIES:
        for ceil in (False, True):
            for cls, fn in ((nn.MaxPool2d, torch.nn.MaxPool2d), (nn.AvgPool2d, torch.nn.AvgPool2d)):
                layer = cls(k, s, p, ceil_mode=ceil)
                out = layer(nn.Input((2, h, w))).shape
                assert out == tuple(fn(k, s, p, ceil_mode=ceil)(torch.zeros(1, 2, h, w)).shape[1:])
        differ += pool_out_hw(h, w, k, s, p, True) != pool_out_hw(h, w, k, s, p)
    assert differ == 4                  # all but the last geometry, where torch drops the window


def test_describe_and_profile_key():
    from neuron.memory.costmodel import layer_key
    assert nn.MaxPool2d(3, 2).ceil_mode is False
    assert nn.MaxPool2d(3, 2).describe() == "MaxPool 3x3/2"
    assert nn.MaxPool2d(3, 2, 1).describe() == "MaxPool 3x3/2 p1"
    assert nn.AvgPool2d(3, 2, ceil_mode=True).describe() == "AvgPool 3x3/2 ceil"
    assert nn.AvgPool2d((3, 1), (2, 1), (1, 0)).describe() == "AvgPool 3x1/2x1 p1x0"
    # the cost model's key is describe() plus the shapes; ceil mode stays apart even where
    # the shapes agree (here torch drops the extra window)
    floor, ceil = (nn.MaxPool2d(3, 3, 1, ceil_mode=c) for c in (False, True))
    for p in (floor, ceil):
        p(nn.Input((2, 8, 8)))
    assert floor.outputs[0].shape == ceil.outputs[0].shape
    assert layer_key(floor, "F", 2) != layer_key(ceil, "F", 2)


def test_invalid_arguments_name_the_layer():
    with pytest.raises(TypeError, match="pool_a: ceil_mode must be True or False"):
        nn.MaxPool2d(2, ceil_mode="yes", name="pool_a")
    with pytest.raises(TypeError, match="pool_b: ceil_mode"):
        nn.AvgPool2d(2, ceil_mode=1, name="pool_b")
    for kw, what in (({"kernel_size": 0}, "kernel_size must be positive"),
                     ({"kernel_size": 2, "stride": 0}, "stride must be positive"),
                     ({"kernel_size": 2, "padding": -1}, "padding must be >= 0")):
        with pytest.raises(GraphError, match=f"pool_c: {what}"):
            nn.MaxPool2d(**kw, name="pool_c")
    with pytest.raises(ShapeError, match="pool_d: padding"):
        nn.AvgPool2d(2, padding=2, name="pool_d")
    with pytest.raises(ShapeError, match="pool_e: input .* too small"):
        nn.MaxPool2d(3, 2, ceil_mode=True, name="pool_e")(nn.Input((1, 1, 1)))
