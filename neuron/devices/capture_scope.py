"""What one CUDA stream capture has seen: the events recorded inside it and the streams that
joined it, so the device's copies and waits follow CUDA's capture rules.

CUDA refuses a capturing stream's wait on an event recorded outside the capture
(cudaErrorStreamCaptureIsolation); such an event completed before the capture began and, since
a launch is ordered after all work queued on every stream (CudaDevice.launch), before every
launch of the graph: its wait is dropped. A side stream that has not joined the capture would
run its copy at once instead of recording it, so it joins from the capture's first node before
its first operation; before the capture ends every joined stream rejoins the origin (an
unjoined one would be cudaErrorStreamCaptureUnjoined, and a side stream that never joined must
not be waited for: that wait is the isolation error again). An event last recorded inside a
capture refuses host queries afterwards (cudaErrorCapturedEvent): ``release`` records each again
outside it. Such a record only orders streams inside the graph; an event the graph must record
at each launch (a timing event) is recorded with cudaEventRecordExternal (``record_external``).
"""
from __future__ import annotations


#: cudaEventRecordExternal / CU_EVENT_RECORD_EXTERNAL: in a capture, an event record node
EVENT_RECORD_EXTERNAL = 1
_driver: dict = {}


def record_external(cp, event, stream) -> None:
    """Record ``event`` on the capturing ``stream`` as an event record node of the graph: the
    runtime's cudaEventRecordWithFlags where CuPy exposes it, else the driver's
    cuEventRecordWithFlags (a runtime event or stream is the driver's handle)."""
    fn = getattr(cp.cuda.runtime, "eventRecordWithFlags", None)
    if fn is not None:
        fn(event.ptr, stream.ptr, EVENT_RECORD_EXTERNAL)
        return
    if "lib" not in _driver:
        import ctypes

        from .cuda_check import _load_libcuda
        lib = _load_libcuda()
        lib.cuEventRecordWithFlags.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint]
        _driver["lib"] = lib
    rc = _driver["lib"].cuEventRecordWithFlags(event.ptr, stream.ptr, EVENT_RECORD_EXTERNAL)
    if rc != 0:
        raise RuntimeError(f"cuEventRecordWithFlags(external) failed with CUDA error {rc}")


class CaptureScope:
    def __init__(self, origin):
        self.origin = origin
        self._events: dict[int, object] = {}
        self._joined = {origin.ptr: origin}
        self._fork = self.register(origin.record())     # the capture's first point

    def register(self, event):
        """``event`` was just recorded on a capturing stream."""
        self._events[id(event)] = event
        return event

    def inside(self, event) -> bool:
        return id(event) in self._events

    def joined(self, stream) -> bool:
        return stream.ptr in self._joined

    def waited(self, stream, event) -> bool:
        """Whether ``stream`` should wait for ``event`` inside this capture (False: the event
        was recorded before it, so it is complete); a wait on an event of the capture joins
        the stream to it."""
        if not self.inside(event):
            return False
        self._joined.setdefault(stream.ptr, stream)
        return True

    def join(self, stream) -> None:
        """``stream`` is about to take work: it joins the capture first, if not yet joined."""
        if stream.ptr not in self._joined:
            stream.wait_event(self._fork)
            self._joined[stream.ptr] = stream

    def rejoin(self) -> None:
        """Every joined side stream's work is done before the origin's capture ends."""
        for ptr, stream in list(self._joined.items()):
            if ptr != self.origin.ptr:
                self.origin.wait_event(self.register(stream.record()))

    def release(self, stream) -> None:
        """After the capture ended: every event recorded inside it is recorded again, outside,
        on ``stream`` (complete with the work queued there), so the host may query it."""
        for event in self._events.values():
            stream.record(event)
        self._events.clear()
