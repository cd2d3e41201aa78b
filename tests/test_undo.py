"""A training step is a transaction: interrupted anywhere, or non-finite, it leaves no trace."""
import threading

import numpy as np
import pytest

import neuron as nn
from neuron.errors import NonFiniteLossError, NonFiniteUpdateError
from neuron.executor import Executor


def residual_bn():
    x = nn.Input((2, 5, 5), name="data")
    a = nn.Conv2d(3, 3, padding=1, name="c1")(x)
    b = nn.BatchNorm(name="bn1")(a)
    c = nn.ReLU(name="r1")(b)
    d = nn.Conv2d(3, 3, padding=1, name="c2")(c)
    s = nn.Conv2d(3, 1, name="sc")(x)
    e = nn.Add(name="add")(d, s)
    y = nn.Linear(4, name="fc")(nn.GlobalAvgPool(name="gap")(nn.BatchNorm(name="bn2")(e)))
    return nn.Graph(x, y, name="residual_bn")


def batch(seed=0, n=4):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 2, 5, 5)).astype(np.float32), rng.integers(0, 4, n)


def same_state(a, b):
    return a.keys() == b.keys() and all(a[k].tobytes() == b[k].tobytes() for k in a)


def pool_at_rest(ex, used_before):
    p = ex.pool
    return (p.used_bytes == used_before and not p.locked and not p.held and
            all(t.persistent for t in p.live.values()) and
            all(t.persistent for t, _ in p.host.values()))


class Interrupt(BaseException):
    pass


CONFIGS = [("liveness", False), ("liveness", True), ("baseline", False),
           ("superneurons", False), ("superneurons", True), ("offload", False)]


@pytest.mark.parametrize("policy,offload_params", CONFIGS)
def test_interrupt_anywhere_leaves_state_pool_and_counter_exactly_as_before(
        policy, offload_params, interrupt_at):
    g = residual_bn()
    kw = dict(optimizer=nn.SGD(lr=0.05, momentum=0.9, weight_decay=1e-3), policy=policy,
              offload_params=offload_params, seed=1)
    ex, ref = Executor(g, 4, **kw), Executor(g, 4, **kw)
    x, y = batch(0)
    ex.train_step(x, y)
    ref.train_step(x, y)
    n_steps = len(ex.steps)
    for n in range(1, n_steps + 1, 2):
        before, it, used = ex.state_dict(), ex.iteration, ex.pool.used_bytes
        undo_hook = interrupt_at(ex, n)
        with pytest.raises(KeyboardInterrupt):
            ex.train_step(x, y)
        undo_hook()
        assert same_state(before, ex.state_dict()), f"interrupted at kernel call {n}"
        assert ex.iteration == it
        assert pool_at_rest(ex, used), f"interrupted at kernel call {n}"
    # and the executor goes on exactly as one that was never interrupted
    x2, y2 = batch(1)
    assert ex.train_step(x2, y2) == ref.train_step(x2, y2)
    assert same_state(ex.state_dict(), ref.state_dict())


def test_any_exception_is_undone_too(interrupt_at):
    g = residual_bn()
    ex = Executor(g, 4, optimizer=nn.SGD(lr=0.1, momentum=0.9), seed=0)
    x, y = batch(0)
    ex.train_step(x, y)
    before = ex.state_dict()
    stop = interrupt_at(ex, len(ex.steps) - 1, Interrupt)   # the second-to-last update
    with pytest.raises(Interrupt):
        ex.train_step(x, y)
    stop()
    assert same_state(before, ex.state_dict())


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_non_finite_update_with_finite_loss_is_refused_whole():
    """A huge momentum buffer: the loss is finite, the update overflows in one layer."""
    g = residual_bn()
    ex = Executor(g, 4, optimizer=nn.SGD(lr=10.0, momentum=0.9), seed=0)
    x, y = batch(0)
    bad = ex.state_dict()
    bad["momentum:c1.weight"][:] = 3e38
    ex.load_state_dict(bad)
    with pytest.raises(NonFiniteUpdateError) as e:
        ex.train_step(x, y)
    assert "undone" in str(e.value) and "iteration 0" in str(e.value)
    assert same_state(bad, ex.state_dict())
    assert ex.iteration == 0
    ex.load_state_dict({**bad, "momentum:c1.weight": np.zeros_like(bad["c1.weight"])})
    assert np.isfinite(ex.train_step(x, y)) and ex.iteration == 1


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_huge_learning_rate_stops_at_the_first_non_finite_step_with_the_last_good_state():
    g = residual_bn()
    ex = Executor(g, 4, optimizer=nn.SGD(lr=1e38, momentum=0.9), seed=0)
    x, y = batch(0)
    for _ in range(5):
        good, it = ex.state_dict(), ex.iteration
        try:
            ex.train_step(x, y)
        except NonFiniteLossError:      # NonFiniteUpdateError is one
            break
    else:
        pytest.fail("lr 1e38 never produced a non-finite step")
    assert it >= 1 and ex.iteration == it
    assert same_state(good, ex.state_dict())
    assert all(np.isfinite(v).all() for v in ex.state_dict().values())


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_non_finite_bn_statistic_is_refused():
    """A finite 3e38 pixel drives a BN running variance to inf."""
    g = residual_bn()
    ex = Executor(g, 4, optimizer=nn.SGD(lr=0.01), seed=0)
    x, y = batch(0)
    x[0, 0, 2, 2] = 3e38
    before = ex.state_dict()
    with pytest.raises(NonFiniteLossError):        # either the loss or the statistic
        ex.train_step(x, y)
    assert same_state(before, ex.state_dict())
    assert np.isfinite(ex.state_dict()["bn1.running_var"]).all()


def test_undo_copies_live_on_the_host_not_in_the_arena():
    g = residual_bn()
    ex = Executor(g, 4, seed=0)
    planned = ex.planned["arena_bytes"]
    x, y = batch(0)
    ex.train_step(x, y)
    assert ex.device.arena_bytes == planned
    blocks = sum(b.nbytes for b in ex.persistent)
    assert ex._undo_record.host_bytes == blocks     # one copy of each written block
    assert ex._undo_record.snapshot_bytes == blocks


def test_two_threads_on_one_executor_get_a_clear_error():
    g = residual_bn()
    ex = Executor(g, 4, seed=0)
    x, y = batch(0)
    inside, release = threading.Event(), threading.Event()
    real = ex._compute

    def slow(step, ctx, ws):
        inside.set()
        release.wait(10)
        return real(step, ctx, ws)
    ex._compute = slow
    t = threading.Thread(target=ex.train_step, args=(x, y))
    t.start()
    assert inside.wait(10)
    try:
        with pytest.raises(RuntimeError, match="already running a step"):
            ex.train_step(x, y)
        with pytest.raises(RuntimeError, match="already running a step"):
            ex.evaluate(x, y)
    finally:
        release.set()
        t.join(10)
    del ex._compute
    assert ex.iteration == 1
    ex.train_step(x, y)
    assert ex.iteration == 2


def test_an_interrupted_evaluate_leaves_the_pool_at_rest(interrupt_at):
    g = residual_bn()
    ex = Executor(g, 4, seed=0)
    x, y = batch(0)
    used = ex.pool.used_bytes
    stop = interrupt_at(ex, 3)
    with pytest.raises(KeyboardInterrupt):
        ex.evaluate(x, y)
    stop()
    assert pool_at_rest(ex, used)
    ex.evaluate(x, y)


@pytest.mark.parametrize("dtype", [np.complex64, np.int64, np.uint8, object])
def test_images_that_are_not_real_floats_are_refused(dtype):
    from neuron.errors import DataError
    ex = Executor(residual_bn(), 4, seed=0)
    x, y = batch(0)
    with pytest.raises(DataError, match=f"dtype {np.dtype(dtype)}"):
        ex.train_step(x.astype(dtype), y)
    assert ex.iteration == 0


# ---- the guard on a device with per-block fences (CudaDevice, on the CUDA stand-ins) --------

def _cuda_executor(cuda_standins, lr=0.01, momentum=0.9):
    if not cuda_standins.have_compiler():
        pytest.skip("g++ is not installed")
    from neuron.devices.cuda import CudaDevice
    cuda_standins.log_streams()
    dev = CudaDevice(16 << 20, headroom_bytes=0)
    return Executor(residual_bn(), 4, device=dev, seed=0,
                    optimizer=nn.SGD(lr=lr, momentum=momentum))


def test_a_steps_snapshots_are_a_few_range_copies_waited_for_once_each(cuda_standins):
    """Where the written blocks stay in place all step, adjacent ones are copied as one range,
    in pieces doubling in size, and compute waits once per piece: a handful of operations
    per step, not two per block (each a graph node and a cross-stream edge)."""
    ex = _cuda_executor(cuda_standins)
    try:
        x, y = batch(0)
        ex.train_step(x, y)
        undo = ex._undo_record
        blocks = ex._snapshots_at_start()
        assert len(blocks) >= 5 and all(undo.stays(b) for b in blocks)
        pieces = [p for run in undo._adjacent_runs(blocks) for p in undo._pieces(run)]
        assert len(pieces) < len(blocks)
        dev = ex.device
        d2h = [op for op in dev.snapshot_stream.ops if op[0] == "d2h"]
        assert len(d2h) == len(pieces)
        assert sum(op[3] for op in d2h) == undo.snapshot_bytes >= sum(b.nbytes for b in blocks)
        waits = [op for op in dev.compute_stream.ops if op[0] == "wait"
                 and op[2] is not None and op[2][0] is dev.snapshot_stream]
        assert len(waits) == len(pieces)
    finally:
        ex.device.close()


def test_pieces_double_from_the_first_and_cut_at_block_boundaries():
    from neuron import undo as undo_mod

    class Block:
        def __init__(self, i, n):
            self.id, self.nbytes = i, n

    class Heap:
        @staticmethod
        def round(n):
            return n

    rec = undo_mod.UndoRecord.__new__(undo_mod.UndoRecord)
    rec.pool = type("P", (), {"heap": Heap()})()
    mib = undo_mod.FIRST_PIECE
    run = [Block(i, mib // 2) for i in range(14)]
    sizes = [sum(b.nbytes for b in p) for p in rec._pieces(run)]
    assert sizes == [mib, 2 * mib, 4 * mib]
    assert [b for p in rec._pieces(run) for b in p] == run
    big = [Block(0, 3 * mib), Block(1, 1)]     # a block larger than its piece is one piece
    assert [len(p) for p in rec._pieces(big)] == [1, 1]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_non_finite_statistic_is_caught_by_the_deferred_check_and_undone(cuda_standins,
                                                                           monkeypatch):
    """A NaN running variance leaves training-mode outputs (and so the loss) finite: only the
    guard's check of the statistics, deferred to one launch before backward, can see it."""
    from neuron.kernels import cuda
    ex = _cuda_executor(cuda_standins)
    calls = {"many": 0, "one": 0}
    many, one = cuda.nonfinite_flag_update_many, cuda.nonfinite_flag_update
    monkeypatch.setattr(cuda, "nonfinite_flag_update_many",
                        lambda f, a: calls.__setitem__("many", calls["many"] + 1) or many(f, a))
    monkeypatch.setattr(cuda, "nonfinite_flag_update",
                        lambda f, a: calls.__setitem__("one", calls["one"] + 1) or one(f, a))
    try:
        x, y = batch(0)
        var = {t.name: t for t in ex.state_tensors}["bn1.running_var"]
        ex.pool.view(var)[1] = np.nan       # load_state_dict refuses it: put it in place
        bad = ex.state_dict()
        with pytest.raises(NonFiniteUpdateError):
            ex.train_step(x, y)
        assert same_state(bad, ex.state_dict()) and ex.iteration == 0
        assert calls["many"] == 1           # both BatchNorms' statistics, one launch
        ex.load_state_dict({**bad, "bn1.running_var": np.ones_like(bad["bn1.running_var"])})
        assert np.isfinite(ex.train_step(x, y)) and ex.iteration == 1
    finally:
        ex.device.close()


def test_a_non_finite_update_on_the_cuda_device_is_undone_from_the_range_copies(cuda_standins):
    ex = _cuda_executor(cuda_standins, lr=10.0)
    try:
        x, y = batch(0)
        ex.train_step(x, y)
        bad = ex.state_dict()
        bad["momentum:c1.weight"][:] = 3e38
        ex.load_state_dict(bad)
        with pytest.raises(NonFiniteUpdateError):
            ex.train_step(x, y)
        assert same_state(bad, ex.state_dict()) and ex.iteration == 1
    finally:
        ex.device.close()


def test_under_offload_params_the_resident_blocks_are_snapshotted_early(cuda_standins):
    """The parameters kept in the arena (``resident_params``) stay put all step: their
    snapshots start with it, as one range, where each used to stall its update for a copy issued
    right before it; those on the host between uses still snapshot before their write. A good
    step's state is unchanged by it (the same as on the CPU), and a failed one is undone."""
    if not cuda_standins.have_compiler():
        pytest.skip("g++ is not installed")
    from neuron.devices import CpuDevice
    from neuron.devices.cuda import CudaDevice
    cuda_standins.log_streams()
    kw = dict(offload_params=True, resident_params=4 << 10, planner="sublinear-sqrt",
              budget=8 << 20, optimizer=nn.SGD(lr=0.1, momentum=0.9))
    dev = CudaDevice(8 << 20, headroom_bytes=0)
    try:
        ex = Executor(residual_bn(), 4, device=dev, seed=0, **kw)
        x, y = batch(0)
        ex.train_step(x, y)
        early, on_host = ex._snapshots_at_start(), ex.host_blocks()
        written = {b.id for s in ex.steps for b in ex._blocks_written(s)}
        assert early and on_host and written & on_host
        assert {b.id for b in early} == written - on_host
        waits = [op for op in dev.compute_stream.ops if op[0] == "wait"
                 and op[2] is not None and op[2][0] is dev.snapshot_stream]
        undo = ex._undo_record
        pieces = [p for r in undo._adjacent_runs(early) for p in undo._pieces(r)]
        assert len(waits) == len(written & on_host) + len(pieces)
        cpu = Executor(residual_bn(), 4, device=CpuDevice(8 << 20), seed=0, **kw)
        cpu.train_step(x, y)
        got, want = ex.state_dict(), cpu.state_dict()
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)
        var = {t.name: t for t in ex.state_tensors}["bn2.running_var"]
        assert var.storage in early                 # a resident block: checked deferred
        ex.pool.view(var)[0] = np.inf
        bad = ex.state_dict()
        with pytest.raises(NonFiniteUpdateError):
            ex.train_step(x, y)
        assert same_state(bad, ex.state_dict())
    finally:
        dev.close()


def test_a_snapshot_before_its_write_runs_under_the_kernel_before_the_write(cuda_standins):
    """Blocks on the host between uses (offload_params) are snapshotted in the step: a
    parameter block before its backward kernel, a BatchNorm's statistics before the kernel of
    the step before where they are in the arena by then (prefetched ahead), so a kernel runs
    between each copy and the wait of the write on it (a copy issued right before its write
    stalled compute for all its bytes)."""
    if not cuda_standins.have_compiler():
        pytest.skip("g++ is not installed")
    from neuron.devices.cuda import CudaDevice
    from neuron.tape import DEVICE_OPS, TIMELINE_OPS, _Ref
    dev = CudaDevice(8 << 20, headroom_bytes=0)
    try:
        ex = Executor(residual_bn(), 4, device=dev, seed=0, offload_params=True,
                      planner="sublinear-sqrt", budget=8 << 20, replay="tape",
                      prefetch_ahead=4,
                      optimizer=nn.SGD(lr=0.1, momentum=0.9))
        x, y = batch(0)
        for _ in range(4):
            ex.train_step(x, y)
        assert ex.replay["ran"] == "tape" and not ex._snapshots_at_start()
        ops = ex._replay.tape.ops
        names = [getattr(fn, "__name__", "") for fn, *_ in ops]
        device_ops = set(DEVICE_OPS) | set(TIMELINE_OPS) | {"nonfinite_flag_update",
                                                          "nonfinite_flag_clear"}
        waited = 0
        for j, (name, (_, args, _, _)) in enumerate(zip(names, ops)):
            if name != "compute_wait" or not isinstance(args[0], _Ref) or \
                    names[args[0].index] != "snapshot":
                continue
            between = names[args[0].index + 1:j]
            assert any(n not in device_ops for n in between), (args[0].index, between)
            waited += 1
        written = {b.id for s in ex.steps for b in ex._blocks_written(s)}
        assert waited == len(written)
    finally:
        dev.close()
