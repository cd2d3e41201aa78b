"""CudaDevice's stream capture (neuron/devices/capture_scope.py) on the CUDA runtime stand-in,
which enforces CUDA's capture rules (cuda_standins/runtime.py, _Capture): the waits, forks and
joins of the device's copies inside a capture, and events usable after it. The first tests show
the stand-in's rules can fail; on a GPU, tests/gpu/test_replay.py runs CUDA's own capture."""
from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def gpu(cuda_standins):
    from neuron.devices.cuda import CudaDevice
    dev = CudaDevice(1 << 16, headroom_bytes=0)
    yield dev, cuda_standins
    dev.close()


def _bufs(dev, n=256):
    from neuron.kernels.pinned_host import pinned_empty
    return dev.view(0, (n,), np.uint8), pinned_empty(n)


# ---- the stand-in's rules ------------------------------------------------------------------

def test_a_capture_refuses_a_wait_for_an_event_recorded_before_it(gpu):
    dev, s = gpu
    before = dev.d2h_stream.record()
    dev.compute_stream.begin_capture()
    with pytest.raises(s.CUDARuntimeError, match="Isolation"):
        dev.compute_stream.wait_event(before)
    dev.compute_stream.end_capture()


def test_a_capture_refuses_to_end_before_a_forked_stream_joined(gpu):
    dev, s = gpu
    c, side = dev.compute_stream, dev.d2h_stream
    c.begin_capture()
    side.wait_event(c.record())                 # forked
    view, host = _bufs(dev)
    s._Cuda.runtime.memcpyAsync(host.ctypes.data, view.data.ptr, 16, 2, side.ptr)
    with pytest.raises(s.CUDARuntimeError, match="Unjoined"):
        c.end_capture()


def test_work_on_a_stream_outside_the_capture_is_refused(gpu):
    dev, s = gpu
    dev.compute_stream.begin_capture()
    view, host = _bufs(dev)
    with pytest.raises(s.CUDARuntimeError, match="outside the live capture"):
        s._Cuda.runtime.memcpyAsync(host.ctypes.data, view.data.ptr, 16, 2, dev.d2h_stream.ptr)
    dev.compute_stream.end_capture()


def test_an_event_recorded_in_a_capture_refuses_the_host(gpu):
    dev, s = gpu
    dev.compute_stream.begin_capture()
    ev = dev.compute_stream.record()
    dev.compute_stream.end_capture()
    with pytest.raises(s.CUDARuntimeError, match="CapturedEvent"):
        ev.synchronize()


# ---- CudaDevice inside them -----------------------------------------------------------------

def test_compute_only_work_needs_no_side_stream(gpu):
    """The side streams that took no work are not waited for at the end (that wait was the
    isolation error of the first H200 capture, 2026-11-27)."""
    dev, _ = gpu
    ev = dev.new_event()
    dev.capture(lambda: dev.record_compute(ev))
    assert ev.done                              # recorded again after the capture


def test_copies_after_events_from_before_the_capture(gpu):
    """An offload after an event of an earlier iteration (complete by then) and a prefetch
    after the whole compute queue fork their streams into the capture and join them back."""
    dev, s = gpu
    view, host = _bufs(dev)
    old = dev.record_compute(dev.new_event())       # before the capture
    dev.synchronize()
    seen = {}

    def work():
        seen["d2h"] = dev.offload(view, host, after=old)
        seen["h2d"] = dev.prefetch(host, view)
        dev.order_after(old)
        dev.compute_wait(seen["d2h"])
        dev.copy_to_host_captured(view, host, 16)
        dev.copy_to_device_captured(host, view, 16)
    dev.capture(work)
    assert all(not st.is_capturing() for st in dev.streams)
    assert seen["d2h"].done and seen["h2d"].done    # valid for the host afterwards


def test_a_codec_step_forks_its_stream(gpu):
    dev, _ = gpu
    view, _ = _bufs(dev)

    class Codec:
        def encode_into(self, src, dst):
            pass
    dev.capture(lambda: dev.encode(Codec(), view, view))


def test_a_failed_capture_ends_and_leaves_its_events_usable(gpu):
    dev, _ = gpu
    ev = dev.new_event()

    def work():
        dev.record_compute(ev)
        raise ValueError("broke inside")
    with pytest.raises(ValueError, match="broke inside"):
        dev.capture(work)
    assert not dev.compute_stream.is_capturing()
    assert ev.done
    dev.capture(lambda: dev.record_compute(ev))     # and the next capture works


def test_a_launch_starts_after_all_work_queued_on_every_stream(gpu):
    """The capture dropped its waits for events from before it: a launch waits for every
    side stream's queue instead."""
    dev, s = gpu
    s.log_streams()
    from neuron.devices.cuda import CudaDevice
    dev2 = CudaDevice(1 << 16, headroom_bytes=0)
    try:
        view, host = _bufs(dev2)
        d2h = dev2.offload(view, host)

        class Graph:
            def launch(self, stream=None):
                stream.ops.append(("graph",))
                s._Stream.issued.append((stream, len(stream.ops) - 1))
        dev2.launch(Graph())
        c = dev2.compute_stream
        launched = (c, max(i for i, op in enumerate(c.ops) if op[0] == "graph"))
        assert s.happens_before((d2h.stream, d2h.pos), launched)
    finally:
        dev2.close()
