"""GPU tests: collected everywhere, skipped (with the reason) where CuPy or a GPU is missing."""
import os
import sys

import pytest

_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from neuron.devices import cuda_unavailable_reason  # noqa: E402 (after the path)

NO_GPU = cuda_unavailable_reason()


def pytest_collection_modifyitems(config, items):
    if NO_GPU is None:
        return
    skip = pytest.mark.skip(reason=NO_GPU)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def deterministic_kernels():
    """Bit equality needs deterministic cuDNN algorithms: the fastest backward-filter ones sum
    with atomics, in an order that changes from run to run (seen on the H100, 2026-11-23)."""
    from neuron.kernels import cuda as K
    saved = K.deterministic
    K.deterministic = True
    yield
    K.deterministic = saved


@pytest.fixture(autouse=True)
def cupy_allocator_restored():
    """Each test starts with the CuPy allocator and stream it found: a CudaDevice a test left
    open routes CuPy's temporaries into its arena, and a later test's plain cupy arrays then
    fail to fit there (seen on the H200, 2026-11-27: 10 engine tests of tests/gpu)."""
    if NO_GPU is not None:
        yield
        return
    import cupy as cp
    allocator, stream = cp.cuda.get_allocator(), cp.cuda.get_current_stream()
    yield
    cp.cuda.set_allocator(allocator)
    stream.use()
