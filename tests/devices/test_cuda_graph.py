"""The tape as a CUDA graph (neuron/devices/cuda_graph.py), on the CPU: the GPU kernel module over
the stand-ins, and a device whose "graph" is the captured work deferred to its launch, with every
host synchronization refused while the work runs (what a real capture forbids). What this
checks: which operations the capture rewrites (the batch from pinned staging, the loss rows
into a fixed buffer averaged after the launch, host waits as device waits), capturing again
when a Varying argument changes, falling back to the tape with a reason, the same bits as eager
execution. What it cannot: CUDA's own capture (tests/gpu/test_replay.py on a GPU)."""
import sys

import numpy as np
import pytest

import neuron as nn
from neuron.devices import CpuDevice
from neuron.executor import Executor

sys.path.insert(0, __file__.rsplit("/", 1)[0] + "/../kernels")
from test_cuda_on_standins import GRAPHS  # noqa: E402


class _Capturing(RuntimeError):
    pass


class DeferredGraph:
    def __init__(self, device, work):
        self.device, self.work = device, work

    def launch(self):
        self.device.capturing = True
        try:
            self.work()
        finally:
            self.device.capturing = False


class GraphDeviceOnCpu(CpuDevice):
    """The CPU arena, the GPU kernel module (stand-ins), graphs as deferred work."""
    name = "graph-standin"
    graph_replay = True
    capturing = False

    @property
    def kernels(self):
        from neuron.kernels import cuda
        return cuda

    @property
    def cupy(self):
        from neuron.kernels import cuda
        return cuda._cp()

    def view(self, offset, shape, dtype):
        from cuda_standins import DevArray
        return super().view(offset, shape, dtype).view(DevArray)

    def synchronize(self):
        if self.capturing:
            raise _Capturing("the host synchronized inside a capture")

    def capture(self, work):
        self.captured = getattr(self, "captured", 0) + 1
        return DeferredGraph(self, work)

    def launch(self, graph):
        graph.launch()

    def upload(self, dst, src):
        dst[...] = src

    def fixed_array(self, shape, dtype):
        return self.cupy.empty(shape, dtype)

    def order_after(self, event):
        pass


def _train(device, replay, steps=6, lr_schedule=False, graph="resnet_cifar8"):
    g = GRAPHS[graph]() if isinstance(graph, str) else graph()
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((4, *g.inputs[0].shape)).astype(np.float32),
             rng.integers(0, 10, 4)) for _ in range(steps)]
    ex = Executor(g, 4, device=device, seed=1, replay=replay,
                  optimizer=nn.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4))
    losses = []
    for i, (x, y) in enumerate(data):
        if lr_schedule:
            ex.optimizer.lr = 0.05 / (1 + i)
        losses.append(ex.train_step(x, y))
    return losses, ex


@pytest.mark.parametrize("lr_schedule", [False, True], ids=["constant_lr", "lr_schedule"])
def test_graph_replay_gives_the_bits_of_eager_execution(gpu_kernels, lr_schedule):
    arena = 64 << 20
    l_off, off = _train(GraphDeviceOnCpu(arena), "off", lr_schedule=lr_schedule)
    dev = GraphDeviceOnCpu(arena)
    l_graph, ex = _train(dev, "graph", lr_schedule=lr_schedule)
    assert l_graph == l_off
    s_off, s_graph = off.state_dict(), ex.state_dict()
    assert all(s_off[k].tobytes() == s_graph[k].tobytes() for k in s_off)
    r = ex.replay
    assert r["ran"] == "graph" and r["tape_because"] is None, r
    replays = r["replayed_iterations"]
    assert replays >= 3
    # captured once: the learning rate is read from a device buffer written before each launch
    assert r["graph_captures"] == 1


def test_the_capture_moves_host_work_to_the_device(gpu_kernels):
    _, ex = _train(GraphDeviceOnCpu(64 << 20), "graph")
    graph = ex._replay.graph
    names = [getattr(fn, "__name__", "") for fn, *_ in graph._capturable_ops()]
    assert "upload" in names                    # the batch and the labels
    assert names.count("upload") == 2
    updates = [(args, kw) for fn, args, kw, _ in graph._capturable_ops()
               if getattr(fn, "__name__", "") == "sgd_update"]
    assert updates and all(kw["neg_lr_buffer"] is not None for _, kw in updates)
    assert "softmax_xent_rows" in names and "softmax_xent_forward" not in names
    assert len(names) == len(ex._replay.tape.ops)       # same positions: results by index


def test_an_iteration_that_cannot_be_captured_replays_the_tape_and_says_why(gpu_kernels):
    """A recorded host synchronization (here a compressed decode on the host would be one;
    the test records a synchronize into the tape) cannot be in a graph: the tape is replayed,
    with the same bits, and the reason is reported once."""
    dev = GraphDeviceOnCpu(64 << 20)
    g = GRAPHS["resnet_cifar8"]()
    ex = Executor(g, 4, device=dev, seed=1, replay="graph",
                  optimizer=nn.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4))
    real = ex._guarded_run

    def with_sync(undo, ctx):
        dev.synchronize()
        return real(undo, ctx)
    ex._guarded_run = with_sync
    rng = np.random.default_rng(0)
    with pytest.warns(RuntimeWarning, match="replaying the tape instead.*synchronize"):
        for _ in range(4):
            ex.train_step(rng.standard_normal((4, 3, 16, 16)).astype(np.float32),
                          rng.integers(0, 10, 4))
    r = ex.replay
    assert r["ran"] == "tape" and "synchronize" in r["tape_because"]


def test_graph_mode_needs_a_device_that_captures():
    with pytest.raises(ValueError, match="needs a device that captures graphs"):
        Executor(GRAPHS["resnet_cifar8"](), 4, device=CpuDevice(64 << 20), replay="graph")


def _with_dropout():
    x = nn.Input((3, 8, 8), name="data")
    h = nn.ReLU(name="r1")(nn.Conv2d(4, 3, padding=1, name="c1")(x))
    h = nn.Dropout(0.5, name="drop")(nn.Linear(16, name="fc1")(h))
    return nn.Graph(x, nn.Linear(10, name="fc2")(h))


def test_dropout_keys_come_from_device_buffers(gpu_kernels):
    """Each iteration's dropout mask is another one (its seed changes), yet the graph is
    captured once: the key is written to a device buffer before each launch, as the learning
    rate is."""
    l_off, off = _train(GraphDeviceOnCpu(64 << 20), "off", graph=_with_dropout)
    l_graph, ex = _train(GraphDeviceOnCpu(64 << 20), "graph", graph=_with_dropout)
    assert l_graph == l_off
    s_off, s_graph = off.state_dict(), ex.state_dict()
    assert all(s_off[k].tobytes() == s_graph[k].tobytes() for k in s_off)
    r = ex.replay
    assert r["ran"] == "graph" and r["replayed_iterations"] >= 3, r
    assert r["graph_captures"] == 1
    ops = ex._replay.graph._capturable_ops()
    drops = [kw for fn, _, kw, _ in ops if getattr(fn, "__name__", "") == "dropout_forward"]
    assert drops and all(kw.get("key_buffer") is not None for kw in drops)

