"""GPU tests: collected everywhere, skipped (with the reason) where CuPy or a GPU is missing."""
import os
import sys

import pytest

_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)


def _why_no_gpu():
    try:
        import cupy
    except Exception as e:              # not installed, or a broken install
        return f"cupy is not importable ({type(e).__name__}: {e})"
    try:
        if not cupy.cuda.is_available():
            return "cupy.cuda.is_available() is False (no GPU or driver)"
    except Exception as e:              # CuPy 13 raised instead of returning False
        return f"no usable GPU ({type(e).__name__}: {e})"
    return None


NO_GPU = _why_no_gpu()


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
