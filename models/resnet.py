"""Residual networks (He et al. 2016).

* ImageNet ResNets with torchvision's structure and *exact* torchvision state_dict names
  (``conv1``, ``bn1``, ``layer1.0.conv1`` ... ``layer4.2.bn3``, ``layerX.0.downsample.0`` (1x1
  conv) / ``.downsample.1`` (BN), ``fc``). All convolutions have ``bias=False``; the stride of a
  bottleneck sits on its 3x3 conv (torchvision's "ResNet v1.5").
  :func:`resnet_bottleneck` builds any block counts: resnet50 [3,4,6,3] (25,557,032 params),
  resnet101 [3,4,23,3] (44,549,160), resnet152 [3,8,36,3] (60,192,808).
  :func:`resnet_basic` builds basic-block ones: resnet18 [2,2,2,2], resnet34 [3,4,6,3].
* :func:`resnet`: the very deep family of SuperNeurons' Table 4, bottleneck blocks with
  (n1, n2, n3, n4) = (6, 32, n3, 6) and depth = 3*(n1+n2+n3+n4) + 2, n3 >= 1; e.g. depth 1919
  is n3 = 595 (about 5,800 layers).
* :func:`resnet_cifar`: the CIFAR ResNets of He et al. Sec. 4.2, depth = 6n+2.

Parameter-free layers get names too (``relu``, ``maxpool``, ``layerX.Y.relu1..3``,
``layerX.Y.add``, ``avgpool``); they hold no parameters, so state_dict names are unaffected.
"""
from __future__ import annotations

from ..layers import Add, BatchNorm, Conv2d, GlobalAvgPool, Linear, MaxPool2d, ReLU
from ._common import (BN_EPS, BN_MOMENTUM, check_in_shape, check_int, check_num_classes, data,
                      graph, nearest_valid)

EXPANSION = 4                       # bottleneck output width = 4 * planes

#: SuperNeurons Table 4: depth = 3*(n1+n2+n3+n4)+2 with these fixed and n3 varied
TABLE4_N1, TABLE4_N2, TABLE4_N4 = 6, 32, 6
TABLE4_MIN_DEPTH = 3 * (TABLE4_N1 + TABLE4_N2 + 1 + TABLE4_N4) + 2      # n3 = 1: 137


def _bn(x, name):
    return BatchNorm(BN_MOMENTUM, BN_EPS, name=name)(x)


def _downsample(x, prefix, out, stride):
    y = Conv2d(out, 1, stride, bias=False, name=f"{prefix}.downsample.0")(x)
    return _bn(y, f"{prefix}.downsample.1")


def bottleneck(x, prefix: str, planes: int, stride: int = 1):
    """torchvision's Bottleneck: 1x1 -> 3x3 (stride) -> 1x1 (4*planes), projection if needed."""
    out = ReLU(name=f"{prefix}.relu1")(_bn(Conv2d(planes, 1, bias=False, name=f"{prefix}.conv1")(x),
                                           f"{prefix}.bn1"))
    out = Conv2d(planes, 3, stride, 1, bias=False, name=f"{prefix}.conv2")(out)
    out = ReLU(name=f"{prefix}.relu2")(_bn(out, f"{prefix}.bn2"))
    out = _bn(Conv2d(planes * EXPANSION, 1, bias=False, name=f"{prefix}.conv3")(out),
              f"{prefix}.bn3")
    identity = x
    if stride != 1 or x.shape[0] != planes * EXPANSION:
        identity = _downsample(x, prefix, planes * EXPANSION, stride)
    return ReLU(name=f"{prefix}.relu3")(Add(name=f"{prefix}.add")(out, identity))


def basic_block(x, prefix: str, planes: int, stride: int = 1):
    """torchvision's BasicBlock: 3x3 (stride) -> 3x3, projection (option B) if shape changes."""
    out = Conv2d(planes, 3, stride, 1, bias=False, name=f"{prefix}.conv1")(x)
    out = ReLU(name=f"{prefix}.relu1")(_bn(out, f"{prefix}.bn1"))
    out = _bn(Conv2d(planes, 3, 1, 1, bias=False, name=f"{prefix}.conv2")(out), f"{prefix}.bn2")
    identity = x
    if stride != 1 or x.shape[0] != planes:
        identity = _downsample(x, prefix, planes, stride)
    return ReLU(name=f"{prefix}.relu2")(Add(name=f"{prefix}.add")(out, identity))


def _check_blocks(blocks, n_stages, model):
    try:
        blocks = list(blocks)
    except TypeError:
        raise ValueError(f"{model}: blocks must be a list of {n_stages} ints, got {blocks!r}") \
            from None
    if len(blocks) != n_stages:
        raise ValueError(f"{model}: expected {n_stages} block counts, got {blocks}")
    for b in blocks:
        check_int(b, "every block count", model)
    return blocks


def _imagenet_resnet(block, blocks, num_classes, in_shape, name):
    in_shape = check_in_shape(in_shape, name)
    num_classes = check_num_classes(num_classes, name)
    blocks = _check_blocks(blocks, 4, name)
    x = data(in_shape)
    h = Conv2d(64, 7, 2, 3, bias=False, name="conv1")(x)
    h = ReLU(name="relu")(_bn(h, "bn1"))
    h = MaxPool2d(3, 2, 1, name="maxpool")(h)
    for i, (n, planes) in enumerate(zip(blocks, (64, 128, 256, 512))):
        for j in range(n):
            h = block(h, f"layer{i + 1}.{j}", planes, 2 if (j == 0 and i > 0) else 1)
    h = GlobalAvgPool(name="avgpool")(h)
    return graph(x, Linear(num_classes, name="fc")(h), name)


def resnet_bottleneck(blocks, num_classes: int = 1000, in_shape=(3, 224, 224), *,
                      name: str | None = None):
    """An ImageNet bottleneck ResNet with block counts ``blocks`` = [n1, n2, n3, n4]."""
    blocks = _check_blocks(blocks, 4, name or "resnet_bottleneck")
    name = name or f"resnet{3 * sum(blocks) + 2}"
    return _imagenet_resnet(bottleneck, blocks, num_classes, in_shape, name)


def resnet_basic(blocks, num_classes: int = 1000, in_shape=(3, 224, 224), *,
                 name: str | None = None):
    """An ImageNet basic-block ResNet (resnet18/34 style) with block counts ``blocks``."""
    blocks = _check_blocks(blocks, 4, name or "resnet_basic")
    name = name or f"resnet{2 * sum(blocks) + 2}"
    return _imagenet_resnet(basic_block, blocks, num_classes, in_shape, name)


def resnet18(num_classes=1000, in_shape=(3, 224, 224)):
    return resnet_basic([2, 2, 2, 2], num_classes, in_shape, name="resnet18")


def resnet34(num_classes=1000, in_shape=(3, 224, 224)):
    return resnet_basic([3, 4, 6, 3], num_classes, in_shape, name="resnet34")


def resnet50(num_classes=1000, in_shape=(3, 224, 224)):
    return resnet_bottleneck([3, 4, 6, 3], num_classes, in_shape, name="resnet50")


def resnet101(num_classes=1000, in_shape=(3, 224, 224)):
    return resnet_bottleneck([3, 4, 23, 3], num_classes, in_shape, name="resnet101")


def resnet152(num_classes=1000, in_shape=(3, 224, 224)):
    return resnet_bottleneck([3, 8, 36, 3], num_classes, in_shape, name="resnet152")


# ---- SuperNeurons Table 4 ------------------------------------------------------------------
def table4_blocks(depth: int) -> list[int]:
    """[n1, n2, n3, n4] of the Table-4 ResNet of this depth; ValueError if there is none."""
    check_int(depth, "depth", "resnet")
    n3, rem = divmod(depth - 2 - 3 * (TABLE4_N1 + TABLE4_N2 + TABLE4_N4), 3)
    if depth < TABLE4_MIN_DEPTH or rem:
        lo, hi = nearest_valid(depth, TABLE4_MIN_DEPTH, 3)
        raise ValueError(
            f"resnet: depth {depth} is not in the SuperNeurons Table-4 family depth = "
            f"3*(n1+n2+n3+n4)+2 with n1={TABLE4_N1}, n2={TABLE4_N2}, n4={TABLE4_N4}, n3 >= 1 "
            f"(depth {TABLE4_MIN_DEPTH}, {TABLE4_MIN_DEPTH + 3}, ...); nearest valid depths: "
            f"{lo} and {hi}")
    return [TABLE4_N1, TABLE4_N2, n3, TABLE4_N4]


def resnet(depth: int, num_classes: int = 1000, in_shape=(3, 224, 224)):
    """SuperNeurons Table 4's very deep ResNets: bottleneck blocks (6, 32, n3, 6), depth =
    3*(n1+n2+n3+n4)+2 (so depth % 3 == 2 and depth >= 137); depth 1919 has n3 = 595."""
    return resnet_bottleneck(table4_blocks(depth), num_classes, in_shape, name=f"resnet{depth}")


# ---- CIFAR ---------------------------------------------------------------------------------
def resnet_cifar(depth: int, num_classes: int = 10, in_shape=(3, 32, 32)):
    """He et al.'s CIFAR ResNet: depth = 6n+2 (20, 32, 44, 56, 110, 1202, ...).

    conv3x3(16)-BN-ReLU, then three stages of n basic blocks with 16, 32, 64 channels (stride 2
    at the start of stages 2 and 3), global average pool, fc. Shortcuts are identity where the
    shape is kept and **option B** (1x1 conv with stride + BN, ``layerX.0.downsample.0/1``)
    where it changes (the paper's CIFAR experiments use option A, zero-padding, which has no
    parameters: ResNet-20 is 272,474 parameters here vs 269,722 with option A).
    Names follow torchvision's ResNet: conv1, bn1, layer1.0.conv1, ..., fc.
    """
    name = "resnet_cifar"
    check_int(depth, "depth", name)
    n, rem = divmod(depth - 2, 6)
    if depth < 8 or rem:
        lo, hi = nearest_valid(depth, 8, 6)
        raise ValueError(f"{name}: depth must be 6n+2 with n >= 1 (8, 14, 20, 32, 44, 56, 110, "
                         f"...), got {depth}; nearest valid depths: {lo} and {hi}")
    in_shape = check_in_shape(in_shape, name)
    num_classes = check_num_classes(num_classes, name)
    x = data(in_shape)
    h = Conv2d(16, 3, 1, 1, bias=False, name="conv1")(x)
    h = ReLU(name="relu")(_bn(h, "bn1"))
    for i, planes in enumerate((16, 32, 64)):
        for j in range(n):
            h = basic_block(h, f"layer{i + 1}.{j}", planes, 2 if (j == 0 and i > 0) else 1)
    h = GlobalAvgPool(name="avgpool")(h)
    return graph(x, Linear(num_classes, name="fc")(h), f"resnet{depth}_cifar")
