"""Host batches go through a reused pinned buffer and an asynchronous copy (fakes, no GPU)."""
from __future__ import annotations

import ctypes

import numpy as np

from neuron.kernels.input_staging import PinnedStager


class Event:
    def __init__(self, log):
        self.log, self.waited = log, 0

    def synchronize(self):
        self.waited += 1
        self.log.append("wait")


def _stager(log, allocs):
    def alloc(n):
        allocs.append(n)
        return np.zeros(n, np.uint8)

    def memcpy(dst, src, n):            # the "device" is host memory here
        log.append(("copy", n))
        ctypes.memmove(dst, src, n)

    return PinnedStager(alloc, memcpy, lambda: Event(log), max_buffers=2)


def test_batches_are_staged_and_buffers_reused_after_their_event():
    log, allocs = [], []
    st = _stager(log, allocs)
    dev = np.empty((4, 3), np.float32)
    for step in range(3):
        x = np.random.default_rng(step).standard_normal((4, 3)).astype(np.float32)
        st.stage(x, dev.ctypes.data)
        assert np.array_equal(dev, x)
    assert allocs == [4096]                              # one pinned buffer, reused
    # before each reuse, the previous copy's event was waited on
    assert log == [("copy", 48), "wait", ("copy", 48), "wait", ("copy", 48)]
    assert st.staged_bytes == 3 * 48


def test_batch_and_labels_keep_their_own_buffers_and_the_count_is_bounded():
    log, allocs = [], []
    st = _stager(log, allocs)
    x_dev, y_dev = np.empty(3000, np.float32), np.empty(5, np.int64)
    st.stage(np.ones(3000, np.float32), x_dev.ctypes.data)
    st.stage(np.arange(5), y_dev.ctypes.data)
    assert allocs == [16384, 4096] and np.array_equal(y_dev, np.arange(5))
    z = np.empty(100000, np.uint8)
    st.stage(np.full(100000, 7, np.uint8), z.ctypes.data)   # a third class: the LRU one goes
    assert len(st._bufs) == 2 and allocs[-1] == 131072 and (z == 7).all()
