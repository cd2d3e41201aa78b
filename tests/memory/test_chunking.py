"""Sub-layer chunking (memory/chunking.py): every layer's step split along the batch.

Results are deterministic, within 1e-6 (relative to each parameter's largest magnitude) of
the unchunked run in float32 after a step, bit-identical between budgets that chunk alike
(chunks streamed through the pool or not), and chunking lowers the largest step."""
from __future__ import annotations

import numpy as np
import pytest

import neuron as nn
from neuron.executor import Executor
from neuron.memory.chunking import chunk_sizes
from neuron.models import build_model
from neuron.plan import lower_bound, plan

BATCH = 8


def tiny_vgg():
    """Conv, BN, ReLU, max pool, LRN, dropout, FC and a fan-out into add and concat (no conv
    bias before BN: its gradient is zero up to rounding, nothing to compare)."""
    x = nn.Input((3, 8, 8), name="data")
    a = nn.ReLU(name="r0")(nn.BatchNorm(name="bn0")(nn.Conv2d(6, 3, padding=1, bias=False, name="c0")(x)))
    b = nn.Conv2d(6, 3, padding=1, name="c1")(a)
    j = nn.Add(name="add")(a, b)                    # a fans out to c1 and add
    cat = nn.Concat(name="cat")(j, a)               # ... and concat
    p = nn.MaxPool2d(2, 2, name="pool")(nn.LRN(3, name="lrn")(cat))
    h = nn.Dropout(0.3, name="drop")(nn.ReLU(name="r1")(nn.Linear(16, name="fc0")(p)))
    return nn.Graph(x, nn.Linear(10, name="fc1")(h), name="tiny_vgg")


GRAPHS = {"tiny_vgg": tiny_vgg,
          "resnet8": lambda: build_model("resnet_cifar", depth=8, in_shape=(3, 8, 8))}


def train(graph, chunks, policy="liveness", budget=None, steps=1):
    ex = Executor(graph, BATCH, policy=policy, seed=5, chunks=chunks, budget=budget,
                  optimizer=nn.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4))
    rng = np.random.default_rng(7)
    losses = []
    for _ in range(steps):
        x = rng.standard_normal((BATCH, *graph.inputs[0].shape)).astype(np.float32)
        losses.append(ex.train_step(x, rng.integers(0, 10, BATCH)))
    return ex, losses


def test_chunk_sizes():
    assert chunk_sizes(10, 3) == [4, 3, 3] and chunk_sizes(8, 8) == [1] * 8
    with pytest.raises(ValueError):
        chunk_sizes(4, 5)


@pytest.mark.parametrize("name", list(GRAPHS))
@pytest.mark.parametrize("chunks", [2, 3])
def test_chunked_matches_unchunked(name, chunks):
    g = GRAPHS[name]()
    (a, la), (b, lb) = train(g, 1), train(g, chunks)
    assert abs(la[0] - lb[0]) <= 1e-6 * abs(la[0])
    pa, pb = a.state_dict(), b.state_dict()
    assert pa.keys() == pb.keys()
    for k in pa:
        scale = max(float(np.abs(pa[k]).max()), 1e-30)
        tol = 1e-6 if ":" not in k else 5e-6        # momentum after one step: the gradient
        assert float(np.abs(pa[k] - pb[k]).max()) <= tol * scale, k
    assert any(not np.array_equal(pa[k], pb[k]) for k in pa)    # really a different order


def test_chunked_deterministic_and_budget_independent():
    g = GRAPHS["resnet8"]()
    free, _ = train(g, 2, steps=2)
    again, _ = train(g, 2, steps=2)
    p = plan(g, BATCH, policy="offload", chunks=2, trace=False)
    tight, _ = train(g, 2, policy="offload", budget=p["min_budget_bytes"], steps=2)
    assert tight.pool.offload_bytes > 0             # chunks streamed through the pool
    ref = free.state_dict()
    for other in (again, tight):
        got = other.state_dict()
        for k in ref:
            assert np.array_equal(ref[k], got[k]), k


def test_chunking_lowers_the_largest_step_and_evaluates():
    g = GRAPHS["tiny_vgg"]()
    one = Executor(g, BATCH, device="virtual", policy="offload")
    four = Executor(g, BATCH, device="virtual", policy="offload", chunks=4)
    assert lower_bound(four, ideal=True)[1] < lower_bound(one, ideal=True)[1]
    (a, _), (b, _) = train(g, 1), train(g, 4)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((BATCH, 3, 8, 8)).astype(np.float32)
    y = rng.integers(0, 10, BATCH)
    (la, ca), (lb, cb) = a.evaluate(x, y), b.evaluate(x, y)
    assert b.last_logits.shape == (BATCH, 10)
    np.testing.assert_allclose(b.last_logits, a.last_logits, rtol=1e-5, atol=1e-5)
    assert abs(la - lb) <= 1e-5 * abs(la) and ca == cb


def test_planner_chooses_the_chunk_count_and_cli_shows_it(capsys):
    import json

    from neuron.cli.main import main
    from neuron.plan import choose_chunks, fits
    g = build_model("resnet_cifar", depth=8)
    whole = plan(g, 16, policy="offload", trace=False)
    budget = whole["ideal_bound_bytes"] - 1          # no whole-layer plan fits below this
    assert not fits(g, 16, budget, policy="offload")
    k = choose_chunks(g, 16, budget, policy="offload")
    assert k is not None and k > 1
    assert fits(g, 16, budget, policy="offload", chunks=k)
    assert not fits(g, 16, budget, policy="offload", chunks=k // 2)
    r = plan(g, 16, policy="offload", budget=budget, chunks="auto", trace=False)
    assert r["fits"] and r["chunks"] == k and r["peak_bytes"] <= budget
    rc = main(["plan", "resnet_cifar", "--depth", "8", "--batch", "16", "--policy", "offload",
               "--budget", str(budget), "--chunks", "auto", "--json"])
    out = capsys.readouterr().out
    assert rc == 0 and f"chunks                  {k} per layer" in out
    assert json.loads(out.strip().splitlines()[-1])["chunks"] == k


def test_auto_chunks_with_a_planner_splits_below_the_whole_layer_bound(capsys):
    """The planners plan a chunked schedule's tensors (it was an error, and before that a bare
    KeyError from the planner's rewrite): `--chunks auto` with a planner splits the layers
    where no whole-layer plan fits, and the CLI says who plans the chunks."""
    from neuron.cli.main import main
    from neuron.plan import choose_chunks
    g = build_model("resnet_cifar", depth=8)
    budget = plan(g, 8, policy="offload", trace=False)["ideal_bound_bytes"] - 1
    k = choose_chunks(g, 8, budget, planner="vdnn")
    assert k is not None and k > 1
    r = plan(g, 8, planner="vdnn", budget=budget, chunks="auto", trace=False)
    assert r["fits"] and r["chunks"] == k and r["peak_bytes"] <= budget
    assert r["planner"] == "vdnn" and r["tensor_decisions"]["swap"] > 0
    assert not r["recompute_off_for_chunks"]
    rc = main(["plan", "resnet_cifar", "--depth", "8", "--batch", "8", "--planner", "vdnn",
               "--chunks", "auto", "--budget", str(budget), "--no-min-budget"])
    out = capsys.readouterr().out
    assert rc == 0 and f"chunks                  {k} per layer" in out
    assert "vdnn plans each chunk's tensors" in out and "fits, peak" in out


def test_the_plan_says_that_chunks_turn_the_policys_recomputation_off(capsys):
    from neuron.cli.main import main
    g = build_model("resnet_cifar", depth=8)
    r = plan(g, 8, policy="superneurons", chunks=2, trace=False)
    assert r["recompute_off_for_chunks"] and r["recompute_strategy"] is None
    assert r["extra_forward_steps"] == 0
    whole = plan(g, 8, policy="superneurons", trace=False)
    assert not whole["recompute_off_for_chunks"] and whole["recompute_strategy"] == "cost"
    assert not plan(g, 8, policy="offload", chunks=2, trace=False)["recompute_off_for_chunks"]
    assert main(["plan", "resnet_cifar", "--depth", "8", "--batch", "8", "--policy",
                 "superneurons", "--chunks", "2"]) == 0
    assert "recomputation is off with chunks" in capsys.readouterr().out
