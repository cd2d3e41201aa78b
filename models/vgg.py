"""VGG (Simonyan & Zisserman 2015) with torchvision's layout and state_dict names.

``features.N`` numbers every conv / [BN] / ReLU / max-pool in order, exactly as torchvision's
``nn.Sequential`` does, so parameters are ``features.0.weight``, ``features.0.bias``, ...
The classifier is ``classifier.0`` (FC 4096), ``.1`` ReLU, ``.2`` Dropout, ``.3`` (FC 4096),
``.4`` ReLU, ``.5`` Dropout, ``.6`` (FC classes). vgg16 (configuration D) has 138,357,544
parameters at 224x224 with 1000 classes.

torchvision puts an ``AdaptiveAvgPool2d((7, 7))`` between the two halves; at 224x224 it is the
identity and is left out here. At other input sizes the first FC simply takes whatever
``512*h*w`` the features produce (e.g. 512 at 32x32), so the parameter count changes.
"""
from __future__ import annotations

from ..layers import BatchNorm, Conv2d, Dropout, Linear, MaxPool2d, ReLU
from ._common import BN_EPS, BN_MOMENTUM, check_in_shape, check_num_classes, data, graph

CONFIGS = {
    "A": [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "B": [64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "D": [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
    "E": [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M",
          512, 512, 512, 512, "M"],
}


def vgg(cfg, batch_norm: bool = False, num_classes: int = 1000, in_shape=(3, 224, 224), *,
        dropout: float = 0.5, name: str = "vgg"):
    """A VGG from a torchvision-style configuration list (ints: 3x3 conv widths, "M": pool)."""
    if isinstance(cfg, str):
        if cfg not in CONFIGS:
            raise ValueError(f"{name}: unknown VGG configuration {cfg!r}; valid: {sorted(CONFIGS)}")
        cfg = CONFIGS[cfg]
    in_shape = check_in_shape(in_shape, name)
    num_classes = check_num_classes(num_classes, name)
    x = data(in_shape)
    h, i = x, 0
    for v in cfg:
        if v == "M":
            h = MaxPool2d(2, 2, name=f"features.{i}")(h)
            i += 1
            continue
        h = Conv2d(int(v), 3, padding=1, name=f"features.{i}")(h)
        i += 1
        if batch_norm:
            h = BatchNorm(BN_MOMENTUM, BN_EPS, name=f"features.{i}")(h)
            i += 1
        h = ReLU(name=f"features.{i}")(h)
        i += 1
    h = ReLU(name="classifier.1")(Linear(4096, name="classifier.0")(h))
    h = Dropout(dropout, name="classifier.2")(h)
    h = ReLU(name="classifier.4")(Linear(4096, name="classifier.3")(h))
    h = Dropout(dropout, name="classifier.5")(h)
    logits = Linear(num_classes, name="classifier.6")(h)
    return graph(x, logits, name)


def vgg11(num_classes=1000, in_shape=(3, 224, 224)):
    return vgg("A", False, num_classes, in_shape, name="vgg11")


def vgg13(num_classes=1000, in_shape=(3, 224, 224)):
    return vgg("B", False, num_classes, in_shape, name="vgg13")


def vgg16(num_classes=1000, in_shape=(3, 224, 224)):
    """torchvision's vgg16: configuration D, no BN (138,357,544 parameters)."""
    return vgg("D", False, num_classes, in_shape, name="vgg16")


def vgg19(num_classes=1000, in_shape=(3, 224, 224)):
    return vgg("E", False, num_classes, in_shape, name="vgg19")


def vgg16_bn(num_classes=1000, in_shape=(3, 224, 224)):
    return vgg("D", True, num_classes, in_shape, name="vgg16_bn")
