"""CudaDevice's CPU-testable parts: temporaries that do not fit name their kernel and step."""
from __future__ import annotations

import pytest

from neuron.cuda_device import ArenaAllocator, ArenaLayout, kernel_context
from neuron.errors import MemoryBudgetError
from neuron.memory.heap import Heap


def _in_module(name, src):
    g = {"__name__": name}
    exec(src, g)            # noqa: S102 (a function whose frame claims to live in `name`)
    return g


def test_a_temporary_that_does_not_fit_names_the_kernel_and_the_step():
    a = ArenaAllocator()
    a.add_region(Heap(1 << 16, block=256), ArenaLayout(0x100000, 1 << 16), "pool")
    kernels = _in_module("neuron.kernels.cuda", "def batchnorm_backward(a, n):\n"
                                                "    return a.malloc(n, 0)\n")
    executor = _in_module("neuron.executor", "def run(step, f, a, n):\n    return f(a, n)\n")
    step = type("Step", (), {"name": "B12:layer1.0.bn1"})()
    with pytest.raises(MemoryBudgetError) as e:
        executor["run"](step, kernels["batchnorm_backward"], a, 1 << 20)
    msg = str(e.value)
    assert "cuda.batchnorm_backward" in msg and "B12:layer1.0.bn1" in msg
    assert "1048576 bytes" in msg and e.value.requested == 1 << 20
    assert e.value.step == "B12:layer1.0.bn1"


def test_kernel_context_outside_the_kernels():
    assert kernel_context() == ("outside neuron's kernels", None)


def test_device_registry_resolves_lazily_and_names_the_kinds():
    import sys

    from neuron import devices
    assert devices._REGISTRY["cuda"] == "neuron.cuda_device:CudaDevice" or \
        "neuron.cuda_device" in sys.modules
    assert isinstance(devices.make_device("cpu", 1 << 16), devices.CpuDevice)
    with pytest.raises(ValueError, match="expected one of cpu, virtual, cuda"):
        devices.make_device("tpu", 1 << 16)

    class Tiny(devices.CpuDevice):
        name = "tiny"

    devices.register_device("tiny", Tiny)
    try:
        assert isinstance(devices.make_device("tiny", 1 << 16), Tiny)
    finally:
        del devices._REGISTRY["tiny"]
    with pytest.raises(ValueError, match="reserved"):
        devices.register_device("auto", Tiny)
