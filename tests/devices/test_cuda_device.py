"""CudaDevice's CPU-testable parts: temporaries that do not fit name their kernel and step; the
stream ordering of its copies and codec work, on the CuPy stand-in's stream log."""
from __future__ import annotations

import numpy as np
import pytest

from neuron.devices.cuda import ArenaAllocator, ArenaLayout, kernel_context
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
    assert devices._REGISTRY["cuda"] == "neuron.devices.cuda:CudaDevice" or \
        "neuron.devices.cuda" in sys.modules
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


# ---- CudaDevice's stream ordering, on the CuPy stand-in's stream log -------------------------
# The stand-in's streams log every operation issued to them; "happens before" is the stream
# order plus the wait_event edges, as CUDA defines it (cuda_standins.happens_before). The tests
# check the orderings the pool relies on (tests/memory/stream_model.py models them for the pool)
# on CudaDevice's own code.

@pytest.fixture
def gpu(cuda_standins):
    """A CudaDevice over the stand-ins, its streams logging; and the stand-in module."""
    from neuron.devices.cuda import CudaDevice
    cuda_standins.log_streams()
    dev = CudaDevice(1 << 16, headroom_bytes=0)
    yield dev, cuda_standins
    dev.close()


def _last(stream, kind):
    """The stream's last operation of that kind, as (stream, index)."""
    return stream, max(i for i, op in enumerate(stream.ops) if op[0] == kind)


def _bytes(dev, offset, n):
    return dev.view(offset, (n,), np.uint8)


def test_an_offload_copies_after_its_producer_and_the_encode(gpu):
    dev, S = gpu
    before = S.happens_before
    producer = S.launch("producer")
    launched = []

    class Codec:
        def encode_into(self, src, dst):
            launched.append(S.launch("encode"))
    encoded = dev.encode(Codec(), _bytes(dev, 0x1000, 64), _bytes(dev, 0x2000, 32))
    encode = _last(dev.codec_stream, "kernel")
    assert launched == [encode] and launched[0][0] is dev.codec_stream
    assert before(producer, encode)
    later = S.launch("later compute")
    ev = dev.offload(_bytes(dev, 0x2000, 32), np.zeros(32, np.uint8), after=encoded)
    copy = _last(dev.d2h_stream, "d2h")
    assert before(producer, copy) and before(encode, copy)
    assert not before(later, copy)                  # only what it is given to wait for
    dev.compute_wait(ev)
    reuse = S.launch("a kernel overwriting the block")
    assert before(copy, reuse)
    assert not before(copy, later)
    dev.offload(_bytes(dev, 0x2000, 32), np.zeros(32, np.uint8))    # no fence given:
    assert before(reuse, _last(dev.d2h_stream, "d2h"))              # all compute so far


def test_the_two_directions_the_codec_and_the_snapshots_have_a_stream_each(gpu):
    dev, S = gpu
    before = S.happens_before
    streams = {id(s) for s in dev.streams}
    assert len(streams) == 5 and dev.copy_stream is dev.d2h_stream
    first = S.launch("the block's last kernel")
    fence = dev.record_compute(dev.new_event())
    unrelated = S.launch("a kernel that touches neither block")
    out = dev.offload(_bytes(dev, 0x1000, 32), np.zeros(32, np.uint8), after=[fence])
    back = dev.prefetch(np.zeros(32, np.uint8), _bytes(dev, 0x2000, 32), compute_waits=False,
                        after=[fence])
    snap = dev.snapshot(_bytes(dev, 0x3000, 32), np.zeros(32, np.uint8), after=[fence])
    d2h, h2d = _last(dev.d2h_stream, "d2h"), _last(dev.h2d_stream, "h2d")
    shot = _last(dev.snapshot_stream, "d2h")
    for c in (d2h, h2d, shot):
        assert before(first, c) and not before(unrelated, c)
    assert not before(d2h, h2d) and not before(h2d, d2h)       # full duplex
    assert not before(shot, h2d) and not before(shot, d2h)     # snapshots queue apart
    assert out is not back and back is not snap


def test_a_prefetch_and_its_decode_come_before_the_reader_and_after_the_last_tenant(gpu):
    dev, S = gpu
    before = S.happens_before
    tenant = S.launch("the block's previous tenant")
    copied = dev.prefetch(np.zeros(32, np.uint8), _bytes(dev, 0x3000, 32), compute_waits=False)
    copy = _last(dev.h2d_stream, "h2d")
    assert before(tenant, copy)
    between = S.launch("compute that overlaps the copy")
    assert not before(copy, between)

    class Codec:
        def decode(self, src, dst):
            S.launch("decode")
    decoded = dev.decode(Codec(), _bytes(dev, 0x3000, 32), _bytes(dev, 0x4000, 64),
                         after=copied)
    decode = _last(dev.codec_stream, "kernel")
    assert before(copy, decode) and before(between, decode)
    dev.compute_wait(decoded)
    reader = S.launch("reader")
    assert before(decode, reader) and before(copy, reader)
    dev.prefetch(np.zeros(32, np.uint8), _bytes(dev, 0x5000, 32))     # compute_waits=True
    plain = _last(dev.h2d_stream, "h2d")
    assert before(plain, S.launch("a reader that waits for nothing itself"))


def test_synchronous_copies_wait_on_the_host_and_synchronize_covers_every_stream(gpu):
    dev, _ = gpu
    dev.copy_to_host(_bytes(dev, 0x1000, 16), np.zeros(16, np.uint8), 16)
    dev.copy_to_device(np.zeros(16, np.uint8), _bytes(dev, 0x1000, 16), 16)
    events = [op[1] for s in (dev.d2h_stream, dev.h2d_stream) for op in s.ops
              if op[0] == "record"]
    assert len(events) == 2 and all(ev.synced for ev in events)
    streams = dev.streams
    dev.synchronize()
    assert all(s.synced for s in streams)
    data = np.random.default_rng(0).integers(0, 256, 0x300, dtype=np.uint8)
    _bytes(dev, 0x100, 0x300)[...] = data
    dev.move(0x100, 0x0, 0x300)                     # compaction: on compute, low to high
    moves = [op for op in dev.compute_stream.ops if op[0] == "d2d"]
    base = dev.arena.ptr
    assert [(m[1] - base, m[2] - base) for m in moves] == [(0, 0x100), (0x100, 0x200),
                                                           (0x200, 0x300)]
    assert np.array_equal(_bytes(dev, 0, 0x300), data)     # overlapping, yet copied whole


def test_cuda_device_runs_every_precision_its_capability_allows(gpu, monkeypatch):
    import os

    from neuron.kernels import cuda as K
    dev, _ = gpu
    assert dev.precision_missing("fp32") is None and dev.precision_missing("tf32") is None
    assert dev.compute_capability == (9, 0)                 # the stand-in's H100
    assert dev.precision_missing("bf16") is None and dev.precision_missing("fp16") is None
    with monkeypatch.context() as m:
        m.setattr(dev._cp.cuda.runtime, "getDeviceProperties",
                  lambda i: {"major": 7, "minor": 5})
        assert "compute capability 8.0" in dev.precision_missing("bf16")
        assert dev.precision_missing("fp16") is None
    monkeypatch.setattr(K, "allow_tf32", False)
    monkeypatch.setenv("CUPY_TF32", "0")
    dev.use_precision("fp32")                   # leaves the switches as they are
    assert K.allow_tf32 is False and os.environ["CUPY_TF32"] == "0"
    dev.use_precision("tf32")
    assert K.allow_tf32 is True and os.environ["CUPY_TF32"] == "1"
