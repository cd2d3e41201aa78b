"""The pinned host cap: lazy buffers, cached ones given back before failing, errors naming it."""
from __future__ import annotations

import numpy as np
import pytest

from neuron.errors import MemoryBudgetError
from neuron.memory.host import HostPool
from neuron.memory.host_budget import (PINNED_FRACTION, default_host_cap, describe_cap,
                                       pinned_fraction)

GIB = 1 << 30


def test_default_cap_is_the_stated_fraction_of_ram():
    assert PINNED_FRACTION == 0.5
    assert default_host_cap(128 * GIB, env={}) == 64 * GIB
    assert default_host_cap(128 * GIB, env={"NEURON_HOST_FRACTION": "0.25"}) == 32 * GIB
    assert default_host_cap(1 << 20, env={}) == GIB          # never below 1 GiB
    with pytest.raises(ValueError, match="NEURON_HOST_FRACTION"):
        pinned_fraction({"NEURON_HOST_FRACTION": "1.5"})
    assert "50%" in describe_cap(64 * GIB, env={})


def test_buffers_are_allocated_lazily_and_reused():
    made = []
    pool = HostPool(lambda n: made.append(n) or np.empty(n, np.uint8), cap=64 << 10)
    assert made == [] and pool.reserved_bytes == 0
    a = pool.get(10000)
    pool.put(a)
    b = pool.get(9000)                       # same 12 KiB class: reused, nothing new pinned
    assert b is a and made == [12288]


def test_cached_buffers_are_given_back_before_the_cap_fails():
    pool = HostPool(lambda n: np.empty(n, np.uint8), cap=32 << 10)
    a = pool.get(16 << 10)
    pool.put(a)                               # cached, still counted as pinned
    b = pool.get(24 << 10)                    # would pass the cap: the cache is trimmed first
    assert pool.trimmed_bytes == 16 << 10 and pool.reserved_bytes == 24 << 10
    with pytest.raises(MemoryBudgetError, match=r"pinned host memory cap of 32768 bytes") as e:
        pool.get(16 << 10)                     # in use 24 KiB + 16 KiB > 32 KiB
    assert e.value.budget == 32 << 10 and e.value.requested == 16 << 10
    pool.put(b)


def test_a_persistent_tensor_gets_its_own_buffer_back():
    pool = HostPool(lambda n: np.empty(n, np.uint8), cap=1 << 20)
    p1, p2 = pool.get(4096, home=1), pool.get(4096, home=2)
    pool.put(p1, home=1)
    pool.put(p2, home=2)
    other = pool.get(4096)                    # an activation: not a home, a new buffer
    assert other is not p1 and other is not p2
    assert pool.get(4096, home=2) is p2 and pool.get(4096, home=1) is p1
    assert pool.in_use_bytes == 3 * 4096 and pool.reserved_bytes == 3 * 4096


def test_homes_are_given_back_last_under_the_cap():
    pool = HostPool(lambda n: np.empty(n, np.uint8), cap=8 << 10)
    a = pool.get(4096, home=1)
    pool.put(a, home=1)                       # kept for tensor 1: reserved, not in use
    b = pool.get(4096)                        # not handed the home: a new buffer
    assert b is not a and pool.reserved_bytes == 8 << 10 and pool.trimmed_bytes == 0
    c = pool.get(4096)                        # past the cap: the home is given back first
    assert c is not a and pool.trimmed_bytes == 4096 and pool.reserved_bytes == 8 << 10


def test_the_plan_limit_and_the_device_cap_are_named_apart():
    pool = HostPool(lambda n: np.empty(n, np.uint8), limit=8 << 10, cap=1 << 20)
    with pytest.raises(MemoryBudgetError, match="host memory budget of 8192 bytes"):
        pool.get(12 << 10)


def test_pool_takes_the_devices_cap_and_attaches_its_heap():
    """A device with host_cap / attach_heap (CudaDevice) gets both wired by the Pool."""
    from neuron.devices import CpuDevice
    from neuron.memory.pool import Pool

    class Dev(CpuDevice):
        host_cap = 1 << 20
        attached = None

        def attach_heap(self, heap):
            self.attached = heap

    d = Dev(1 << 20)
    p = Pool(d)
    assert p.host_pool.cap == 1 << 20 and d.attached is p.heap
    assert Pool(CpuDevice(1 << 20)).host_pool.cap is None
