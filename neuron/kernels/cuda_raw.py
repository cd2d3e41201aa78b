"""CuPy raw kernels for what cuDNN cannot do the way torch does it.

* pooling on C-contiguous NCHW arrays for ceil-mode output shapes (cuDNN computes floor-mode
  shapes only) and average-pool backward (cudnnPoolingBackward wants x and y, which AvgPool2d
  does not keep). Backward kernels gather (one thread per input element, no atomics), so they are
  deterministic;
* LRN for an even window (cuDNN centres the window one channel further than torch) and outside
  cuDNN's bounds on n, k and beta.

* the fused elementwise kernels of the other layers: sigmoid/tanh/leaky-ReLU backward, the
  dropout mask (the counter hash of neuron.kernels.dropout_mask) and its application, the
  cross-entropy rows and gradient, and the whole SGD step.

Compiled on first use (functools.cache); neuron.kernels.cuda calls them.
"""
from __future__ import annotations

import functools


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
    """Pooling on C-contiguous NCHW arrays for the shapes cuDNN cannot do (ceil mode) and for
    average-pool backward. Backward kernels gather (one thread per input element, no atomics),
    so they are deterministic."""
    cp = _cp()
    geo = "int32 H, int32 W, int32 Ho, int32 Wo, int32 kh, int32 kw, int32 sh, int32 sw, " \
          "int32 ph, int32 pw"
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
    avgb = cp.ElementwiseKernel(
        "raw T dy, " + geo, "T dx", r"""
        long long iw = i % W, t = i / W, ih = t % H, nc = t / H;
        const long long yb = nc * Ho * Wo;
        T acc = 0;
        long long ho0 = lmax(nr_lo(ih + ph - kh + 1, sh), 0LL), ho1 = lmin(nr_hi(ih + ph, sh), (long long)Ho - 1);
        long long wo0 = lmax(nr_lo(iw + pw - kw + 1, sw), 0LL), wo1 = lmin(nr_hi(iw + pw, sw), (long long)Wo - 1);
        for (long long ho = ho0; ho <= ho1; ++ho) {
            long long hs = ho * sh - ph, ch = lmin(hs + kh, (long long)H + ph) - hs;
            for (long long wo = wo0; wo <= wo1; ++wo) {
                long long ws = wo * sw - pw, cw = lmin(ws + kw, (long long)W + pw) - ws;
                acc += dy[yb + ho * Wo + wo] / T(ch * cw);
            }
        }
        dx = acc;""", "neuron_avgpool_bwd", preamble=_POOL_PREAMBLE)
    return maxf, maxb, avgf, avgb


_LRN_PREAMBLE = r"""
template <typename T>
__device__ T lrn_scale(const T* x, long long base, long long HW, int C, int c, int lo, int hi,
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
        T scale = lrn_scale(&x[0], base, HW, C, c, lo, hi, a_over_n, k);
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
            T sc = lrn_scale(&x[0], base, HW, C, cc, lo, hi, a_over_n, k);
            acc += dy[j] * y[j] / sc;
        }
        T scale = lrn_scale(&x[0], base, HW, C, c, lo, hi, a_over_n, k);
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
