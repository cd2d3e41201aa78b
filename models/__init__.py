"""The model zoo: the networks of the SuperNeurons evaluation and their torchvision relatives.

    from neuron.models import build_model, model_names
    net = build_model("resnet50")                        # ImageNet, (3, 224, 224), 1000 classes
    net = build_model("resnet", depth=1919)              # SuperNeurons Table 4 (n3 = 595)
    net = build_model("resnet_cifar", depth=56)          # CIFAR, (3, 32, 32), 10 classes
    net = build_model("densenet121", num_classes=10, in_shape=(3, 64, 64))

Every builder returns a :class:`neuron.Graph` whose input layer is named ``"data"`` and whose
output is the logits (num_classes,); the executor attaches the softmax loss. Parameter names
follow torchvision's state_dict (timm's for Inception-v4) where a counterpart exists.

``depth`` is only for the families parameterized by it: ``resnet`` (Table 4, required),
``resnet_cifar`` (6n+2, required) and ``densenet_cifar`` (6n+4, default 100).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..graph import Graph
from .alexnet import alexnet
from .densenet import (densenet, densenet121, densenet161, densenet169, densenet201, densenet264,
                       densenet_cifar)
from .inception_v4 import inception_v4
from .resnet import (resnet, resnet18, resnet34, resnet50, resnet101, resnet152, resnet_basic,
                     resnet_bottleneck, resnet_cifar, table4_blocks)
from .vgg import vgg, vgg11, vgg13, vgg16, vgg16_bn, vgg19

IMAGENET = (3, 224, 224)
CIFAR = (3, 32, 32)

#: ``ModelSpec.depth`` values: a model with no depth argument / one that must be given one
NO_DEPTH = None
REQUIRED = "required"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    builder: Callable[..., Graph]       # builder([depth,] num_classes=..., in_shape=...)
    in_shape: tuple[int, int, int]      # default per-sample input shape
    num_classes: int                    # default number of classes
    depth: object = NO_DEPTH            # NO_DEPTH, REQUIRED, or the default depth (an int)
    description: str = ""


MODELS: dict[str, ModelSpec] = {}


def register(spec: ModelSpec) -> ModelSpec:
    if spec.name in MODELS:
        raise ValueError(f"model {spec.name!r} is already registered")
    MODELS[spec.name] = spec
    return spec


for _spec in [
    ModelSpec("alexnet", alexnet, (3, 227, 227), 1000,
              description="SuperNeurons AlexNet (LRN, single tower), 227x227 as the paper"),
    ModelSpec("vgg11", vgg11, IMAGENET, 1000, description="VGG-11 (config A), torchvision names"),
    ModelSpec("vgg13", vgg13, IMAGENET, 1000, description="VGG-13 (config B), torchvision names"),
    ModelSpec("vgg16", vgg16, IMAGENET, 1000, description="VGG-16 (config D), torchvision names"),
    ModelSpec("vgg16_bn", vgg16_bn, IMAGENET, 1000, description="VGG-16 with BN, torchvision names"),
    ModelSpec("vgg19", vgg19, IMAGENET, 1000, description="VGG-19 (config E), torchvision names"),
    ModelSpec("resnet18", resnet18, IMAGENET, 1000, description="basic-block ResNet [2,2,2,2]"),
    ModelSpec("resnet34", resnet34, IMAGENET, 1000, description="basic-block ResNet [3,4,6,3]"),
    ModelSpec("resnet50", resnet50, IMAGENET, 1000, description="bottleneck ResNet [3,4,6,3]"),
    ModelSpec("resnet101", resnet101, IMAGENET, 1000, description="bottleneck ResNet [3,4,23,3]"),
    ModelSpec("resnet152", resnet152, IMAGENET, 1000, description="bottleneck ResNet [3,8,36,3]"),
    ModelSpec("resnet", resnet, IMAGENET, 1000, REQUIRED,
              description="SuperNeurons Table 4 ResNet: bottleneck (6,32,n3,6), "
                          "depth = 3*(44+n3)+2 (137, 140, ..., 1919, ...)"),
    ModelSpec("resnet_cifar", resnet_cifar, CIFAR, 10, REQUIRED,
              description="He et al. CIFAR ResNet, depth = 6n+2, option-B shortcuts"),
    ModelSpec("densenet121", densenet121, IMAGENET, 1000, description="DenseNet-BC (6,12,24,16)"),
    ModelSpec("densenet161", densenet161, IMAGENET, 1000,
              description="DenseNet-BC (6,12,36,24), growth 48"),
    ModelSpec("densenet169", densenet169, IMAGENET, 1000, description="DenseNet-BC (6,12,32,32)"),
    ModelSpec("densenet201", densenet201, IMAGENET, 1000, description="DenseNet-BC (6,12,48,32)"),
    ModelSpec("densenet264", densenet264, IMAGENET, 1000, description="DenseNet-BC (6,12,64,48)"),
    ModelSpec("densenet_cifar", densenet_cifar, CIFAR, 10, 100,
              description="CIFAR DenseNet-BC, growth 12, depth = 6n+4 (default 100)"),
    ModelSpec("inception_v4", inception_v4, (3, 299, 299), 1000,
              description="Inception-v4, timm names"),
]:
    register(_spec)
del _spec


def model_names() -> list[str]:
    """The registered model names, sorted."""
    return sorted(MODELS)


def build_model(name: str, *, depth: int | None = None, num_classes: int | None = None,
                in_shape: tuple | None = None) -> Graph:
    """Build the registered model ``name`` (see :func:`model_names`).

    ``num_classes`` and ``in_shape`` default to the model's (1000 and (3, 224, 224) for ImageNet
    models, (3, 227, 227) for alexnet, (3, 299, 299) for inception_v4, 10 and (3, 32, 32) for the
    CIFAR ones). ``depth`` must be given exactly for the models that take one (ValueError
    otherwise), and an invalid depth is a ValueError naming the nearest valid ones.
    """
    spec = MODELS.get(name) if isinstance(name, str) else None
    if spec is None:
        raise ValueError(f"unknown model {name!r}; valid names: {', '.join(model_names())}")
    kwargs = {"num_classes": spec.num_classes if num_classes is None else num_classes,
              "in_shape": spec.in_shape if in_shape is None else tuple(in_shape)}
    if spec.depth is NO_DEPTH:
        if depth is not None:
            takes = [n for n in model_names() if MODELS[n].depth is not NO_DEPTH]
            raise ValueError(f"model {name!r} takes no depth (got depth={depth!r}); the models "
                             f"with a depth are: {', '.join(takes)}")
        return spec.builder(**kwargs)
    if depth is None:
        if spec.depth == REQUIRED:
            raise ValueError(f"model {name!r} needs a depth ({spec.description})")
        depth = spec.depth
    return spec.builder(depth, **kwargs)


__all__ = ["MODELS", "ModelSpec", "alexnet", "build_model", "densenet", "densenet121",
           "densenet161", "densenet169", "densenet201", "densenet264", "densenet_cifar",
           "inception_v4", "model_names", "register", "resnet", "resnet101", "resnet152",
           "resnet18", "resnet34", "resnet50", "resnet_basic", "resnet_bottleneck",
           "resnet_cifar", "table4_blocks", "vgg", "vgg11", "vgg13", "vgg16", "vgg16_bn", "vgg19"]
