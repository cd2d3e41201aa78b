"""Shared helpers for the model zoo: argument checks and small building blocks."""
from __future__ import annotations

from ..graph import Graph, Tensor
from ..layers import BatchNorm, Conv2d, ReLU, input_tensor

#: BatchNorm defaults used by every model unless it says otherwise (PyTorch's defaults)
BN_MOMENTUM = 0.1
BN_EPS = 1e-5


def check_in_shape(in_shape, model: str) -> tuple[int, int, int]:
    try:
        shape = tuple(int(s) for s in in_shape)
    except TypeError:
        raise ValueError(f"{model}: in_shape must be a (C, H, W) tuple, got {in_shape!r}") from None
    if len(shape) != 3 or any(s <= 0 for s in shape) or any(
            isinstance(s, bool) or int(s) != s for s in in_shape):
        raise ValueError(f"{model}: in_shape must be three positive ints (C, H, W), "
                         f"got {in_shape!r}")
    return shape


def check_num_classes(num_classes, model: str) -> int:
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes <= 0:
        raise ValueError(f"{model}: num_classes must be a positive int, got {num_classes!r}")
    return num_classes


def check_int(value, what: str, model: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{model}: {what} must be an int >= {minimum}, got {value!r}")
    return value


def nearest_valid(depth: int, first: int, step: int) -> tuple[int, int]:
    """The two valid depths nearest ``depth`` in the family first, first+step, first+2*step, ...

    Below the family: its two smallest members; otherwise the members just below and above.
    """
    if depth < first:
        return first, first + step
    k = (depth - first) // step
    return first + k * step, first + (k + 1) * step


def data(in_shape) -> Tensor:
    return input_tensor(in_shape, name="data")


def conv_bn(x: Tensor, prefix: str, out: int, kernel, stride=1, padding=0, *,
            relu: bool = True, eps: float = BN_EPS, conv: str = "conv", bn: str = "bn",
            act: str = "relu") -> Tensor:
    """Conv(bias=False) -> BN -> [ReLU], named ``{prefix}.conv`` / ``.bn`` / ``.relu``."""
    y = Conv2d(out, kernel, stride, padding, bias=False, name=f"{prefix}.{conv}")(x)
    y = BatchNorm(BN_MOMENTUM, eps, name=f"{prefix}.{bn}")(y)
    return ReLU(name=f"{prefix}.{act}")(y) if relu else y


def graph(x: Tensor, logits: Tensor, name: str) -> Graph:
    return Graph(x, logits, name=name)
