"""CuPy raw kernels for what cuDNN cannot do the way torch does it.

* pooling on C-contiguous NCHW arrays for ceil-mode output shapes (cuDNN computes floor-mode
  shapes only) and average-pool backward (cudnnPoolingBackward wants x and y, which AvgPool2d
  does not keep). Backward kernels gather (one thread per input element, no atomics), so they are
  deterministic;
* LRN for an even window (cuDNN centres the window one channel further than torch) and outside
  cuDNN's bounds on n, k and beta.

* the fused elementwise kernels of the other layers: sigmoid/tanh/leaky-ReLU backward, the
  dropout mask (the counter hash of neuron.kernels.dropout_mask) and its application, the
<<<<<<< HEAD
  cross-entropy rows and gradient, and the whole SGD step, per tensor or for all of a layer's
  tensors in one launch (over a device table of their pointers: kernels/pointer_tables.py).
=======
  cross-entropy rows and gradient, the whole SGD step, and Add + ReLU (AddReLU) each way.
>>>>>>> addrelu

Compiled on first use (functools.cache); neuron.kernels.cuda calls them.
"""
from __future__ import annotations

import functools
import types


def _cp():
    import cupy
    return cupy


_POOL_PREAMBLE = r"""
__device__ inline long long nr_lo(long long a, long long s) {  // ceil(a / s) for any sign
    return a >= 0 ? (a + s - 1) / s : -((-a) / s);
}
__device__ inline long long nr_hi(long long a, long long s) {  // floor(a / s) for any sign
    return a >= 0 ? a / s : -((-a + s - 1) / s);
}
__device__ inline long long lmin(long long a, long long b) { return a < b ? a : b; }
__device__ inline long long lmax(long long a, long long b) { return a > b ? a : b; }
"""


@functools.cache
def _k_pool():
    """Pooling for the shapes cuDNN cannot do (ceil mode) and for average-pool backward.
    Arrays are indexed logically (N, C, H, W in C order): a raw one through CuPy's CArray,
    which follows its strides, and the output by the element index, so channels-last maps
    need no C-ordered copies. Backward kernels gather (one thread per input element, no
    atomics), so they are deterministic."""
    cp = _cp()
    geo = POOL_GEO
    maxf = cp.ElementwiseKernel(
        "raw T x, T neg_inf, " + geo, "T y", r"""
        long long wo = i % Wo, t = i / Wo, ho = t % Ho, nc = t / Ho;
        const long long base = nc * H * W;
        T m = neg_inf;
        for (int a = 0; a < kh; ++a) {
            long long ih = ho * sh - ph + a;
            if (ih < 0 || ih >= H) continue;
            for (int b = 0; b < kw; ++b) {
                long long iw = wo * sw - pw + b;
                if (iw < 0 || iw >= W) continue;
                T v = x[base + ih * W + iw];
                m = (v > m || isnan(v)) ? v : m;     // NaN sticks, like np.maximum
            }
        }
        y = m;""", "neuron_maxpool_fwd")
    maxb = cp.ElementwiseKernel(
        "raw T x, raw T y, raw T dy, " + geo, "T dx", r"""
        long long iw = i % W, t = i / W, ih = t % H, nc = t / H;
        const long long xb = nc * H * W, yb = nc * Ho * Wo;
        const T xv = x[i];
        T acc = 0;
        long long ho0 = lmax(nr_lo(ih + ph - kh + 1, sh), 0LL), ho1 = lmin(nr_hi(ih + ph, sh), (long long)Ho - 1);
        long long wo0 = lmax(nr_lo(iw + pw - kw + 1, sw), 0LL), wo1 = lmin(nr_hi(iw + pw, sw), (long long)Wo - 1);
        for (long long ho = ho0; ho <= ho1; ++ho) {
            for (long long wo = wo0; wo <= wo1; ++wo) {
                const T m = y[yb + ho * Wo + wo];
                if (!(xv == m)) continue;
                // the gradient goes to the FIRST maximum of the window in row-major order
                bool first = true;
                for (int a = 0; a < kh && first; ++a) {
                    long long jh = ho * sh - ph + a;
                    if (jh < 0 || jh >= H) continue;
                    for (int b = 0; b < kw; ++b) {
                        long long jw = wo * sw - pw + b;
                        if (jw < 0 || jw >= W) continue;
                        if (jh == ih && jw == iw) { a = kh; break; }
                        if (x[xb + jh * W + jw] == m) { first = false; break; }
                    }
                }
                if (first) acc += dy[yb + ho * Wo + wo];
            }
        }
        dx = acc;""", "neuron_maxpool_bwd", preamble=_POOL_PREAMBLE)
    avgf = cp.ElementwiseKernel(
        "raw T x, " + geo, "T y", r"""
        long long wo = i % Wo, t = i / Wo, ho = t % Ho, nc = t / Ho;
        const long long base = nc * H * W;
        T s = 0;
        for (int a = 0; a < kh; ++a) {
            long long ih = ho * sh - ph + a;
            if (ih < 0 || ih >= H) continue;
            for (int b = 0; b < kw; ++b) {
                long long iw = wo * sw - pw + b;
                if (iw < 0 || iw >= W) continue;
                s += x[base + ih * W + iw];
            }
        }
        // torch's count_include_pad divisor: the window clipped to the padded input
        long long hs = ho * sh - ph, ws = wo * sw - pw;
        long long ch = lmin(hs + kh, (long long)H + ph) - hs, cw = lmin(ws + kw, (long long)W + pw) - ws;
        y = s / T(ch * cw);""", "neuron_avgpool_fwd", preamble=_POOL_PREAMBLE)
    avgb = cp.ElementwiseKernel("raw T dy, " + geo, "T dx",
                                avgpool_bwd_body("T", "{}", "dx = acc;"), "neuron_avgpool_bwd",
                                preamble=_POOL_PREAMBLE)
    return maxf, maxb, avgf, avgb


@functools.cache
def _k_avgpool_bwd_low(low: str = "bf16"):
    """Average-pool backward over ``low``'s 2-byte bits (bf16 or fp16): the gather of
    ``_k_pool``'s, reading dy as float, summing in float and rounding dx once (what float32
    copies of dy and dx would give, without those copies outside the plan: DenseNet's
    transitions)."""
    from .cuda_low import LOW_PREAMBLE
    defs = f"#define LD nr_{low}_ld\n#define ST nr_{low}_st\n"
    return _cp().ElementwiseKernel(
        "raw uint16 dy, " + POOL_GEO, "uint16 dx",
        avgpool_bwd_body("float", "LD({})", "dx = ST(acc);"), f"neuron_avgpool_bwd_{low}",
        preamble=LOW_PREAMBLE + defs + _POOL_PREAMBLE)


#: the pooling kernels' geometry parameters
POOL_GEO = "int32 H, int32 W, int32 Ho, int32 Wo, int32 kh, int32 kw, int32 sh, int32 sw, " \
    "int32 ph, int32 pw"


def avgpool_bwd_body(acc: str, load: str, store: str) -> str:
    """The average-pool backward gather (one thread per input element): ``acc`` the type of
    its sum, ``load`` a format of one read of dy, ``store`` the write of dx (the 2-byte
    variant, ``_k_avgpool_bwd_low``, reads bits, sums in float and rounds once)."""
    return r"""
        long long iw = i % W, t = i / W, ih = t % H, nc = t / H;
        const long long yb = nc * Ho * Wo;
        """ + acc + r""" acc = 0;
        long long ho0 = lmax(nr_lo(ih + ph - kh + 1, sh), 0LL), ho1 = lmin(nr_hi(ih + ph, sh), (long long)Ho - 1);
        long long wo0 = lmax(nr_lo(iw + pw - kw + 1, sw), 0LL), wo1 = lmin(nr_hi(iw + pw, sw), (long long)Wo - 1);
        for (long long ho = ho0; ho <= ho1; ++ho) {
            long long hs = ho * sh - ph, ch = lmin(hs + kh, (long long)H + ph) - hs;
            for (long long wo = wo0; wo <= wo1; ++wo) {
                long long ws = wo * sw - pw, cw = lmin(ws + kw, (long long)W + pw) - ws;
                acc += """ + load.format("dy[yb + ho * Wo + wo]") + " / " + acc + r"""(ch * cw);
            }
        }
        """ + store


_LRN_PREAMBLE = r"""
// x: the raw array itself (CuPy's CArray: x[j] is the element of logical NCHW index j, through
// its strides), so a channels-last map is read in place, with no C-ordered copy
template <typename A, typename T>
__device__ T lrn_scale(const A& x, long long base, long long HW, int C, int c, int lo, int hi,
                       T a_over_n, T k) {
    T s = 0;
    for (int cc = c - lo; cc <= c + hi; ++cc) {
        if (cc < 0 || cc >= C) continue;
        T v = x[base + (long long)cc * HW];
        s += v * v;
    }
    return s * a_over_n + k;
}
"""


@functools.cache
def _k_lrn():
    cp = _cp()
    args = "int32 C, int64 HW, int32 lo, int32 hi, T a_over_n, T k, T beta"
    fwd = cp.ElementwiseKernel("raw T x, " + args, "T y", r"""
        long long hw = i % HW, t = i / HW; int c = t % C; long long n = t / C;
        long long base = n * C * HW + hw;
        T scale = lrn_scale(x, base, HW, C, c, lo, hi, a_over_n, k);
        y = x[i] * pow(scale, -beta);""", "neuron_lrn_fwd", preamble=_LRN_PREAMBLE,
        options=("--fmad=false",))
    bwd = cp.ElementwiseKernel("raw T x, raw T y, raw T dy, " + args + ", T coef", "T dx", r"""
        long long hw = i % HW, t = i / HW; int c = t % C; long long n = t / C;
        long long base = n * C * HW + hw;
        // channels whose window contains c: c - hi .. c + lo
        T acc = 0;
        for (int cc = c - hi; cc <= c + lo; ++cc) {
            if (cc < 0 || cc >= C) continue;
            long long j = base + (long long)cc * HW;
            T sc = lrn_scale(x, base, HW, C, cc, lo, hi, a_over_n, k);
            acc += dy[j] * y[j] / sc;
        }
        T scale = lrn_scale(x, base, HW, C, c, lo, hi, a_over_n, k);
        dx = dy[i] * pow(scale, -beta) + acc * x[i] * coef;""", "neuron_lrn_bwd",
        preamble=_LRN_PREAMBLE, options=("--fmad=false",))
    return fwd, bwd


_FMA_PREAMBLE = r"""
__device__ inline float fused(float a, float b, float c) { return fmaf(a, b, c); }
__device__ inline double fused(double a, double b, double c) { return fma(a, b, c); }
"""


@functools.cache
def _k_sigmoid_bwd():
    return _cp().ElementwiseKernel("T y, T dy", "T dx", "dx = dy * ((T(1) - y) * y)",
                                   "neuron_sigmoid_bwd")


@functools.cache
def _k_tanh_bwd():
    return _cp().ElementwiseKernel("T y, T dy", "T dx", "dx = dy * (T(1) - y * y)",
                                   "neuron_tanh_bwd", options=("--fmad=false",))


@functools.cache
def _k_leaky():
    cp = _cp()
    fwd = cp.ElementwiseKernel("T x, T slope", "T y", "y = x > T(0) ? x : x * slope",
                               "neuron_leaky_relu_fwd")
    bwd = cp.ElementwiseKernel("T y, T dy, T slope", "T dx", "dx = y > T(0) ? dy : dy * slope",
                               "neuron_leaky_relu_bwd")
    return fwd, bwd


@functools.cache
def _k_dropout(key_on_device: bool = False):
    """(mask, apply) kernels; ``key_on_device``: the mask's key is read from a one-element
    device buffer plus a per-call ``add`` (a chunk's offset), so a CUDA graph keeps the
    iteration's seed there instead of baking it into the capture."""
    cp = _cp()
    key_param = "raw uint64 key_buf, uint64 add" if key_on_device else "uint64 key"
    key_read = "const unsigned long long key = key_buf[0] + add;\n" if key_on_device else ""
    mask = cp.ElementwiseKernel(f"{key_param}, float32 keep", "uint8 m", key_read + r"""
        unsigned long long z = key + (unsigned long long)(i + 1) * 0x9E3779B97F4A7C15ULL;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        z = z ^ (z >> 31);
        float u = (float)(z >> 40) * (1.0f / 16777216.0f);
        m = u < keep ? 1 : 0;""", "neuron_dropout_mask" + ("_keybuf" if key_on_device else ""))
    if key_on_device:
        return mask, _k_dropout()[1]
    apply = cp.ElementwiseKernel("T x, uint8 m, T scale", "T y", "y = (x * T(m)) * scale",
                                 "neuron_dropout_apply", options=("--fmad=false",))
    return mask, apply


@functools.cache
def _k_xent():
    cp = _cp()
    # one thread per sample; the log-sum-exp straight from the logits (not log of the
    # probabilities, which underflow) in double, as numpy_ref does
    rows = cp.ElementwiseKernel("raw T logits, raw int64 labels, int64 K", "U loss", r"""
        const long long base = i * K;
        double m = (double)logits[base];
        for (long long j = 1; j < K; ++j) m = fmax(m, (double)logits[base + j]);
        double s = 0.0;
        for (long long j = 0; j < K; ++j) s += exp((double)logits[base + j] - m);
        loss = (U)(log(s) + m - (double)logits[base + labels[i]]);""", "neuron_xent_rows")
    grad = cp.ElementwiseKernel("T p, raw int64 labels, int64 K, T inv_n", "T d", r"""
        const long long row = i / K, col = i % K;
        d = (col == labels[row] ? p - T(1) : p) * inv_n;""", "neuron_xent_grad",
        options=("--fmad=false",))
    return rows, grad


@functools.cache
def _k_sgd(check_finite: bool = False, lr_on_device: bool = False):
    """(with momentum, plain) SGD kernels; ``check_finite`` adds a last ``raw bool flag`` output
    that is set when the new parameter or velocity is NaN or infinite (the step guard's check,
    fused into the update instead of a kernel per tensor). An output, not an input: CuPy makes
    inputs const. ``lr_on_device``: -lr is read from a one-element device buffer (``raw T
    neg_lr``) instead of a scalar argument, so a CUDA graph keeps its learning rate there."""
    cp = _cp()
    lr_param = "raw T neg_lr_buf" if lr_on_device else "T neg_lr"
    lr_read = "\n        const T neg_lr = neg_lr_buf[0];" if lr_on_device else ""
    suffix_lr = "_lrbuf" if lr_on_device else ""
    # --fmad=false keeps velocity*momentum + d as two roundings (torch: buf.mul_(m).add_(d));
    # the explicit fused() calls are the fused multiply-adds of torch's add(alpha=...).
    opts = ("--fmad=false",)
    flag_out = ", raw bool flag" if check_finite else ""
    check_v = "\n        if (!isfinite((double)p) || !isfinite((double)v)) flag[0] = true;" \
        if check_finite else ""
    check_p = "\n        if (!isfinite((double)p)) flag[0] = true;" if check_finite else ""
    suffix = "_checked" if check_finite else ""
    with_v = cp.ElementwiseKernel(
        f"T g, T wd, T mom, {lr_param}, int32 first, int32 nesterov", "T p, T v" + flag_out,
        lr_read + r"""
        T d = (wd != T(0)) ? fused(wd, p, g) : g;
        T vv;
        if (first) { vv = d; } else { vv = v * mom; vv = vv + d; }
        v = vv;
        d = nesterov ? fused(mom, vv, d) : vv;
        p = fused(neg_lr, d, p);""" + check_v, "neuron_sgd_momentum" + suffix + suffix_lr,
        preamble=_FMA_PREAMBLE, options=opts)
    plain = cp.ElementwiseKernel(f"T g, T wd, {lr_param}", "T p" + flag_out, lr_read + r"""
        T d = (wd != T(0)) ? fused(wd, p, g) : g;
        p = fused(neg_lr, d, p);""" + check_p, "neuron_sgd" + suffix + suffix_lr,
        preamble=_FMA_PREAMBLE,
        options=opts)
    return with_v, plain


#: elements of one tensor that one block of the multi-tensor SGD kernel updates, and its threads
SGD_MANY_CHUNK, SGD_MANY_THREADS = 2048, 256
#: the C types of the parameters it updates (other dtypes take the per-tensor kernel)
SGD_MANY_TYPES = {"float32": "float", "float64": "double"}


def _many_tensor_of_block(row: int) -> str:
    """CUDA lines of a multi-tensor kernel: ``lo``, the tensor whose blocks hold this block
    ``b``, found in the table's first-block list after ``ntensors`` rows of ``row`` values."""
    return f"""    const long long* start = table + {row} * (long long)ntensors;
    const long long b = blockIdx.x;
    int lo = 0, hi = ntensors - 1;          // the last tensor whose first block is <= b
    while (lo < hi) {{
        const int mid = (lo + hi + 1) / 2;
        if (start[mid] <= b) lo = mid; else hi = mid - 1;
    }}"""


def sgd_many_source(dtype: str = "float32", check_finite: bool = False,
                    lr_on_device: bool = False) -> tuple[str, str]:
    """(CUDA source, kernel name) of the SGD step over several tensors in one launch.

    ``table`` (int64, device): ``ntensors`` rows (param, grad, velocity pointers, element
    count; velocity 0 without momentum), then the ``ntensors + 1`` first blocks of each tensor:
    block b updates elements [(b - start[t]) * SGD_MANY_CHUNK, ... + SGD_MANY_CHUNK) of the
    tensor t whose blocks hold b. Each element gets _k_sgd's arithmetic, operation for
    operation (compiled with --fmad=false too), so its bits are the per-tensor kernel's;
    ``check_finite`` and ``lr_on_device`` mean what they mean there."""
    t = SGD_MANY_TYPES[dtype]
    name = f"neuron_sgd_many_{dtype}" + ("_checked" if check_finite else "") + \
        ("_lrbuf" if lr_on_device else "")
    lr_param = "const T* neg_lr_buf" if lr_on_device else "T neg_lr_arg"
    lr_read = "neg_lr_buf[0]" if lr_on_device else "neg_lr_arg"
    flag_param = ", bool* flag" if check_finite else ""
    check_v = "if (!isfinite((double)pi) || !isfinite((double)vv)) flag[0] = true;" \
        if check_finite else ""
    check_p = "if (!isfinite((double)pi)) flag[0] = true;" if check_finite else ""
    src = f"""typedef {t} T;
__device__ inline float fused(float a, float b, float c) {{ return fmaf(a, b, c); }}
__device__ inline double fused(double a, double b, double c) {{ return fma(a, b, c); }}

extern "C" __global__ void {name}(const long long* table, int ntensors, T wd, T mom,
        {lr_param}, int first, int nesterov, int with_v{flag_param}) {{
{_many_tensor_of_block(4)}
    T* p = (T*)table[4 * lo];
    const T* g = (const T*)table[4 * lo + 1];
    T* v = (T*)table[4 * lo + 2];
    const long long n = table[4 * lo + 3];
    const long long first_i = (b - start[lo]) * {SGD_MANY_CHUNK}LL;
    const long long end_i = first_i + {SGD_MANY_CHUNK}LL < n ? first_i + {SGD_MANY_CHUNK}LL : n;
    const T neg_lr = {lr_read};
    for (long long i = first_i + threadIdx.x; i < end_i; i += blockDim.x) {{
        T pi = p[i];
        const T gi = g[i];
        T d = (wd != T(0)) ? fused(wd, pi, gi) : gi;
        if (with_v) {{
            T vv;
            if (first) {{ vv = d; }} else {{ vv = v[i] * mom; vv = vv + d; }}
            v[i] = vv;
            d = nesterov ? fused(mom, vv, d) : vv;
            pi = fused(neg_lr, d, pi);
            p[i] = pi;
            {check_v}
        }} else {{
            pi = fused(neg_lr, d, pi);
            p[i] = pi;
            {check_p}
        }}
    }}
}}
"""
    return src, name


@functools.cache
def _k_sgd_many(dtype: str = "float32", check_finite: bool = False, lr_on_device: bool = False):
    """The multi-tensor SGD kernel of ``sgd_many_source`` (a RawModule's function)."""
    src, name = sgd_many_source(dtype, check_finite, lr_on_device)
    return _cp().RawModule(code=src, options=("--fmad=false",)).get_function(name)


def nonfinite_many_source(dtype: str = "float32") -> tuple[str, str]:
    """(CUDA source, kernel name) of the step guard's finiteness check over several tensors in
    one launch: ``table`` as sgd_many_source's, with rows of (pointer, element count), then the
    first blocks; ``flag[0]`` is set where any element is NaN or infinite (compared in double,
    as the per-tensor kernel does)."""
    t = SGD_MANY_TYPES[dtype]
    name = f"neuron_nonfinite_many_{dtype}"
    src = f"""typedef {t} T;
extern "C" __global__ void {name}(const long long* table, int ntensors, bool* flag) {{
{_many_tensor_of_block(2)}
    const T* a = (const T*)table[2 * lo];
    const long long n = table[2 * lo + 1];
    const long long first_i = (b - start[lo]) * {SGD_MANY_CHUNK}LL;
    const long long end_i = first_i + {SGD_MANY_CHUNK}LL < n ? first_i + {SGD_MANY_CHUNK}LL : n;
    for (long long i = first_i + threadIdx.x; i < end_i; i += blockDim.x) {{
        if (!isfinite((double)a[i])) flag[0] = true;
    }}
}}
"""
    return src, name


@functools.lru_cache(maxsize=None)
def _k_nonfinite_many(dtype: str = "float32"):
    """The multi-tensor finiteness check of ``nonfinite_many_source`` (a RawModule's function)."""
    src, name = nonfinite_many_source(dtype)
    return _cp().RawModule(code=src).get_function(name)


# ---- BatchNorm + ReLU fused (layers/norm.py BNReLU; neuron.kernels.cuda.bnrelu_*) -----------
#
# NCHW viewed as (N, C, HW); M = N*HW values per channel. A per-channel reduction is three
# elementwise kernels: P threads per channel each sum a strided share of the channel (thread p
# reads the channel's values p, p+P, p+2P, ... in (n, hw) order, so a warp reads consecutive
# addresses; four loads in flight per thread), then one thread per 32 partial sums adds them
# in double (``fold``), then one thread per channel adds its P/32 folded sums: a fixed order
# (deterministic, no atomics) and no long serial loop. T is the data's type, U the parameters'
# and the partial sums' (float for float and 2-byte data, double for double). --fmad=false and
# one shared function for z = (x - mean) * (invstd * gamma) + beta make backward's recomputed z
# the forward's to the bit, so the ReLU mask backward uses is the one forward applied.

_BNRELU_PREAMBLE = r"""
template <typename V> __device__ inline V nr_bn_z(V x, V m, V s, V b) { return (x - m) * s + b; }
"""

_BNRELU_STRIDE = r"""
        const long long c = i / P, p = i % P;
        long long n = p / HW, s = p % HW;
        const long long dn = P / HW, ds = P % HW;"""

_BNRELU_NEXT = r"""
            n += dn; s += ds;
            if (s >= HW) { s -= HW; ++n; }"""


def _bnrelu_loop(load: str, add: str) -> str:
    """The strided loop of a reduction kernel: ``load`` declares the values of element offset
    ``o``K (K = 0..3) and ``add`` folds value set K in; four loads issued before their adds."""
    def at(k):
        return f"""
            const long long o{k} = (n * C + c) * HW + s;""" + _BNRELU_NEXT
    four = "".join(at(k) for k in range(4)) + "".join(load.replace("K", str(k)) for k in range(4))
    four += "".join(add.replace("K", str(k)) for k in range(4))
    one = at(0) + load.replace("K", "0") + add.replace("K", "0")
    return f"""
        long long j = p;
        for (; j + 3 * P < M; j += 4 * P) {{{four}
        }}
        for (; j < M; j += P) {{{one}
        }}"""


#: the most partial sums of one fused kernel call (its workspace stays under 10 MiB)
BNRELU_MAX_PARTIALS = 1 << 20


def bnrelu_partials(m: int, channels: int) -> int:
    """Threads per channel of the fused kernels' reductions over m values: a power of two from
    32 to 4096, each thread summing at least 16 values, at most BNRELU_MAX_PARTIALS in all."""
    p = 32
    while p < 4096 and 2 * p * 16 <= m and 2 * p * channels <= BNRELU_MAX_PARTIALS:
        p *= 2
    return p


def bnrelu_workspace_bytes(m: int, channels: int, itemsize: int) -> int:
    """Bytes of a fused kernel call's partial sums: two arrays of C*P (float32 for 2- and
    4-byte data, float64 for float64 data) and two of C*P/32 folded sums (float64): the BNReLU
    layer's planned workspace."""
    p = bnrelu_partials(m, channels)
    return 2 * channels * p * max(int(itemsize), 4) + 2 * channels * (p // 32) * 8


@functools.cache
def _k_bnrelu(low: str | None = None):
    """The fused BatchNorm + ReLU kernels, as a namespace: ``stats`` (per-thread shifted sums
    and sums of squares), ``finish`` (mean, 1/sqrt(var + eps), the running statistics),
    ``fold`` (32 partial sums into one, in double), ``apply`` (y = max(z, 0)), ``sums`` (per-thread sum(dz) and sum(dz * xhat), dz = dy*(z>0)),
    ``sums_finish`` (dbeta, dgamma), ``dx`` / ``dx_acc`` (dx = or += gamma*invstd*(dz -
    dbeta/M - xhat*dgamma/M)) and ``mask`` (dz alone, for synchronized BatchNorm).

    ``low`` ("bf16", "fp16"): the data (x, y, dy, dx) as the 16 raw bits of that type
    (cuda_low's conversions, float32 arithmetic, each stored value rounded once); U, the
    parameters' and the sums' type, is float32 then."""
    cp = _cp()
    opts = ("--fmad=false",)
    if low is None:
        D, sfx = "T", ""
        pre = "#define NR_LD(v) ((U)(v))\n#define NR_ST(v) ((T)(v))\n"
    else:
        from .cuda_low import LOW_PREAMBLE
        D, sfx = "uint16", f"_{low}"
        pre = LOW_PREAMBLE + (f"#define NR_LD(v) ((U)nr_{low}_ld(v))\n"
                              f"#define NR_ST(v) nr_{low}_st((float)(v))\n")
    pre_z = pre + _BNRELU_PREAMBLE

    def kernel(ins, outs, body, name, preamble=pre_z):
        return cp.ElementwiseKernel(ins.replace("@", D), outs.replace("@", D), body,
                                    f"neuron_bnrelu_{name}{sfx}", preamble=preamble,
                                    options=opts)
    geo = "int64 C, int64 HW, int64 M, int64 P"
    stats = kernel("raw @ x, " + geo, "U s1, U s2", _BNRELU_STRIDE + r"""
        const U k = NR_LD(x[c * HW]);   // the shift: the channel's first value
        U a = 0, b = 0;""" + _bnrelu_loop(r"""
            const U vK = NR_LD(x[oK]) - k;""", r"""
            a += vK;
            b += vK * vK;""") + r"""
        s1 = a;
        s2 = b;""", "stats")
    fold = kernel("raw U s1, raw U s2", "float64 f1, float64 f2", r"""
        double a = 0, b = 0;
        for (int q = 0; q < 32; ++q) {
            a += (double)s1[i * 32 + q];
            b += (double)s2[i * 32 + q];
        }
        f1 = a;
        f2 = b;""", "fold", preamble="")
    finish = kernel(
        "raw float64 f1, raw float64 f2, raw @ x, int64 HW, int64 M, int64 Q, U momentum, "
        "U eps, int32 update", "U save_mean, U save_invstd, U running_mean, U running_var", r"""
        double a = 0, b = 0;
        for (long long q = 0; q < Q; ++q) {
            a += f1[i * Q + q];
            b += f2[i * Q + q];
        }
        const double d = a / (double)M;
        double var = b / (double)M - d * d;     // biased, about the shift
        if (var < 0) var = 0;
        const double mean = (double)NR_LD(x[i * HW]) + d;
        save_mean = (U)mean;
        save_invstd = (U)(1.0 / sqrt(var + (double)eps));
        if (update) {
            const double mom = (double)momentum;
            const double unbiased = var * (double)M / (double)(M > 1 ? M - 1 : 1);
            running_mean = (U)((1.0 - mom) * (double)running_mean + mom * mean);
            running_var = (U)((1.0 - mom) * (double)running_var + mom * unbiased);
        }""", "finish")
    apply = kernel(
        "@ x, raw U mean, raw U invstd, raw U gamma, raw U beta, int64 C, int64 HW", "@ y", r"""
        const long long c = (i / HW) % C;
        const U z = nr_bn_z(NR_LD(x), mean[c], invstd[c] * gamma[c], beta[c]);
        y = NR_ST(z > U(0) ? z : (z != z ? z : U(0)));    // max(z, 0), NaN kept""", "apply")
    sums = kernel(
        "raw @ x, raw @ dy, raw U mean, raw U invstd, raw U gamma, raw U beta, " + geo,
        "U sdz, U sdzx", _BNRELU_STRIDE + r"""
        const U m = mean[c], is = invstd[c], sc = invstd[c] * gamma[c], b = beta[c];
        U a = 0, e = 0;""" + _bnrelu_loop(r"""
            const U xK = NR_LD(x[oK]), gK = NR_LD(dy[oK]);""", r"""
            const U dzK = (nr_bn_z(xK, m, sc, b) > U(0) ? U(1) : U(0)) * gK;
            a += dzK;
            e += dzK * ((xK - m) * is);""") + r"""
        sdz = a;
        sdzx = e;""", "sums")
    sums_finish = kernel("raw float64 f1, raw float64 f2, int64 Q", "U dgamma, U dbeta", r"""
        double a = 0, b = 0;
        for (long long q = 0; q < Q; ++q) {
            a += f1[i * Q + q];
            b += f2[i * Q + q];
        }
        dbeta = (U)a;
        dgamma = (U)b;""", "sums_finish", preamble="")
    dx_in = ("@ x, @ dy, raw U mean, raw U invstd, raw U gamma, raw U beta, raw U dgamma, "
             "raw U dbeta, int64 C, int64 HW, U inv_m")
    dx_body = r"""
        const long long c = (i / HW) % C;
        const U m = mean[c], is = invstd[c], g = gamma[c];
        const U xv = NR_LD(x);
        const U dz = (nr_bn_z(xv, m, is * g, beta[c]) > U(0) ? U(1) : U(0)) * NR_LD(dy);
        const U v = g * is * (dz - dbeta[c] * inv_m - (xv - m) * is * (dgamma[c] * inv_m));"""
    dx = kernel(dx_in, "@ dx", dx_body + "\n        dx = NR_ST(v);", "dx")
    dx_acc = kernel(dx_in, "@ dx", dx_body + "\n        dx = NR_ST(NR_LD(dx) + v);", "dx_acc")
    mask = kernel(
        "@ x, @ dy, raw U mean, raw U invstd, raw U gamma, raw U beta, int64 C, int64 HW",
        "@ dz", r"""
        const long long c = (i / HW) % C;
        const U z = nr_bn_z(NR_LD(x), mean[c], invstd[c] * gamma[c], beta[c]);
        dz = NR_ST((z > U(0) ? U(1) : U(0)) * NR_LD(dy));""", "mask")
    return types.SimpleNamespace(stats=stats, fold=fold, finish=finish, apply=apply, sums=sums,
                                 sums_finish=sums_finish, dx=dx, dx_acc=dx_acc, mask=mask)


# ---- Add + ReLU fused (layers/join.py AddReLU; neuron.kernels.cuda.add_relu_*) -------------

_ADD_RELU_PREAMBLE = r"""
template <typename V> __device__ inline V nr_relu(V s) {
    return s > V(0) ? s : (s != s ? s : V(0));      // max(s, 0), NaN kept, -0 as +0
}
"""


@functools.cache
def _k_add_relu(low: str | None = None):
    """The fused Add + ReLU kernels, as a namespace: ``fwd`` (y = max(a + b, 0), NaN kept),
    ``acc`` (y = max(y + a, 0): the last input of three or more) and ``mask`` (dy = (y > 0) *
    dy in place: a multiply, as relu_backward's, so a masked NaN stays NaN and -dy gives -0).

    ``low`` ("bf16", "fp16"): the data as the 16 raw bits of that type (cuda_low's
    conversions, float32 arithmetic, each stored value rounded once)."""
    cp = _cp()
    if low is None:
        D, sfx, pre = "T", "", "#define NR_LD(v) (v)\n#define NR_ST(v) (v)\n#define NR_F T\n"
    else:
        from .cuda_low import LOW_PREAMBLE
        D, sfx = "uint16", f"_{low}"
        pre = LOW_PREAMBLE + (f"#define NR_LD nr_{low}_ld\n#define NR_ST nr_{low}_st\n"
                              "#define NR_F float\n")

    def kernel(ins, outs, body, name):
        return cp.ElementwiseKernel(ins.replace("@", D), outs.replace("@", D), body,
                                    f"neuron_add_relu_{name}{sfx}",
                                    preamble=pre + _ADD_RELU_PREAMBLE)
    fwd = kernel("@ a, @ b", "@ y", "y = NR_ST(nr_relu(NR_F(NR_LD(a) + NR_LD(b))))", "fwd")
    acc = kernel("@ a", "@ y", "y = NR_ST(nr_relu(NR_F(NR_LD(y) + NR_LD(a))))", "acc")
    mask = kernel("@ y", "@ dy",
                  "dy = NR_ST((NR_LD(y) > NR_F(0) ? NR_F(1) : NR_F(0)) * NR_LD(dy))", "mask")
    return types.SimpleNamespace(fwd=fwd, acc=acc, mask=mask)
