"""Compaction: when the free bytes suffice but no hole does, the pool slides tensors together
(bytes preserved) instead of failing or evicting."""
from __future__ import annotations

import numpy as np
import pytest

from neuron.devices import CpuDevice, VirtualDevice
from neuron.errors import MemoryBudgetError
from neuron.memory.pool import Pool
from neuron.memory.tensors import Kind, TensorRegistry


def fragmented(compact: bool, device=CpuDevice):
    reg = TensorRegistry()
    ts = [reg.add(f"t{i}", Kind.ACTIVATION, (256,), np.float32) for i in range(6)]   # 1 KiB
    pool = Pool(device(6 * 1024), compact=compact)
    for i, t in enumerate(ts):
        v = pool.alloc(t)
        if v is not None:
            v[...] = np.arange(256) + 1000 * i
    for t in ts[::2]:                     # three 1 KiB holes, none adjacent
        pool.free(t)
    big = reg.add("big", Kind.ACTIVATION, (512,), np.float32)                       # 2 KiB
    return pool, ts, big


def test_without_compaction_scattered_bytes_fail():
    pool, _, big = fragmented(False)
    with pytest.raises(MemoryBudgetError, match="largest free block 1024"):
        pool.alloc(big)


@pytest.mark.parametrize("device", [CpuDevice, VirtualDevice])
def test_compaction_makes_one_hole_and_keeps_the_bytes(device):
    pool, ts, big = fragmented(True, device)
    pool.alloc(big)
    assert pool.compactions == 1 and pool.moved_bytes > 0
    if device is CpuDevice:
        for i in (1, 3, 5):
            np.testing.assert_array_equal(pool.view(ts[i]), np.arange(256) + 1000 * i)
    offs = sorted(pool.offset[t.id] for t in ts[1::2])
    assert offs == [0, 1024, 2048]        # slid to the bottom, in address order


def test_compaction_never_makes_bytes_that_are_not_there():
    pool, _, _ = fragmented(True)
    reg = TensorRegistry()
    huge = reg.add("huge", Kind.ACTIVATION, (1024,), np.float32)                    # 4 KiB
    with pytest.raises(MemoryBudgetError):
        pool.alloc(huge)
