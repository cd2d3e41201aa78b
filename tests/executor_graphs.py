"""The small graphs the executor tests train, and their random batches."""
import numpy as np

import neuron as nn


# ---------------------------------------------------------------- graphs
def residual_bn():
    """Residual block: conv-BN-tanh-conv + 1x1 shortcut, Add, tanh, global pool, FC."""
    x = nn.Input((2, 5, 5), name="data")
    a = nn.Conv2d(3, 3, padding=1, name="c1")(x)
    b = nn.BatchNorm(name="bn1")(a)
    c = nn.Tanh(name="t1")(b)
    d = nn.Conv2d(3, 3, padding=1, name="c2")(c)
    s = nn.Conv2d(3, 1, name="sc")(x)
    e = nn.Add(name="add")(d, s)
    f = nn.Tanh(name="t2")(e)
    y = nn.Linear(4, name="fc")(nn.GlobalAvgPool(name="gap")(f))
    return nn.Graph(x, y, name="residual_bn")


def concat_fan_lrn():
    """An intermediate tensor fans out to three branches (gradient accumulation), Concat,
    max pool and a strongly nonlinear LRN."""
    x = nn.Input((2, 6, 6), name="data")
    h = nn.Conv2d(3, 3, padding=1, name="stem")(x)
    a = nn.Conv2d(2, 1, name="br_a")(h)
    b = nn.Conv2d(2, 3, padding=1, name="br_b")(h)
    c = nn.Sigmoid(name="br_c")(h)
    cat = nn.Concat(name="cat")(a, b, c)
    p = nn.MaxPool2d(2, name="pool")(cat)
    n = nn.LRN(size=3, alpha=1.0, beta=0.75, k=1.0, name="lrn")(p)
    y = nn.Linear(3, name="fc")(n)
    return nn.Graph(x, y, name="concat_fan_lrn")


def dropout_mix():
    """Grouped/dilated/strided conv, LeakyReLU, padded avg pool, dropout (fixed mask),
    sigmoid, 1-D BN."""
    x = nn.Input((2, 7, 7), name="data")
    h = nn.Conv2d(4, 3, stride=2, padding=2, dilation=2, groups=2, name="gconv")(x)
    h = nn.LeakyReLU(0.1, name="lrelu")(h)
    h = nn.AvgPool2d(2, stride=2, padding=1, name="apool")(h)
    h = nn.Dropout(0.5, name="drop")(h)
    h = nn.Sigmoid(name="sig")(nn.Linear(6, name="fc1")(h))
    h = nn.BatchNorm(name="bn1d")(h)
    y = nn.Linear(3, name="fc2")(h)
    return nn.Graph(x, y, name="dropout_mix")


def relu_maxpool():
    x = nn.Input((1, 8, 8), name="data")
    h = nn.ReLU(name="r1")(nn.Conv2d(3, 3, padding=1, name="c1")(x))
    h = nn.MaxPool2d(3, stride=2, padding=1, name="mp")(h)
    h = nn.ReLU(name="r2")(nn.BatchNorm(name="bn")(nn.Conv2d(4, 3, padding=1, name="c2")(h)))
    y = nn.Linear(5, name="fc")(nn.GlobalAvgPool(name="gap")(h))
    return nn.Graph(x, y, name="relu_maxpool")


def data_joins():
    """Joins that read the data tensor (which has no gradient) next to computed tensors."""
    x = nn.Input((2, 4, 4), name="data")
    h = nn.Conv2d(2, 3, padding=1, name="c")(x)
    a = nn.Tanh(name="t0")(h)
    c = nn.Concat(name="cat")(x, a, h)
    d = nn.Add(name="add_x")(nn.Conv2d(2, 1, name="c2")(c), x)
    y = nn.Linear(3, name="fc")(nn.Tanh(name="t")(d))
    return nn.Graph(x, y, name="data_joins")


def self_join():
    """A layer that takes the same tensor twice: Add(h, h), Concat(a, h, h)."""
    x = nn.Input((2, 4, 4), name="data")
    h = nn.Conv2d(2, 3, padding=1, name="c")(x)
    a = nn.Add(name="selfadd")(h, h)
    c = nn.Concat(name="cat")(a, h, h)
    y = nn.Linear(3, name="fc")(nn.Tanh(name="t")(c))
    return nn.Graph(x, y, name="self_join")


def small_resnet():
    """Two residual stages (one with a strided projection shortcut), BN, dropout, FC."""
    x = nn.Input((3, 8, 8), name="data")
    h = nn.ReLU(name="stem.relu")(nn.BatchNorm(name="stem.bn")(
        nn.Conv2d(4, 3, padding=1, bias=False, name="stem.conv")(x)))
    for i, (cout, stride) in enumerate([(4, 1), (8, 2)]):
        p = f"b{i}"
        r = nn.Conv2d(cout, 3, stride=stride, padding=1, bias=False, name=f"{p}.conv1")(h)
        r = nn.ReLU(name=f"{p}.relu1")(nn.BatchNorm(name=f"{p}.bn1")(r))
        r = nn.BatchNorm(name=f"{p}.bn2")(nn.Conv2d(cout, 3, padding=1, bias=False,
                                                    name=f"{p}.conv2")(r))
        sc = h if stride == 1 and cout == h.shape[0] else nn.BatchNorm(name=f"{p}.down.bn")(
            nn.Conv2d(cout, 1, stride=stride, bias=False, name=f"{p}.down.conv")(h))
        h = nn.ReLU(name=f"{p}.relu2")(nn.Add(name=f"{p}.add")(r, sc))
    h = nn.Dropout(0.3, name="drop")(nn.GlobalAvgPool(name="gap")(h))
    return nn.Graph(x, nn.Linear(10, name="fc")(h), name="small_resnet")


def batch_for(graph, batch, num_classes, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, *graph.inputs[0].shape))
    y = rng.integers(0, num_classes, batch)
    return x, y


def states_equal(a, b):
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes() for k in a)
