"""Fixtures shared across test folders."""
import os

import numpy as np
import pytest

_KERNELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels")


def _codec_samples(n: int) -> np.ndarray:
    """n float32 values with the FreeLunch codecs' hard cases: a zero block, a block of ties
    (scale 2, odd integers), a subnormal, a large value; the rest spread over 60 decades."""
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 10.0 ** rng.integers(-30, 30, n)).astype(np.float32)
    x[: min(n, 40)] = 0.0
    if n >= 96:
        x[64:96] = np.r_[127.0, np.arange(1, 62, 2)] * np.tile([1, -1], 16)
    x[-3:] = [1e-42, -3e38, 0.5][-min(n, 3):]
    return x


@pytest.fixture(scope="session")
def codec_samples():
    return _codec_samples


def _interrupt_at(ex, n, exc=KeyboardInterrupt):
    """Make the n-th kernel call of ``ex``'s next step raise exc (as Ctrl-C would); returns the
    call that undoes it."""
    real, calls = ex._compute, [0]

    def compute(step, ctx, ws):
        calls[0] += 1
        if calls[0] == n:
            raise exc(f"injected at {step.name}")
        return real(step, ctx, ws)
    ex._compute = compute
    return lambda: ex.__dict__.pop("_compute", None)


@pytest.fixture(scope="session")
def interrupt_at():
    return _interrupt_at


@pytest.fixture
def cuda_standins(monkeypatch, tmp_path_factory):
    """The CuPy, CUDA runtime, cuDNN and NCCL stand-ins (tests/kernels/cuda_standins/)
    installed in this process for one test; yields the module. Kernels are compiled (with g++,
    when they run) into one folder for the session."""
    monkeypatch.syspath_prepend(_KERNELS)
    import cuda_standins
    if cuda_standins.ElementwiseKernel.build_dir is None:
        cuda_standins.ElementwiseKernel.build_dir = tmp_path_factory.mktemp("cuda_raw")
    cuda_standins.install(monkeypatch, cuda_standins.ElementwiseKernel.build_dir)
    yield cuda_standins
    cuda_standins.uninstall()


@pytest.fixture
def gpu_kernels(cuda_standins):
    """neuron.kernels.cuda running on the CPU over the stand-ins; skipped without g++, which
    compiles the raw kernels."""
    if not cuda_standins.have_compiler():
        pytest.skip("g++ is not installed")
    from neuron.kernels import cuda
    return cuda
