"""The unified tensor pool (memory/pool.py) and its host side (memory/host.py), on the CPU
device (real bytes) and the virtual device (offsets only)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from neuron.devices import CpuDevice, VirtualDevice
from neuron.errors import MemoryBudgetError
from neuron.memory.host import HostPool
from neuron.memory.pool import Pool
from neuron.memory.tensors import Kind, TensorRegistry

KiB = 1024
DEVICES = {"cpu": CpuDevice, "virtual": VirtualDevice}


@pytest.fixture
def reg():
    return TensorRegistry()


def act(reg, name, nbytes=KiB, kind=Kind.ACTIVATION, dtype=np.float32):
    n = nbytes // np.dtype(dtype).itemsize
    return reg.add(name, kind, (n,), dtype)


def pool(kind="cpu", blocks=4, evict=True, host_budget=None):
    return Pool(DEVICES[kind](blocks * KiB), block=KiB, evict=evict, host_budget=host_budget)


def step(name="F3:conv1"):
    return SimpleNamespace(name=name)


def pattern(t, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, t.nbytes, dtype=np.uint8).view(t.dtype).reshape(t.shape)


# ---------------------------------------------------------------- alloc / free / view
@pytest.mark.parametrize("kind", list(DEVICES))
def test_alloc_free_bookkeeping(reg, kind):
    p = pool(kind, blocks=8)
    a = act(reg, "a", 1000)                       # rounds up to one block
    b = act(reg, "b", 3 * KiB, kind=Kind.GRADIENT)
    va = p.alloc(a)
    p.alloc(b)
    if kind == "cpu":
        assert va.shape == a.shape and va.dtype == a.dtype
    else:
        assert va is None
    assert p.resident(a) and p.resident(b)
    assert p.used_bytes == 4 * KiB == p.high_water
    assert p.by_kind[list(Kind).index(Kind.ACTIVATION)] == KiB
    assert p.by_kind[list(Kind).index(Kind.GRADIENT)] == 3 * KiB
    assert p.by_kind_at_peak[Kind.GRADIENT] == 3 * KiB
    assert p.max_extent == 4 * KiB
    p.free(a)
    assert not p.resident(a) and p.used_bytes == 3 * KiB and p.high_water == 4 * KiB
    assert a.id not in p.live and a.id not in p.lru
    p.free(a)                                     # freeing something absent is a no-op
    assert p.used_bytes == 3 * KiB
    with pytest.raises(RuntimeError, match="allocated twice"):
        p.alloc(b)
    p.free(b)
    assert p.used_bytes == 0 and not p.live and not p.lru
    assert p.heap.num_allocated == 0


def test_views_alias_the_arena_and_do_not_overlap(reg):
    p = pool("cpu", blocks=8)
    ts = [act(reg, f"t{i}", (i + 1) * 512) for i in range(4)]
    for i, t in enumerate(ts):
        p.alloc(t)[...] = pattern(t, i)
    for i, t in enumerate(ts):
        v = p.view(t)
        assert np.shares_memory(v, p.device.buffer)
        assert v.tobytes() == pattern(t, i).tobytes()
    offs = sorted((p.offset[t.id], p.heap.size_of(p.offset[t.id])) for t in ts)
    assert all(o1 + s1 <= o2 for (o1, s1), (o2, _) in zip(offs, offs[1:]))


def test_raw_regions_workspace_and_held(reg):
    p = pool("cpu", blocks=4)
    off = p.alloc_bytes(1500, "workspace:F1:conv", step())
    assert p.used_bytes == 2 * KiB
    assert p.by_kind_at_peak[Kind.WORKSPACE] == 2 * KiB
    p.free_bytes(off)
    assert p.used_bytes == 0
    off = p.alloc_bytes(KiB, "workspace:F2:conv")
    p.hold_bytes(off)
    assert p.used_bytes == KiB
    p.release_held()
    assert p.used_bytes == 0 and p.held == []


# ---------------------------------------------------------------- eviction
@pytest.mark.parametrize("kind", list(DEVICES))
def test_lock_prevents_eviction(reg, kind):
    p = pool(kind, blocks=4)
    ts = [act(reg, f"t{i}") for i in range(4)]
    for t in ts:
        p.alloc(t)
    p.lock([t.id for t in ts])
    e = act(reg, "e")
    with pytest.raises(MemoryBudgetError):
        p.alloc(e, step())
    assert all(p.resident(t) for t in ts) and p.offload_count == 0
    assert not p.resident(e)
    p.unlock([ts[2].id])
    p.alloc(e)
    assert not p.resident(ts[2]) and ts[2].id in p.host
    assert all(p.resident(t) for t in ts[:2] + ts[3:])


def test_pinned_never_evicted(reg):
    p = pool("cpu", blocks=2)
    a, b, c = (act(reg, n) for n in "abc")
    p.alloc(a, pin=True)
    assert a.id in p.pinned and a.id not in p.lru
    p.alloc(b)
    p.alloc(c)                                    # evicts b, not the older pinned a
    assert p.resident(a) and not p.resident(b)
    p.lock([c.id])
    with pytest.raises(MemoryBudgetError):
        p.alloc(act(reg, "d"))
    assert p.resident(a) and p.resident(c)


@pytest.mark.parametrize("kind", list(DEVICES))
def test_lru_evicts_oldest_unlocked_first(reg, kind):
    p = pool(kind, blocks=4)
    a, b, c, d = ts = [act(reg, n) for n in "abcd"]
    for t in ts:
        p.alloc(t)
    p.lock([a.id])
    p.unlock([a.id])                              # a used most recently: b c d a
    p.lock([c.id])                                # c in use: skipped
    order = []
    for name in "efg":
        p.alloc(act(reg, name))
        order.append(next(t.name for t in ts if t.id in p.host and t.name not in order))
    assert order == ["b", "d", "a"]
    assert p.resident(c)
    assert p.offload_count == 3 and p.offload_bytes == 3 * KiB
    assert list(p.host) == [b.id, d.id, a.id]


def test_no_eviction_when_policy_does_not_allow_it(reg):
    p = pool("cpu", blocks=2, evict=False)
    p.alloc(act(reg, "a"))
    p.alloc(act(reg, "b"))
    with pytest.raises(MemoryBudgetError):
        p.alloc(act(reg, "c"))
    assert p.offload_count == 0 and len(p.live) == 2


def test_eviction_makes_a_contiguous_hole(reg):
    """A 2-block request when the free space is fragmented evicts until a hole fits."""
    p = pool("cpu", blocks=4)
    a, b, c, d = ts = [act(reg, n) for n in "abcd"]
    for t in ts:
        p.alloc(t)
    p.free(b)                                     # hole at block 1, LRU: a c d
    big = act(reg, "big", 2 * KiB)
    p.alloc(big)                                  # a alone makes [0,2) free
    assert not p.resident(a) and p.resident(c) and p.resident(d)
    assert p.offset[big.id] == 0


# ---------------------------------------------------------------- offload / ensure / prefetch
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.uint8])
def test_offload_then_ensure_restores_bytes_exactly(reg, dtype):
    p = pool("cpu", blocks=4)
    t = act(reg, "t", 1500 if np.dtype(dtype).itemsize <= 4 else 1504, dtype=dtype)
    want = pattern(t, 7)                          # random bytes: NaN payloads, denormals, ...
    p.alloc(t)[...] = want
    off0 = p.offset[t.id]
    p.offload(t)
    assert not p.resident(t) and t.id in p.host
    # scribble over the freed region
    junk = act(reg, "junk", 4 * KiB, dtype=np.uint8)
    p.alloc(junk)[...] = 0xAB
    assert p.offset[junk.id] == off0
    p.free(junk)
    p.ensure(t, step())
    assert p.view(t).tobytes() == want.tobytes()
    assert p.misses == 1 and p.hits == 0
    assert p.offload_bytes == p.prefetch_bytes == t.nbytes


def test_evicted_tensor_comes_back_intact_through_lru(reg):
    p = pool("cpu", blocks=3)
    ts = [act(reg, f"t{i}") for i in range(3)]
    for i, t in enumerate(ts):
        p.alloc(t)[...] = pattern(t, i)
    extra = [act(reg, f"x{i}") for i in range(3)]
    for i, t in enumerate(extra):                 # pushes every original out
        p.alloc(t)[...] = pattern(t, 10 + i)
    assert all(t.id in p.host for t in ts)
    for i, t in enumerate(ts):                    # and back, evicting the extras
        p.lock([t.id])
        p.ensure(t)
        assert p.view(t).tobytes() == pattern(t, i).tobytes()
    p.unlock([t.id for t in ts])
    for i, t in enumerate(extra):
        p.ensure(t)
        assert p.view(t).tobytes() == pattern(t, 10 + i).tobytes()
    assert p.misses == 6 and p.hits == 0
    p.ensure(extra[0])
    assert p.hits == 1


def test_ensure_of_a_missing_tensor_is_a_schedule_bug(reg):
    p = pool("cpu")
    t = act(reg, "ghost")
    with pytest.raises(RuntimeError, match=r"step B9:fc: act:ghost|ghost.*never produced"):
        p.ensure(t, step("B9:fc"))
    p.alloc(t)
    p.free(t)
    with pytest.raises(RuntimeError, match="never produced or already freed"):
        p.ensure(t)


@pytest.mark.parametrize("kind", list(DEVICES))
def test_prefetch_never_evicts(reg, kind):
    p = pool(kind, blocks=3)
    a, b, c, d = (act(reg, n) for n in "abcd")
    p.alloc(a)
    p.offload(a)
    for t in (b, c, d):
        p.alloc(t)                                # arena full, all unlocked
    assert p.prefetch(a) is False
    assert p.offload_count == 1 and all(p.resident(t) for t in (b, c, d))
    assert not p.resident(a) and p.prefetch_bytes == 0
    assert p.evict_enabled                        # restored after the attempt
    p.free(c)
    assert p.prefetch(a) is True
    assert p.resident(a) and p.prefetch_bytes == a.nbytes and p.prefetch_count == 1
    assert p.misses == 0
    p.ensure(a)
    assert p.hits == 1 and p.misses == 0
    assert p.prefetch(a) is False                 # not on the host any more
    assert p.prefetch(act(reg, "never")) is False


def test_counters(reg):
    p = pool("cpu", blocks=2)
    a = act(reg, "a", 1000)
    b = act(reg, "b", 2000)
    p.alloc(a)
    p.alloc(b)                                    # evicts a (1000 bytes)
    p.ensure(b)                                   # hit
    p.lock([b.id])
    with pytest.raises(MemoryBudgetError):
        p.ensure(a)                               # b locked and a needs a block: no room
    p.unlock([b.id])
    p.ensure(a)                                   # miss: evicts b (2000 bytes), brings a back
    c = p.counters()
    # a's host buffer is released after b's is taken: both were on the host at once
    assert c == {"offload_bytes": 3000, "prefetch_bytes": 1000, "offloads": 2,
                 "prefetches": 1, "evictions": 2, "evicted_bytes": 3000, "evictions_ahead": 0,
                 "ahead_fallbacks": 0, "clean_evictions": 0, "clean_evicted_bytes": 0,
                 "cache_hits": 1, "cache_misses": 2,
                 "compactions": 0, "compacted_bytes": 0, "host_peak_bytes": 8192}
    p.prefetch(b)                                 # no room: nothing changes
    assert p.counters() == c


# ---------------------------------------------------------------- errors
def test_budget_error_names_step_tensor_and_bytes(reg):
    p = pool("cpu", blocks=4, evict=False)
    p.alloc(act(reg, "w", KiB, kind=Kind.PARAM))
    p.alloc(act(reg, "x", 2 * KiB))
    big = reg.add("act:layer1.conv", Kind.ACTIVATION, (4, 8, 8, 8), np.float32)   # 8 KiB
    with pytest.raises(MemoryBudgetError) as ei:
        p.alloc(big, step("F7:layer1.conv"))
    e = ei.value
    msg = str(e)
    for frag in ("step F7:layer1.conv", "act:layer1.conv", "activation", "(4, 8, 8, 8)",
                 "8192 bytes", "arena of 4096 bytes", "largest free block 1024",
                 "7168 bytes short"):
        assert frag in msg, (frag, msg)
    assert (e.step, e.tensor, e.requested, e.largest_free, e.free_bytes, e.budget, e.short) == \
        ("F7:layer1.conv", "act:layer1.conv", 8192, KiB, KiB, 4 * KiB, 7 * KiB)
    assert not p.resident(big) and p.used_bytes == 3 * KiB
    with pytest.raises(MemoryBudgetError, match=r"setup: cannot allocate workspace:F1 "
                                                r"\(workspace\) of 2048 bytes"):
        p.alloc_bytes(2000, "workspace:F1")


def test_host_budget_exceeded(reg):
    p = pool("cpu", blocks=6, host_budget=8 * KiB)
    ts = [act(reg, f"t{i}", 5000) for i in range(4)]       # 5 blocks each, 8 KiB host class
    p.alloc(ts[0])[...] = pattern(ts[0], 0)
    p.alloc(ts[1])                                # evicts t0: 8 KiB of host in use
    assert p.host_pool.in_use_bytes == 8 * KiB
    with pytest.raises(MemoryBudgetError, match="host memory budget of 8192 bytes exceeded") \
            as ei:
        p.alloc(ts[2])                            # would evict t1: host full
    assert ei.value.budget == 8 * KiB
    assert p.resident(ts[1]) and ts[0].id in p.host and not p.resident(ts[2])
    with pytest.raises(MemoryBudgetError, match="host memory budget"):
        p.offload(ts[1])
    assert p.resident(ts[1])                      # a failed offload changes nothing
    with pytest.raises(MemoryBudgetError, match="host memory budget"):
        p.ensure(ts[0])                           # would have to evict t1 to the full host
    assert p.resident(ts[1]) and ts[0].id in p.host
    p.free(ts[1])
    p.ensure(ts[0])                               # room now: t0 back, its host buffer released
    assert p.view(ts[0]).tobytes() == pattern(ts[0], 0).tobytes()
    assert p.host_pool.in_use_bytes == 0


# ---------------------------------------------------------------- host pool
def test_host_pool_reuses_released_buffers():
    h = HostPool()
    assert h.size_class(1) == 4096 and h.size_class(4096) == 4096 and h.size_class(4097) == 8192
    a = h.get(5000)
    assert a.nbytes == 8192 and a.dtype == np.uint8
    assert (h.in_use_bytes, h.reserved_bytes, h.peak_bytes) == (8192, 8192, 8192)
    h.put(a)
    assert h.in_use_bytes == 0
    b = h.get(6000)                               # same class: the very same buffer
    assert b is a
    assert h.reserved_bytes == 8192
    c = h.get(6000)                               # none free: a new one
    assert c is not a and h.reserved_bytes == 16384 and h.peak_bytes == 16384
    d = h.get(100)                                # another class
    assert d.nbytes == 4096 and h.reserved_bytes == 20480
    for x in (b, c, d):
        h.put(x)
    for _ in range(3):                            # steady state: no growth
        xs = [h.get(8000), h.get(8000), h.get(10)]
        for x in xs:
            h.put(x)
    assert h.reserved_bytes == 20480 and h.in_use_bytes == 0


def test_host_pool_limit():
    h = HostPool(limit=8192)
    a = h.get(4096)
    h.get(4096)
    with pytest.raises(MemoryBudgetError, match="8192 bytes exceeded"):
        h.get(1)
    h.put(a)
    assert h.get(10) is a


def test_pool_reuses_host_buffers_across_offloads(reg):
    p = pool("cpu", blocks=4)
    ts = [act(reg, f"t{i}", 3000) for i in range(6)]
    p.alloc(ts[0])
    p.offload(ts[0])
    reserved = p.host_pool.reserved_bytes
    assert reserved == 4096
    p.ensure(ts[0])                               # buffer back to the host pool
    for prev, t in zip(ts, ts[1:]):
        p.alloc(t)                                # evicts the previous one ...
        assert prev.id in p.host
        p.free(prev)                              # ... whose host copy is then dropped
    assert p.offload_count == 6
    assert p.host_pool.reserved_bytes == reserved
    assert p.host_pool.peak_bytes == 4096


def test_place_on_host_and_free_from_host(reg):
    p = pool("cpu", blocks=2)
    t = act(reg, "w", 1000, kind=Kind.PARAM)
    v = pattern(t, 3)
    p.place_on_host(t, v)
    assert not p.resident(t) and p.host_view(t).tobytes() == v.tobytes()
    assert p.used_bytes == 0 and p.host_pool.in_use_bytes == 4096
    p.ensure(t)
    assert p.view(t).tobytes() == v.tobytes()
    assert p.host_pool.in_use_bytes == 0
    p.offload(t)
    p.free(t)                                     # drop it from the host
    assert t.id not in p.host and p.host_pool.in_use_bytes == 0


def param(reg, name, nbytes=1000):
    return reg.add(name, Kind.PARAM, (nbytes // 4,), np.float32, persistent=True)


@pytest.mark.parametrize("kind", ["cpu", "virtual"])
def test_a_clean_parameter_block_is_evicted_without_a_copy(reg, kind):
    """A persistent block brought back from its home buffer and written by nothing since is
    evicted by freeing its block: the home still holds its bytes. Once written, it is copied."""
    p = pool(kind, blocks=2)
    t = param(reg, "w")
    v = pattern(t, 3)
    p.place_on_host(t, v)
    p.ensure(t)
    p.offload(t)                                  # clean: nothing copied
    c = p.counters()
    assert (c["offload_bytes"], c["clean_evictions"], c["clean_evicted_bytes"]) == (0, 1, 1000)
    assert not p.resident(t) and p.used_bytes == 0 and p.host_pool.in_use_bytes == 4096
    p.ensure(t)                                   # from the same home, its bytes intact
    if kind == "cpu":
        assert p.view(t).tobytes() == v.tobytes()
        p.view(t)[:] = 7.0                        # a kernel writes it (an update) ...
    p.written([t])                                # ... and the executor says so
    p.offload(t)
    assert p.counters()["offload_bytes"] == 1000 and p.counters()["clean_evictions"] == 1
    if kind == "cpu":
        assert (p.host_view(t) == 7.0).all()
        p.ensure(t)
        assert (p.view(t) == 7.0).all()


def test_a_clean_block_whose_home_was_given_back_is_copied(reg):
    """The host pool may give homes back under its pinned-memory cap: the block is copied."""
    p = pool("cpu", blocks=2)
    t = param(reg, "w")
    v = pattern(t, 4)
    p.place_on_host(t, v)
    p.ensure(t)
    p.host_pool.trim(homes=True)
    assert p.host_pool.home_of(t.id) is None
    p.offload(t)
    assert p.counters()["offload_bytes"] == 1000 and p.counters()["clean_evictions"] == 0
    p.ensure(t)
    assert p.view(t).tobytes() == v.tobytes()


def test_an_iteration_starts_with_no_clean_block(reg):
    p = pool("cpu", blocks=2)
    t = param(reg, "w")
    p.place_on_host(t, pattern(t, 5))
    p.ensure(t)
    p.release_held()                              # the iteration's end
    p.offload(t)
    assert p.counters()["offload_bytes"] == 1000


def test_virtual_and_cpu_pools_make_the_same_decisions(reg):
    """The planner's premise: the same call sequence gives the same offsets and counters."""
    ts = [act(reg, f"t{i}", (i % 3 + 1) * 700) for i in range(12)]

    def run(kind):
        p = pool(kind, blocks=6)
        log = []
        freed = set()
        for i, t in enumerate(ts):
            p.lock([t.id])
            p.alloc(t)
            if i >= 2 and i - 2 not in freed:
                p.ensure(ts[i - 2])
            p.unlock([t.id])
            if i % 4 == 3:
                p.free(ts[i - 1])
                freed.add(i - 1)
            if i >= 3 and ts[i - 3].id in p.host:
                p.prefetch(ts[i - 3])
            log.append((dict(p.offset), sorted(p.host), p.used_bytes))
        return log, p.counters(), p.high_water, p.max_extent

    log, counters, _, _ = run("cpu")
    assert counters["offloads"] > 0 and counters["cache_misses"] > 0

    assert run("cpu") == run("virtual")


def test_a_compressed_eviction_stages_in_the_arena_or_goes_uncompressed(reg):
    """COMPRESS (memory/compressed_swap.py): an evicted feature map is encoded into a staging
    block of the arena first. Where free space holds it the eviction goes ahead compressed
    (host bytes halved at rate 2); where none does, the tensor goes to the host as it is, comes
    back exact, and is compressed again next time."""
    from neuron.memory.codecs import Bf16
    p = pool(blocks=40)                             # t0 and t1 take 32 blocks, 8 are free
    t0, t1, t2 = (act(reg, f"t{i}", 16 * KiB) for i in range(3))
    p.codecs = {t0.id: Bf16()}
    x = np.random.default_rng(0).standard_normal(t0.shape).astype(np.float32)
    p.alloc(t0)[...] = x
    p.alloc(t1)
    p.lock([t1.id, t2.id])
    p.alloc(t2, step())                             # evicts t0 through an 8-block staging
    assert t0.id in p.host and p.host_pool.in_use_bytes == 8 * KiB
    assert p.used_bytes == 32 * KiB and p.by_kind_at_peak[Kind.WORKSPACE] == 8 * KiB
    p.free(t1)
    p.ensure(t0, step())
    got = p.view(t0)
    assert np.all(np.abs(got - x) <= Bf16().bound(x)) and not np.array_equal(got, x)
    assert p.used_bytes == 32 * KiB                 # the staging block went after the decode

    q = pool(blocks=32)                             # no block left for a staging area
    u0, u1, u2 = (act(reg, f"u{i}", 16 * KiB) for i in range(3))
    q.codecs = {u0.id: Bf16()}
    q.alloc(u0)[...] = x
    q.alloc(u1)
    q.lock([u1.id, u2.id])
    q.alloc(u2, step())
    assert u0.id in q.host and q.host_pool.in_use_bytes == 16 * KiB      # as it is
    assert u0.id in q.uncompressed and u0.id not in q.codecs
    q.free(u1)
    q.ensure(u0, step())
    np.testing.assert_array_equal(q.view(u0), x)
    assert q.codecs == {u0.id: q.codecs[u0.id]} and not q.uncompressed


def test_a_compressed_miss_without_room_to_stage_decodes_on_the_host(reg):
    from neuron.memory.codecs import Bf16
    p = pool(blocks=32)
    t0, t1, t2 = act(reg, "t0", 16 * KiB), act(reg, "t1", 8 * KiB), act(reg, "t2", 8 * KiB)
    p.codecs = {t0.id: Bf16()}
    x = np.random.default_rng(1).standard_normal(t0.shape).astype(np.float32)
    p.alloc(t0)[...] = x
    p.offload(t0)                                   # staged and compressed: 8 KiB on the host
    assert p.host_pool.in_use_bytes == 8 * KiB
    p.alloc(t1)
    p.alloc(t2)
    p.lock([t0.id, t1.id, t2.id])                   # 16 blocks free: t0, and no staging block
    p.ensure(t0, step())
    got = p.view(t0)
    assert np.all(np.abs(got - x) <= Bf16().bound(x)) and not np.array_equal(got, x)
    assert p.used_bytes == 32 * KiB and p.prefetch_bytes == 16 * KiB and not p.staged
    assert t0.id in p.codecs                        # compressed again next time


# ---------------------------------------------------------------- planned offloads' held blocks
@pytest.mark.parametrize("kind", list(DEVICES))
def test_a_deferred_offload_keeps_its_block_until_its_release_step(reg, kind):
    p = pool(kind, blocks=4)
    a, b = act(reg, "a"), act(reg, "b")
    p.alloc(a)
    p.alloc(b)
    p.log = []
    p.offload(a, defer=True, until=5)
    p.offload(b, defer=True)                    # no step: released at the next release
    assert p.used_bytes == 2 * KiB and p.host.keys() == {a.id, b.id}
    p.release_draining(4)
    assert p.used_bytes == KiB and [e[0] for e in p.draining] == [a]
    p.release_draining(5)
    assert p.used_bytes == 0 and not p.draining
    assert p.log[-2:] == [("drain", b.id, 0), ("drain", a.id, 0)]


@pytest.mark.parametrize("kind", list(DEVICES))
def test_a_held_block_is_released_before_anything_is_evicted(reg, kind):
    """Short of room, the pool releases a block kept for its offload's copy (a wait for a copy
    under way) before it evicts a tensor (a new copy out and back)."""
    p = pool(kind, blocks=3)
    a, b, c = act(reg, "a"), act(reg, "b"), act(reg, "c")
    for t in (a, b, c):
        p.alloc(t)
    p.offload(a, defer=True, until=10)
    p.alloc(act(reg, "d"))
    assert p.offload_count == 1 and p.evictions == 0     # a's planned offload only
    assert not p.draining and p.resident(b) and p.resident(c)


def test_a_prefetch_does_not_release_a_held_block(reg):
    p = pool("cpu", blocks=2)
    a, b = act(reg, "a"), act(reg, "b")
    p.alloc(a)
    p.alloc(b)
    p.offload(a, defer=True, until=10)
    p.offload(b)
    p.alloc(act(reg, "c"))                       # b's block
    assert not p.prefetch(b)                     # no room without waiting for a's copy
    assert len(p.draining) == 1
