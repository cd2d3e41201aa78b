"""The pool's asynchronous copy path (what CudaDevice uses: copy stream + events), exercised on
the CPU with a device whose copies complete late (stream_model.py): same arithmetic, every
prefetched tensor waited on before its kernel, host buffers read only once their copy is done
and written by a copy ordered after the copy that last read them."""
from __future__ import annotations

import numpy as np
import pytest

import neuron as nn
from neuron.devices import CpuDevice
from neuron.executor import Executor
from neuron.plan import plan
from stream_model import StreamModelDevice, pending


def chain():
    x = nn.Input((2, 16, 16), name="data")
    h = nn.Conv2d(8, 1, bias=False, name="stem")(x)
    for i in range(8):
        h = nn.Conv2d(8, 1, bias=False, name=f"c{i}")(h)
        if i % 2:
            h = nn.ReLU(name=f"r{i}")(nn.BatchNorm(name=f"bn{i}")(h))
    return nn.Graph(x, nn.Linear(10, name="fc")(nn.GlobalAvgPool(name="gap")(h)))


def train_sync_and_late(fraction, iters, **kw):
    """The chain trained on the synchronous CPU device and on the late-copy one, in a budget of
    ``fraction`` of its liveness peak: the late run must be the same, bit for bit. Returns
    both executors."""
    g, batch = chain(), 8
    budget = int(plan(g, batch, policy="liveness", search_min=False)["peak_bytes"] * fraction)
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((batch, 2, 16, 16)).astype(np.float32),
             rng.integers(0, 10, batch)) for _ in range(iters)]
    runs = {}
    for name, dev in (("sync", CpuDevice(budget)), ("late", StreamModelDevice(budget))):
        ex = Executor(g, batch, device=dev, seed=1, optimizer=nn.SGD(lr=0.05, momentum=0.9),
                      **kw)
        losses = [ex.train_step(x, y) for x, y in data]
        runs[name] = (losses, ex.state_dict(), ex)
    assert runs["late"][0] == runs["sync"][0]
    for k, v in runs["sync"][1].items():
        np.testing.assert_array_equal(runs["late"][1][k], v)
    return runs["sync"][2], runs["late"][2]


def test_late_copies_train_like_synchronous_ones():
    _, ex = train_sync_and_late(0.7, 3, policy="superneurons", offload_params=True)
    dev = ex.device
    c = ex.pool.counters()
    assert c["prefetches"] > 0 and c["offloads"] > 0
    assert dev.events and all(ev.waited for ev in dev.events if id(ev) not in pending(ex.pool))
    assert not ex.pool.inflight                 # every prefetch was consumed or settled
    assert len(ex.pool.deferred) < c["prefetches"]      # buffers came back for reuse


def test_host_buffers_come_back_whatever_the_copies_timing(monkeypatch):
    """A host buffer released while a prefetch still reads it returns to the host pool at once,
    with the prefetch's event for the next copy into it to wait for: the pool never asks
    whether a copy is done, so every iteration draws the same buffers at the same steps (a
    recorded iteration repeats: the 4,292-deep ResNet's did not on the H200, 2026-11-27)."""
    def asked(self, ev):
        raise AssertionError("the pool asked whether a copy is done")
    monkeypatch.setattr(StreamModelDevice, "is_done", asked)
    _, ex = train_sync_and_late(0.7, 3, policy="superneurons", offload_params=True)
    c = ex.pool.counters()
    assert c["prefetches"] > 0 and c["offloads"] > 0
    assert not ex.pool.deferred or len(ex.pool.deferred) < c["prefetches"]


def test_the_planned_host_budget_holds_while_prefetch_copies_still_read_their_buffers():
    # the plan frees a prefetched tensor's host buffer at the prefetch; a copy still reading it
    # must not make the run exceed the planned host peak (the H100 widest run did, by 1.8 GB)
    g, batch = chain(), 8
    budget = int(plan(g, batch, policy="liveness", search_min=False)["peak_bytes"] * 0.7)

    sync = Executor(g, batch, device=CpuDevice(budget), policy="superneurons",
                    offload_params=True, seed=1)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((batch, 2, 16, 16)).astype(np.float32), rng.integers(0, 10, batch)
    want = [sync.train_step(x, y) for _ in range(2)]
    host_peak = sync.pool.host_pool.peak_bytes
    assert host_peak > 0
    late = Executor(g, batch, device=StreamModelDevice(budget, polls=10 ** 6), policy="superneurons",
                    offload_params=True, seed=1, host_budget=host_peak)
    assert [late.train_step(x, y) for _ in range(2)] == want
    assert late.pool.host_pool.peak_bytes <= host_peak


def test_residency_states_follow_a_tensor():
    from neuron.memory.pool import Pool, Residency
    from neuron.memory.tensors import Kind, TensorRegistry
    reg = TensorRegistry()
    a = reg.add("a", Kind.ACTIVATION, (256,), np.float32)
    pool = Pool(StreamModelDevice(1 << 16), evict=True)
    assert pool.state(a) is Residency.ABSENT
    pool.alloc(a)
    assert pool.state(a) is Residency.DEVICE
    pool.offload(a)
    assert pool.state(a) is Residency.HOST
    assert pool.prefetch(a)
    assert pool.state(a) is Residency.PREFETCHING       # its copy's event is not done yet
    pool.ensure_all([a])                                # the consumer waits on the GPU
    assert pool.state(a) is Residency.DEVICE
    pool.free(a)
    assert pool.state(a) is Residency.ABSENT


@pytest.mark.parametrize("planner,fraction", [("vdnn:compress=2", 0.7),
                                              ("superneurons:compress=4", 0.3)])
def test_compressed_swaps_on_a_codec_stream_train_like_synchronous_ones(planner, fraction):
    """FreeLunch's codec on its own stream (CudaDevice.encode/decode): the same bytes as the
    synchronous codec, every staging block waited for before reuse and back at the end."""
    g = chain()
    budget = int(plan(g, 8, policy="liveness", search_min=False)["peak_bytes"] * fraction)
    sync, late = train_sync_and_late(fraction, 2, planner=planner, budget=budget)
    for ex in (sync, late):
        pool = ex.pool
        assert pool.codecs and pool.counters()["offloads"] > 0
        assert not pool.staged and not pool.inflight and not pool.draining
        assert pool.used_bytes == sum(pool.heap.round(t.nbytes) for t in pool.live.values())
        assert pool.high_water == ex.planned["peak_bytes"]        # staging in the plan
    assert late.device.events and all(ev.waited for ev in late.device.events
                                      if id(ev) not in pending(late.pool))      # no race


def test_the_stream_model_shows_host_reads_and_writes_that_do_not_wait():
    """The model itself: what would be a race on the GPU gives wrong bytes or an error here."""
    dev = StreamModelDevice(1 << 12, polls=10 ** 6)
    view = dev.view(0, (16,), np.float32)
    view[...] = np.arange(16, dtype=np.float32)
    buf = np.zeros(64, np.uint8)
    ev = dev.offload(view, buf)
    dev.compute_wait(ev)                        # orders kernels, tells the host nothing
    assert np.isnan(buf.view(np.float32)).all()
    assert not dev.is_done(ev)
    dev.wait(ev)
    np.testing.assert_array_equal(buf.view(np.float32), np.arange(16))

    back = dev.view(256, (16,), np.float32)
    ev2 = dev.prefetch(buf, back)
    buf[:4] = 7                                 # reused while the copy may still read it
    with pytest.raises(AssertionError, match="written while a copy"):
        dev.wait(ev2)

    first, second = dev.offload(view, buf), dev.prefetch(buf, back)
    dev.wait(second)                            # FIFO: the earlier copy is complete too
    assert first.complete
    np.testing.assert_array_equal(back, np.arange(16))


def test_a_compressed_miss_decoded_on_the_host_waits_for_the_copy_that_filled_its_buffer():
    """A miss with no room for a staging block decodes on the host (compressed_swap.py). The
    eviction that sent the tensor there only made compute wait for its copy: the host must
    wait too before it reads the buffer."""
    from neuron.memory.codecs import Bf16
    from neuron.memory.pool import Pool
    from neuron.memory.tensors import Kind, TensorRegistry
    KiB = 1024
    reg = TensorRegistry()
    t0 = reg.add("t0", Kind.ACTIVATION, (4 * KiB,), np.float32)
    t1, t2 = (reg.add(f"t{i}", Kind.ACTIVATION, (2 * KiB,), np.float32) for i in (1, 2))
    p = Pool(StreamModelDevice(32 * KiB, polls=10 ** 6), block=KiB, evict=True)
    p.codecs = {t0.id: Bf16()}
    x = np.random.default_rng(1).standard_normal(t0.shape).astype(np.float32)
    p.alloc(t0)[...] = x
    p.offload(t0)                               # staged, compressed, copied: compute waits
    p.alloc(t1)
    p.alloc(t2)
    p.lock([t0.id, t1.id, t2.id])
    p.ensure(t0)                                # no room to stage: decoded on the host
    got = p.view(t0)
    assert p.prefetch_bytes == t0.nbytes and not p.staged
    assert np.all(np.abs(got - x) <= Bf16().bound(x))


def test_a_step_interrupted_anywhere_on_late_copies_leaves_no_trace(interrupt_at):
    """The step transaction (undo.py) under copies and codec work that are still running when
    the step is cut: the state read back is the state before, and training goes on as if the
    step had never started."""
    g, batch = chain(), 8
    budget = int(plan(g, batch, policy="liveness", search_min=False)["peak_bytes"] * 0.4)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((batch, 2, 16, 16)).astype(np.float32), rng.integers(0, 10, batch)

    def make(dev):
        return Executor(g, batch, device=dev, seed=1, budget=budget, offload_params=True,
                        planner="superneurons:compress=2",
                        optimizer=nn.SGD(lr=0.05, momentum=0.9))
    ex, ref = make(StreamModelDevice(budget, polls=10 ** 6)), make(CpuDevice(budget))
    assert ex.train_step(x, y) == ref.train_step(x, y)
    for n in range(1, len(ex.steps) + 1, 4):
        before = ex.state_dict()
        undo = interrupt_at(ex, n)
        with pytest.raises(KeyboardInterrupt):
            ex.train_step(x, y)
        undo()
        after = ex.state_dict()
        assert all(after[k].tobytes() == v.tobytes() for k, v in before.items()), n
    assert ex.pool.counters()["offloads"] > 0 and ex.pool.codecs
    assert ex.train_step(x, y) == ref.train_step(x, y)
    for k, v in ref.state_dict().items():
        np.testing.assert_array_equal(ex.state_dict()[k], v)
