"""`--device cuda` says what is missing (neuron/devices/cuda_check.py), checked with stand-ins
for CuPy and cuDNN so that it runs without a GPU."""
import sys
import types

import pytest

from neuron.devices import cuda_check
from neuron.cli.main import main
from neuron.kernels import cudnn


def fake_cupy(devices=1, driver_error=None, nvrtc_error=None):
    def count():
        if driver_error:
            raise driver_error
        return devices

    def nvrtc_version():
        if nvrtc_error:
            raise nvrtc_error
        return (13, 0)
    runtime = types.SimpleNamespace(getDeviceCount=count, driverGetVersion=lambda: 12040)
    cuda = types.SimpleNamespace(runtime=runtime, nvrtc=types.SimpleNamespace(
        getVersion=nvrtc_version), is_available=lambda: devices > 0)
    return types.SimpleNamespace(cuda=cuda)


@pytest.fixture
def no_cudnn(monkeypatch):
    def missing():
        raise cudnn.CudnnNotFoundError([("system loader", "libcudnn.so.9: cannot open")])
    monkeypatch.setattr(cudnn, "lib", missing)


def test_without_cupy_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)        # import cupy -> ImportError
    problems = cuda_check.missing_for_cuda()
    assert "CuPy" in problems[0] and "cupy-cuda13x" in problems[0]
    with pytest.raises(cuda_check.CudaSetupError) as e:
        cuda_check.require_cuda()
    assert "neuron-arena[cuda]" in str(e.value) and "-e '.[cuda]'" in str(e.value)


def _no_driver():
    raise OSError("libcuda.so.1: cannot open shared object file")


def test_without_cupy_the_driver_and_cudnn_are_named_too(monkeypatch, no_cudnn):
    """A fresh machine lacks all three: one message names each (the driver is looked for
    through libcuda itself, without CuPy)."""
    monkeypatch.setitem(sys.modules, "cupy", None)
    monkeypatch.setattr(cuda_check, "_load_libcuda", _no_driver)
    problems = cuda_check.missing_for_cuda()
    assert len(problems) == 3, problems
    assert "CuPy" in problems[0] and "libcuda.so.1" in problems[1] and \
        "libcudnn.so.9" in problems[2]


class _CupyImportWatch:
    """A finder that fails every CuPy import as if it were not installed, and records whether
    the check was on the stack when the first one came."""

    def __init__(self):
        self.first = None

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] != "cupy":
            return None
        if self.first is None:
            import traceback
            self.first = [f"{f.filename}:{f.lineno}" for f in traceback.extract_stack()]
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)


@pytest.mark.parametrize("argv", [
    ["train", "resnet_cifar", "--depth", "8", "--iters", "1", "--batch", "4", "--no-progress"],
    ["profile", "resnet_cifar", "--depth", "8", "--batch", "2", "-o", "unused.json"],
    ["deepest", "resnet_cifar", "--budget", "64MiB", "--confirm"],
    ["train", "resnet_cifar", "--depth", "8", "--iters", "1", "--data-parallel"],
])
def test_the_check_runs_before_anything_imports_cupy(monkeypatch, capsys, no_cudnn, argv):
    for name in [m for m in sys.modules if m == "cupy" or m.startswith("cupy.")]:
        monkeypatch.delitem(sys.modules, name)
    watch = _CupyImportWatch()
    monkeypatch.setattr(sys, "meta_path", [watch, *sys.meta_path])
    monkeypatch.setattr(cuda_check, "_load_libcuda", _no_driver)
    rc = main([*argv, "--device", "cuda"])
    err = capsys.readouterr().err
    assert rc == 1 and len(err.strip().splitlines()) == 1, err
    assert "device cuda is not usable" in err and "CuPy" in err and "libcuda" in err and \
        "libcudnn" in err, err
    assert watch.first is not None
    assert any("cuda_check.py" in f for f in watch.first), "CuPy imported before the check:\n" \
        + "\n".join(watch.first)


def test_old_driver_and_missing_cudnn_are_both_named(monkeypatch, no_cudnn):
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(
        driver_error=RuntimeError("cudaErrorInsufficientDriver")))
    problems = cuda_check.missing_for_cuda()
    assert any("driver supports CUDA 12.4" in p and "InsufficientDriver" in p for p in problems)
    assert any("libcudnn.so.9" in p and "nvidia-cudnn-cu13" in p for p in problems)


def test_missing_nvrtc_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(nvrtc_error=OSError("libnvrtc.so.13")))
    monkeypatch.setattr(cudnn, "lib", lambda: object())
    assert cuda_check.missing_for_cuda() == [p for p in cuda_check.missing_for_cuda()
                                             if "NVRTC" in p and "libnvrtc.so.13" in p]
    assert len(cuda_check.missing_for_cuda()) == 1


def test_a_complete_stack_passes(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy())
    monkeypatch.setattr(cudnn, "lib", lambda: object())
    assert cuda_check.missing_for_cuda() == []
    cuda_check.require_cuda()


def test_train_device_cuda_fails_with_one_clear_message(monkeypatch, capsys, no_cudnn):
    monkeypatch.setitem(sys.modules, "cupy", None)
    rc = main(["train", "resnet_cifar", "--depth", "8", "--iters", "1", "--batch", "4",
               "--device", "cuda", "--no-progress"])
    err = capsys.readouterr().err
    assert rc != 0 and "device cuda is not usable" in err and "CuPy" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
