"""Fixed-rate lossy codecs for feature maps kept for backward (FreeLunch, seed 002).

A fixed rate means a tensor's compressed size is a function of its element count alone, so
the planner and the simulator know it at plan time. Two codecs, for float32 tensors:

- ``bf16`` (rate 2): the upper 16 bits of each float32, rounded to nearest even. Bound, for
  normal floats: |decoded - x| <= 2^-8 |x| (8 significant bits).
- ``bfp8`` (rate 4 nominal, 32/33 x 4 = 3.88 with the exponents): 8-bit block floating point.
  Blocks of 32 values share one int8 power-of-two exponent E, the smallest with
  max|x| / 2^E <= 127; each value is stored as round(x / 2^E) in int8. Bound, per block:
  |decoded - x| <= 2^(E-1) <= max(max|x| / 127, 2^-129).

On the CPU they are NumPy array expressions. On the GPU (a CuPy input) they are the fused
kernels of kernels/cuda_codecs.py, bitwise the same, which write straight into the arena
block they are given and take no temporary (GPU-unverified until tests/gpu/test_cuda_codecs.py
has run). CuPy is never imported for a NumPy input.
"""
from __future__ import annotations

import numpy as np

BLOCK = 32


def _xp(x):
    if isinstance(x, np.ndarray):
        return np
    import cupy                         # only ever for a CuPy input
    return cupy


def _gpu():
    from ..kernels import cuda_codecs
    return cuda_codecs


class Codec:
    name = ""
    rate = 1
    unit = 1            # elements encoded together (a slice to encode starts on a multiple)

    def nbytes(self, num_elements: int) -> int:
        raise NotImplementedError

    def pieces(self, lo: int, hi: int, total: int) -> list[tuple[int, int, int]]:
        """Where the encoding of elements [lo, hi) of ``total`` (``encode_into`` of that
        slice, lo a multiple of ``unit``) lies in the encoding of all of them: (offset in the
        slice's encoding, offset in the whole's, bytes) per contiguous piece. Bitwise the same
        bytes, so a tensor may be encoded slice by slice (memory/compressed_swap.py)."""
        raise NotImplementedError

    def encode(self, x):
        """float32 array -> a new 1-D uint8 array of ``nbytes(x.size)`` bytes."""
        out = _xp(x).empty(self.nbytes(x.size), np.uint8)
        self.encode_into(x, out)
        return out

    def encode_into(self, x, out) -> None:
        """Write the encoding of x into ``out`` (uint8, at least ``nbytes(x.size)`` bytes: the
        pool's staging block in the arena)."""
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

    def pieces(self, lo, hi, total):
        return [(0, 2 * lo, 2 * (hi - lo))]

    def encode_into(self, x, out) -> None:
        if not isinstance(x, np.ndarray):
            return _gpu().bf16_encode(x, out)
        u = np.ascontiguousarray(x, dtype=np.float32).reshape(-1).view(np.uint32)
        rounded = (u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16
        out[:2 * u.size].view(np.uint16)[...] = rounded

    def decode(self, data, out) -> None:
        if not isinstance(out, np.ndarray):
            return _gpu().bf16_decode(data, out)
        h = data[:out.size * 2].view(np.uint16).astype(np.uint32) << 16
        out.reshape(-1)[...] = h.view(np.float32)

    def bound(self, x):
        return _xp(x).abs(x) * 2.0 ** -8


class Bfp8(Codec):
    name, rate, unit = "bfp8", 4, BLOCK

    def nbytes(self, num_elements: int) -> int:
        blocks = -(-num_elements // BLOCK)
        return blocks + blocks * BLOCK

    def pieces(self, lo, hi, total):
        # the exponents of all blocks, then their values: two pieces
        first, blocks, every = lo // BLOCK, -(-(hi - lo) // BLOCK), -(-total // BLOCK)
        return [(0, first, blocks), (blocks, every + first * BLOCK, blocks * BLOCK)]

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

    def encode_into(self, x, out) -> None:
        blocks = -(-x.size // BLOCK)
        if not isinstance(x, np.ndarray):
            return _gpu().bfp8_encode(x, out, blocks)
        e = self.exponents(x)
        q = np.rint(np.ldexp(self._blocks(x), -e.astype(np.int32)[:, None]))
        out[:blocks] = e.view(np.uint8)
        out[blocks:blocks + blocks * BLOCK] = np.clip(q, -127, 127).astype(np.int8) \
            .reshape(-1).view(np.uint8)

    def decode(self, data, out) -> None:
        blocks = -(-out.size // BLOCK)
        if not isinstance(out, np.ndarray):
            return _gpu().bfp8_decode(data, out, blocks)
        e = data[:blocks].view(np.int8).astype(np.int32)
        q = data[blocks:blocks + blocks * BLOCK].view(np.int8).reshape(blocks, BLOCK)
        v = np.ldexp(q.astype(np.float32), e[:, None])
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
