"""The GPU kernel module trains like numpy_ref, on the CPU: the executor runs every step through
neuron.kernels.cuda with the CuPy and cuDNN stand-ins (cuda_standins/), so each wrapper gets
the arrays, descriptors, accumulate flags and temporaries that a real run gives it.

The numbers differ from numpy_ref only where the GPU module computes differently by design: the
loss rows in float64, the gathered pooling gradients' summation order. So losses and parameters
after a few steps agree to float32 rounding (a wrong wire gives an error in the first digits)."""
from __future__ import annotations

import numpy as np
import pytest

import neuron as nn
from neuron.devices import CpuDevice
from neuron.executor import Executor
from neuron.models import build_model
from neuron.plan import plan


def CudaKernelsOnCpu(arena):
    """The CPU arena with the GPU kernel module on the stand-ins (cuda_standins)."""
    from cuda_standins import CudaKernelsOnCpu as device
    return device(arena)


def alexnet_like():
    """LRN with an even window (a raw kernel) and an odd one (cuDNN), max and average pooling
    (average backward is a raw kernel), sigmoid; no dropout (its mask is the counter hash on the
    GPU, NumPy's generator on the CPU, by design)."""
    x = nn.Input((3, 17, 17), name="data")
    h = nn.ReLU(name="r1")(nn.Conv2d(8, 3, padding=1, name="c1")(x))
    h = nn.LRN(4, name="lrn_even")(h)
    h = nn.MaxPool2d(3, 2, name="p1")(h)
    h = nn.ReLU(name="r2")(nn.Conv2d(8, 3, padding=1, bias=False, name="c2")(h))
    h = nn.LRN(5, name="lrn_odd")(h)
    h = nn.AvgPool2d(2, 2, name="p2")(h)
    h = nn.Sigmoid(name="s")(nn.Linear(16, name="fc1")(h))
    return nn.Graph(x, nn.Linear(10, name="fc2")(h))


def ceil_pools():
    """Ceil-mode pools: three with shapes cuDNN cannot compute (the raw kernels; the cuDNN
    stand-in refuses them) and one whose last window torch drops, so its shape is the floor
    one and it may go to cuDNN."""
    x = nn.Input((3, 16, 16), name="data")
    h = nn.ReLU(name="r1")(nn.Conv2d(8, 3, padding=1, name="c1")(x))
    h = nn.MaxPool2d(3, 2, ceil_mode=True, name="p1")(h)                  # 16 -> 8 (floor 7)
    h = nn.ReLU(name="r2")(nn.Conv2d(8, 3, padding=1, name="c2")(h))
    h = nn.AvgPool2d(3, 2, 1, ceil_mode=True, name="p2")(h)               # 8 -> 5 (floor 4)
    h = nn.MaxPool2d(2, 2, 1, ceil_mode=True, name="p3")(h)               # 5 -> 3 (floor 3)
    h = nn.AvgPool2d(2, 2, ceil_mode=True, name="p4")(h)                  # 3 -> 2 (floor 1)
    return nn.Graph(x, nn.Linear(10, name="fc")(h))


GRAPHS = {
    "resnet_cifar8": lambda: build_model("resnet_cifar", depth=8, in_shape=(3, 16, 16)),
    "densenet_cifar10": lambda: build_model("densenet_cifar", depth=10, in_shape=(3, 16, 16)),
    "alexnet_like": alexnet_like,
    "ceil_pools": ceil_pools,
}


def train(graph, device, steps=3, **kw):
    batch = 4
    g = GRAPHS[graph]()
    shape = g.inputs[0].shape
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((batch, *shape)).astype(np.float32),
             rng.integers(0, 10, batch)) for _ in range(steps)]
    ex = Executor(g, batch, device=device, seed=1, **kw,
                  optimizer=nn.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4))
    losses = [ex.train_step(x, y) for x, y in data]
    return losses, ex.state_dict(), ex


def _arena_for(graph, kw):
    """(graph, arena bytes, executor keywords, fraction): ``kw["fraction"]`` of the graph's
    liveness peak as the budget, or a roomy 64 MiB arena without one."""
    kw = dict(kw)
    fraction = kw.pop("fraction", None)
    g = GRAPHS[graph]()
    if fraction == "min":                   # the least the policy's plan fits in
        arena = plan(g, 4, trace=False, **kw)["min_budget_bytes"]
    else:
        arena = int(plan(g, 4, policy="liveness", search_min=False)["peak_bytes"] * fraction) \
            if fraction else 64 << 20
    if fraction:
        kw["budget"] = arena
    return g, arena, kw, fraction


def _same(a, b):
    (la, sa, _), (lb, sb, _) = a, b
    np.testing.assert_allclose(la, lb, rtol=2e-5)
    assert sa.keys() == sb.keys()
    for k in sa:
        np.testing.assert_allclose(sa[k], sb[k], rtol=2e-4, atol=2e-6, err_msg=k)


@pytest.mark.parametrize("graph", list(GRAPHS))
def test_the_gpu_kernel_module_trains_like_numpy_ref(gpu_kernels, graph):
    arena = 64 << 20
    _same(train(graph, CudaKernelsOnCpu(arena)), train(graph, CpuDevice(arena)))


def test_under_memory_pressure_with_recomputation_and_chunks(gpu_kernels):
    """Recomputed BN (running statistics untouched), offloaded parameters, a chunked schedule
    (gradients accumulated across chunks: the beta = 1 paths)."""
    g = GRAPHS["resnet_cifar8"]()
    peak = plan(g, 4, policy="liveness", search_min=False)["peak_bytes"]
    budget = int(peak * 0.5)
    for kw in ({"planner": "superneurons", "offload_params": True, "budget": budget},
               {"policy": "superneurons", "chunks": 2}):
        _same(train("resnet_cifar8", CudaKernelsOnCpu(budget if "budget" in kw else 64 << 20),
                    **kw),
              train("resnet_cifar8", CpuDevice(budget if "budget" in kw else 64 << 20), **kw))


def test_a_wrong_accumulate_flag_is_caught(gpu_kernels, monkeypatch):
    """The check can fail: conv backward-data that overwrites where it must add (beta 0 for
    accumulate) trains differently."""
    import cuda_standins
    dnn = gpu_kernels.dnn
    real = type(dnn).convolution_backward_data

    def overwrite(self, *a, beta=0.0, **k):
        return real(self, *a, beta=0.0, **k)
    monkeypatch.setattr(cuda_standins.CudnnStandIn, "convolution_backward_data", overwrite)
    with pytest.raises(AssertionError):
        _same(train("resnet_cifar8", CudaKernelsOnCpu(64 << 20)),
              train("resnet_cifar8", CpuDevice(64 << 20)))


@pytest.mark.parametrize("graph,kw", [
    ("resnet_cifar8", {}),
    ("resnet_cifar8", {"policy": "superneurons", "chunks": 2}),
    ("densenet_cifar10", {"planner": "superneurons", "offload_params": True, "fraction": 0.5}),
    ("resnet_cifar8", {"planner": "vdnn", "fraction": 0.6}),
    ("alexnet_like", {"policy": "superneurons", "compact": True, "offload_params": True,
                      "fraction": 0.7}),
])
def test_cuda_device_itself_trains_like_the_cpu(gpu_kernels, graph, kw):
    """CudaDevice's own code on the CUDA runtime stand-in (device memory is host memory at real
    addresses): the one arena and its views, CuPy temporaries routed into the pool's heap,
    offloads and prefetches through pinned buffers with memcpyAsync, compaction, the input
    stager, the step guard's flag."""
    from neuron.devices.cuda import CudaDevice
    _, arena, kw, fraction = _arena_for(graph, kw)
    dev = CudaDevice(arena, headroom_bytes=0)
    temporaries = []
    malloc = dev.allocator.malloc
    dev.allocator.malloc = lambda n, device_id=0: temporaries.append(n) or malloc(n, device_id)
    try:
        got = train(graph, dev, **kw)
        _same(got, train(graph, CpuDevice(arena), **kw))
        pool = got[2].pool
        assert dev.allocator.live_bytes == 0            # every temporary was given back
        if kw.get("chunks"):            # accumulating kernels take CuPy temporaries: the arena's
            assert temporaries
        if fraction:
            c = pool.counters()
            assert c["offloads"] > 0 and c["prefetches"] > 0
            from neuron.devices.cuda import pinned_host_bytes
            assert pinned_host_bytes() >= pool.host_pool.reserved_bytes > 0     # pinned
        assert pool.high_water <= arena
    finally:
        dev.close()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("kw", [{}, {"planner": "superneurons", "offload_params": True,
                                     "fraction": 0.5}])
def test_an_interrupted_step_on_cuda_device_is_undone(gpu_kernels, interrupt_at, kw):
    """tests/gpu/test_step_guard.py's interrupted step, on CudaDevice's own code here: a step
    interrupted at every 7th kernel leaves parameters, optimizer state and BN statistics
    bitwise as they were (also with parameters offloaded to pinned memory under a budget)."""
    from neuron.devices.cuda import CudaDevice
    g, arena, kw, _ = _arena_for("resnet_cifar8", kw)
    dev = CudaDevice(arena, headroom_bytes=0)
    try:
        _, _, ex = train("resnet_cifar8", dev, steps=1, **kw)
        rng = np.random.default_rng(5)
        xb = rng.standard_normal((4, *g.inputs[0].shape)).astype(np.float32)
        yb = rng.integers(0, 10, 4)
        before = ex.state_dict()
        for n in range(1, len(ex.steps), 7):
            undo = interrupt_at(ex, n)
            with pytest.raises(KeyboardInterrupt):
                ex.train_step(xb, yb)
            undo()
            after = ex.state_dict()
            assert all(before[k].tobytes() == after[k].tobytes() for k in before), n
            assert ex.iteration == 1
        ex.train_step(xb, yb)           # and the next step runs
        assert ex.iteration == 2
    finally:
        dev.close()


class _RerunGraph:
    """A graph captured on the stand-ins, which ran the work as it was issued: its launch runs
    the captured work again, as CUDA runs a graph's nodes (what the capture fixed stays fixed:
    the work is the same closure, with the same arguments)."""

    def __init__(self, work):
        self.work = work

    def launch(self, stream=None):
        self.work()


@pytest.fixture
def rerun_graphs(monkeypatch, cuda_standins):
    """CudaDevice.capture under the stand-in's capture rules, every byte of device and pinned
    memory put back afterwards, returning a graph whose launch runs the work again."""
    from neuron.devices.cuda import CudaDevice
    real = CudaDevice.capture

    def capture(self, work):
        restore = cuda_standins.memory_snapshot()
        try:
            real(self, work)
        finally:
            restore()
        return _RerunGraph(work)
    monkeypatch.setattr(CudaDevice, "capture", capture)


@pytest.mark.parametrize("graph,kw", [
    ("resnet_cifar8", {}),
    ("resnet_cifar8", {"policy": "superneurons", "chunks": 2}),
    ("densenet_cifar10", {"planner": "superneurons", "offload_params": True, "fraction": 0.5}),
    ("alexnet_like", {"policy": "superneurons", "compact": True, "offload_params": True,
                      "fraction": 0.7}),
    # the least budget: parameters go to the host and back every iteration, each to the
    # buffer it left (its home), or the records never repeat (memory/host.py)
    ("resnet_cifar8", {"policy": "superneurons", "offload_params": True, "fraction": "min"}),
    # compressed swaps: the codec stream's kernels inside the capture
    ("resnet_cifar8", {"planner": "superneurons:compress=2", "fraction": 0.6}),
    # prefetches several steps ahead (memory/prefetch_horizon.py), their events on the tape
    ("resnet_cifar8", {"policy": "superneurons", "fraction": 0.5, "prefetch_ahead": "auto"}),
    ("densenet_cifar10", {"planner": "superneurons", "offload_params": True, "fraction": 0.5,
                          "prefetch_ahead": "auto"}),
    # the kit's deepest configuration: parameters on the host but for some kept resident,
    # sqrt(n) checkpoints, prefetches 4 steps ahead
    ("resnet_cifar8", {"planner": "sublinear-sqrt", "offload_params": True,
                       "resident_params": 48 << 10, "prefetch_ahead": 4, "fraction": 0.6}),
    # ... fused (BatchNorm+ReLU, Add+ReLU: the stage's choice where fusion proved itself)
    ("resnet_cifar8", {"planner": "sublinear-sqrt", "offload_params": True, "fuse": True,
                       "resident_params": 48 << 10, "prefetch_ahead": 4, "fraction": 0.6}),
])
def test_the_tape_replays_cuda_device_bit_identically(gpu_kernels, rerun_graphs, graph, kw):
    """CudaDevice's recorded iteration (kernel calls with their descriptors and views, the
    pool's asynchronous copies and event waits, the step guard) replayed, as a tape and as a
    graph captured under CUDA's capture rules, gives the bits of the same device running every
    iteration; under a budget too, or it says why it cannot."""
    _, arena, kw, _ = _arena_for(graph, kw)
    runs = replays_bit_identically(graph, arena, **kw)
    if "compress" in str(kw.get("planner")):        # the codec ran, and is on the tape
        names = {getattr(fn, "__name__", "") for fn, *_ in runs["graph"][2]._replay.tape.ops}
        assert {"encode", "decode"} <= names, names


def test_a_nonfinite_image_in_a_graph_step_is_named_and_undone(gpu_kernels, rerun_graphs):
    """The images' check runs inside the graph (into the step guard's flag); a bad batch is
    named on the host after the launch, and the step is undone."""
    from neuron.devices.cuda import CudaDevice
    from neuron.errors import DataError
    _, arena, _, _ = _arena_for("resnet_cifar8", {})
    dev = CudaDevice(arena, headroom_bytes=0)
    try:
        _, _, ex = train("resnet_cifar8", dev, steps=5, replay="graph")
        assert ex.replay["ran"] == "graph"
        before = ex.state_dict()
        rng = np.random.default_rng(4)
        x = rng.standard_normal((4, 3, 16, 16)).astype(np.float32)
        x[1, 1, 1, 1] = np.inf
        with pytest.raises(DataError, match="NaN or infinity"):
            ex.train_step(x, np.zeros(4, np.int64))
        after = ex.state_dict()
        assert all(before[k].tobytes() == after[k].tobytes() for k in before)
        x[1, 1, 1, 1] = 0.0
        ex.train_step(x, np.zeros(4, np.int64))
        assert ex.replay["ran"] == "graph" and ex.iteration == 6
    finally:
        dev.close()


@pytest.mark.parametrize("graph,kw", [
    ("resnet_cifar8", {"policy": "superneurons", "fraction": "min"}),
    ("densenet_cifar10", {"planner": "superneurons", "offload_params": True, "fraction": 0.5}),
])
def test_under_a_budget_the_fourth_iteration_replays(gpu_kernels, rerun_graphs, graph, kw):
    """The first iteration chooses algorithms, so its record differs from the second; the
    second and third record one program, and the fourth replays. The copy events held across
    an iteration's end are their streams' carry events (Pool.carry_copies): held as ring
    events, whose slots depend on the copies the iteration before issued, the second record
    waited on other events than the third and replay began an iteration later (the deepest
    ResNet's eager iteration takes about 20 s on the GPU)."""
    from neuron.devices.cuda import CudaDevice
    _, arena, kw, _ = _arena_for(graph, kw)
    dev = CudaDevice(arena, headroom_bytes=0)
    try:
        _, _, ex = train(graph, dev, steps=4, replay="graph", **kw)
        r = ex.replay
        assert ex.pool.offload_bytes > 0, "no copies: the budget exerts no pressure"
        assert r["recorded_iterations"] == 3 and r["replayed_iterations"] == 1, r
        assert r["ran"] == "graph" and r["eager_because"] is None, r
        names = {getattr(fn, "__name__", "") for fn, *_ in ex._replay.tape.ops}
        assert "carry_copies" in names, "no copy event was held across the iteration's end"
    finally:
        dev.close()


def test_an_iteration_longer_than_the_fences_event_ring_replays(gpu_kernels, rerun_graphs):
    """resnet_cifar 56 under a budget: more steps per iteration than the block fences' ring of
    step events (fences.RING), so the ring wraps inside every iteration, as it does hundreds
    of times in the deepest ResNet's. The fourth iteration replays as a captured graph with
    eager's bits."""
    from neuron.devices.cuda import CudaDevice
    from neuron.memory.fences import RING
    g = build_model("resnet_cifar", depth=56, in_shape=(3, 16, 16))
    batch = 4
    r = plan(g, batch, policy="liveness", search_min=False, trace=False)
    persistent = r["params"] * 8                    # parameters and momentum
    arena = int(persistent + 0.3 * (r["peak_bytes"] - persistent))
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((batch, 3, 16, 16)).astype(np.float32),
             rng.integers(0, 10, batch)) for _ in range(5)]
    runs = {}
    for mode in ("off", "graph"):
        dev = CudaDevice(arena, headroom_bytes=0)
        try:
            ex = Executor(g, batch, device=dev, seed=1, budget=arena, replay=mode,
                          policy="superneurons",
                          optimizer=nn.SGD(lr=0.01, momentum=0.9, weight_decay=1e-4))
            assert len(ex.steps) > RING
            runs[mode] = [ex.train_step(x, y) for x, y in data], ex.state_dict(), ex
        finally:
            dev.close()
    (l_off, s_off, ex_off), (l_graph, s_graph, ex) = runs["off"], runs["graph"]
    assert ex_off.pool.offload_bytes > 0, "no copies: the budget exerts no pressure"
    assert l_graph == l_off
    assert all(s_off[k].tobytes() == s_graph[k].tobytes() for k in s_off)
    rep = ex.replay
    assert rep["ran"] == "graph" and rep["eager_because"] is None, rep
    assert rep["recorded_iterations"] == 3 and rep["replayed_iterations"] == 2, rep


def replays_bit_identically(graph, arena, **kw) -> dict:
    """Six steps of ``graph`` on CudaDevice (the stand-ins) eagerly, as a tape and as a graph
    (mode -> train's answer): the replays give eager's losses and every state bit, and each
    replayed at least 2 iterations in the mode asked for."""
    from neuron.devices.cuda import CudaDevice
    runs = {}
    for mode in ("off", "tape", "graph"):
        dev = CudaDevice(arena, headroom_bytes=0)
        try:
            runs[mode] = train(graph, dev, steps=6, replay=mode, **kw)
        finally:
            dev.close()
    l_off, s_off, _ = runs["off"]
    for mode in ("tape", "graph"):
        losses, state, ex = runs[mode]
        assert losses == l_off, mode
        assert all(s_off[k].tobytes() == state[k].tobytes() for k in s_off), mode
        r = ex.replay
        assert r["eager_because"] is None, r
        assert r["replayed_iterations"] >= 2, r
        assert r["ran"] == mode and r["tape_because"] is None, r
    return runs
