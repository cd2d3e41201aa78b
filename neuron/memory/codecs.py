"""Fixed-rate lossy codecs for feature maps kept for backward (FreeLunch, seed 002).

A fixed rate means a tensor's compressed size is a function of its element count alone, so
the planner and the simulator know it at plan time. Two codecs, for float32 tensors:

- ``bf16`` (rate 2): the upper 16 bits of each float32, rounded to nearest even. Bound, for
  normal floats: |decoded - x| <= 2^-8 |x| (8 significant bits).
- ``bfp8`` (rate 4 nominal, 32/33 x 4 = 3.88 with the exponents): 8-bit block floating point.
  Blocks of 32 values share one int8 power-of-two exponent E, the smallest with
  max|x| / 2^E <= 127; each value is stored as round(x / 2^E) in int8. Bound, per block:
  |decoded - x| <= 2^(E-1) <= max(max|x| / 127, 2^-129).

The functions are written once against the array module of their input: NumPy arrays on the
CPU, CuPy arrays on the GPU (GPU-unverified). CuPy is never imported for a NumPy input.
"""
from __future__ import annotations

import numpy as np

BLOCK = 32


def _xp(x):
    if isinstance(x, np.ndarray):
        return np
    import cupy                         # only ever for a CuPy input
    return cupy


class Codec:
    name = ""
    rate = 1

    def nbytes(self, num_elements: int) -> int:
        raise NotImplementedError

    def encode(self, x):
        """float32 array -> 1-D uint8 array of ``nbytes(x.size)`` bytes."""
        raise NotImplementedError

    def decode(self, data, out) -> None:
        """Fill the float32 array ``out`` from ``data`` (uint8, as ``encode`` made it)."""
        raise NotImplementedError

    def bound(self, x):
        """Per-element bound on |decode(encode(x)) - x| (the codec's stated guarantee)."""
        raise NotImplementedError


class Bf16(Codec):
    name, rate = "bf16", 2

    def nbytes(self, num_elements: int) -> int:
        return 2 * num_elements

    def encode(self, x):
        xp = _xp(x)
        u = xp.ascontiguousarray(x, dtype=xp.float32).reshape(-1).view(xp.uint32)
        rounded = (u + xp.uint32(0x7FFF) + ((u >> 16) & xp.uint32(1))) >> 16
        return rounded.astype(xp.uint16).view(xp.uint8)

    def decode(self, data, out) -> None:
        xp = _xp(out)
        h = data[:out.size * 2].view(xp.uint16).astype(xp.uint32) << 16
        out.reshape(-1)[...] = h.view(xp.float32)

    def bound(self, x):
        return _xp(x).abs(x) * 2.0 ** -8


class Bfp8(Codec):
    name, rate = "bfp8", 4

    def nbytes(self, num_elements: int) -> int:
        blocks = -(-num_elements // BLOCK)
        return blocks + blocks * BLOCK

    def _blocks(self, x):
        xp = _xp(x)
        flat = xp.ascontiguousarray(x, dtype=xp.float32).reshape(-1)
        pad = (-flat.size) % BLOCK
        if pad:
            flat = xp.concatenate([flat, xp.zeros(pad, xp.float32)])
        return flat.reshape(-1, BLOCK)

    def exponents(self, x):
        xp = _xp(x)
        m = xp.abs(self._blocks(x)).max(axis=1)
        _, e = xp.frexp(m / xp.float32(127))     # m/127 <= 2^e, and > 2^(e-1) when m > 0
        e = xp.where(m > 0, e, -128)            # an all-zero block: the smallest scale
        return xp.clip(e, -128, 127).astype(xp.int8)

    def encode(self, x):
        xp = _xp(x)
        b = self._blocks(x)
        e = self.exponents(x)
        q = xp.rint(xp.ldexp(b, -e.astype(xp.int32)[:, None]))
        q = xp.clip(q, -127, 127).astype(xp.int8)
        return xp.concatenate([e.view(xp.uint8), q.reshape(-1).view(xp.uint8)])

    def decode(self, data, out) -> None:
        xp = _xp(out)
        blocks = -(-out.size // BLOCK)
        e = data[:blocks].view(xp.int8).astype(xp.int32)
        q = data[blocks:blocks + blocks * BLOCK].view(xp.int8).reshape(blocks, BLOCK)
        v = xp.ldexp(q.astype(xp.float32), e[:, None])
        out.reshape(-1)[...] = v.reshape(-1)[:out.size]

    def bound(self, x):
        xp = _xp(x)
        e = self.exponents(x).astype(xp.int32)
        per_block = xp.ldexp(xp.ones(e.shape, xp.float32), e - 1)
        return xp.repeat(per_block, BLOCK)[:x.size].reshape(x.shape)


CODECS = {2: Bf16(), 4: Bfp8()}


def get_codec(rate) -> Codec:
    try:
        return CODECS[int(rate)]
    except (KeyError, ValueError):
        raise ValueError(f"compression rate {rate!r}: choose 2 (bf16) or 4 (8-bit block "
                         "floating point)") from None
