"""Inception-v4 (Szegedy et al. 2016) at 299x299, laid out and named like timm's inception_v4.

``features.0..2`` stem convs, ``features.3`` Mixed3a, ``.4`` Mixed4a, ``.5`` Mixed5a,
``.6-9`` 4x Inception-A, ``.10`` Reduction-A, ``.11-17`` 7x Inception-B, ``.18`` Reduction-B,
``.19-21`` 3x Inception-C, then ``global_pool``, ``head_drop`` and ``last_linear``. Every
"conv" is timm's ConvNormAct: Conv(bias=False) ``<p>.conv`` + BN(eps 1e-3) ``<p>.bn`` + ReLU
``<p>.relu``, so parameter names match timm's state_dict (``features.6.branch1.0.conv.weight``,
``features.19.branch2_3a.bn.running_var``, ``last_linear.weight``, ...). 42,679,816
parameters with 1000 classes, as timm.

Differences from timm: (1) the 3x3/1 average pools of the A/B/C blocks use neuron's AvgPool2d,
which counts the zero padding (torch's ``count_include_pad=True``) where timm excludes it; this
only changes border pixels. (2) The paper's dropout (keep 0.8) before the classifier is on by
default (``drop_rate=0.2``); timm defaults to 0 (``drop_rate=0`` leaves the layer out).
"""
from __future__ import annotations

from ..layers import AvgPool2d, Concat, Dropout, GlobalAvgPool, Linear, MaxPool2d
from ._common import check_in_shape, check_num_classes, conv_bn, data, graph

BN_EPS_INCEPTION = 1e-3


def _conv(x, prefix, out, kernel, stride=1, padding=0):
    return conv_bn(x, prefix, out, kernel, stride, padding, eps=BN_EPS_INCEPTION)


def _cat(p, xs):
    return Concat(name=f"{p}.concat")(xs)


def mixed3a(x, p):
    return _cat(p, [MaxPool2d(3, 2, name=f"{p}.maxpool")(x), _conv(x, f"{p}.conv", 96, 3, 2)])


def mixed4a(x, p):
    b0 = _conv(_conv(x, f"{p}.branch0.0", 64, 1), f"{p}.branch0.1", 96, 3)
    b1 = _conv(x, f"{p}.branch1.0", 64, 1)
    b1 = _conv(b1, f"{p}.branch1.1", 64, (1, 7), padding=(0, 3))
    b1 = _conv(b1, f"{p}.branch1.2", 64, (7, 1), padding=(3, 0))
    b1 = _conv(b1, f"{p}.branch1.3", 96, 3)
    return _cat(p, [b0, b1])


def mixed5a(x, p):
    return _cat(p, [_conv(x, f"{p}.conv", 192, 3, 2), MaxPool2d(3, 2, name=f"{p}.maxpool")(x)])


def inception_a(x, p):
    b0 = _conv(x, f"{p}.branch0", 96, 1)
    b1 = _conv(_conv(x, f"{p}.branch1.0", 64, 1), f"{p}.branch1.1", 96, 3, padding=1)
    b2 = _conv(x, f"{p}.branch2.0", 64, 1)
    b2 = _conv(b2, f"{p}.branch2.1", 96, 3, padding=1)
    b2 = _conv(b2, f"{p}.branch2.2", 96, 3, padding=1)
    b3 = AvgPool2d(3, 1, 1, name=f"{p}.branch3.0")(x)
    b3 = _conv(b3, f"{p}.branch3.1", 96, 1)
    return _cat(p, [b0, b1, b2, b3])


def reduction_a(x, p):
    b0 = _conv(x, f"{p}.branch0", 384, 3, 2)
    b1 = _conv(x, f"{p}.branch1.0", 192, 1)
    b1 = _conv(b1, f"{p}.branch1.1", 224, 3, padding=1)
    b1 = _conv(b1, f"{p}.branch1.2", 256, 3, 2)
    b2 = MaxPool2d(3, 2, name=f"{p}.branch2")(x)
    return _cat(p, [b0, b1, b2])


def inception_b(x, p):
    b0 = _conv(x, f"{p}.branch0", 384, 1)
    b1 = _conv(x, f"{p}.branch1.0", 192, 1)
    b1 = _conv(b1, f"{p}.branch1.1", 224, (1, 7), padding=(0, 3))
    b1 = _conv(b1, f"{p}.branch1.2", 256, (7, 1), padding=(3, 0))
    b2 = _conv(x, f"{p}.branch2.0", 192, 1)
    b2 = _conv(b2, f"{p}.branch2.1", 192, (7, 1), padding=(3, 0))
    b2 = _conv(b2, f"{p}.branch2.2", 224, (1, 7), padding=(0, 3))
    b2 = _conv(b2, f"{p}.branch2.3", 224, (7, 1), padding=(3, 0))
    b2 = _conv(b2, f"{p}.branch2.4", 256, (1, 7), padding=(0, 3))
    b3 = AvgPool2d(3, 1, 1, name=f"{p}.branch3.0")(x)
    b3 = _conv(b3, f"{p}.branch3.1", 128, 1)
    return _cat(p, [b0, b1, b2, b3])


def reduction_b(x, p):
    b0 = _conv(_conv(x, f"{p}.branch0.0", 192, 1), f"{p}.branch0.1", 192, 3, 2)
    b1 = _conv(x, f"{p}.branch1.0", 256, 1)
    b1 = _conv(b1, f"{p}.branch1.1", 256, (1, 7), padding=(0, 3))
    b1 = _conv(b1, f"{p}.branch1.2", 320, (7, 1), padding=(3, 0))
    b1 = _conv(b1, f"{p}.branch1.3", 320, 3, 2)
    b2 = MaxPool2d(3, 2, name=f"{p}.branch2")(x)
    return _cat(p, [b0, b1, b2])


def inception_c(x, p):
    b0 = _conv(x, f"{p}.branch0", 256, 1)
    b1 = _conv(x, f"{p}.branch1_0", 384, 1)
    b1 = Concat(name=f"{p}.branch1_cat")(
        [_conv(b1, f"{p}.branch1_1a", 256, (1, 3), padding=(0, 1)),
         _conv(b1, f"{p}.branch1_1b", 256, (3, 1), padding=(1, 0))])
    b2 = _conv(x, f"{p}.branch2_0", 384, 1)
    b2 = _conv(b2, f"{p}.branch2_1", 448, (3, 1), padding=(1, 0))
    b2 = _conv(b2, f"{p}.branch2_2", 512, (1, 3), padding=(0, 1))
    b2 = Concat(name=f"{p}.branch2_cat")(
        [_conv(b2, f"{p}.branch2_3a", 256, (1, 3), padding=(0, 1)),
         _conv(b2, f"{p}.branch2_3b", 256, (3, 1), padding=(1, 0))])
    b3 = AvgPool2d(3, 1, 1, name=f"{p}.branch3.0")(x)
    b3 = _conv(b3, f"{p}.branch3.1", 256, 1)
    return _cat(p, [b0, b1, b2, b3])


def inception_v4(num_classes: int = 1000, in_shape=(3, 299, 299), *, drop_rate: float = 0.2):
    """Inception-v4: stem, 4x A, Reduction-A, 7x B, Reduction-B, 3x C, avg pool, dropout, fc.
    The smallest input it accepts is 75x75 (the valid-padded stem and reductions)."""
    in_shape = check_in_shape(in_shape, "inception_v4")
    num_classes = check_num_classes(num_classes, "inception_v4")
    x = data(in_shape)
    h = _conv(x, "features.0", 32, 3, 2)
    h = _conv(h, "features.1", 32, 3)
    h = _conv(h, "features.2", 64, 3, padding=1)
    h = mixed3a(h, "features.3")
    h = mixed4a(h, "features.4")
    h = mixed5a(h, "features.5")
    blocks = [inception_a] * 4 + [reduction_a] + [inception_b] * 7 + [reduction_b] \
        + [inception_c] * 3
    for i, block in enumerate(blocks, start=6):
        h = block(h, f"features.{i}")
    h = GlobalAvgPool(name="global_pool")(h)
    if drop_rate:
        h = Dropout(drop_rate, name="head_drop")(h)
    return graph(x, Linear(num_classes, name="last_linear")(h), "inception_v4")
