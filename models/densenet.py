"""DenseNet-BC (Huang et al. 2017) with torchvision's structure and state_dict names.

``features.conv0`` (7x7/2) ``features.norm0`` ``features.relu0`` ``features.pool0`` (3x3/2 max),
then per block ``features.denseblock{i}.denselayer{j}.{norm1,relu1,conv1,norm2,relu2,conv2}``
and between blocks ``features.transition{i}.{norm,relu,conv,pool}``, finally
``features.norm5``, ReLU, global average pool and ``classifier``.

Each dense layer is BN-ReLU-Conv1x1(bn_size*growth)-BN-ReLU-Conv3x3(growth), and its input is
the channel concatenation of *every* earlier feature map of its block (the "full join"): like
torchvision's ``torch.cat(prev_features, 1)``, every dense layer j > 1 has its own Concat
layer ``...denselayer{j}.concat`` over the block input and the outputs of layers 1..j-1, and
the block output is one more Concat (``features.denseblock{i}.concat``). Convolutions have no
bias; transitions compress channels to ``floor(compression * C)`` and average-pool 2x2/2.

Parameter counts with 1000 classes (torchvision): densenet121 7,978,856; densenet161
28,681,000; densenet169 14,149,480; densenet201 20,013,928. densenet264 (6, 12, 64, 48), the
paper's largest ImageNet model, has no torchvision counterpart.
"""
from __future__ import annotations

import math

from ..layers import AvgPool2d, BatchNorm, Concat, Conv2d, GlobalAvgPool, Linear, MaxPool2d, ReLU
from ._common import (BN_EPS, BN_MOMENTUM, check_in_shape, check_int, check_num_classes, data,
                      graph, nearest_valid)


def _bn(x, name):
    return BatchNorm(BN_MOMENTUM, BN_EPS, name=name)(x)


def dense_layer(features: list, prefix: str, growth_rate: int, bn_size: int):
    """One BN-ReLU-Conv1x1-BN-ReLU-Conv3x3 layer fed by the concat of ``features``."""
    x = features[0] if len(features) == 1 else Concat(name=f"{prefix}.concat")(features)
    h = ReLU(name=f"{prefix}.relu1")(_bn(x, f"{prefix}.norm1"))
    h = Conv2d(bn_size * growth_rate, 1, bias=False, name=f"{prefix}.conv1")(h)
    h = ReLU(name=f"{prefix}.relu2")(_bn(h, f"{prefix}.norm2"))
    return Conv2d(growth_rate, 3, 1, 1, bias=False, name=f"{prefix}.conv2")(h)


def dense_block(x, prefix: str, num_layers: int, growth_rate: int, bn_size: int):
    features = [x]
    for j in range(num_layers):
        features.append(dense_layer(features, f"{prefix}.denselayer{j + 1}", growth_rate,
                                    bn_size))
    return Concat(name=f"{prefix}.concat")(features)


def transition(x, prefix: str, out: int):
    h = ReLU(name=f"{prefix}.relu")(_bn(x, f"{prefix}.norm"))
    h = Conv2d(out, 1, bias=False, name=f"{prefix}.conv")(h)
    return AvgPool2d(2, 2, name=f"{prefix}.pool")(h)


def densenet(block_config, growth_rate: int = 32, num_init_features: int = 64,
             bn_size: int = 4, compression: float = 0.5, in_shape=(3, 224, 224),
             num_classes: int = 1000, *, stem: str = "imagenet", name: str = "densenet"):
    """A DenseNet-BC. ``stem="imagenet"``: conv0 7x7/2 + norm0 + relu0 + pool0 3x3/2 max
    (torchvision); ``stem="cifar"``: a single 3x3/1 conv0 (Huang et al.'s CIFAR networks), no
    pooling; the first dense layer's BN-ReLU follows it."""
    in_shape = check_in_shape(in_shape, name)
    num_classes = check_num_classes(num_classes, name)
    try:
        block_config = [check_int(n, "every block size", name) for n in block_config]
    except TypeError:
        raise ValueError(f"{name}: block_config must be a list of ints, got {block_config!r}") \
            from None
    if not block_config:
        raise ValueError(f"{name}: block_config is empty")
    growth_rate = check_int(growth_rate, "growth_rate", name)
    num_init_features = check_int(num_init_features, "num_init_features", name)
    bn_size = check_int(bn_size, "bn_size", name)
    if not 0.0 < compression <= 1.0:
        raise ValueError(f"{name}: compression must be in (0, 1], got {compression}")
    x = data(in_shape)
    if stem == "imagenet":
        h = Conv2d(num_init_features, 7, 2, 3, bias=False, name="features.conv0")(x)
        h = ReLU(name="features.relu0")(_bn(h, "features.norm0"))
        h = MaxPool2d(3, 2, 1, name="features.pool0")(h)
    elif stem == "cifar":
        h = Conv2d(num_init_features, 3, 1, 1, bias=False, name="features.conv0")(x)
    else:
        raise ValueError(f"{name}: stem must be 'imagenet' or 'cifar', got {stem!r}")
    for i, n in enumerate(block_config):
        h = dense_block(h, f"features.denseblock{i + 1}", n, growth_rate, bn_size)
        if i != len(block_config) - 1:
            h = transition(h, f"features.transition{i + 1}",
                           max(1, int(math.floor(h.shape[0] * compression))))
    h = ReLU(name="features.relu5")(_bn(h, "features.norm5"))
    h = GlobalAvgPool(name="avgpool")(h)
    return graph(x, Linear(num_classes, name="classifier")(h), name)


def densenet121(num_classes=1000, in_shape=(3, 224, 224)):
    return densenet((6, 12, 24, 16), 32, 64, in_shape=in_shape, num_classes=num_classes,
                    name="densenet121")


def densenet161(num_classes=1000, in_shape=(3, 224, 224)):
    return densenet((6, 12, 36, 24), 48, 96, in_shape=in_shape, num_classes=num_classes,
                    name="densenet161")


def densenet169(num_classes=1000, in_shape=(3, 224, 224)):
    return densenet((6, 12, 32, 32), 32, 64, in_shape=in_shape, num_classes=num_classes,
                    name="densenet169")


def densenet201(num_classes=1000, in_shape=(3, 224, 224)):
    return densenet((6, 12, 48, 32), 32, 64, in_shape=in_shape, num_classes=num_classes,
                    name="densenet201")


def densenet264(num_classes=1000, in_shape=(3, 224, 224)):
    return densenet((6, 12, 64, 48), 32, 64, in_shape=in_shape, num_classes=num_classes,
                    name="densenet264")


def densenet_cifar(depth: int = 100, num_classes: int = 10, in_shape=(3, 32, 32), *,
                   growth_rate: int = 12):
    """Huang et al.'s CIFAR DenseNet-BC: three blocks of (depth-4)/6 dense layers, growth 12,
    2*growth initial features from a 3x3 conv, compression 0.5. depth = 6n+4 (40, 100, 190,
    250, ...); DenseNet-BC-100 (k=12) has 769,162 parameters with 10 classes."""
    name = "densenet_cifar"
    check_int(depth, "depth", name)
    n, rem = divmod(depth - 4, 6)
    if depth < 10 or rem:
        lo, hi = nearest_valid(depth, 10, 6)
        raise ValueError(f"{name}: depth must be 6n+4 with n >= 1 (10, 16, ..., 40, ..., 100, "
                         f"...), got {depth}; nearest valid depths: {lo} and {hi}")
    return densenet((n, n, n), growth_rate, 2 * growth_rate, in_shape=in_shape,
                    num_classes=num_classes, stem="cifar", name=f"densenet{depth}_cifar")
