"""Cost-aware recomputation (memory/recompute.py): which tensors are dropped, how the schedule is
rewritten, how many extra forwards each strategy costs, and that training is unchanged by it
(BN running statistics updated once, dropout masks reused)."""
from __future__ import annotations

import numpy as np
import pytest

import neuron as nn
from neuron.executor import Executor, with_loss
from neuron.memory.liveness import frees_for
from neuron.memory.recompute import CHECKPOINT_KINDS, plan_recompute
from neuron.memory.schedule import build_schedule
from neuron.models import build_model
from neuron.models.densenet import densenet

STRATEGIES = ("speed", "cost", "memory")


# ---------------------------------------------------------------- graphs
def cheap_chain(short=2, long=24, c=4, hw=8):
    """conv0 -> (BN, ReLU) x short -> conv1 -> (BN, ReLU) x long -> GAP -> fc.
    The short segment plus its own backward step fits under l_peak (set by conv1's 5x5 im2col
    workspace), so cost-aware recomputes it speed-centric; the long one is far above
    (memory-centric)."""
    x = nn.Input((2, hw, hw), name="data")
    h = nn.Conv2d(c, 1, bias=False, name="conv0")(x)
    for i in range(short):
        h = nn.ReLU(name=f"a.relu{i}")(nn.BatchNorm(name=f"a.bn{i}")(h))
    h = nn.Conv2d(c, 5, padding=2, bias=False, name="conv1")(h)
    for i in range(long):
        h = nn.ReLU(name=f"b.relu{i}")(nn.BatchNorm(name=f"b.bn{i}")(h))
    y = nn.Linear(3, name="fc")(nn.GlobalAvgPool(name="gap")(h))
    return nn.Graph(x, y, name="cheap_chain")


def relu_run(k):
    """conv -> ReLU x k -> GAP -> fc: one segment of k+1 cheap layers; each ReLU output is read
    by its own backward only, the GAP output by fc's backward."""
    x = nn.Input((1, 4, 4), name="data")
    h = nn.Conv2d(2, 1, name="conv")(x)
    for i in range(k):
        h = nn.ReLU(name=f"relu{i}")(h)
    y = nn.Linear(3, name="fc")(nn.GlobalAvgPool(name="gap")(h))
    return nn.Graph(x, y, name=f"relu_run{k}")


def dropout_net():
    """Dropout (p=0.5) whose output BN reads in backward: it is dropped and recomputed."""
    x = nn.Input((2, 6, 6), name="data")
    h = nn.Conv2d(4, 3, padding=1, name="conv1")(x)
    h = nn.Dropout(0.5, name="drop")(h)
    h = nn.ReLU(name="relu")(nn.BatchNorm(name="bn")(h))
    h = nn.Conv2d(4, 3, padding=1, name="conv2")(h)
    h = nn.Dropout(0.3, name="drop2")(nn.ReLU(name="relu2")(h))
    y = nn.Linear(5, name="fc")(nn.GlobalAvgPool(name="gap")(h))
    return nn.Graph(x, y, name="dropout_net")


def resnet8():
    return build_model("resnet_cifar", depth=8, in_shape=(3, 8, 8))


def small_densenet():
    return densenet(block_config=(2, 2), growth_rate=4, num_init_features=8, in_shape=(3, 8, 8),
                    num_classes=10, stem="cifar")


GRAPHS = {"resnet8": resnet8, "densenet": small_densenet, "cheap_chain": cheap_chain,
          "dropout_net": dropout_net, "relu_run5": lambda: relu_run(5)}


def schedule(graph, batch=4):
    return build_schedule(with_loss(graph), batch, np.float32, ("momentum",))


def rewrite(graph, strategy, batch=4):
    """A fresh schedule and its rewrite (plan_recompute registers versions in the schedule)."""
    s = schedule(graph, batch)
    original = list(s.steps)
    steps, report = plan_recompute(s, strategy)
    return s, original, steps, report


def producers(sched):
    return {sched.act[id(t)].id: layer for layer in sched.graph.route for t in layer.outputs}


def expected_dropped(sched, original):
    """Independently: forward tensors read by a backward step whose producer is a cheap
    (non-checkpoint) layer."""
    prod = producers(sched)
    out = {}
    for s in original:
        if s.phase != "B":
            continue
        for t in [*s.ins, *s.outs]:
            if t is not None and t.id in prod and prod[t.id].kind not in CHECKPOINT_KINDS:
                out[t.id] = t
    return out


def chain_layers(sched, tid):
    layer = producers(sched)[tid]
    out = []
    while layer.kind not in CHECKPOINT_KINDS:
        out.append(layer)
        layer = layer.inputs[0].producer
    return out[::-1]


# ---------------------------------------------------------------- what is dropped
@pytest.mark.parametrize("name", list(GRAPHS))
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_dropped_tensors_are_cheap_outputs_read_in_backward(name, strategy):
    sched, original, steps, report = rewrite(GRAPHS[name](), strategy)
    dropped = expected_dropped(sched, original)
    assert dropped, "the graph has nothing to recompute: the test would be vacuous"
    assert report.dropped_tensors == len(dropped)
    assert report.dropped_bytes == sum(t.nbytes for t in dropped.values())
    # after the rewrite, backward reads exactly the non-dropped forward tensors it read before
    before = {t.id for s in original if s.phase == "B" for t in [*s.ins, *s.outs]
              if t is not None}
    after = {t.id for s in steps if s.phase == "B" for t in [*s.ins, *s.outs] if t is not None}
    forward_ids = set(producers(sched))
    assert after & forward_ids == before - set(dropped)
    # checkpoint outputs are never dropped
    prod = producers(sched)
    assert all(prod[tid].kind not in CHECKPOINT_KINDS for tid in dropped)


@pytest.mark.parametrize("name", list(GRAPHS))
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_backward_reads_versions_written_by_earlier_recompute_steps(name, strategy):
    sched, original, steps, report = rewrite(GRAPHS[name](), strategy)
    dropped = expected_dropped(sched, original)
    written_by = {}
    for i, s in enumerate(steps):
        assert s.index == i
        if s.phase == "B":
            assert not {t.id for t in s.reads} & set(dropped), s.name
        for t in s.reads:
            if not t.persistent and t.kind.value in ("activation", "data"):
                assert t.id in written_by, f"{s.name} reads {t.name} before anything wrote it"
        for t in s.writes:
            assert t.id not in written_by, f"{t.name} written twice"
            written_by[t.id] = i
    versions = {t.id: t for s in steps if s.phase == "R" for t in s.outs}
    assert versions
    prod = producers(sched)
    for t in versions.values():
        base = sched.registry[t.name.split("@r")[0]]      # a version of a forward tensor ...
        assert prod[base.id].kind not in CHECKPOINT_KINDS   # ... made by a cheap layer
        assert (base.shape, base.dtype, base.kind) == (t.shape, t.dtype, t.kind)
    # every version is used by a later step (no wasted recomputation)
    for vid, t in versions.items():
        assert any(vid in {r.id for r in s.reads} for s in steps[written_by[vid] + 1:]), t.name
    # the forward copy of a dropped tensor dies before backward starts (that is the saving)
    first_b = next(i for i, s in enumerate(steps) if s.phase == "B")
    freed_at = {t.id: i for i, dead in enumerate(frees_for(steps)) for t in dead}
    for tid in dropped:
        assert freed_at[tid] < first_b, sched.registry.tensors[tid].name


@pytest.mark.parametrize("name", list(GRAPHS))
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_recompute_steps_only_run_cheap_layers(name, strategy):
    sched, original, steps, report = rewrite(GRAPHS[name](), strategy)
    rsteps = [s for s in steps if s.phase == "R"]
    assert len(rsteps) == report.extra_forward_steps > 0
    forward = {s.layer.name for s in original if s.phase == "F"}
    for s in rsteps:
        assert s.layer.kind not in CHECKPOINT_KINDS, s.name
        assert s.layer.name in forward
        # a recompute re-reads aux (BN statistics, dropout mask) and writes only new versions
        aux_ids = {t.id for t in s.aux.values()}
        assert aux_ids <= {t.id for t in s.reads}
        assert not aux_ids & {t.id for t in s.writes}
        assert [t.id for t in s.writes] == [t.id for t in s.outs]
        assert all("@r" in t.name for t in s.outs)
        assert not any(t.persistent for t in s.writes)
    # the original step list is untouched (no renumbering, no R steps)
    assert [s.index for s in original] == list(range(len(original)))
    assert all(s.phase in "FB" for s in sched.steps)
    # F steps are kept as they were, in order, before any backward
    assert [s.layer.name for s in steps if s.phase == "F"] == \
        [s.layer.name for s in original if s.phase == "F"]
    assert [s.layer.name for s in steps if s.phase == "B"] == \
        [s.layer.name for s in original if s.phase == "B"]


def test_unknown_strategy():
    with pytest.raises(ValueError, match="speed, memory, cost"):
        plan_recompute(schedule(relu_run(2)), "fastest")


# ---------------------------------------------------------------- how many extra forwards
def _extra(graph, strategy):
    return rewrite(graph, strategy)[3]


@pytest.mark.parametrize("name", ["resnet8", "densenet", "cheap_chain", "dropout_net"])
def test_extra_forwards_speed_le_cost_le_memory(name):
    r = {s: _extra(GRAPHS[name](), s) for s in STRATEGIES}
    assert r["speed"].extra_forward_steps <= r["cost"].extra_forward_steps \
        <= r["memory"].extra_forward_steps
    for s, rep in r.items():
        assert rep.speed_segments + rep.memory_segments == rep.segments > 0
        assert rep.strategy == s
    assert r["speed"].memory_segments == 0 and r["memory"].speed_segments == 0
    assert len({(rep.dropped_tensors, rep.dropped_bytes, rep.segments, rep.l_peak)
                for rep in r.values()}) == 1


def test_long_cheap_segment_makes_memory_centric_strictly_more():
    g = cheap_chain(short=2, long=24)
    r = {s: _extra(g, s) for s in STRATEGIES}
    assert r["speed"].extra_forward_steps < r["cost"].extra_forward_steps \
        < r["memory"].extra_forward_steps
    # cost-aware: the short segment speed-centric, the long one memory-centric
    assert (r["cost"].speed_segments, r["cost"].memory_segments) == (1, 1)
    sched = schedule(g)
    assert r["cost"].l_peak == max(s.resident_bytes() for s in sched.steps)


@pytest.mark.parametrize("k", [1, 3, 6])
def test_table1_closed_forms_on_one_segment(k):
    """k ReLUs + GAP after a conv: speed-centric recomputes each of the k+1 layers once,
    memory-centric recomputes the prefix for every backward read: (k+1) + k(k+1)/2."""
    g = relu_run(k)
    assert _extra(g, "speed").extra_forward_steps == k + 1
    assert _extra(g, "memory").extra_forward_steps == (k + 1) + k * (k + 1) // 2


@pytest.mark.parametrize("name", list(GRAPHS))
def test_speed_centric_recomputes_each_dropped_layer_once(name):
    sched, original, steps, report = rewrite(GRAPHS[name](), "speed")
    names = [s.layer.name for s in steps if s.phase == "R"]
    assert len(names) == len(set(names)), "a layer recomputed twice under speed-centric"
    dropped = expected_dropped(sched, original)
    want = {l.name for tid in dropped for l in chain_layers(sched, tid)}
    assert set(names) == want
    assert report.extra_forward_steps == len(want)


@pytest.mark.parametrize("name", list(GRAPHS))
def test_memory_centric_count_matches_independent_model(name):
    """Each backward step that reads a dropped tensor re-runs that tensor's chain from its
    checkpoint; nothing recomputed is kept."""
    sched, original, steps, report = rewrite(GRAPHS[name](), "memory")
    dropped = expected_dropped(sched, original)
    want = 0
    for s in original:
        if s.phase == "B":
            for t in [*s.ins, *s.outs]:
                if t is not None and t.id in dropped:
                    want += len(chain_layers(sched, t.id))
    assert report.extra_forward_steps == want
    # intermediates die at once: every version is read by exactly one later step
    versions = {t.id for s in steps if s.phase == "R" for t in s.outs}
    reads = [t.id for s in steps for t in s.reads if t.id in versions]
    assert sorted(reads) == sorted(versions)


def test_memory_centric_peak_not_above_speed_centric():
    g = cheap_chain(short=2, long=24)
    peaks = {}
    for s in STRATEGIES:
        ex = Executor(g, 4, device="virtual", policy="recompute", recompute_strategy=s)
        peaks[s] = ex.simulate()["peak_bytes"]
    live = Executor(g, 4, device="virtual", policy="liveness").simulate()["peak_bytes"]
    assert peaks["memory"] <= peaks["cost"] <= peaks["speed"] <= live
    assert peaks["memory"] < live


# ---------------------------------------------------------------- training is unchanged
def _train(graph, policy, strategy="cost", steps=3, batch=4, k=10, seed=2):
    ex = Executor(graph, batch, policy=policy, recompute_strategy=strategy, seed=seed,
                  optimizer=nn.SGD(lr=0.05, momentum=0.9, weight_decay=5e-4))
    losses = []
    for i in range(steps):
        rng = np.random.default_rng(100 + i)
        x = rng.standard_normal((batch, *graph.inputs[0].shape)).astype(np.float32)
        losses.append(ex.train_step(x, rng.integers(0, k, batch)))
    return ex, losses


def _same(a, b):
    return a.keys() == b.keys() and all(a[k].tobytes() == b[k].tobytes() for k in a)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_bn_running_statistics_updated_once_under_recompute(strategy):
    g = resnet8()
    ref, lref = _train(g, "liveness")
    ex, l = _train(g, "recompute", strategy)
    assert any(s.phase == "R" and s.layer.kind == "bn" for s in ex.steps)   # not vacuous
    init = Executor(g, 4, seed=2).state_dict()
    s_ref, s = ref.state_dict(), ex.state_dict()
    stats = [k for k in s if k.endswith(("running_mean", "running_var"))]
    assert len(stats) >= 10
    for k in stats:
        assert s[k].tobytes() == s_ref[k].tobytes(), k
        assert not np.array_equal(s[k], init[k]), k        # they did move
    assert l == lref
    assert _same(s, s_ref)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_dropout_mask_reused_by_recompute(strategy):
    g = dropout_net()
    ex, l = _train(g, "recompute", strategy, k=5)
    rdrop = [s for s in ex.steps if s.phase == "R" and s.layer.kind == "dropout"]
    assert rdrop, "dropout is not recomputed: the test would be vacuous"
    for s in rdrop:
        assert s.aux["mask"].id in {t.id for t in s.reads}
    ref, lref = _train(g, "liveness", k=5)
    assert l == lref
    assert _same(ex.state_dict(), ref.state_dict())
    # the masks do matter: a different seed trains differently
    other, lo = _train(g, "liveness", k=5, seed=3)
    assert lo != lref


@pytest.mark.parametrize("name", ["cheap_chain", "densenet"])
def test_every_strategy_trains_bit_identically(name):
    g = GRAPHS[name]()
    k = 3 if name == "cheap_chain" else 10
    ref, lref = _train(g, "liveness", k=k, steps=2)
    for s in STRATEGIES:
        ex, l = _train(g, "recompute", s, k=k, steps=2)
        assert l == lref, s
        assert _same(ex.state_dict(), ref.state_dict()), s
        assert ex.pool.high_water == ex.planned["peak_bytes"]


def test_plan_recompute_twice_on_one_schedule():
    s = schedule(relu_run(3))
    a, _ = plan_recompute(s, "speed")
    b, _ = plan_recompute(s, "memory")
    assert len(b) > len(a)
