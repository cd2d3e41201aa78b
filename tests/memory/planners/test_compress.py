"""COMPRESS (issue 13): compressed swaps move and hold fewer bytes, training with them is
deterministic for a seed, lossy (so never on by default) and close to the exact run."""
from __future__ import annotations

import argparse

import numpy as np
import pytest

import neuron as nn
from neuron.cli.planning import add_planner_arg, planner_spec
from neuron.executor import Executor
from neuron.memory.clock import makespan
from neuron.memory.compressed_swap import sent_uncompressed
from neuron.memory.costmodel import CostModel
from neuron.memory.planners import get_planner
from neuron.memory.planners.compress import Compressed
from neuron.models import build_model


@pytest.fixture(scope="module")
def graph():
    return build_model("resnet_cifar", depth=20, in_shape=(3, 8, 8))


def train(graph, planner):
    ex = Executor(graph, 4, optimizer=nn.SGD(lr=0.05, momentum=0.9), seed=3, planner=planner)
    losses = []
    for i in range(2):
        rng = np.random.default_rng(1000 + i)
        x = rng.standard_normal((4, 3, 8, 8)).astype(np.float32)
        losses.append(ex.train_step(x, rng.integers(0, 10, 4)))
    return losses, ex.state_dict(), ex


@pytest.mark.parametrize("rate", [2, 4])
def test_compressed_swaps_move_fewer_bytes_and_cost_codec_time(graph, rate):
    cost = CostModel.analytic("h100")
    runs = {}
    for p in ("vdnn", f"vdnn:compress={rate}"):
        ex = Executor(graph, 4, device="virtual", planner=p, cost=cost)
        r = ex.simulate(None, trace=False, events=True)
        runs[p] = (ex, r, makespan(r["events"], ex.steps, 4, cost))
    (ex0, r0, t0), (ex1, r1, t1) = runs.values()
    assert ex1.decisions.counts()["compress"] > 0
    assert r0["offload_bytes"] / r1["offload_bytes"] >= 0.95 * rate * (32 / 33 if rate == 4
                                                                         else 1)
    assert r1["prefetch_bytes"] == r1["offload_bytes"]
    assert r1["host_peak_bytes"] < r0["host_peak_bytes"]
    assert t0.codec_s == 0 and t1.codec_s > 0
    assert t1.bytes_moved < t0.bytes_moved


@pytest.mark.parametrize("rate", [2, 4])
def test_training_with_compression_is_deterministic_lossy_and_close(graph, rate):
    exact_losses, exact, _ = train(graph, "vdnn")
    a_losses, a, ex = train(graph, f"vdnn:compress={rate}")
    b_losses, b, _ = train(graph, f"vdnn:compress={rate}")
    assert ex.pool.codecs and ex.pool.offload_bytes > 0
    assert a_losses == b_losses
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert any(not np.array_equal(a[k], exact[k]) for k in a)        # the codec did act
    assert exact_losses[0] == a_losses[0]           # backward only reads the decoded maps
    assert abs(a_losses[1] - exact_losses[1]) < 0.05 * abs(exact_losses[1])


def test_off_by_default_and_cli(graph):
    ex = Executor(graph, 4, device="virtual", planner="vdnn")
    assert not ex.pool.codecs and not ex.decisions.compress
    assert isinstance(get_planner("capuchin:compress=2"), Compressed)
    # HOME decides per tensor (its fourth code) instead of the wrapper compressing every map
    home = get_planner("home:compress=2,iterations=1")
    assert not isinstance(home, Compressed) and home.rate == 2
    with pytest.raises(ValueError, match="rate 3"):
        get_planner("home:compress=3")
    with pytest.raises(ValueError, match="rate 3"):
        get_planner("vdnn:compress=3")
    p = argparse.ArgumentParser()
    add_planner_arg(p)
    assert planner_spec(p.parse_args([])) is None
    assert planner_spec(p.parse_args(["--compress", "4"])) == "superneurons:compress=4"
    assert planner_spec(p.parse_args(["--planner", "vdnn", "--compress", "2"])) == \
        "vdnn:compress=2"


def test_the_executor_simulates_a_compressed_plan_with_its_compression(graph):
    """The simulation the executor uses for a compressed plan (the planner's own, whose every
    candidate was simulated compressed: test_compressed_planning.py) is a fresh one's, of
    compressed bytes."""
    live = Executor(graph, 4, device="virtual", policy="liveness")
    peak = live.simulate(None, trace=False)["peak_bytes"]
    resident = sum(t.nbytes for t in live.persistent)
    budget = int(resident + 0.3 * (peak - resident))
    runs = {}
    for p in ("superneurons", "superneurons:compress=2"):
        ex = Executor(graph, 4, device="virtual", planner=p, budget=budget)
        used = ex.simulate(budget, trace=False)
        fresh = ex._simulate(budget, trace=False)
        assert used["fits"] and used["offload_bytes"] == fresh["offload_bytes"], p
        runs[p] = used
    plain, squeezed = runs["superneurons"], runs["superneurons:compress=2"]
    assert plain["offload_bytes"] > 0
    assert squeezed["offload_bytes"] < plain["offload_bytes"]


@pytest.mark.parametrize("planner,fraction", [("capuchin", 0.3), ("superneurons", 0.2),
                                              ("vdnn", 0.2)])
def test_compressed_plans_fit_where_the_plain_ones_do(planner, fraction):
    """A compressed offload needs a staging block; where free space has none, the tensor goes
    to the host as it is, and a planned one frees the tensor's block once encoded. (These
    cases failed while the staging block could only be had by evicting, and while a planned
    offload held both blocks for the copy.)"""
    g = build_model("resnet_cifar", depth=20, in_shape=(3, 32, 32))
    live = Executor(g, 32, device="virtual", policy="liveness")
    budget = int(live.simulate(None, trace=False)["peak_bytes"] * fraction)
    runs = {}
    for p in (planner, f"{planner}:compress=2"):
        ex = Executor(g, 32, device="virtual", planner=p, budget=budget)
        runs[p] = ex.simulate(budget, trace=False)
        assert runs[p]["fits"] and runs[p]["offload_bytes"] > 0, p


@pytest.mark.parametrize("planner,fraction", [("superneurons", 0.2), ("superneurons", 0.3),
                                              ("capuchin", 0.2), ("capuchin", 0.3),
                                              ("vdnn", 0.2)])
def test_compressed_plans_move_fewer_bytes_than_the_plain_ones_in_no_more_time(planner,
                                                                              fraction):
    """resnet_cifar 20 at batch 32 in a fraction of its liveness peak: compressed moves fewer
    bytes, no compressed tensor goes to the host as it is, and the iteration is no slower than
    plain by more than the codec's own passes. (At 0.2, compressed superneurons moved more
    bytes than plain while a prefetch held the decoded block and the staging block until the
    reader; at 0.3 it was slower by 2.5 times its codec time; capuchin sent 17 and 10
    evictions uncompressed for want of a whole staging block. Since capuchin's count search
    tries fewer recomputes than the excess, its plan at 0.3 leaves more to the cache and 2 of
    its evictions find no staging block; that plan is 30% faster than the one before.)"""
    g = build_model("resnet_cifar", depth=20, in_shape=(3, 32, 32))
    cost = CostModel.analytic("h100")
    live = Executor(g, 32, device="virtual", policy="liveness")
    budget = int(live.simulate(None, trace=False)["peak_bytes"] * fraction)
    runs = {}
    for p in (planner, f"{planner}:compress=2"):
        ex = Executor(g, 32, device="virtual", planner=p, budget=budget, cost=cost)
        r = ex.simulate(budget, trace=False, events=True)
        assert r["fits"], p
        runs[p] = (ex, r, makespan(r["events"], ex.steps, 32, cost))
    (_, plain, t0), (ex, squeezed, t1) = runs.values()
    assert 0 < squeezed["offload_bytes"] < plain["offload_bytes"]
    assert t1.makespan_s <= t0.makespan_s + t1.codec_s
    allowed = 2 if (planner, fraction) == ("capuchin", 0.3) else 0
    assert sent_uncompressed(squeezed["events"], ex.decisions.compress) <= allowed
