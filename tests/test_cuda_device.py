"""CudaDevice's CPU-testable parts: temporaries that do not fit name their kernel and step; the
stream ordering of its copies and codec work, against a CuPy stand-in that logs the streams."""
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


# ---- CudaDevice's stream ordering, against a CuPy stand-in that records the stream graph -----
# Every operation a stream runs is logged; "happens before" is the stream order plus the
# wait_event edges, as CUDA defines it. The tests check the orderings the pool relies on
# (tests/memory/stream_model.py models them for the pool) on CudaDevice's own code.

class _Event:
    def __init__(self, disable_timing=False):
        self.stream, self.pos, self.synced = None, None, False

    def synchronize(self):
        self.synced = True


class _Stream:
    def __init__(self, cp, name):
        self.cp, self.name, self.ops, self.synced = cp, name, [], False
        self.ptr = id(self)

    def record(self, event=None):
        ev = event or _Event()
        ev.stream, ev.pos = self, len(self.ops)
        self.ops.append(("record", ev))
        return ev

    def wait_event(self, ev):
        self.ops.append(("wait", ev))

    def synchronize(self):
        self.synced = True

    def __enter__(self):
        self.cp.current.append(self)

    def __exit__(self, *exc):
        self.cp.current.pop()


class _FakeCupy:
    def __init__(self):
        self.current = []
        runtime = type("runtime", (), {"memcpyDeviceToHost": "d2h", "memcpyHostToDevice": "h2d",
                                       "memcpyDeviceToDevice": "d2d",
                                       "memcpyAsync": staticmethod(self._memcpy)})
        self.cuda = type("cuda", (), {"runtime": runtime, "Event": _Event})
        self.streams = {}

    def stream(self, name):
        s = self.streams[name] = _Stream(self, name)
        return s

    def _memcpy(self, dst, src, n, kind, stream_ptr):
        s = next(s for s in self.streams.values() if s.ptr == stream_ptr)
        s.ops.append((kind, dst, src, n))

    def kernel(self, what):
        """A kernel launched now, on the current stream (compute unless a `with` says)."""
        s = self.current[-1] if self.current else self.streams["compute"]
        s.ops.append(("kernel", what))
        return (s, len(s.ops) - 1)


def _before(cp, a, b) -> bool:
    """Whether op a = (stream, index) happens before op b on the GPU."""
    seen, todo = set(), [b]
    while todo:
        s, j = todo.pop()
        for i in range(j - 1, -1, -1):
            if (s, i) == a:
                return True
            if (s, i) in seen:
                break
            seen.add((s, i))
            op = s.ops[i]
            if op[0] == "wait" and op[1].stream is not None:
                todo.append((op[1].stream, op[1].pos))
    return False


class _View:
    def __init__(self, ptr, nbytes):
        self.nbytes, self.data = nbytes, type("D", (), {"ptr": ptr})()
        self.flags = type("F", (), {"c_contiguous": True})()


@pytest.fixture
def gpu():
    from neuron.cuda_device import CudaDevice
    cp = _FakeCupy()
    dev = CudaDevice.__new__(CudaDevice)            # the streams only: no CUDA, no arena
    dev._cp, dev.arena = cp, type("Arena", (), {"ptr": 0x100000})()
    dev.compute_stream, dev.copy_stream, dev.codec_stream = (
        cp.stream(n) for n in ("compute", "copy", "codec"))
    return dev, cp


def _op(cp, stream, kind):
    s = cp.streams[stream]
    return s, max(i for i, op in enumerate(s.ops) if op[0] == kind)


def test_an_offload_copies_after_its_producer_and_the_encode(gpu):
    import numpy as np
    dev, cp = gpu
    producer = cp.kernel("producer")

    class Codec:
        def encode_into(self, src, dst):
            cp.kernel("encode")
    encoded = dev.encode(Codec(), _View(0x1000, 64), _View(0x2000, 32))
    encode = _op(cp, "codec", "kernel")
    assert encode[0].name == "codec" and _before(cp, producer, encode)
    later = cp.kernel("later compute")
    ev = dev.offload(_View(0x2000, 32), np.zeros(32, np.uint8), after=encoded)
    copy = _op(cp, "copy", "d2h")
    assert _before(cp, producer, copy) and _before(cp, encode, copy)
    assert _before(cp, later, copy)                 # after all compute queued so far
    dev.compute_wait(ev)
    reuse = cp.kernel("a kernel overwriting the block")
    assert _before(cp, copy, reuse)
    assert not _before(cp, copy, later)


def test_a_prefetch_and_its_decode_come_before_the_reader_and_after_the_last_tenant(gpu):
    import numpy as np
    dev, cp = gpu
    tenant = cp.kernel("the block's previous tenant")
    copied = dev.prefetch(np.zeros(32, np.uint8), _View(0x3000, 32), compute_waits=False)
    copy = _op(cp, "copy", "h2d")
    assert _before(cp, tenant, copy)
    between = cp.kernel("compute that overlaps the copy")
    assert not _before(cp, copy, between)

    class Codec:
        def decode(self, src, dst):
            cp.kernel("decode")
    decoded = dev.decode(Codec(), _View(0x3000, 32), _View(0x4000, 64), after=copied)
    decode = _op(cp, "codec", "kernel")
    assert _before(cp, copy, decode) and _before(cp, between, decode)
    dev.compute_wait(decoded)
    reader = cp.kernel("reader")
    assert _before(cp, decode, reader) and _before(cp, copy, reader)


def test_synchronous_copies_wait_on_the_host_and_synchronize_covers_every_stream(gpu):
    import numpy as np
    dev, cp = gpu
    events = []
    real = cp.cuda.Event
    cp.cuda.Event = lambda **kw: events.append(real(**kw)) or events[-1]
    dev.copy_to_host(_View(0x1000, 16), np.zeros(16, np.uint8), 16)
    dev.copy_to_device(np.zeros(16, np.uint8), _View(0x1000, 16), 16)
    assert len(events) == 2 and all(ev.synced for ev in events)
    dev.synchronize()
    assert all(s.synced for s in cp.streams.values())
    dev.move(0x100, 0x0, 0x300)                     # compaction: on compute, low to high
    moves = [op for op in cp.streams["compute"].ops if op[0] == "d2d"]
    base = dev.arena.ptr
    assert [(m[1] - base, m[2] - base) for m in moves] == [(0, 0x100), (0x100, 0x200),
                                                           (0x200, 0x300)]
