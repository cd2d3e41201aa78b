"""Graph building and route construction (SuperNeurons Algorithm 1: DFS with arrival counters)."""
import time

import numpy as np
import pytest

import neuron as nn
from neuron.errors import GraphError, ShapeError
from neuron.executor import Executor
from neuron.graph import Graph, route
from neuron.layers import Input


# ---------------------------------------------------------------- helpers
def pos(g):
    return {l.name: i for i, l in enumerate(g.route)}


def assert_topological(g):
    """Every layer comes after every layer that feeds it, and each layer appears once."""
    p = pos(g)
    assert len(p) == len(g.route)
    for layer in g.route:
        for t in layer.inputs:
            assert p[t.producer.name] < p[layer.name], (t.producer.name, layer.name)


def names(g):
    return [l.name for l in g.route]


# ---------------------------------------------------------------- construction
def test_chain():
    x = nn.Input((3, 8, 8), name="data")
    h = nn.Conv2d(4, 3, padding=1, name="conv")(x)
    h = nn.ReLU(name="relu")(h)
    h = nn.MaxPool2d(2, name="pool")(h)
    y = nn.Linear(10, name="fc")(h)
    g = Graph(x, y)
    assert names(g) == ["data", "conv", "relu", "pool", "fc"]
    assert [l.index for l in g.route] == list(range(5))
    assert len(g) == 5
    assert set(g.layers) == set(names(g))
    assert y.shape == (10,)
    assert h.shape == (4, 4, 4)
    # parameters in route order, qualified by layer name
    assert [q for q, *_ in g.params()] == ["conv.weight", "conv.bias", "fc.weight", "fc.bias"]
    assert g.num_params() == 4 * 3 * 9 + 4 + 10 * 64 + 10


def test_fan_out_then_join_waits_for_all_inputs():
    x = nn.Input((2, 6, 6), name="data")
    a = nn.Conv2d(4, 3, padding=1, name="a")(x)
    # a fans out to three branches of different lengths; Add must wait for all of them
    b1 = nn.ReLU(name="b1")(a)
    b2 = nn.Tanh(name="b2b")(nn.Sigmoid(name="b2a")(a))
    b3 = nn.ReLU(name="b3c")(nn.Tanh(name="b3b")(nn.Conv2d(4, 1, name="b3a")(a)))
    s = nn.Add(name="join")(b1, b2, b3)
    y = nn.Linear(3, name="fc")(s)
    g = Graph(x, y)
    assert_topological(g)
    p = pos(g)
    for n in ["b1", "b2b", "b3c", "b2a", "b3a", "b3b"]:
        assert p[n] < p["join"]
    assert names(g)[-2:] == ["join", "fc"]
    assert names(g)[:2] == ["data", "a"]


def _figure6():
    """A nonlinear graph in the spirit of the SuperNeurons paper's Figure 6 (nested fans).

        data -> a -> b -> c -> d -> e ----------+
                |         |                      |
                |         +-> h -----------------+--> i (join) -> j -> k
                +-> f -> g ----------------------+
    """
    x = nn.Input((2, 6, 6), name="data")
    a = nn.Conv2d(3, 3, padding=1, name="a")(x)
    b = nn.ReLU(name="b")(a)
    c = nn.Conv2d(3, 3, padding=1, name="c")(b)
    d = nn.ReLU(name="d")(c)
    e = nn.Conv2d(3, 1, name="e")(d)
    h = nn.Conv2d(3, 1, name="h")(c)
    f = nn.Conv2d(3, 1, name="f")(a)
    gg = nn.ReLU(name="g")(f)
    return x, e, gg, h


@pytest.mark.parametrize("join", ["add", "concat"])
def test_figure6_nested_fans(join):
    x, e, gg, h = _figure6()
    layer = nn.Add(name="i") if join == "add" else nn.Concat(name="i")
    i = layer(e, gg, h)
    k = nn.Linear(5, name="k")(nn.ReLU(name="j")(i))
    g = Graph(x, k)
    assert_topological(g)
    p = pos(g)
    assert p["i"] > max(p["e"], p["g"], p["h"])
    assert p["i"] < p["j"] < p["k"]
    assert i.shape == ((3, 6, 6) if join == "add" else (9, 6, 6))
    # depth first, first consumer first: a's first branch (b..e) is walked to the join before
    # the nested fan at c resumes (h), then a's second branch (f, g); only then is i ready.
    assert names(g) == ["data", "a", "b", "c", "d", "e", "h", "f", "g", "i", "j", "k"]


def test_densenet_full_join():
    """Each layer concatenates the outputs of all previous layers (DenseNet block)."""
    x = nn.Input((2, 5, 5), name="data")
    feats = [x]
    for k in range(7):
        inp = feats[0] if len(feats) == 1 else nn.Concat(name=f"cat{k}")(*feats)
        feats.append(nn.Conv2d(2, 3, padding=1, name=f"conv{k}")(inp))
    y = nn.Linear(3, name="fc")(nn.Concat(name="catout")(*feats))
    g = Graph(x, y)
    assert_topological(g)
    p = pos(g)
    for k in range(1, 7):
        assert p[f"cat{k}"] > max(p[f"conv{j}"] for j in range(k))
        assert p[f"conv{k}"] > p[f"cat{k}"]
    assert g.layers["catout"].outputs[0].shape == (2 + 7 * 2, 5, 5)
    assert len(g) == 1 + 7 + 6 + 1 + 1


def test_two_inputs_and_input_with_no_consumers_before_others():
    x1 = nn.Input((4,), name="x1")
    x2 = nn.Input((4,), name="x2")
    y = nn.Linear(2, name="fc")(nn.Add(name="add")(nn.ReLU(name="r")(x1), x2))
    g = Graph([x1, x2], y)
    assert_topological(g)
    assert set(names(g)) == {"x1", "x2", "r", "add", "fc"}


def test_long_chain_no_recursion():
    n = 10_000
    x = nn.Input((4,), name="data")
    h = x
    for _ in range(n):
        h = nn.ReLU()(h)
    t0 = time.perf_counter()
    g = Graph(x, h)
    dt = time.perf_counter() - t0
    assert len(g) == n + 1
    assert_topological(g)
    assert dt < 5.0, f"route of a {n}-layer chain took {dt:.1f}s"


def test_long_residual_chain():
    """2,000 residual blocks: fans and joins deep enough to break a recursive DFS."""
    x = nn.Input((4,), name="data")
    h = x
    for _ in range(2000):
        h = nn.Add()(h, nn.Tanh()(h))
    g = Graph(x, h)
    assert len(g) == 1 + 2 * 2000
    assert_topological(g)


# ---------------------------------------------------------------- errors
def test_cycle_is_an_error_naming_layers():
    x = nn.Input((4,), name="data")
    a_layer = nn.Add(name="cyc_a")
    r0 = nn.ReLU(name="cyc_pre")(x)
    a = a_layer(r0, x)
    b = nn.ReLU(name="cyc_b")(a)
    c = nn.Tanh(name="cyc_c")(b)
    out = nn.Linear(2, name="cyc_out")(c)
    # close a cycle by hand: cyc_c's output becomes a third input of cyc_a
    a_layer.inputs.append(c)
    c.consumers.append(a_layer)
    with pytest.raises(GraphError) as ei:
        Graph(x, out)
    msg = str(ei.value)
    for n in ("cyc_a", "cyc_b", "cyc_c"):
        assert n in msg
    assert "cycle" in msg


def test_route_function_reports_cycle_directly():
    x = nn.Input((4,), name="data")
    r1_layer = nn.Add(name="loop1")
    r1 = r1_layer(x, x)
    r2 = nn.ReLU(name="loop2")(r1)
    r1_layer.inputs[1] = r2            # loop1 <- loop2 <- loop1
    r2.consumers.append(r1_layer)
    x.consumers.remove(r1_layer)
    layers = [x.producer, r1_layer, r2.producer]
    with pytest.raises(GraphError, match="loop1"):
        route([x], layers)


def test_dangling_layer_is_an_error_naming_it():
    x = nn.Input((4,), name="data")
    y = nn.Linear(2, name="used")(x)
    nn.ReLU(name="dangling_relu")(x)
    with pytest.raises(GraphError, match="dangling_relu"):
        Graph(x, y)


def test_dangling_branch_in_the_middle():
    x = nn.Input((4,), name="data")
    h = nn.ReLU(name="mid")(x)
    nn.Linear(3, name="side_fc")(h)
    y = nn.Linear(2, name="main_fc")(h)
    with pytest.raises(GraphError, match="side_fc"):
        Graph(x, y)


def test_input_not_declared():
    x1 = nn.Input((4,), name="decl")
    x2 = nn.Input((4,), name="undeclared")
    y = nn.Linear(2, name="fc")(nn.Add(name="add")(x1, x2))
    with pytest.raises(GraphError, match="undeclared"):
        Graph(x1, y)


def test_graph_input_must_come_from_input_layer():
    x = nn.Input((4,), name="data")
    h = nn.ReLU(name="r")(x)
    y = nn.Linear(2, name="fc")(h)
    with pytest.raises(GraphError, match="graph input r "):
        Graph(h, y)


def test_graph_input_that_reaches_no_output():
    x1 = nn.Input((4,), name="used_in")
    x2 = nn.Input((4,), name="unused_in")
    y = nn.Linear(2, name="fc")(x1)
    with pytest.raises(GraphError, match="unused_in"):
        Graph([x1, x2], y)


def test_duplicate_layer_names():
    x = nn.Input((4,), name="data")
    y = nn.ReLU(name="same")(nn.ReLU(name="same")(x))
    with pytest.raises(GraphError, match="same"):
        Graph(x, y)


def test_calling_a_layer_twice():
    x = nn.Input((4,), name="data")
    r = nn.ReLU(name="twice")
    r(x)
    with pytest.raises(GraphError, match="twice"):
        r(x)


@pytest.mark.parametrize("bad", [np.zeros((4,)), [1, 2], 3.0, None, "x"])
def test_wrong_input_types(bad):
    with pytest.raises(GraphError, match="Tensor"):
        nn.ReLU(name="r_bad")(bad)


def test_wrong_number_of_inputs():
    x = nn.Input((4,), name="data")
    with pytest.raises(GraphError, match="expects 1"):
        nn.ReLU(name="r2")(x, x)
    with pytest.raises(GraphError, match="at least 2"):
        nn.Add(name="add1")(x)


def test_conv_on_1d_input():
    x = nn.Input((10,), name="data")
    with pytest.raises(ShapeError, match="convbad"):
        nn.Conv2d(4, 3, name="convbad")(x)


def test_add_mismatched_shapes_names_layer():
    x = nn.Input((2, 4, 4), name="data")
    a = nn.Conv2d(3, 1, name="c3")(x)
    b = nn.Conv2d(5, 1, name="c5")(x)
    with pytest.raises(ShapeError, match="badadd"):
        nn.Add(name="badadd")(a, b)
    # the failed call left no trace: inputs have no consumer and the layer can still be used
    assert a.consumers == [] and b.consumers == []


def test_concat_different_hw():
    x = nn.Input((2, 8, 8), name="data")
    a = nn.Conv2d(3, 1, name="ca")(x)
    b = nn.MaxPool2d(2, name="pb")(x)
    with pytest.raises(ShapeError, match="badcat"):
        nn.Concat(name="badcat")(a, b)


def test_conv_kernel_larger_than_input():
    x = nn.Input((1, 4, 4), name="data")
    with pytest.raises(ShapeError, match="bigk"):
        nn.Conv2d(2, 5, name="bigk")(x)
    # with enough padding it fits
    assert nn.Conv2d(2, 5, padding=1, name="bigk_ok")(x).shape == (2, 2, 2)


def test_pool_too_small_and_bad_args():
    x = nn.Input((1, 2, 2), name="data")
    with pytest.raises(ShapeError, match="bigpool"):
        nn.MaxPool2d(3, name="bigpool")(x)
    with pytest.raises(GraphError):
        nn.Conv2d(0, 3, name="zero_out")
    with pytest.raises(GraphError):
        nn.Dropout(1.0, name="drop_all")


# ---------------------------------------------------------------- backward route
def _fan_net():
    x = nn.Input((2, 6, 6), name="data")
    a = nn.Conv2d(3, 3, padding=1, name="a")(x)
    b = nn.BatchNorm(name="b")(a)
    c = nn.ReLU(name="c")(b)
    d = nn.Conv2d(3, 1, name="d")(c)
    e = nn.Add(name="e")(d, a)
    f = nn.MaxPool2d(2, name="f")(e)
    return Graph(x, nn.Linear(4, name="fc")(f))


def test_backward_route_is_the_mirror():
    g = _fan_net()
    ex = nn.Executor(g, 2)
    steps = ex.schedule.steps
    phases = [s.phase for s in steps]
    nf = phases.count("F")
    assert phases == ["F"] * nf + ["B"] * (len(steps) - nf)
    route_ = ex.train_graph.route
    assert [s.layer for s in steps[:nf]] == route_
    assert [s.layer for s in steps[nf:]] == [l for l in reversed(route_)
                                            if not isinstance(l, Input)]
    assert [s.index for s in steps] == list(range(len(steps)))
    # the training graph adds the labels input and the loss layer
    assert route_[-1].name == "loss"
    assert {"data", "labels"} <= {l.name for l in route_ if isinstance(l, Input)}
    assert not any(isinstance(s.layer, Input) for s in steps if s.phase == "B")
    # the tensor a fans out to two consumers: the second adds its share in place (it reads the
    # started gradient and writes no temporary)
    acc = [(s, g) for s in steps for _, g, a in s.grad_targets if a]
    assert len(acc) == 1 and "a" in acc[0][1].name
    s, g = acc[0]
    assert g in s.reads and g not in s.writes
    assert not any(t.name.startswith("gradtmp") for t in ex.schedule.registry.tensors)


# ---------------------------------------------------------------- bad arguments, reuse
def test_graph_arguments_must_be_tensors():
    x = nn.Input((2, 4, 4))
    y = nn.Linear(3)(nn.GlobalAvgPool()(nn.Conv2d(2, 3)(x)))
    for bad in ("str", [], [1], None):
        with pytest.raises(TypeError, match="Graph outputs must be a Tensor"):
            nn.Graph(x, bad)
    with pytest.raises(TypeError, match="Graph inputs must be a Tensor"):
        nn.Graph("x", y)


def test_a_second_graph_over_the_same_tensors_after_an_executor():
    x = nn.Input((2, 4, 4))
    y = nn.Linear(3)(nn.GlobalAvgPool()(nn.Conv2d(2, 3)(x)))
    ex = Executor(nn.Graph(x, y), 2)
    ex2 = Executor(nn.Graph(x, y), 2)       # the first executor's loss layer is not "dangling"
    rng = np.random.default_rng(0)
    xb, yb = rng.standard_normal((2, 2, 4, 4)), np.array([0, 2])
    assert ex.train_step(xb, yb) == ex2.train_step(xb, yb)
