"""GPU: neuron's own cuBLAS handle (kernels/cublas.py) computes what cupy.matmul computes, and
can be captured in a CUDA graph, which CuPy's cannot."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("a_t", [False, True])
@pytest.mark.parametrize("b_t", [False, True])
def test_gemm_matches_cupy_matmul(dtype, a_t, b_t):
    import cupy as cp
    from neuron.kernels import cublas
    rng = np.random.default_rng(7)
    m, n, k = 37, 19, 53
    a = cp.asarray(rng.standard_normal((k, m) if a_t else (m, k)).astype(dtype))
    b = cp.asarray(rng.standard_normal((n, k) if b_t else (k, n)).astype(dtype))
    a, b = (a.T if a_t else a), (b.T if b_t else b)
    out = cp.full((m, n), np.nan, dtype)            # poisoned: every element must be written
    assert cublas.gemm(cp, a, b, out)
    ref = cp.asnumpy(a).astype(np.float64) @ cp.asnumpy(b).astype(np.float64)
    got = cp.asnumpy(out).astype(np.float64)
    assert np.isfinite(got).all()
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert err < (1e-5 if dtype == np.float32 else 1e-12), err


def test_gemm_is_captured_in_a_cuda_graph():
    import cupy as cp
    from neuron.kernels import cublas
    rng = np.random.default_rng(8)
    a = cp.asarray(rng.standard_normal((64, 32)).astype(np.float32))
    b = cp.asarray(rng.standard_normal((32, 16)).astype(np.float32))
    out = cp.zeros((64, 16), np.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        assert cublas.gemm(cp, a, b, out)           # warm: the handle binds to the stream
        stream.begin_capture()
        try:
            cublas.gemm(cp, a, b, out)
        finally:
            graph = stream.end_capture()
        out.fill(0)
        a[...] = cp.asarray(rng.standard_normal((64, 32)).astype(np.float32))
        graph.launch(stream=stream)
        stream.synchronize()
    ref = cp.asnumpy(a) @ cp.asnumpy(b)
    np.testing.assert_allclose(cp.asnumpy(out), ref, rtol=1e-4, atol=1e-4)
