"""kernels/cublas.py on the CPU: the row-major product mapped onto cuBLAS's column-major gemm,
checked by running that gemm's definition over the operands' memory in NumPy (the real library
runs in tests/gpu/test_cublas_gpu.py)."""
import numpy as np
import pytest

from neuron.kernels import cublas


def _column_major(flat, rows, cols, ld):
    """The rows x cols column-major matrix at ``flat`` with leading dimension ``ld``."""
    idx = np.arange(rows)[:, None] + np.arange(cols)[None, :] * ld
    return flat[idx]


def _cublas_gemm(transa, transb, M, N, K, A, lda, B, ldb, ldc):
    """cuBLAS's definition: C = op(A) op(B), C is M x N column-major with leading dim ldc."""
    opa = _column_major(A, M, K, lda) if transa == cublas.OP_N else _column_major(A, K, M, lda).T
    opb = _column_major(B, K, N, ldb) if transb == cublas.OP_N else _column_major(B, N, K, ldb).T
    C = opa @ opb
    out = np.zeros(max(ldc * N, 1))
    out[(np.arange(M)[:, None] + np.arange(N)[None, :] * ldc).ravel()] = C.ravel()
    return out


def _operand(rng, rows, cols, order):
    """A rows x cols operand: C-contiguous, or a transposed view of a C-contiguous array."""
    if order == "C":
        return rng.standard_normal((rows, cols))
    return rng.standard_normal((cols, rows)).T


@pytest.mark.parametrize("a_order", ["C", "F"])
@pytest.mark.parametrize("b_order", ["C", "F"])
@pytest.mark.parametrize("mnk", [(3, 5, 4), (1, 7, 2), (6, 1, 3), (4, 4, 1), (1, 1, 1)])
def test_gemm_args_compute_the_row_major_product(a_order, b_order, mnk):
    m, n, k = mnk
    rng = np.random.default_rng(m * 100 + n * 10 + k)
    a, b = _operand(rng, m, k, a_order), _operand(rng, k, n, b_order)
    order_a = "C" if a.flags.c_contiguous else "F"
    order_b = "C" if b.flags.c_contiguous else "F"
    transa, transb, M, N, K, lda, ldb, ldc = cublas.gemm_args(m, n, k, order_a, order_b)
    # the operands' memory, as cuBLAS sees it: A is b's, B is a's
    mem_b, mem_a = b.ravel(order="K"), a.ravel(order="K")
    out = _cublas_gemm(transa, transb, M, N, K, mem_b, lda, mem_a, ldb, ldc)
    np.testing.assert_allclose(out[:m * n].reshape(m, n), a @ b, rtol=1e-12, atol=1e-12)


def test_gemm_args_refuse_an_empty_product():
    assert cublas.gemm_args(0, 3, 2, "C", "C") is None
    assert cublas.gemm_args(2, 3, 0, "C", "C") is None


def test_a_wrong_mapping_is_caught():
    """The check above can fail: the operands in cuBLAS's other order give another matrix."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((4, 4)), rng.standard_normal((4, 4))
    transa, transb, M, N, K, lda, ldb, ldc = cublas.gemm_args(4, 4, 4, "C", "C")
    out = _cublas_gemm(transa, transb, M, N, K, a.ravel(), lda, b.ravel(), ldb, ldc)
    assert not np.allclose(out.reshape(4, 4), a @ b)
