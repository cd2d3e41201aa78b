"""Each layer's backward runs on exactly what it declares (retain_inputs / retain_outputs /
aux): given None for everything else it computes the same gradients as when given everything.
The declarations are also the minimal ones the design relies on (liveness frees the rest)."""
from __future__ import annotations

import numpy as np
import pytest

import neuron as nn
from neuron.kernels import numpy_ref as k
from neuron.layers import base
from neuron.layers import AddReLU
from neuron.layers.base import Context

N = 3
CASES = {   # name: (layer factory, per-sample input shapes, retain_inputs, retain_outputs)
    "conv": (lambda: nn.Conv2d(4, 3, padding=1), [(2, 5, 5)], (0,), ()),
    "bn": (lambda: nn.BatchNorm(), [(2, 5, 5)], (0,), ()),
    "relu": (lambda: nn.ReLU(), [(2, 5, 5)], (), (0,)),
    "leaky": (lambda: nn.LeakyReLU(0.1), [(2, 5, 5)], (), (0,)),
    "sigmoid": (lambda: nn.Sigmoid(), [(2, 5, 5)], (), (0,)),
    "tanh": (lambda: nn.Tanh(), [(2, 5, 5)], (), (0,)),
    "maxpool": (lambda: nn.MaxPool2d(2), [(2, 6, 6)], (0,), (0,)),
    "avgpool": (lambda: nn.AvgPool2d(2), [(2, 6, 6)], (), ()),
    "gap": (lambda: nn.GlobalAvgPool(), [(2, 5, 5)], (), ()),
    "linear": (lambda: nn.Linear(4), [(2, 3, 3)], (0,), ()),
    "dropout": (lambda: nn.Dropout(0.4), [(2, 5, 5)], (), ()),
    "lrn": (lambda: nn.LRN(3), [(4, 5, 5)], (0,), (0,)),
    "add": (lambda: nn.Add(), [(2, 5, 5), (2, 5, 5)], (), ()),
    "add_relu": (lambda: AddReLU(), [(2, 5, 5), (2, 5, 5), (2, 5, 5)], (), (0,)),
    "concat": (lambda: nn.Concat(), [(2, 5, 5), (3, 5, 5)], (), ()),
}


def run(name, hide: bool):
    factory, shapes, _, _ = CASES[name]
    rng = np.random.default_rng(7)
    layer = factory()
    layer(*[nn.Input(s) for s in shapes])
    ins = [rng.standard_normal((N, *s)) for s in shapes]
    outs = [np.empty((N, *t.shape)) for t in layer.outputs]
    params = {n: rng.standard_normal(p.shape) + (2.0 if "var" in n else 0.0)
              for n, p in layer.param_specs.items()}
    aux = {n: np.empty(a.shape, a.dtype if a.dtype is not None else np.float64)
           for n, a in layer.aux_specs(N).items()}
    nbytes = layer.workspace_bytes("F", N, 8)
    ws = np.empty(nbytes, np.uint8) if nbytes else None
    ctx = Context(training=True, seed=1)
    layer.forward(k, ins, outs, params, aux, ws, ctx)
    douts = [rng.standard_normal(o.shape) for o in outs]
    dins = [np.full_like(x, np.nan) for x in ins]
    dparams = {n: np.full(p.shape, np.nan) for n, p in layer.param_specs.items() if p.trainable}
    b_ins = [x if (i in layer.retain_inputs or not hide) else None for i, x in enumerate(ins)]
    b_outs = [y if (j in layer.retain_outputs or not hide) else None for j, y in enumerate(outs)]
    layer.backward(k, b_ins, b_outs, douts, dins, params, dparams, aux, ws, ctx)
    return layer, dins, dparams


@pytest.mark.parametrize("name", list(CASES))
def test_backward_needs_only_what_it_declares(name):
    _, full, pfull = run(name, hide=False)
    layer, hidden, phidden = run(name, hide=True)
    for a, b in zip(full, hidden):
        np.testing.assert_array_equal(a, b)
        assert np.all(np.isfinite(b))
    for n in pfull:
        np.testing.assert_array_equal(pfull[n], phidden[n])


@pytest.mark.parametrize("name", list(CASES))
def test_declarations_are_the_minimal_ones(name):
    factory, shapes, retain_in, retain_out = CASES[name]
    layer = factory()
    assert tuple(layer.retain_inputs) == retain_in
    assert tuple(layer.retain_outputs) == retain_out


def test_softmax_loss_keeps_labels_and_probabilities_only():
    loss = nn.SoftmaxCrossEntropy()
    assert loss.retain_inputs == (1,) and loss.retain_outputs == ()
    loss(nn.Input((5,)), nn.Input((), dtype=np.int64))
    assert set(loss.aux_specs(N)) == {"probs"}


def test_layer_names_are_unique_by_default():
    a, b = nn.ReLU(), nn.ReLU()
    assert a.name != b.name and isinstance(a, base.Layer)


def test_add_relu_is_add_then_relu():
    """AddReLU's forward and backward give the bits of Add then ReLU; backward leaves the
    masked gradient in douts[0] (what the inputs it aliases read) and writes it into the
    others' gradients, overwriting or adding (an input given twice: its second share adds)."""
    rng = np.random.default_rng(3)
    ins = [rng.standard_normal((N, 2, 4, 4)).astype(np.float32) for _ in range(3)]
    dy = rng.standard_normal((N, 2, 4, 4)).astype(np.float32)
    z, y, dz = np.empty_like(dy), np.empty_like(dy), np.empty_like(dy)
    k.add_forward(ins, z)
    k.relu_forward(z, y)
    k.relu_backward(y, dy, dz)
    layer = AddReLU()
    layer(*[nn.Input((2, 4, 4)) for _ in ins])
    fy = np.empty_like(dy)
    layer.forward(k, ins, [fy], {}, {}, None, Context())
    assert fy.tobytes() == y.tobytes()
    fdy = dy.copy()
    d0, d2 = np.full_like(dy, np.nan), np.ones_like(dy)
    layer.backward(k, [None] * 3, [fy], [fdy], [d0, None, d2], {}, {}, {}, None,
                   Context(accumulate=frozenset({2})))
    assert fdy.tobytes() == dz.tobytes() and d0.tobytes() == dz.tobytes()
    assert d2.tobytes() == (1 + dz).tobytes()
