"""Shared helpers of the numpy_ref tests: finite-difference gradients and test inputs."""
import numpy as np
import pytest

F64 = np.float64
H_FD = 1e-6
TOL = 1e-6

def rng(seed=0):
    return np.random.default_rng(seed)


def garbage(shape, dtype=F64):
    """Outputs start as NaN: backward kernels must overwrite, not accumulate."""
    return np.full(shape, np.nan, dtype=dtype)


def numgrad(loss, a, h=H_FD):
    """Central-difference gradient of the scalar loss() w.r.t. array a
    (perturbed in place)."""
    assert a.flags.c_contiguous
    flat = a.reshape(-1)
    g = np.empty(a.size, dtype=F64)
    for i in range(a.size):
        old = flat[i]
        flat[i] = old + h
        fp = loss()
        flat[i] = old - h
        fm = loss()
        flat[i] = old
        g[i] = (fp - fm) / (2 * h)
    return g.reshape(a.shape)


def relerr(num, ana):
    num = np.asarray(num, dtype=F64)
    ana = np.asarray(ana, dtype=F64)
    den = np.linalg.norm(num) + np.linalg.norm(ana)
    return np.linalg.norm(num - ana) / max(den, 1e-300)


def assert_grad(num, ana, tol=TOL):
    assert np.all(np.isfinite(ana))
    err = relerr(num, ana)
    assert err < tol, f"relative error {err:.3e}"


def proj_loss(fwd, out_shape, seed=123):
    """Returns (loss(), R) with loss = sum(R * fwd-output)."""
    r = rng(seed).standard_normal(out_shape)
    y = np.empty(out_shape)

    def loss():
        fwd(y)
        return float(np.sum(r * y))

    return loss, r


def distinct(shape, seed=0, spacing=0.01):
    """Random values pairwise at least `spacing` apart (no max-pool ties)."""
    n = int(np.prod(shape))
    v = rng(seed).permutation(n).astype(F64) * spacing - n * spacing / 2
    return v.reshape(shape)


def away_from_zero(shape, seed=0, margin=1e-2):
    x = rng(seed).standard_normal(shape)
    x[np.abs(x) < margin] += 3 * margin
    return x


def torch_or_skip():
    return pytest.importorskip("torch")
