"""Initializers: each takes (rng, shape) and returns a float64 array (cast by the executor)."""
from __future__ import annotations

import math

import numpy as np


def _fans(shape):
    receptive = math.prod(shape[2:]) if len(shape) > 2 else 1
    fan_in = shape[1] * receptive if len(shape) > 1 else shape[0]
    return fan_in, shape[0] * receptive


def he_normal(rng, shape):
    """Kaiming normal, fan_out, ReLU gain (torchvision's ResNet/DenseNet convolution init)."""
    _, fan_out = _fans(shape)
    return rng.standard_normal(shape) * math.sqrt(2.0 / fan_out)


def xavier_uniform(rng, shape):
    fan_in, fan_out = _fans(shape)
    a = math.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-a, a, shape)


def torch_linear_weight(rng, shape):
    """PyTorch's nn.Linear default: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    a = 1.0 / math.sqrt(shape[1])
    return rng.uniform(-a, a, shape)


def torch_linear_bias(fan_in):
    a = 1.0 / math.sqrt(fan_in)
    return lambda rng, shape: rng.uniform(-a, a, shape)


def zeros(rng, shape):
    return np.zeros(shape)


def ones(rng, shape):
    return np.ones(shape)


def normal(std):
    return lambda rng, shape: rng.standard_normal(shape) * std
