"""The GPU path's own kernels (kernels/cuda_raw.py) and the wrappers that call them
(kernels/cuda.py, cuda_pool.py), run without a GPU and compared with numpy_ref.

The CuPy stand-in (cuda_standins/) makes each ``ElementwiseKernel`` out of its very source,
compiled by g++; everything else the wrappers ask of CuPy is NumPy's. So this checks the argument
order and geometry the wrappers pass, the indexing and the arithmetic. Kernels compiled with
``--fmad=false`` are built with ``-ffp-contract=off`` and must agree bit for bit; CUDA's pow, exp
and log may differ from glibc's by an ulp or two, so LRN and the loss rows get a tolerance.
The cuDNN paths (floor-mode pooling, odd LRN windows, convolutions, BN) are the cuDNN
stand-in's here: test_cuda_on_standins.py trains through them. Skipped without g++."""
from __future__ import annotations

import numpy as np
import pytest

from neuron.kernels import cuda, cuda_pool, cuda_raw, numpy_ref


def _x(shape, seed=0, dtype=np.float32, ties=False):
    x = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    return np.round(x * 2) / 2 if ties else x          # ties: equal maxima in one window


def _both(fn_name, *arrays_then_args, out):
    """Run numpy_ref's and cuda's ``fn_name`` on copies; returns (want, got) of ``out``."""
    res = []
    for mod in (numpy_ref, cuda):
        args = [a.copy() if isinstance(a, np.ndarray) else a for a in arrays_then_args]
        getattr(mod, fn_name)(*args)
        res.append(args[out])
    return res


@pytest.mark.parametrize("padding", [0, 1])
@pytest.mark.parametrize("accumulate", [False, True])
def test_ceil_mode_max_pooling(gpu_kernels, padding, accumulate):
    x = _x((2, 3, 8, 9), ties=True)
    ho, wo = numpy_ref.pool_out_hw(8, 9, (3, 3), (2, 2), (padding, padding), ceil_mode=True)
    assert (ho, wo) != numpy_ref.pool_out_hw(8, 9, (3, 3), (2, 2), (padding, padding))
    y = np.zeros((2, 3, ho, wo), np.float32)
    want, got = _both("maxpool_forward", x, y, 3, 2, padding, out=1)
    np.testing.assert_array_equal(got, want)
    dy, dx = _x(want.shape, 1), _x(x.shape, 2)
    want_dx, got_dx = _both("maxpool_backward", x, want, dy, dx, 3, 2, padding, accumulate,
                            out=3)
    # overlapping windows: the kernel gathers per input element in window order, NumPy
    # scatters per tap, so sums of several gradients may round differently (a gradient sent
    # to the wrong element would be off by a whole value)
    np.testing.assert_allclose(got_dx, want_dx, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("ceil", [False, True])
def test_average_pooling(gpu_kernels, ceil):
    x = _x((2, 2, 8, 9))
    ho, wo = numpy_ref.pool_out_hw(8, 9, (3, 2), (2, 2), (1, 0), ceil_mode=ceil)
    if ceil:                        # floor-mode forward is cuDNN's; backward is always ours
        assert (ho, wo) != numpy_ref.pool_out_hw(8, 9, (3, 2), (2, 2), (1, 0))
        y = np.zeros((2, 2, ho, wo), np.float32)
        want, got = _both("avgpool_forward", x, y, (3, 2), 2, (1, 0), out=1)
        np.testing.assert_array_equal(got, want)
    dy = _x((2, 2, ho, wo), 3)
    for accumulate in (False, True):
        want, got = _both("avgpool_backward", dy, _x(x.shape, 4), (3, 2), 2, (1, 0),
                          accumulate, out=1)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("size,k", [(4, 2.0), (2, 1.0), (5, 1e-6)])
def test_lrn_where_cudnn_is_not_used(gpu_kernels, size, k):
    """An even window (cuDNN centres it one channel off torch's) or k below cuDNN's bound."""
    args = (size, 1e-2, 0.75, k)
    assert not cuda_pool._lrn_cudnn_ok(*args)
    x = _x((2, 6, 3, 4))
    y = np.zeros_like(x)
    want, got = _both("lrn_forward", x, y, *args, out=1)
    np.testing.assert_allclose(got, want, rtol=2e-6)
    dy = _x(x.shape, 5)
    want_dx, got_dx = _both("lrn_backward", x, want, dy, np.zeros_like(x), *args, out=3)
    np.testing.assert_allclose(got_dx, want_dx, rtol=2e-5, atol=1e-6)


def test_activations_without_cudnn(gpu_kernels):
    y, dy = _x((4, 33)), _x((4, 33), 1)
    s = 1 / (1 + np.exp(-y))
    for name, out_arg in (("sigmoid_backward", s), ("tanh_backward", np.tanh(y))):
        for accumulate in (False, True):
            want, got = _both(name, out_arg, dy, _x(y.shape, 2), accumulate, out=2)
            np.testing.assert_array_equal(got, want)
    want, got = _both("leaky_relu_forward", y, np.zeros_like(y), 0.1, out=1)
    np.testing.assert_array_equal(got, want)
    want, got = _both("leaky_relu_backward", want, dy, _x(y.shape, 3), 0.1, True, out=2)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("batch_offset", [0, 3])
def test_dropout_mask_and_scaling(gpu_kernels, batch_offset):
    """The GPU draws the counter-hash mask of dropout_mask.py (NumPy's generator is the CPU's,
    another mask by design); a chunk of the batch gets its part of the whole batch's mask."""
    from neuron.kernels.dropout_mask import dropout_mask_reference
    x = _x((4, 5, 6))
    y, mask = np.zeros_like(x), np.zeros(x.shape, np.uint8)
    cuda.dropout_forward(x, y, mask, 0.3, 1234, batch_offset)
    whole = dropout_mask_reference((batch_offset + 4, 5, 6), 0.3, 1234)
    np.testing.assert_array_equal(mask, whole[batch_offset:])
    assert 0.5 < mask.mean() < 0.9
    want = np.zeros_like(x)
    numpy_ref.dropout_apply(x, want, mask, 0.3)
    np.testing.assert_array_equal(y, want)
    dy = _x(x.shape, 1)
    a = _x(x.shape, 2)
    b = a.copy()
    numpy_ref.dropout_backward(dy, mask, a, 0.3, True)
    cuda.dropout_backward(dy, mask, b, 0.3, True)
    np.testing.assert_array_equal(b, a)


def test_softmax_loss_rows_and_gradient(gpu_kernels):
    logits = _x((6, 10)) * 30                          # large: the log-sum-exp must be stable
    labels = np.array([0, 9, 3, 3, 7, 1])
    probs = np.zeros_like(logits)
    want = numpy_ref.softmax_xent_forward(logits, labels, probs)
    rows = np.zeros(6, np.float64)
    cuda_raw._k_xent()[0](logits, labels.astype(np.int64), np.int64(10), rows)
    z = logits.astype(np.float64)                      # the kernel works in float64 throughout
    exact = np.log(np.exp(z - z.max(1, keepdims=True)).sum(1)) + z.max(1) - z[range(6), labels]
    np.testing.assert_allclose(rows, exact, rtol=1e-12)
    np.testing.assert_allclose(rows.mean(), want, rtol=1e-6)   # NumPy's exp is float32
    for accumulate, total in ((False, None), (True, 12)):
        a = _x(logits.shape, 1)
        b = a.copy()
        numpy_ref.softmax_xent_backward(probs, labels, a, accumulate, total)
        cuda.softmax_xent_backward(probs, labels, b, accumulate, total)
        np.testing.assert_array_equal(b, a)


@pytest.mark.parametrize("momentum,nesterov,wd", [(0.0, False, 0.0), (0.0, False, 1e-3),
                                                  (0.9, False, 0.0), (0.9, True, 5e-4)])
def test_the_sgd_step(gpu_kernels, momentum, nesterov, wd):
    p0, g = _x((300,)), _x((300,), 1)
    for first in (True, False):
        v0 = _x((300,), 2) if momentum else None
        runs = []
        for mod in (numpy_ref, cuda):
            p, v = p0.copy(), (v0.copy() if v0 is not None else None)
            flag = np.zeros(1, bool)
            mod.sgd_update(p, g, v, 0.1, momentum, wd, nesterov, first_step=first, flag=flag)
            runs.append((p, v, flag))
        (p_want, v_want, f_want), (p_got, v_got, f_got) = runs
        np.testing.assert_array_equal(p_got, p_want)
        if momentum:
            np.testing.assert_array_equal(v_got, v_want)
        assert not f_got[0] and not f_want[0]
    p, flag = np.full(3, 3e38, np.float32), np.zeros(1, bool)
    cuda.sgd_update(p, np.full(3, -3e38, np.float32), None, 10.0, 0.0, 0.0, False, flag=flag)
    assert flag[0]                                      # the fused finiteness check


def test_the_stand_in_refuses_a_wrong_argument(gpu_kernels):
    """It could fail: a kernel called with the wrong dtype or a missing argument is an error."""
    y = _x((3, 4))
    with pytest.raises(AssertionError, match="expected float32|is float64"):
        cuda_raw._k_sigmoid_bwd()(y, y.astype(np.float64), np.zeros_like(y))
    with pytest.raises(AssertionError, match="arguments"):
        cuda_raw._k_sigmoid_bwd()(y, np.zeros_like(y))


def _dev(a):
    from cuda_standins import DevArray
    return np.ascontiguousarray(a).view(DevArray)


def _fused_launches():
    from cuda_standins.cupy_arrays import _RawFunction
    return sum(n for name, n in _RawFunction.launches.items() if "sgd_many" in name)


#: sizes around the kernel's chunk (several blocks, a partial one, one element)
_SIZES = (cuda_raw.SGD_MANY_CHUNK * 2 + 5, 3, cuda_raw.SGD_MANY_CHUNK, 1, 700)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("momentum,nesterov,wd", [(0.0, False, 0.0), (0.0, False, 1e-3),
                                                  (0.9, False, 0.0), (0.9, True, 5e-4)])
def test_one_sgd_launch_for_several_tensors(gpu_kernels, dtype, momentum, nesterov, wd):
    """cuda.sgd_update_many gives the per-tensor kernel's bits in one launch (first step and
    later ones, with a learning rate given or read from a device buffer)."""
    ps = [_x((n,), k, dtype) for k, n in enumerate(_SIZES)]
    gs = [_x((n,), 10 + k, dtype) for k, n in enumerate(_SIZES)]
    vs = [_x((n,), 20 + k, dtype) for k, n in enumerate(_SIZES)]
    for first in (True, False):
        for lr_buffer in (None, _dev(np.array([-0.1], dtype))):
            runs = []
            for many in (False, True):
                p, g = [_dev(a.copy()) for a in ps], [_dev(a) for a in gs]
                v = [_dev(a.copy()) for a in vs] if momentum else [None] * len(ps)
                flag = _dev(np.zeros(1, bool))
                before = _fused_launches()
                if many:
                    cuda.sgd_update_many(p, g, v, 0.1, momentum, wd, nesterov, first, flag=flag,
                                         neg_lr_buffer=lr_buffer)
                else:
                    for a, b, c in zip(p, g, v):
                        cuda.sgd_update(a, b, c, 0.1, momentum, wd, nesterov, first, flag=flag,
                                        neg_lr_buffer=lr_buffer)
                assert _fused_launches() - before == int(many)
                runs.append((p, v, flag))
            (p0, v0, f0), (p1, v1, f1) = runs
            assert all(a.tobytes() == b.tobytes() for a, b in zip(p0, p1))
            if momentum:
                assert all(a.tobytes() == b.tobytes() for a, b in zip(v0, v1))
            assert not f0[0] and not f1[0]


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_the_fused_step_sets_the_guard_flag(gpu_kernels, momentum):
    """A non-finite result in any one tensor (the last element of a later block) sets it."""
    p = [_dev(_x((n,), k)) for k, n in enumerate(_SIZES)]
    g = [_dev(_x((n,), 10 + k)) for k, n in enumerate(_SIZES)]
    v = [_dev(np.zeros(n, np.float32)) for n in _SIZES] if momentum else [None] * len(p)
    g[0][-1] = np.float32(3e38)
    flag = _dev(np.zeros(1, bool))
    cuda.sgd_update_many(p, g, v, 10.0, momentum, 0.0, False, flag=flag)
    assert flag[0] and not np.isfinite(p[0][-1])
    flag[0] = False
    g[0][-1] = 0.0
    cuda.sgd_update_many(p, g, v, 0.0001, momentum, 0.0, False, flag=flag)
    assert flag[0] == (not np.isfinite(p[0][-1]))


def test_the_pointer_table_is_made_once_per_set_of_addresses(gpu_kernels):
    from neuron.kernels.pointer_tables import TABLES
    p = [_dev(_x((n,), k)) for k, n in enumerate(_SIZES)]
    g = [_dev(_x((n,), 10 + k)) for k, n in enumerate(_SIZES)]
    v = [_dev(np.zeros(n, np.float32)) for n in _SIZES]
    start = TABLES.uploads
    for _ in range(3):
        cuda.sgd_update_many(p, g, v, 0.1, 0.9, 0.0, False)
    assert TABLES.uploads == start + 1
    cuda.sgd_update_many(p[:2], g[:2], v[:2], 0.1, 0.9, 0.0, False)     # other tensors
    assert TABLES.uploads == start + 2


def test_where_one_launch_cannot_serve_the_tensors_are_updated_one_by_one(gpu_kernels,
                                                                          monkeypatch):
    """One tensor, mixed dtypes, a gradient of other strides, or the switch off: the
    per-tensor kernels, with their bits; a dtype the kernel has no variant for, too."""
    a, b = _x((40,)), _x((6, 7), 1)
    cases = {
        "one tensor": ([a], [_x((40,), 2)]),
        "mixed dtypes": ([a, b.astype(np.float64)], [_x((40,), 2), _x((6, 7), 3, np.float64)]),
        "strides": ([a, b], [_x((40,), 2), np.asfortranarray(_x((6, 7), 3))]),
        "switch off": ([a, b], [_x((40,), 2), _x((6, 7), 3)]),
    }
    for why, (ps, gs) in cases.items():
        monkeypatch.setattr(cuda, "sgd_per_layer", why != "switch off")
        before = _fused_launches()
        p1, p2 = [_dev(x.copy()) for x in ps], [_dev(x.copy()) for x in ps]
        g = [np.asarray(x).view(type(p1[0])) for x in gs]
        cuda.sgd_update_many(p1, g, [None] * len(ps), 0.1, 0.0, 1e-3, False)
        for p, gg in zip(p2, g):
            cuda.sgd_update(p, gg, None, 0.1, 0.0, 1e-3, False)
        assert _fused_launches() == before, why
        assert all(x.tobytes() == y.tobytes() for x, y in zip(p1, p2)), why
    monkeypatch.setattr(cuda, "sgd_per_layer", True)
    half = [_dev(a.astype(np.float16)), _dev(b.astype(np.float16))]
    assert cuda._sgd_table(half, half, [None, None], 0.0) is None
    assert cuda._sgd_table([_dev(a), _dev(b)], [_dev(a), _dev(b)], [None, None], 0.0)
    with pytest.raises(ValueError, match="velocity buffer for every parameter"):
        cuda.sgd_update_many([_dev(a), _dev(a)], [_dev(a), _dev(a)], [None, None], 0.1, 0.9,
                             0.0, False)


def test_the_raw_kernel_stand_in_refuses_a_wrong_argument(gpu_kernels):
    """It could fail: a float64 scalar where the kernel takes a float (on a GPU CuPy would pass
    its 8 bytes, and the step would read garbage), or an argument too few."""
    p = [_dev(_x((5,), k)) for k in range(2)]
    table = cuda._sgd_table(p, p, [None, None], 0.0)[0]
    k = cuda_raw._k_sgd_many("float32")
    args = (table, np.int32(2), np.float32(0), np.float32(0), np.float32(-0.1), np.int32(0),
            np.int32(0), np.int32(0))
    k((1,), (32,), args)
    with pytest.raises(AssertionError, match="wd is a float, given float64"):
        k((1,), (32,), args[:2] + (np.float64(0),) + args[3:])
    with pytest.raises(AssertionError, match="7 arguments for 8"):
        k((1,), (32,), args[:-1])
