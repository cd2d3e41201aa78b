"""The GPU path's elementwise kernels for 2-byte feature maps (bf16, fp16 mixed precision).

Every low-precision array reaches these kernels as its 16 raw bits (a ``uint16`` view) and is
converted in registers by the functions of ``LOW_PREAMBLE``: bfloat16 and IEEE half to float32
and back, round to nearest even, NaN kept a NaN, overflow to infinity, half subnormals exact.
The conversions are written out in integer arithmetic instead of taken from cuda_bf16.h /
cuda_fp16.h, so the kernels need no CUDA toolkit header at run time (NVRTC on the GPU machine
compiles them with CuPy's headers alone), CuPy's own bfloat16 support is not relied on beyond
holding the arrays, and the CPU stand-ins compile the very same source with g++.

Arithmetic is float32 and each result is rounded to the low type once, where it is stored: what
cuDNN does with a float compute type, and what neuron/precision/mixed_cpu.py (the CPU reference) does.
Compiled on first use, one kernel per low type (functools.cache); neuron.kernels.cuda calls them.
"""
from __future__ import annotations

import functools

import numpy as np

#: the low types by dtype name (NumPy's / ml_dtypes' names) -> the suffix of their kernels
LOW_NAMES = {"bfloat16": "bf16", "float16": "fp16"}

LOW_PREAMBLE = r"""
#ifdef __CUDACC__
__device__ inline unsigned int nr_fbits(float f) { return __float_as_uint(f); }
__device__ inline float nr_bitsf(unsigned int u) { return __uint_as_float(u); }
#else
#include <cstring>
inline unsigned int nr_fbits(float f) { unsigned int u; std::memcpy(&u, &f, 4); return u; }
inline float nr_bitsf(unsigned int u) { float f; std::memcpy(&f, &u, 4); return f; }
#endif
__device__ inline float nr_bf16_ld(unsigned short h) { return nr_bitsf(((unsigned int)h) << 16); }
__device__ inline unsigned short nr_bf16_st(float f) {
    unsigned int u = nr_fbits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);  // NaN
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
__device__ inline float nr_fp16_ld(unsigned short h) {
    unsigned int sign = ((unsigned int)h & 0x8000u) << 16;
    unsigned int e = ((unsigned int)h >> 10) & 0x1fu, m = (unsigned int)h & 0x3ffu;
    if (e == 0x1fu) return nr_bitsf(sign | 0x7f800000u | (m << 13));       // inf, NaN
    if (e == 0u) {                                                          // zero, subnormal
        float v = (float)m * 5.9604644775390625e-08f;                       // m * 2^-24, exact
        return sign ? -v : v;
    }
    return nr_bitsf(sign | ((e + 112u) << 23) | (m << 13));
}
__device__ inline unsigned short nr_fp16_st(float f) {
    unsigned int x = nr_fbits(f);
    unsigned int sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (unsigned short)(sign | 0x7e00u);           // NaN
    if (ax >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);          // >= 65520: inf
    if (ax < 0x38800000u) {                                                  // below 2^-14
        if (ax < 0x33000000u) return (unsigned short)sign;                   // below 2^-25: 0
        unsigned int e = ax >> 23, mant = (ax & 0x7fffffu) | 0x800000u;
        unsigned int s = 126u - e, q = mant >> s, rem = mant & ((1u << s) - 1u);
        unsigned int half = 1u << (s - 1u);
        if (rem > half || (rem == half && (q & 1u))) ++q;
        return (unsigned short)(sign | q);
    }
    unsigned int r = ax - 0x38000000u;                                       // rebias 127 -> 15
    return (unsigned short)(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
}
"""


def low_name(dtype) -> str | None:
    """"bf16" / "fp16" for a 2-byte floating dtype (ml_dtypes' bfloat16, float16), else None."""
    return LOW_NAMES.get(np.dtype(dtype).name)


def is_low(a) -> bool:
    return a is not None and low_name(a.dtype) is not None


def bits(a):
    """A low-precision array's raw bits (its uint16 view), what the kernels here take."""
    return a.view(np.uint16)


def _cp():
    import cupy
    return cupy


def _kernel(in_params, out_params, body, name, low):
    """An ElementwiseKernel over ``low``'s bits: LD(h) reads one as float, ST(f) rounds one."""
    defs = f"#define LD nr_{low}_ld\n#define ST nr_{low}_st\n"
    return _cp().ElementwiseKernel(in_params, out_params, body, f"neuron_{name}_{low}",
                                   preamble=LOW_PREAMBLE + defs)


@functools.cache
def _k_cast(low: str):
    """(to low, to float32, a float32 value (``acc``: plus y) rounded through low into
    float32 y: a float32 master's gradient of a low-type weight, summed over chunks, rounded
    after each as the CPU reference rounds it)."""
    return (_kernel("float32 x", "uint16 y", "y = ST(x)", "to_low", low),
            _kernel("uint16 x", "float32 y", "y = LD(x)", "to_f32", low),
            _kernel("float32 x, int32 acc", "float32 y", "y = LD(ST(acc ? y + x : x))",
                    "round_into", low))


@functools.cache
def _k_arith(low: str):
    """(a + b, y += x, x * scale, dropout's x * mask * scale)."""
    return (_kernel("uint16 a, uint16 b", "uint16 y", "y = ST(LD(a) + LD(b))", "add", low),
            _kernel("uint16 x", "uint16 y", "y = ST(LD(y) + LD(x))", "acc", low),
            _kernel("uint16 x, float32 s", "uint16 y", "y = ST(LD(x) * s)", "scale", low),
            _kernel("uint16 x, uint8 m, float32 s", "uint16 y",
                    "y = ST((LD(x) * (float)m) * s)", "dropout_apply", low))


@functools.cache
def _k_rows(low: str):
    """Kernels that read rows of a raw array: (global average pool over H*W, its backward, a
    linear layer's bias added to its float32 product, a linear bias gradient's column sums)."""
    return (
        _kernel("raw uint16 x, int64 hw", "uint16 y", r"""
            float s = 0.0f;
            const long long base = i * hw;
            for (long long j = 0; j < hw; ++j) s += LD(x[base + j]);
            y = ST(s / (float)hw)""", "mean_hw", low),
        _kernel("raw uint16 dy, int64 hw, float32 inv", "uint16 dx",
                "dx = ST(LD(dy[i / hw]) * inv)", "spread_hw", low),
        _kernel("float32 t, raw uint16 b, int64 n", "uint16 y", "y = ST(t + LD(b[i % n]))",
                "bias_rows", low),
        _kernel("raw uint16 dy, int64 rows, int64 cols, int32 acc", "float32 db", r"""
            float s = 0.0f;
            for (long long r = 0; r < rows; ++r) s += LD(dy[r * cols + i]);
            db = LD(ST(acc ? db + s : s))""", "col_sums", low))


@functools.cache
def _k_nonfinite(low: str):
    """flag |= any(x is inf or NaN): the exponent bits all ones."""
    mask = "0x7f80u" if low == "bf16" else "0x7c00u"
    return _kernel("uint16 x", "raw bool flag",
                   f"if ((((unsigned int)x) & {mask}) == {mask}) flag[0] = true",
                   "nonfinite", low)


@functools.cache
def _k_xent_grad(low: str):
    """The cross entropy's logit gradient from float32 probabilities, times ``scale`` (1/N, and
    fp16's loss scale) in float32, rounded to the low type once; ``acc`` adds it instead."""
    return _kernel("float32 p, raw int64 labels, int64 K, float32 scale, int32 acc",
                   "uint16 d", r"""
            const long long row = i / K, col = i % K;
            const float g = (col == labels[row] ? p - 1.0f : p) * scale;
            d = acc ? ST(LD(d) + g) : ST(g)""", "xent_grad", low)


@functools.cache
def _k_unscale():
    """fp16's unscale of a float32 parameter gradient: g *= inv_scale; a gradient that is inf
    or NaN sets ``overflow`` (read once per step) and the step guard's ``flag``."""
    return _cp().ElementwiseKernel(
        "float32 inv_scale", "float32 g, raw bool flag, raw bool overflow", r"""
        if (!isfinite(g)) { flag[0] = true; overflow[0] = true; }
        g = g * inv_scale""", "neuron_unscale_f32")


def factories():
    """Every kernel factory with the arguments it is built for (the NVRTC compile check)."""
    out = []
    for low in LOW_NAMES.values():
        out += [(_k_cast, (low,)), (_k_arith, (low,)), (_k_rows, (low,)),
                (_k_nonfinite, (low,)), (_k_xent_grad, (low,))]
    return out + [(_k_unscale, ())]


KERNEL_CACHES = (_k_cast, _k_arith, _k_rows, _k_nonfinite, _k_xent_grad, _k_unscale)


# ---- the operations neuron.kernels.cuda dispatches to for low-precision arrays -------------

def _kernels(a, factory):
    return factory(low_name(a.dtype))


def cast(dst, src) -> None:
    """dst <- src where one or both is low precision (float32 <-> low, or low -> low)."""
    if is_low(dst) and is_low(src):
        if dst.dtype == src.dtype:
            bits(dst)[...] = bits(src)
            return
        tmp = _cp().empty(src.shape, np.float32)
        cast(tmp, src)
        cast(dst, tmp)
    elif is_low(dst):
        _kernels(dst, _k_cast)[0](_f32(src), bits(dst))
    else:
        if dst.dtype != np.float32:
            raise TypeError(f"low-precision cast into {dst.dtype}: float32 or a low type only")
        _kernels(src, _k_cast)[1](bits(src), dst)


def _f32(a):
    if a.dtype == np.float32:
        return a
    raise TypeError(f"a low-precision array is cast from float32 or a low type, not {a.dtype}")


def to_f32(src):
    """A float32 copy of a low-precision array (a temporary from the arena)."""
    out = _cp().empty(src.shape, np.float32)
    cast(out, src)
    return out


def round_into(dst, src, low, accumulate=False) -> None:
    """dst (float32) <- src (float32; ``accumulate``: dst + src) rounded through ``low``."""
    _k_cast(low_name(low))[2](src, np.int32(bool(accumulate)), dst)


def add(a, b, out) -> None:
    _kernels(out, _k_arith)[0](bits(a), bits(b), bits(out))


def accumulate(dst, src) -> None:
    """dst += src (both low)."""
    _kernels(dst, _k_arith)[1](bits(src), bits(dst))


def scale(src, s, out) -> None:
    _kernels(out, _k_arith)[2](bits(src), np.float32(s), bits(out))


def dropout_apply(x, mask, s, y) -> None:
    _kernels(y, _k_arith)[3](bits(x), mask, np.float32(s), bits(y))


def fill(a, value) -> None:
    """Every element of a low-precision array set to ``value`` (rounded to its type)."""
    bits(a).fill(int(np.array(value, a.dtype).view(np.uint16)))


def mean_hw(x, y) -> None:
    """y[n, c] = mean of x[n, c, :, :] (x C-contiguous NCHW)."""
    hw = int(x.shape[2]) * int(x.shape[3])
    _kernels(y, _k_rows)[0](bits(x), np.int64(hw), bits(y).reshape(-1))


def spread_hw(dy, dx) -> None:
    """dx[n, c, h, w] = dy[n, c] / (H * W)."""
    hw = int(dx.shape[2]) * int(dx.shape[3])
    _kernels(dx, _k_rows)[1](bits(dy), np.int64(hw), np.float32(1.0 / hw), bits(dx).reshape(-1))


def bias_rows(t, b, y) -> None:
    """y = t (float32 rows) + b (per column), rounded once to y's low type."""
    _kernels(y, _k_rows)[2](t, bits(b), np.int64(b.size), bits(y))


def col_sums(dy, db, accumulate=False) -> None:
    """db (float32) = the column sums of dy (low, rows x cols), rounded through the low type
    (the gradient of a low-precision bias: neuron/precision/mixed_cpu.py); ``accumulate`` adds them to
    db first, the sum rounded once."""
    rows, cols = dy.shape
    _kernels(dy, _k_rows)[3](bits(dy), np.int64(rows), np.int64(cols),
                             np.int32(bool(accumulate)), db.reshape(-1))


def nonfinite(flag, a) -> None:
    _kernels(a, _k_nonfinite)(bits(a).reshape(-1), flag)


def xent_grad(probs, labels, dlogits, scale_, accumulate=False) -> None:
    n, k = probs.shape
    _kernels(dlogits, _k_xent_grad)(probs, labels, np.int64(k), np.float32(scale_),
                                    np.int32(bool(accumulate)), bits(dlogits))


def unscale(grad, inv_scale, flag, overflow) -> None:
    _k_unscale()(np.float32(inv_scale), grad, flag, overflow)
