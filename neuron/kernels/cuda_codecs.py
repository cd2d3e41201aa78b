"""The FreeLunch codecs (memory/codecs.py) as fused CUDA kernels: each reads its input once and
writes its output once, straight into the arena block the pool gave it, with no CuPy
temporary. A compressed offload runs when memory is tightest, so a codec that took
full-size temporaries (as the array-expression form does) would need the bytes it is meant to
save. Bitwise the same results as the NumPy forms (tests/gpu/test_cuda_codecs.py).

The kernels run on the current stream: CudaDevice.encode/decode make it the codec stream.
Compiled on first use (functools.cache).
"""
from __future__ import annotations

import functools

import numpy as np

BLOCK = 32                      # = memory.codecs.BLOCK: one warp per block of values
_THREADS = 256

BFP8_SOURCE = r"""
extern "C" __global__ void neuron_bfp8_encode(const float* x, unsigned char* out,
                                              long long n, long long blocks) {
    // one warp per block of 32 values: the block's max |x| by shuffles, lane 0 writes the
    // shared exponent, every lane its int8 value (pad values past n are 0, as in NumPy)
    long long gid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long b = gid >> 5;
    if (b >= blocks) return;            // blockDim is a multiple of 32: whole warps leave
    int lane = threadIdx.x & 31;
    long long i = b * 32 + lane;
    float v = i < n ? x[i] : 0.0f;
    float m = fabsf(v);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    int e;
    frexpf(m / 127.0f, &e);             // m/127 <= 2^e
    if (!(m > 0.0f)) e = -128;          // an all-zero block: the smallest scale
    e = max(-128, min(127, e));
    if (lane == 0) out[b] = (unsigned char)(signed char)e;
    float q = rintf(ldexpf(v, -e));
    q = fminf(fmaxf(q, -127.0f), 127.0f);
    out[blocks + i] = (unsigned char)(signed char)(int)q;
}

extern "C" __global__ void neuron_bfp8_decode(const unsigned char* data, float* out,
                                              long long n, long long blocks) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int e = (int)(signed char)data[i >> 5];
    out[i] = ldexpf((float)(signed char)data[blocks + i], e);
}
"""


def _cp():
    import cupy
    return cupy


# bf16: round to nearest even on the upper 16 bits, wrapping as NumPy's uint32 arithmetic does
BF16_ENCODE = "h = (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16)"
BF16_DECODE = "u = ((unsigned int)h) << 16"


@functools.cache
def _bf16():
    cp = _cp()
    return (cp.ElementwiseKernel("uint32 u", "uint16 h", BF16_ENCODE, "neuron_bf16_encode"),
            cp.ElementwiseKernel("uint16 h", "uint32 u", BF16_DECODE, "neuron_bf16_decode"))


@functools.cache
def _bfp8():
    mod = _cp().RawModule(code=BFP8_SOURCE)
    return mod.get_function("neuron_bfp8_encode"), mod.get_function("neuron_bfp8_decode")


def _flat(a, dtype):
    if not a.flags.c_contiguous:
        raise ValueError(f"codec arrays must be C-contiguous (shape {a.shape}, strides "
                         f"{a.strides})")
    return a.reshape(-1).view(dtype)


def bf16_encode(x, out) -> None:
    """float32 x -> out (uint8, 2 bytes per value)."""
    if x.size:
        _bf16()[0](_flat(x, np.uint32), _flat(out, np.uint8)[:2 * x.size].view(np.uint16))


def bf16_decode(data, out) -> None:
    if out.size:
        _bf16()[1](_flat(data, np.uint8)[:2 * out.size].view(np.uint16), _flat(out, np.uint32))


def bfp8_encode(x, out, blocks: int) -> None:
    """float32 x -> out (uint8): ``blocks`` exponents, then blocks * 32 int8 values."""
    if blocks:
        _bfp8()[0]((-(-blocks * BLOCK // _THREADS),), (_THREADS,),
                   (_flat(x, np.float32), _flat(out, np.uint8), np.int64(x.size),
                    np.int64(blocks)))


def bfp8_decode(data, out, blocks: int) -> None:
    if out.size:
        _bfp8()[1]((-(-out.size // _THREADS),), (_THREADS,),
                   (_flat(data, np.uint8), _flat(out, np.float32), np.int64(out.size),
                    np.int64(blocks)))
