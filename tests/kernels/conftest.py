import os
import sys

# Make `import neuron` work when pytest is run without installing the package.
_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)


import pytest  # noqa: E402


@pytest.fixture
def gpu_kernels(monkeypatch, tmp_path_factory):
    """neuron.kernels.cuda running on the CPU over the CuPy and cuDNN stand-ins
    (cuda_standins.py); skipped without g++, which compiles the raw kernels."""
    import cuda_standins
    from neuron.kernels import cuda
    if not cuda_standins.have_compiler():
        pytest.skip("g++ is not installed")
    if cuda_standins.ElementwiseKernel.build_dir is None:
        cuda_standins.ElementwiseKernel.build_dir = tmp_path_factory.mktemp("cuda_raw")
    cuda_standins.install(monkeypatch, cuda_standins.ElementwiseKernel.build_dir)
    yield cuda
    cuda_standins.uninstall()
