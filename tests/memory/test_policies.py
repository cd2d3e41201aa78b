"""Acceptance criteria of the memory policies on the CPU.

- every policy (baseline, liveness, offload, recompute, superneurons), with and without
  offload_params, trains resnet_cifar-20 and a small DenseNet bit-identically to the baseline
  (parameters and optimizer state);
- the pool's measured high-water mark is the planned peak, and plan() predicts it;
- a budget 30% below the liveness peak trains correctly under superneurons, moving bytes;
- min_budget falls baseline > liveness > superneurons;
- a budget below the minimum fails in the constructor, before any state exists, and the CLI
  says what the minimum is.
"""
from __future__ import annotations

import numpy as np
import pytest

import neuron as nn
from neuron import executor as executor_mod
from neuron.devices import CpuDevice
from neuron.errors import MemoryBudgetError
from neuron.executor import Executor
from neuron.models import build_model
from neuron.models.densenet import densenet
from neuron.plan import plan

POLICIES = ("baseline", "liveness", "offload", "recompute", "superneurons")
EVICTING = ("offload", "superneurons")
STEPS = 5


# ---------------------------------------------------------------- models
def resnet20():
    return build_model("resnet_cifar", depth=20, in_shape=(3, 8, 8))


def small_densenet(hw=16):
    return densenet(block_config=(2, 2), growth_rate=4, num_init_features=8,
                    in_shape=(3, hw, hw), num_classes=10, stem="cifar")


def conv_chain(n=8, c=8, hw=16):
    """Activations dominate (1x1 convs, few parameters) and most layers are checkpoints, so
    recomputation alone cannot save 30%: the pool has to offload."""
    x = nn.Input((2, hw, hw), name="data")
    h = nn.Conv2d(c, 1, bias=False, name="stem")(x)
    for i in range(n):
        h = nn.Conv2d(c, 1, bias=False, name=f"c{i}")(h)
        if i % 2:
            h = nn.ReLU(name=f"r{i}")(nn.BatchNorm(name=f"bn{i}")(h))
    y = nn.Linear(10, name="fc")(nn.GlobalAvgPool(name="gap")(h))
    return nn.Graph(x, y, name="conv_chain")


MODELS = {"resnet20": (resnet20, 4), "densenet": (small_densenet, 4), "conv_chain": (conv_chain, 8)}
_graphs: dict = {}


def model(name):
    if name not in _graphs:
        build, batch = MODELS[name]
        _graphs[name] = (build(), batch)
    return _graphs[name]


def batch_data(graph, batch, i):
    rng = np.random.default_rng(1000 + i)
    x = rng.standard_normal((batch, *graph.inputs[0].shape)).astype(np.float32)
    return x, rng.integers(0, graph.outputs[0].shape[0], batch)


def make(graph, batch, policy, offload_params=False, budget=None, **kw):
    return Executor(graph, batch, policy=policy, offload_params=offload_params, budget=budget,
                    optimizer=nn.SGD(lr=0.05, momentum=0.9, weight_decay=5e-4), seed=3, **kw)


class Run:
    """STEPS training steps; what happened is recorded (exceptions too) and tests assert."""

    def __init__(self, name, policy, offload_params, budget=None, steps=STEPS):
        graph, batch = model(name)
        self.error = None
        self.losses, self.high_water = [], []
        self.ex = make(graph, batch, policy, offload_params, budget)
        self.planned = self.ex.planned
        for i in range(steps):
            try:
                self.losses.append(self.ex.train_step(*batch_data(graph, batch, i)))
            except MemoryBudgetError as e:
                self.error = e
                break
            self.high_water.append(self.ex.pool.high_water)
        self.state = self.ex.state_dict()


_runs: dict = {}


def run(name, policy, offload_params=False, budget=None):
    key = (name, policy, offload_params, budget)
    if key not in _runs:
        _runs[key] = Run(name, policy, offload_params, budget)
    return _runs[key]


def assert_same_state(a, b):
    assert a.keys() == b.keys()
    differ = [k for k in a if a[k].dtype != b[k].dtype or a[k].tobytes() != b[k].tobytes()]
    assert not differ, f"{len(differ)} of {len(a)} tensors differ, e.g. {differ[:5]}"


CASES = [pytest.param(n, p, o, id=f"{n}-{p}{'-offload_params' if o else ''}")
         for n in ("resnet20", "densenet") for p in POLICIES for o in (False, True)]


# ---------------------------------------------------------------- bit-identical training
@pytest.mark.parametrize("name,policy,offload_params", CASES)
def test_trains_bit_identically_to_baseline(name, policy, offload_params):
    ref = run(name, "baseline")
    assert ref.error is None
    r = run(name, policy, offload_params)
    if r.error is not None:
        raise r.error
    assert len(r.losses) == STEPS
    assert r.losses == ref.losses
    assert_same_state(r.state, ref.state)
    # parameters and optimizer state both compared, and they moved
    assert any(k.startswith("momentum:") for k in r.state)
    init = make(*model(name), "baseline").state_dict()
    assert sum(not np.array_equal(init[k], r.state[k]) for k in init) > len(init) // 2


@pytest.mark.parametrize("name,policy,offload_params", CASES)
def test_measured_high_water_is_the_planned_peak(name, policy, offload_params):
    r = run(name, policy, offload_params)
    if r.error is not None:
        raise r.error
    assert r.planned["fits"]
    assert r.high_water == [r.planned["peak_bytes"]] * STEPS
    assert r.ex.device.arena_bytes == r.planned["arena_bytes"]
    trace = r.ex.last_trace
    assert len(trace) == len(r.ex.steps)
    assert max(row.bytes_in_use for row in trace) <= r.planned["peak_bytes"]


@pytest.mark.parametrize("policy", POLICIES)
def test_every_iteration_starts_from_the_planned_state(policy):
    """Between iterations only parameters and optimizer state exist: in the arena, or with
    offload_params all on the host (a regression test: cached parameters left in the arena
    made later iterations of an evicting policy differ from the plan, and fail)."""
    graph, batch = small_densenet(), 4
    for offload_params in (False, True):
        ex = make(graph, batch, policy, offload_params)
        for i in range(3):
            ex.train_step(*batch_data(graph, batch, i))
            resident = [t for t in ex.persistent if ex.pool.resident(t)]
            if offload_params:
                assert resident == [] and ex.pool.used_bytes == 0
                assert set(ex.pool.host) == {t.id for t in ex.persistent}
            else:
                assert len(resident) == len(ex.persistent) and not ex.pool.host
                assert ex.pool.used_bytes == sum(ex.pool.heap.round(max(t.nbytes, 1))
                                                 for t in ex.persistent)
            assert ex.pool.high_water == ex.planned["peak_bytes"]
        loss, correct = ex.evaluate(*batch_data(graph, batch, 9))      # inference too
        assert np.isfinite(loss) and 0 <= correct <= batch
        if offload_params:
            assert ex.pool.used_bytes == 0


# ---------------------------------------------------------------- plan() predicts the pool
def _budgets(name, policy):
    graph, batch = model(name)
    p = plan(graph, batch, policy=policy, trace=False)
    mb, peak = p["min_budget_bytes"], p["unbounded_peak_bytes"]
    return [None, mb, (mb + peak) // 2 + 12345]


@pytest.mark.parametrize("name", ["densenet", "resnet20"])
@pytest.mark.parametrize("policy", POLICIES)
def test_plan_predicts_the_executor_and_the_pool(name, policy):
    graph, batch = model(name)
    budgets = _budgets(name, policy) if name == "densenet" or policy in EVICTING else [None]
    for budget in budgets:
        p = plan(graph, batch, policy=policy, budget=budget, search_min=False)
        assert p["fits"], (policy, budget)
        ex = make(graph, batch, policy, budget=budget)
        assert ex.planned["peak_bytes"] == p["peak_bytes"], (policy, budget)
        assert ex.planned["offload_bytes"] == p["offload_bytes"]
        assert ex.device.arena_bytes == (budget or ex.planned["arena_bytes"])
        ex.train_step(*batch_data(graph, batch, 0))
        assert ex.pool.high_water == p["peak_bytes"], (policy, budget)
        assert ex.pool.offload_bytes == p["offload_bytes"]
        assert ex.pool.prefetch_bytes == p["prefetch_bytes"]
        assert [r.bytes_in_use for r in ex.last_trace] == \
            [s["bytes_in_use"] for s in p["steps"]]
        if budget is not None:
            assert p["peak_bytes"] <= budget


# ---------------------------------------------------------------- 30% below liveness
@pytest.mark.parametrize("name,offload_params", [("conv_chain", False), ("conv_chain", True),
                                                 ("resnet20", True)])
def test_training_30_percent_below_liveness_peak(name, offload_params):
    graph, batch = model(name)
    live = plan(graph, batch, policy="liveness", offload_params=offload_params,
                search_min=False)
    budget = int(live["peak_bytes"] * 0.7)
    p = plan(graph, batch, policy="superneurons", offload_params=offload_params, budget=budget,
             search_min=False)
    assert p["fits"], "choose a model where 30% below liveness is feasible"
    for other in ("liveness", "recompute"):          # neither frees nor recomputes enough
        assert not plan(graph, batch, policy=other, offload_params=offload_params,
                        budget=budget, search_min=False)["fits"]
    r = run(name, "superneurons", offload_params, budget)
    assert r.error is None, r.error
    assert r.ex.device.arena_bytes == budget
    assert max(r.high_water) <= budget
    assert r.high_water[0] == p["peak_bytes"]
    c = r.ex.pool.counters()
    assert c["offload_bytes"] > 0 and c["prefetch_bytes"] > 0
    assert c["offload_bytes"] >= STEPS * p["offload_bytes"] // 2
    ref = run(name, "baseline")
    assert r.losses == ref.losses
    assert_same_state(r.state, ref.state)


# ---------------------------------------------------------------- minimum budgets
@pytest.mark.parametrize("offload_params", [False, True])
@pytest.mark.parametrize("name", ["resnet20", "densenet"])
def test_min_budget_falls_baseline_liveness_superneurons(name, offload_params):
    graph, batch = model(name)
    mb = {p: plan(graph, batch, policy=p, offload_params=offload_params,
                  trace=False)["min_budget_bytes"] for p in ("baseline", "liveness",
                                                             "superneurons")}
    assert mb["baseline"] > mb["liveness"] > mb["superneurons"], mb


def test_superneurons_never_needs_more_than_liveness_with_offload_params():
    graph, batch = small_densenet(hw=8), 4
    mb = {p: plan(graph, batch, policy=p, offload_params=True, trace=False)["min_budget_bytes"]
          for p in ("liveness", "superneurons")}
    assert mb["superneurons"] <= mb["liveness"], mb


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("offload_params", [False, True])
def test_budget_below_minimum_fails_before_any_state(monkeypatch, policy, offload_params):
    graph, batch = model("densenet")
    p = plan(graph, batch, policy=policy, offload_params=offload_params, trace=False)
    made = []
    real = executor_mod.make_device
    monkeypatch.setattr(executor_mod, "make_device",
                        lambda *a, **k: made.append(a) or real(*a, **k))
    too_small = [p["ideal_bound_bytes"] - 1, p["min_budget_bytes"] // 2]
    if policy not in EVICTING:          # without eviction the minimum is exact
        too_small.append(p["min_budget_bytes"] - 1)
    for budget in too_small:
        with pytest.raises(MemoryBudgetError) as ei:
            make(graph, batch, policy, offload_params, budget)
        msg = str(ei.value)
        assert "cannot allocate" in msg and "bytes short" in msg, msg
        assert ei.value.budget <= budget
    assert made == []                   # no device, no arena, no parameters were created
    ex = make(graph, batch, policy, offload_params, p["min_budget_bytes"])
    assert made and ex.planned["fits"]
    ex.train_step(*batch_data(graph, batch, 0))


def test_cli_train_with_too_small_budget_states_the_minimum(capsys):
    from neuron.cli.main import main
    need = plan(build_model("resnet_cifar", depth=8), 4, policy="liveness",
                trace=False)["min_budget_bytes"]
    for budget in ("100KiB", str(need - 1)):
        rc = main(["train", "resnet_cifar", "--depth", "8", "--batch", "4", "--iters", "1",
                   "--device", "cpu", "--budget", budget, "--no-progress",
                   "--policy", "liveness"])         # under --budget train's default plans
        err = capsys.readouterr().err
        assert rc == 2
        assert f"completes an iteration is {need} bytes" in err, err
        assert "policy liveness" in err
        assert err.count("\n") == 1                     # one line, no traceback


@pytest.mark.parametrize("phase", ["F", "B"])
def test_an_arena_too_small_is_refused_before_any_state(phase):
    graph = build_model("resnet_cifar", depth=8, in_shape=(3, 8, 8))
    batch = 4
    probe = make(graph, batch, "liveness")
    arena = probe.planned["arena_bytes"]
    size = None
    for frac in np.linspace(0.99, 0.6, 40):        # a size that fails in the wanted phase
        cand = int(arena * frac)
        sim = probe.simulate(cand)
        if not sim["fits"] and (sim["error"].step or "").startswith(phase):
            size, where = cand, sim["error"].step
            break
    assert size is not None
    # an arena handed in as a Device is proved by a plan at construction too: the step that
    # would fail is named before any parameter exists, so no step can fail half-way
    with pytest.raises(MemoryBudgetError) as ei:
        Executor(graph, batch, device=CpuDevice(size), policy="liveness", seed=3,
                 optimizer=nn.SGD(lr=0.05, momentum=0.9, weight_decay=5e-4))
    assert ei.value.step == where
