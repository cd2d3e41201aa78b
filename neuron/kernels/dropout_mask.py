"""The dropout mask as a stateless counter hash of (seed, element index), in NumPy.

The GPU's dropout kernel (neuron.kernels.cuda) draws exactly this mask; the NumPy version serves
tests, moving a run between devices, and CPU references that must drop the same units as the GPU.
Pure NumPy: importable without CuPy.
"""
from __future__ import annotations

import numpy as np

_GOLDEN = 0x9E3779B97F4A7C15
_M64 = (1 << 64) - 1


def _splitmix_finalize(z: int) -> int:
    z &= _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _seed_key(seed: int) -> int:
    return _splitmix_finalize(int(seed) & _M64)


def dropout_mask_reference(shape, p, seed) -> np.ndarray:
    """The exact mask dropout_forward draws on the GPU, computed with NumPy (for tests and for
    moving a run between devices): element i (C order) is kept iff
    u_i < float32(1 - p), u_i = top 24 bits of splitmix64(splitmix64(seed) + (i+1)*golden) / 2^24.

    It is deliberately not NumPy's generator: a stateless hash of (seed, index) needs no
    generator state on the device and gives the same mask for any launch configuration."""
    n = int(np.prod(shape, dtype=np.int64))
    if p >= 1.0:
        return np.zeros(shape, np.uint8)
    if p <= 0.0:
        return np.ones(shape, np.uint8)
    with np.errstate(over="ignore"):
        i = np.arange(1, n + 1, dtype=np.uint64)
        z = np.uint64(_seed_key(seed)) + i * np.uint64(_GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    u = (z >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / (1 << 24))
    return (u < np.float32(1.0 - p)).astype(np.uint8).reshape(shape)
