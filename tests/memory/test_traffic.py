"""The run moves what the plan moves (memory/traffic.py): for every policy and every planner, on a
small ResNet under a budget that forces moves, each iteration's offloads and prefetches (bytes,
tensors, order) equal the plan's simulated iteration, on the synchronous CPU device, on a device
whose copies complete late (the asynchronous path CudaDevice takes) and on CudaDevice's own code
over the CUDA stand-ins."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from neuron.devices import CpuDevice
from neuron.executor import Executor
from neuron.memory.planners import planner_names
from neuron.memory.policy import POLICIES
from neuron.memory.traffic import TrafficCheck, first_difference
from stream_model import StreamModelDevice

sys.path.insert(0, __file__.rsplit("/", 1)[0] + "/planners")
from planner_training import resnet8_budget  # noqa: E402

FRACTION = 0.6
RUNS = [{"policy": p} for p in POLICIES] + [{"planner": p} for p in planner_names()] + \
    [{"planner": "superneurons", "offload_params": True}, {"planner": "vdnn:compress=2"}]
#: those that move bytes at FRACTION (the rest only recompute or keep), checked to move
MOVERS = {"offload", "superneurons", "vdnn", "vdnn-conv", "capuchin", "home", "dqn",
          "checkmate", "vdnn:compress=2"}


def _name(kw):
    return ",".join(str(v) for v in kw.values())


def _train(dev_factory, kw, iters=2):
    graph, batch, budget = resnet8_budget(FRACTION, size=8, batch=4)
    dev = dev_factory(budget)
    try:
        ex = Executor(graph, batch, device=dev, seed=1, budget=budget, **kw)
    except Exception as e:         # a plan that cannot fit this budget fails before any state
        pytest.skip(f"{_name(kw)} does not fit {FRACTION} of the peak: {e}"[:200])
    check = TrafficCheck(ex)
    rng = np.random.default_rng(0)
    for _ in range(iters):
        x = rng.standard_normal((batch, 3, 8, 8)).astype(np.float32)
        check.begin()
        ex.train_step(x, rng.integers(0, 10, batch))
        check.end()
    return check, ex


@pytest.mark.parametrize("kw", RUNS, ids=_name)
@pytest.mark.parametrize("device", ["cpu", "late"])
def test_each_iteration_moves_what_the_plan_moves(kw, device):
    check, ex = _train(CpuDevice if device == "cpu" else StreamModelDevice, kw)
    assert check.iterations == 2
    assert not check.mismatches, check.mismatches[0]
    assert check.last == check.planned
    r = check.report()
    assert r["ran"] == r["planned"]
    if _name(kw).split(",")[0] in MOVERS:
        assert r["planned"]["offload_bytes"] > 0 and r["planned"]["prefetch_bytes"] > 0


@pytest.mark.parametrize("kw", [{"policy": "superneurons"}, {"planner": "superneurons"},
                                {"planner": "capuchin"}, {"planner": "vdnn"},
                                {"planner": "superneurons", "offload_params": True}], ids=_name)
def test_cuda_device_moves_what_the_plan_moves(gpu_kernels, kw):
    from neuron.devices.cuda import CudaDevice
    check, ex = _train(lambda b: CudaDevice(b, headroom_bytes=0), kw)
    ex.device.close()
    assert not check.mismatches, check.mismatches[0]
    assert check.report()["planned"]["prefetch_bytes"] > 0


def test_a_difference_is_found_and_placed():
    planned = [("offload", 1, 64), ("prefetch", 1, 64)]
    assert first_difference(planned, list(planned)) is None
    assert first_difference(planned, [("offload", 1, 64), ("fetch", 1, 64)]) == \
        {"index": 1, "planned": ("prefetch", 1, 64), "ran": ("fetch", 1, 64)}
    assert first_difference(planned, planned[:1])["ran"] is None
