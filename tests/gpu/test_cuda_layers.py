"""GPU tests: every CUDA kernel against the NumPy reference, the cuDNN ABI against its headers,
copy/compute overlap, the arena device, and one training step of a small ResNet on GPU vs CPU.

Skipped (see conftest.py) where CuPy or a GPU is missing. Run on the GPU machine with
``python -m pytest tests/gpu -q -rs``.
"""
from __future__ import annotations

import shutil
import time

import numpy as np
import pytest

from neuron.kernels import cuda as K
from neuron.kernels import cudnn as dnn
from neuron.kernels import numpy_ref as R

pytestmark = pytest.mark.gpu

F32 = dict(rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def cp():
    import cupy
    return cupy


@pytest.fixture(scope="module")
def dev(cp):
    """One arena device for the module. Its pool heap is attached, so every CuPy array the
    tests make (and every temporary the kernels make) lives in the arena."""
    from neuron.devices.cuda import CudaDevice
    from neuron.memory.heap import Heap
    d = CudaDevice(1 << 30, scratch_bytes=64 << 20)
    d.test_heap = Heap(d.arena_bytes, block=256)
    d.attach_heap(d.test_heap)
    K.deterministic, K.allow_tf32 = False, False
    yield d
    d.close()


@pytest.fixture(autouse=True)
def _fresh_algo_state(dev):
    K.deterministic, K.allow_tf32 = False, False
    yield


class Out:
    """An output argument: allocated (NaN-filled, so unwritten elements show) on both sides."""

    def __init__(self, shape, dtype=np.float32):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)


class InOut:
    """An array updated in place (parameters, running statistics): same start on both sides."""

    def __init__(self, a):
        self.a = np.asarray(a)


def both(cp, name, *args):
    """Run numpy_ref.<name> and cuda.<name> on the same arguments.

    Returns (pairs, ref_return, gpu_return) where pairs are (reference, gpu-as-numpy) for every
    Out/InOut argument in order."""
    ra, ga, pairs = [], [], []
    for a in args:
        if isinstance(a, Out):
            fillv = np.nan if a.dtype.kind == "f" else 0
            r = np.full(a.shape, fillv, a.dtype)
            g = cp.full(a.shape, fillv, a.dtype)
            pairs.append((r, g))
        elif isinstance(a, InOut):
            r, g = a.a.copy(), cp.asarray(a.a)
            pairs.append((r, g))
        elif isinstance(a, np.ndarray):
            r, g = a.copy(), cp.asarray(a)
        elif isinstance(a, list) and a and isinstance(a[0], (np.ndarray, Out, type(None))):
            r, g = [], []
            for e in a:
                if isinstance(e, Out):
                    fillv = np.nan
                    re_, ge_ = np.full(e.shape, fillv, e.dtype), cp.full(e.shape, fillv, e.dtype)
                    pairs.append((re_, ge_))
                elif e is None:
                    re_ = ge_ = None
                else:
                    re_, ge_ = e.copy(), cp.asarray(e)
                r.append(re_)
                g.append(ge_)
        else:
            r = g = a
        ra.append(r)
        ga.append(g)
    rr = getattr(R, name)(*ra)
    gr = getattr(K, name)(*ga)
    cp.cuda.get_current_stream().synchronize()
    return [(r, cp.asnumpy(g)) for r, g in pairs], rr, gr


def close(pairs, **tol):
    tol = tol or F32
    for i, (r, g) in enumerate(pairs):
        np.testing.assert_allclose(g, r, err_msg=f"output {i}", **tol)


def rnd(*shape, dtype=np.float32, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)


# ----------------------------------------------------------------------------------------------
# convolution
# ----------------------------------------------------------------------------------------------

CONVS = [  # (x shape, w shape, stride, padding, dilation, groups)
    ((4, 3, 17, 15), (8, 3, 3, 3), 1, 1, 1, 1),
    ((2, 8, 16, 16), (16, 8, 3, 3), 2, 1, 1, 1),
    ((2, 8, 12, 12), (8, 4, 3, 3), 1, 2, 2, 2),      # grouped, dilated
    ((3, 16, 9, 9), (32, 16, 1, 1), 1, 0, 1, 1),     # 1x1
    ((2, 3, 32, 32), (16, 3, 7, 7), 2, 3, 1, 1),     # ResNet stem
]


@pytest.mark.parametrize("xs, ws, s, p, d, g", CONVS)
@pytest.mark.parametrize("bias", [True, False])
def test_conv_forward_backward(cp, dev, xs, ws, s, p, d, g, bias):
    x, w = rnd(*xs, seed=1), rnd(*ws, seed=2, scale=0.3)
    b = rnd(ws[0], seed=3) if bias else None
    ho, wo = R.conv2d_out_hw(xs[2], xs[3], ws[2], ws[3], s, p, d)
    ys = (xs[0], ws[0], ho, wo)
    wsb = R.conv2d_workspace_bytes(xs, ws, s, p, d, g, 4)
    pairs, _, _ = both(cp, "conv2d_forward", x, w, b, Out(ys), s, p, d, g,
                       np.zeros(wsb, np.uint8))
    close(pairs)
    dy = rnd(*ys, seed=4)
    pairs, _, _ = both(cp, "conv2d_backward", x, w, dy, Out(xs), Out(ws),
                       Out((ws[0],)) if bias else None, s, p, d, g, np.zeros(wsb, np.uint8))
    close(pairs, rtol=1e-4, atol=3e-4)


def test_conv_float64(cp, dev):
    xs, ws = (2, 4, 9, 9), (6, 4, 3, 3)
    x, w, b = rnd(*xs, dtype=np.float64), rnd(*ws, dtype=np.float64, seed=1), rnd(6, dtype=np.float64)
    wsb = R.conv2d_workspace_bytes(xs, ws, 1, 1, 1, 1, 8)
    pairs, _, _ = both(cp, "conv2d_forward", x, w, b, Out((2, 6, 9, 9), np.float64), 1, 1, 1, 1,
                       np.zeros(wsb, np.uint8))
    close(pairs, rtol=1e-10, atol=1e-10)
    dy = rnd(2, 6, 9, 9, dtype=np.float64, seed=5)
    pairs, _, _ = both(cp, "conv2d_backward", x, w, dy, Out(xs, np.float64), Out(ws, np.float64),
                       Out((6,), np.float64), 1, 1, 1, 1, np.zeros(wsb, np.uint8))
    close(pairs, rtol=1e-10, atol=1e-10)


def test_conv_algorithm_under_a_tiny_limit(cp, dev):
    xs, ws = (8, 16, 28, 28), (32, 16, 3, 3)
    x, w = cp.asarray(rnd(*xs)), cp.asarray(rnd(*ws, seed=1, scale=0.2))
    y = cp.empty((8, 32, 28, 28), cp.float32)
    K.clear_conv_algo_cache()
    zero = K.choose_conv_algo("fwd", xs, ws, 1, 1, 1, 1, np.float32, 0, arrays=(x, w, y))
    assert zero.memory == 0
    big_ws = cp.empty(256 << 20, cp.uint8)
    big = K.choose_conv_algo("fwd", xs, ws, 1, 1, 1, 1, np.float32, 256 << 20,
                             arrays=(x, w, y), workspace=big_ws)
    assert big.source == "find" and big.memory <= 256 << 20
    # a limit in the same power-of-two bucket reuses the measurement
    again = K.choose_conv_algo("fwd", xs, ws, 1, 1, 1, 1, np.float32, (256 << 20) + 4096,
                               arrays=(x, w, y), workspace=big_ws)
    assert again.source == "find-cached" and again.algo == big.algo
    # the kernel itself chooses under the workspace it is handed, and stays correct
    ref = np.empty((8, 32, 28, 28), np.float32)
    R.conv2d_forward(cp.asnumpy(x), cp.asnumpy(w), None, ref, 1, 1, 1, 1, None)
    for nbytes in (0, 600, 64 << 20):
        ws_arr = cp.empty(nbytes, cp.uint8) if nbytes else None
        K.conv2d_forward(x, w, None, y, 1, 1, 1, 1, ws_arr)
        rec = K.conv_algo_trace[-1]
        assert rec.kind == "fwd" and rec.workspace_bytes <= nbytes and rec.limit_bytes <= nbytes
        np.testing.assert_allclose(cp.asnumpy(y), ref, **F32)


def test_deterministic_mode_is_bit_reproducible(cp, dev):
    K.deterministic = True
    K.clear_conv_algo_cache()
    xs, ws = (4, 8, 16, 16), (16, 8, 3, 3)
    x, w = cp.asarray(rnd(*xs)), cp.asarray(rnd(*ws, seed=1))
    dy = cp.asarray(rnd(4, 16, 16, 16, seed=2))
    wsb = cp.empty(R.conv2d_workspace_bytes(xs, ws, 1, 1, 1, 1, 4), cp.uint8)
    outs = []
    for _ in range(2):
        y = cp.empty((4, 16, 16, 16), cp.float32)
        dx, dw = cp.empty(xs, cp.float32), cp.empty(ws, cp.float32)
        K.conv2d_forward(x, w, None, y, 1, 1, 1, 1, wsb)
        K.conv2d_backward(x, w, dy, dx, dw, None, 1, 1, 1, 1, wsb)
        outs.append([cp.asnumpy(a) for a in (y, dx, dw)])
    for a, b in zip(*outs):
        assert np.array_equal(a, b)
    assert all(r.source == "heuristic" for r in list(K.conv_algo_trace)[-6:])


# ----------------------------------------------------------------------------------------------
# batch normalization
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(8, 6, 5, 7), (16, 10)])
@pytest.mark.parametrize("update", [True, False])
def test_batchnorm_train(cp, dev, shape, update):
    c = shape[1]
    x = rnd(*shape, scale=2.0) + 0.5
    gamma, beta = rnd(c, seed=1), rnd(c, seed=2)
    rm, rv = InOut(rnd(c, seed=3)), InOut(np.abs(rnd(c, seed=4)) + 0.5)
    pairs, _, _ = both(cp, "batchnorm_forward_train", x, gamma, beta, Out(shape), rm, rv,
                       Out((c,)), Out((c,)), 0.1, 1e-5, update)
    close(pairs)
    if not update:      # a recompute must leave the running statistics untouched
        assert np.array_equal(pairs[1][1], rm.a) and np.array_equal(pairs[2][1], rv.a)


def test_batchnorm_infer_and_backward(cp, dev):
    shape, c = (4, 6, 5, 5), 6
    x, gamma, beta = rnd(*shape) * 3 + 1, rnd(c, seed=1), rnd(c, seed=2)
    rm, rv = rnd(c, seed=3), np.abs(rnd(c, seed=4)) + 0.5
    pairs, _, _ = both(cp, "batchnorm_forward_infer", x, gamma, beta, Out(shape), rm, rv, 1e-5)
    close(pairs)
    sm, si = np.empty(c, np.float32), np.empty(c, np.float32)
    R.batchnorm_forward_train(x, gamma, beta, np.empty(shape, np.float32), None, None, sm, si,
                              0.1, 1e-5, False)
    dy = rnd(*shape, seed=7)
    pairs, _, _ = both(cp, "batchnorm_backward", x, dy, gamma, sm, si, Out(shape), Out((c,)),
                       Out((c,)))
    close(pairs, rtol=1e-4, atol=3e-4)


# ----------------------------------------------------------------------------------------------
# activations, pooling, linear, dropout, LRN, joins, loss, optimizer, primitives
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("act, extra", [("relu", ()), ("sigmoid", ()), ("tanh", ()),
                                        ("leaky_relu", (0.1,))])
def test_activations(cp, dev, act, extra):
    shape = (4, 5, 6, 7)
    x = rnd(*shape, scale=3.0)
    pairs, _, _ = both(cp, f"{act}_forward", x, Out(shape), *extra)
    close(pairs, rtol=1e-5, atol=1e-6)
    y = pairs[0][0]
    pairs, _, _ = both(cp, f"{act}_backward", y, rnd(*shape, seed=1), Out(shape), *extra)
    close(pairs, rtol=1e-5, atol=1e-6)


POOLS = [((3, 3), (2, 2), (1, 1), False), ((2, 2), (2, 2), (0, 0), False),
         ((3, 3), (1, 1), (1, 1), False), ((3, 3), (2, 2), (0, 0), True),   # ceil: CuPy kernels
         ((2, 3), (2, 1), (1, 1), True)]


@pytest.mark.parametrize("kernel, stride, padding, ceil", POOLS)
@pytest.mark.parametrize("kind", ["max", "avg"])
def test_pooling(cp, dev, kernel, stride, padding, ceil, kind):
    xs = (2, 3, 10, 11)
    x = rnd(*xs)
    ys = (2, 3, *R.pool_out_hw(10, 11, kernel, stride, padding, ceil_mode=ceil))
    pairs, _, _ = both(cp, f"{kind}pool_forward", x, Out(ys), kernel, stride, padding)
    close(pairs, rtol=1e-5, atol=1e-6)
    y, dy = pairs[0][0], rnd(*ys, seed=1)
    if kind == "max":
        pairs, _, _ = both(cp, "maxpool_backward", x, y, dy, Out(xs), kernel, stride, padding)
    else:
        pairs, _, _ = both(cp, "avgpool_backward", dy, Out(xs), kernel, stride, padding)
    close(pairs, rtol=1e-5, atol=1e-5)


def test_global_avgpool_and_linear(cp, dev):
    x = rnd(4, 6, 5, 5)
    pairs, _, _ = both(cp, "global_avgpool_forward", x, Out((4, 6)))
    close(pairs, rtol=1e-5, atol=1e-6)
    pairs, _, _ = both(cp, "global_avgpool_backward", rnd(4, 6, seed=1), Out((4, 6, 5, 5)))
    close(pairs, rtol=1e-6, atol=1e-7)
    x, w, b = rnd(8, 20), rnd(5, 20, seed=1), rnd(5, seed=2)
    pairs, _, _ = both(cp, "linear_forward", x, w, b, Out((8, 5)))
    close(pairs, rtol=1e-5, atol=1e-5)
    pairs, _, _ = both(cp, "linear_backward", x, w, rnd(8, 5, seed=3), Out((8, 20)), Out((5, 20)),
                       Out((5,)))
    close(pairs, rtol=1e-5, atol=1e-5)


def test_dropout(cp, dev):
    shape, p, seed = (8, 16, 5, 5), 0.3, 987654321
    x = cp.asarray(rnd(*shape))
    y, m = cp.empty(shape, cp.float32), cp.empty(shape, cp.uint8)
    K.dropout_forward(x, y, m, p, seed)
    mask = K.dropout_mask_reference(shape, p, seed)
    assert np.array_equal(cp.asnumpy(m), mask)           # the documented hash, bit for bit
    ref = np.empty(shape, np.float32)
    R.dropout_apply(cp.asnumpy(x), ref, mask, p)
    assert np.array_equal(cp.asnumpy(y), ref)
    y2 = cp.empty(shape, cp.float32)
    K.dropout_apply(x, y2, m, p)                          # recompute reuses the mask
    assert cp.array_equal(y, y2)
    dy = rnd(*shape, seed=1)
    pairs, _, _ = both(cp, "dropout_backward", dy, mask, Out(shape), p)
    assert np.array_equal(pairs[0][1], pairs[0][0])
    m2 = cp.empty(shape, cp.uint8)
    K.dropout_forward(x, y2, m2, p, seed)
    assert cp.array_equal(m, m2)                          # deterministic in the seed


@pytest.mark.parametrize("size", [5, 3, 4])      # odd: cuDNN; even: the CuPy kernels
def test_lrn(cp, dev, size):
    shape = (2, 7, 4, 5)
    x = rnd(*shape, scale=2.0)
    pairs, _, _ = both(cp, "lrn_forward", x, Out(shape), size, 1e-2, 0.75, 2.0)
    close(pairs, rtol=1e-5, atol=1e-6)
    y = pairs[0][0]
    pairs, _, _ = both(cp, "lrn_backward", x, y, rnd(*shape, seed=1), Out(shape), size, 1e-2,
                       0.75, 2.0)
    close(pairs, rtol=1e-4, atol=1e-5)


def test_add_and_concat(cp, dev):
    a, b, c = rnd(2, 3, 4, 4), rnd(2, 3, 4, 4, seed=1), rnd(2, 3, 4, 4, seed=2)
    pairs, _, _ = both(cp, "add_forward", [a, b, c], Out((2, 3, 4, 4)))
    close(pairs, rtol=1e-6, atol=1e-6)
    d = rnd(2, 5, 4, 4, seed=3)
    pairs, _, _ = both(cp, "concat_forward", [a, d], Out((2, 8, 4, 4)))
    close(pairs, rtol=0, atol=0)
    dy = rnd(2, 8, 4, 4, seed=4)
    pairs, _, _ = both(cp, "concat_backward", dy, [Out((2, 3, 4, 4)), None])
    close(pairs, rtol=0, atol=0)


def test_softmax_cross_entropy(cp, dev):
    logits = rnd(16, 10, scale=4.0)
    logits[0, 3] = 80.0                                   # a confident sample: lse, not log(p)
    labels = np.random.default_rng(1).integers(0, 10, 16).astype(np.int64)
    pairs, ref_loss, gpu_loss = both(cp, "softmax_xent_forward", logits, labels, Out((16, 10)))
    close(pairs, rtol=1e-5, atol=1e-7)
    assert isinstance(gpu_loss, float) and gpu_loss == pytest.approx(ref_loss, rel=1e-6)
    pairs, _, _ = both(cp, "softmax_xent_backward", pairs[0][0], labels, Out((16, 10)))
    close(pairs, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("momentum, wd, nesterov, first", [
    (0.9, 0.0, False, False), (0.9, 5e-4, False, False), (0.9, 1e-4, True, False),
    (0.0, 1e-4, False, False), (0.9, 0.0, False, True)])
def test_sgd_update_matches_torch_semantics(cp, dev, momentum, wd, nesterov, first):
    p, g, v = rnd(1000), rnd(1000, seed=1), rnd(1000, seed=2)
    vel = InOut(v) if momentum else None
    pairs, _, _ = both(cp, "sgd_update", InOut(p), g, vel, 0.1, momentum, wd, nesterov, first)
    for r, gg in pairs:         # fused multiply-adds on both sides: at most one ulp apart
        np.testing.assert_array_max_ulp(gg, r, maxulp=1)


def test_memory_primitives(cp, dev):
    a = cp.empty((3, 4), cp.float32)
    K.fill(a, 2.5)
    assert float(a.sum()) == 30.0
    host = rnd(3, 4)
    K.copy(a, host)                                       # host -> device (the data layer)
    assert np.array_equal(cp.asnumpy(a), host)
    labels = cp.empty(5, cp.int64)
    K.copy(labels, np.arange(5))
    assert cp.asnumpy(labels).tolist() == [0, 1, 2, 3, 4]
    big = cp.zeros((3, 8), cp.float32)
    K.copy(big[:, ::2], host)                             # strided destination
    assert np.array_equal(cp.asnumpy(big[:, ::2]), host)
    b = cp.asarray(rnd(3, 4, seed=1))
    K.add_inplace(a, b)
    np.testing.assert_allclose(cp.asnumpy(a), host + cp.asnumpy(b), rtol=1e-6)


# ----------------------------------------------------------------------------------------------
# ABI against the headers (g++), device, transfers
# ----------------------------------------------------------------------------------------------

def test_ctypes_layout_matches_cudnn_headers_compiled_with_gpp():
    cc = shutil.which("g++") or shutil.which("gcc")
    inc = dnn.find_include_dir()
    if cc is None or inc is None:
        pytest.skip("g++ or the cuDNN headers are missing")
    assert dnn.check_headers(inc, cc) == []


def test_views_are_zero_copy_and_bounded(cp, dev):
    v = dev.view(4096, (10,), np.float32)
    assert v.data.ptr == dev.arena.ptr + 4096
    v.fill(1.0)
    raw = dev.view(4096, (40,), np.uint8)
    assert cp.asnumpy(raw).tobytes() == np.ones(10, np.float32).tobytes()
    with pytest.raises(ValueError):
        dev.view(dev.arena_bytes - 8, (4,), np.float32)
    with pytest.raises(ValueError):
        dev.view(2, (4,), np.float32)                     # misaligned for float32


def test_cupy_temporaries_live_in_the_arena(cp, dev):
    a = cp.empty(12345, cp.float32)
    lo, hi = dev.layout.base, dev.scratch_layout.end
    assert lo <= a.data.ptr < hi
    n = dev.allocator.live_count
    b = a * 2                                             # an elementwise temporary
    assert dev.allocator.live_count == n + 1 and lo <= b.data.ptr < hi
    del b
    assert dev.allocator.live_count == n


def test_arena_larger_than_the_card_is_a_budget_error(cp, dev):
    from neuron.devices.cuda import CudaDevice
    from neuron.errors import MemoryBudgetError
    total = cp.cuda.runtime.memGetInfo()[1]
    with pytest.raises(MemoryBudgetError, match=r"cannot allocate a \d+ byte arena") as ei:
        CudaDevice(2 * total)
    assert ei.value.requested >= 2 * total
    cp.cuda.Stream.null.use()
    dev.compute_stream.use()


def test_pinned_pool_reuses_page_locked_buffers(cp, dev):
    a = dev.host_pool.get(1 << 20)
    assert cp.cuda.pinned_memory.is_memory_pinned(a.__array_interface__["data"][0])
    dev.host_pool.release(a)
    b = dev.host_pool.get((1 << 20) - 10)
    assert b.__array_interface__["data"][0] == a.__array_interface__["data"][0]
    dev.host_pool.release(b)


_SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
}
"""


def test_offload_and_prefetch_overlap_compute(cp, dev):
    spin = cp.RawKernel(_SPIN, "spin")
    n = 32 << 20                                          # 128 MiB of float32
    src = cp.arange(n, dtype=cp.float32)
    dst = cp.empty(n, cp.float32)
    host = dev.host_pool.get(src.nbytes)
    dev.synchronize()
    # offload: issued while compute is idle, then compute is kept busy for ~0.5-1 s
    t0 = time.perf_counter()
    ev = dev.offload(src, host)
    spin((1,), (1,), (np.int64(1_500_000_000),))
    dev.wait(ev)
    t_copy = time.perf_counter() - t0
    assert not dev.compute_stream.done, "the copy should finish while compute still runs"
    dev.synchronize()
    t_all = time.perf_counter() - t0
    assert t_copy < t_all
    assert np.array_equal(host.view(np.float32)[:5], np.arange(5, dtype=np.float32))
    # prefetch: same, host -> device; compute waits only when told to
    ev = dev.prefetch(host, dst, compute_waits=False)
    spin((1,), (1,), (np.int64(1_500_000_000),))
    dev.wait(ev)
    assert not dev.compute_stream.done
    assert dev.is_done(ev)
    dev.compute_wait(ev)
    assert bool(cp.array_equal(dst, src))
    dev.synchronize()
    dev.host_pool.release(host)


def test_pool_interface_copies_round_trip(cp, dev):
    src = cp.arange(1000, dtype=cp.float32)
    buf = dev.host_allocator()(4096)
    assert cp.cuda.pinned_memory.is_memory_pinned(buf.__array_interface__["data"][0])
    dev.copy_to_host(src, buf, src.nbytes)      # synchronous: the block may be freed now
    assert np.array_equal(buf[:4000].view(np.float32), np.arange(1000, dtype=np.float32))
    dst = cp.zeros(1000, cp.float32)
    dev.copy_to_device(buf, dst, dst.nbytes)
    assert bool(cp.array_equal(dst, src))


# ----------------------------------------------------------------------------------------------
# a training step end to end
# ----------------------------------------------------------------------------------------------

def _tiny_resnet():
    import neuron as nn
    from neuron.layers import Add, BatchNorm, Conv2d, GlobalAvgPool, Linear, MaxPool2d, ReLU

    def cbr(x, out, k, s, p, name, relu=True):
        y = Conv2d(out, k, s, p, bias=False, name=name + ".conv")(x)
        y = BatchNorm(name=name + ".bn")(y)
        return ReLU(name=name + ".relu")(y) if relu else y

    x = nn.Input((3, 32, 32), name="data")
    h = cbr(x, 16, 3, 1, 1, "stem")
    h = MaxPool2d(3, 2, 1, name="pool")(h)
    y = cbr(cbr(h, 16, 3, 1, 1, "b1a"), 16, 3, 1, 1, "b1b", relu=False)
    h = ReLU(name="b1.relu")(Add(name="b1.add")(h, y))
    y = cbr(cbr(h, 32, 3, 2, 1, "b2a"), 32, 3, 1, 1, "b2b", relu=False)
    sc = cbr(h, 32, 1, 2, 0, "b2s", relu=False)
    h = ReLU(name="b2.relu")(Add(name="b2.add")(sc, y))
    logits = Linear(10, name="fc")(GlobalAvgPool(name="gap")(h))
    return nn.Graph(x, logits, name="tiny_resnet")


def test_resnet_training_step_gpu_matches_cpu(cp, dev):
    import neuron as nn
    from neuron.executor import Executor
    graph = _tiny_resnet()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 3, 32, 32)).astype(np.float32)
    y = rng.integers(0, 10, 8)
    results = {}
    for kind in ("cpu", "cuda"):
        ex = Executor(graph, 8, device=kind, optimizer=nn.SGD(lr=0.1, momentum=0.9), seed=0)
        losses = [ex.train_step(x, y) for _ in range(2)]
        results[kind] = (losses, ex.state_dict())
        if kind == "cuda":
            assert ex.device.name == "cuda"
            ex.device.close()
            dev.compute_stream.use()
    (l_cpu, s_cpu), (l_gpu, s_gpu) = results["cpu"], results["cuda"]
    assert l_gpu == pytest.approx(l_cpu, rel=1e-4)
    assert s_cpu.keys() == s_gpu.keys()
    for k in s_cpu:
        np.testing.assert_allclose(s_gpu[k], s_cpu[k], rtol=2e-3, atol=2e-4, err_msg=k)
