"""Planning without a GPU (neuron/plan.py) and its CLI: plan(), lower_bound(), min_budget(),
search_max(), deepest(), widest(), `neuron plan|deepest|widest`."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron.cli.main import main
from neuron.executor import Executor
from neuron.memory.policy import POLICIES
from neuron.memory.tensors import Kind
from neuron.models import build_model
from neuron.models.densenet import densenet
from neuron.plan import (DEPTH_FAMILIES, MIN_BUDGET_TOLERANCE, deepest, fits, lower_bound,
                         min_budget, plan, search_max, widest)

EVICTING = {n for n, p in POLICIES.items() if p.offload}
MiB = 1 << 20


def resnet8():
    return build_model("resnet_cifar", depth=8, in_shape=(3, 8, 8))


def small_densenet():
    return densenet(block_config=(2, 2), growth_rate=4, num_init_features=8, in_shape=(3, 8, 8),
                    num_classes=10, stem="cifar")


GRAPHS = {"resnet8": resnet8, "densenet": small_densenet}
_cache: dict = {}


def graph(name):
    if name not in _cache:
        _cache[name] = GRAPHS[name]()
    return _cache[name]


# ---------------------------------------------------------------- plan() output
KEYS = {"model", "batch", "policy", "budget_bytes", "peak_bytes", "min_budget_bytes",
        "lower_bound_bytes", "fits", "extra_forward_steps", "offload_bytes", "prefetch_bytes",
        "bytes_by_kind", "steps"}
STEP_KEYS = {"step", "layer", "phase", "bytes_in_use", "live_tensors", "workspace_bytes",
             "peak_bytes"}


@pytest.mark.parametrize("policy", list(POLICIES))
def test_plan_keys_and_values(policy):
    g = graph("resnet8")
    r = plan(g, 4, policy=policy, model="resnet_cifar")
    assert KEYS <= set(r)
    assert json.loads(json.dumps(r)) == r                  # plain JSON
    assert (r["model"], r["batch"], r["policy"], r["budget_bytes"]) == \
        ("resnet_cifar", 4, policy, None)
    assert r["fits"] is True and r["error"] is None
    assert r["peak_bytes"] == r["unbounded_peak_bytes"] > 0
    assert isinstance(r["min_budget_bytes"], int) and isinstance(r["lower_bound_bytes"], int)
    if POLICIES[policy].recompute:
        assert r["extra_forward_steps"] > 0 and r["recompute_strategy"] == "cost"
    else:
        assert r["extra_forward_steps"] == 0 and r["recompute_strategy"] is None
    assert r["offload_bytes"] == 0 and r["prefetch_bytes"] == 0   # unbounded: nothing moves
    assert set(r["bytes_by_kind"]) == {k.value for k in Kind}
    assert sum(r["bytes_by_kind"].values()) == r["peak_bytes"]
    assert r["bytes_by_kind"]["param"] > 0 and r["bytes_by_kind"]["opt_state"] > 0
    steps = r["steps"]
    assert len(steps) == r["num_steps"]
    assert all(set(s) == STEP_KEYS for s in steps)
    assert [s["step"] for s in steps] == list(range(len(steps)))
    assert max(s["bytes_in_use"] for s in steps) <= r["peak_bytes"]
    # bytes_in_use is after each step's frees; the step's own peak is where the iteration's is
    assert all(s["peak_bytes"] >= s["bytes_in_use"] for s in steps)
    assert max(s["peak_bytes"] for s in steps) == r["peak_bytes"]
    if POLICIES[policy].free_dead:      # per step, not a running maximum
        assert steps[-1]["peak_bytes"] < r["peak_bytes"]
    phases = "".join(s["phase"] for s in steps)
    assert phases.startswith("F") and phases.endswith("B")
    assert ("R" in phases) == POLICIES[policy].recompute
    assert steps[0]["layer"] == "data"


def test_plan_with_a_budget():
    g = graph("resnet8")
    free = plan(g, 4, policy="superneurons", search_min=False)
    assert free["min_budget_bytes"] is None
    tight = plan(g, 4, policy="superneurons")
    b = tight["min_budget_bytes"]
    r = plan(g, 4, policy="superneurons", budget=b)
    assert r["fits"] and r["budget_bytes"] == b and r["peak_bytes"] <= b
    assert r["offload_bytes"] > 0 and r["prefetch_bytes"] > 0
    assert r["unbounded_peak_bytes"] == free["peak_bytes"]
    bad = plan(g, 4, policy="superneurons", budget=r["ideal_bound_bytes"] - 1)
    assert bad["fits"] is False
    assert bad["peak_bytes"] is None and bad["offload_bytes"] is None and "steps" not in bad
    assert "cannot allocate" in bad["error"]
    assert json.loads(json.dumps(bad)) == bad


def test_plan_trace_off_and_offload_params():
    g = graph("densenet")
    r = plan(g, 2, policy="liveness", offload_params=True, trace=False)
    assert "steps" not in r
    p = plan(g, 2, policy="liveness", trace=False)
    assert r["offload_params"] is True and p["offload_params"] is False
    assert r["peak_bytes"] < p["peak_bytes"]
    assert r["bytes_by_kind"]["param"] < p["bytes_by_kind"]["param"]


# ---------------------------------------------------------------- bounds
@pytest.mark.parametrize("name", list(GRAPHS))
@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("offload_params", [False, True])
def test_lower_bound_le_min_budget_le_extent(name, policy, offload_params):
    ex = Executor(graph(name), 4, device="virtual", policy=policy,
                  offload_params=offload_params)
    unbounded = ex.simulate(None)
    lb, max_step = lower_bound(ex)
    assert 0 < max_step <= lb
    ideal, ideal_step = lower_bound(ex, ideal=True)
    assert 0 < ideal_step <= max_step and ideal <= lb
    mb = min_budget(ex, unbounded, ideal)
    assert ideal <= mb <= unbounded["arena_bytes"]
    assert unbounded["peak_bytes"] <= unbounded["arena_bytes"]
    assert ex.simulate(mb)["fits"]
    assert not ex.simulate(ideal - 1)["fits"]              # a bound indeed
    if policy not in EVICTING:
        # without eviction the tensor bytes in use do not depend on the arena, compaction
        # makes the free bytes one block when they are short, and a workspace that does not
        # fit shrinks to none: the minimum is exactly the tensors' peak
        assert mb == (unbounded["tensor_peak_bytes"] if ex.compact
                      else unbounded["arena_bytes"])
        assert not ex.simulate(mb - 1)["fits"]
        assert not ex.simulate(mb - 2 * ex.block)["fits"]
        # without compaction (the paper's pool) the layout depends on the arena (workspaces
        # shrink where they do not fit): the search gives a verified budget within the extent
        nc = Executor(graph(name), 4, device="virtual", policy=policy,
                      offload_params=offload_params, compact=False)
        unc = nc.simulate(None)
        mnc = min_budget(nc, unc, ideal)
        assert mb <= mnc <= unc["arena_bytes"] and nc.simulate(mnc)["fits"]
        if policy == "baseline":        # one shared workspace, never shrunk: exactly the extent
            assert mnc == unc["arena_bytes"] and not nc.simulate(mnc - 1)["fits"]
    # plan() reports the same numbers
    r = plan(graph(name), 4, policy=policy, offload_params=offload_params, trace=False)
    assert (r["lower_bound_bytes"], r["max_step_bytes"], r["min_budget_bytes"]) == \
        (lb, max_step, mb)
    assert (r["ideal_bound_bytes"], r["ideal_max_step_bytes"]) == (ideal, ideal_step)
    assert r["min_budget_vs_ideal_bound"] == round(mb / ideal, 4)


def test_lower_bound_counts_resident_state_unless_offloaded():
    g = graph("resnet8")
    ex = Executor(g, 4, device="virtual", policy="liveness")
    exo = Executor(g, 4, device="virtual", policy="liveness", offload_params=True)
    lb, step = lower_bound(ex)
    lbo, stepo = lower_bound(exo)
    resident = sum(-(-t.nbytes // ex.block) * ex.block for t in ex.persistent)
    assert lb == step + resident
    assert lbo == stepo and stepo >= step
    assert lbo < lb


def test_no_budget_below_min_budget_fits():
    """Scan a grid between the lower bound and min_budget*(1 - tolerance) on a few evicting
    configurations: nothing there fits. (Fitting is not monotone in general under LRU
    eviction; this guards that the search stays tight on these networks.)"""
    violations = []
    for depth, hw, batch, offload_params in [(20, 16, 4, True), (20, 16, 4, False),
                                             (20, 32, 8, True), (20, 8, 4, True)]:
        g = build_model("resnet_cifar", depth=depth, in_shape=(3, hw, hw))
        r = plan(g, batch, policy="superneurons", offload_params=offload_params, trace=False)
        lb, mb = r["ideal_bound_bytes"], r["min_budget_bytes"]
        ex = Executor(g, batch, device="virtual", policy="superneurons",
                      offload_params=offload_params)
        top = int(mb * (1 - MIN_BUDGET_TOLERANCE)) - 2 * ex.block
        for b in range(lb, top, max(ex.block, (top - lb) // 40)):
            if ex.simulate(b)["fits"]:
                violations.append((depth, hw, batch, offload_params, b, mb))
    assert violations == []


# ---------------------------------------------------------------- search_max
@settings(max_examples=200, deadline=None)
@given(t=st.integers(1, 1 << 20), start=st.integers(1, 64))
def test_search_max_finds_the_threshold(t, start):
    calls = []
    k, probes = search_max(lambda k: calls.append(k) or k <= t, start=start, limit=1 << 20)
    if t < start:
        assert k is None and len(probes) == 1
        return
    assert k == t
    assert [p.value for p in probes] == calls
    assert all(p.fits == (p.value <= t) for p in probes)
    assert all(p.seconds >= 0 for p in probes)
    assert len(probes) <= 2 * t.bit_length() + 2                 # logarithmic
    assert len(set(calls)) == len(calls)                         # nothing probed twice


@given(t=st.integers(1, 5000))
@settings(max_examples=50, deadline=None)
def test_search_max_stops_at_the_limit(t):
    k, _ = search_max(lambda k: True, start=1, limit=t)
    assert k == t
    k, _ = search_max(lambda k: k <= 3 * t, start=1, limit=t)
    assert k == t


def test_search_max_progress_callback():
    seen = []
    k, probes = search_max(lambda k: k <= 37, progress=lambda v, ok: seen.append((v, ok)))
    assert k == 37
    assert seen == [(p.value, p.fits) for p in probes]


# ---------------------------------------------------------------- deepest / widest
@pytest.mark.parametrize("policy", ["liveness", "superneurons"])
@pytest.mark.parametrize("budget", [4 * MiB, 8 * MiB])
def test_deepest_answer_fits_and_next_does_not(policy, budget):
    r = deepest("resnet_cifar", 2, budget, policy=policy)
    d = r["deepest"]
    assert d is not None and (d - 2) % 6 == 0
    assert fits(build_model("resnet_cifar", depth=d), 2, budget, policy=policy)
    assert not fits(build_model("resnet_cifar", depth=d + 6), 2, budget, policy=policy)
    assert r["probes"] and all(set(p) == {"depth", "fits", "seconds"} for p in r["probes"])
    assert {"depth": d, "fits": True} in [{k: p[k] for k in ("depth", "fits")}
                                          for p in r["probes"]]
    assert (r["policy"], r["offload_params"], r["budget_bytes"]) == (policy, False, budget)


def test_deepest_nothing_fits_and_superneurons_goes_deeper():
    assert deepest("resnet_cifar", 2, 1 * MiB, policy="liveness")["deepest"] is None
    d_live = deepest("resnet_cifar", 2, 8 * MiB, policy="liveness")["deepest"]
    d_sn = deepest("resnet_cifar", 2, 8 * MiB, policy="superneurons")["deepest"]
    assert d_sn > d_live


def test_deepest_rejects_a_model_without_depth():
    with pytest.raises(ValueError, match="resnet_cifar"):
        deepest("vgg16", 2, 8 * MiB)
    assert DEPTH_FAMILIES["resnet_cifar"][0](3) == 20


@pytest.mark.parametrize("policy", ["liveness", "superneurons"])
@pytest.mark.parametrize("budget", [4 * MiB, 8 * MiB])
def test_widest_answer_fits_and_next_does_not(policy, budget):
    r = widest("resnet_cifar", budget, depth=8, policy=policy)
    b = r["widest"]
    g = build_model("resnet_cifar", depth=8)
    assert b is not None and b >= 1
    assert fits(g, b, budget, policy=policy)
    assert not fits(g, b + 1, budget, policy=policy)
    assert all(set(p) == {"batch", "fits", "seconds"} for p in r["probes"])


# ---------------------------------------------------------------- CLI
def _last_json(out):
    return json.loads(out.strip().splitlines()[-1])


def test_cli_plan_json(capsys):
    rc = main(["plan", "resnet_cifar", "--depth", "8", "--batch", "2", "--json",
               "--policy", "liveness"])
    out = capsys.readouterr().out
    assert rc == 0
    r = _last_json(out)
    assert KEYS <= set(r)
    assert (r["model"], r["batch"], r["policy"], r["fits"]) == ("resnet_cifar", 2, "liveness",
                                                                True)
    want = plan(build_model("resnet_cifar", depth=8), 2, policy="liveness")
    for k in ("peak_bytes", "min_budget_bytes", "lower_bound_bytes", "bytes_by_kind", "steps"):
        assert r[k] == want[k], k
    assert "minimum budget" in out and "ideal layer bound" in out


def test_cli_plan_budget_that_does_not_fit(capsys):
    rc = main(["plan", "resnet_cifar", "--depth", "8", "--batch", "2", "--json",
               "--budget", "1MiB", "--policy", "liveness"])
    out = capsys.readouterr().out
    assert rc == 1
    r = _last_json(out)
    assert r["fits"] is False and r["budget_bytes"] == MiB
    assert "does NOT fit" in out and str(r["min_budget_bytes"]) in out


def test_cli_plan_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "trace.png"
    rc = main(["plan", "resnet_cifar", "--depth", "8", "--batch", "2", "--no-min-budget",
               "--plot", str(png)])
    assert rc == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 1000
    assert str(png) in capsys.readouterr().out


def test_cli_unknown_policy(capsys):
    with pytest.raises(SystemExit) as e:      # argparse: --policy lists its choices
        main(["plan", "resnet_cifar", "--depth", "8", "--policy", "greedy"])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert "greedy" in err
    for name in POLICIES:
        assert name in err
    with pytest.raises(SystemExit) as e:
        main(["deepest", "resnet_cifar", "--budget", "64MiB", "--policy", "greedy"])
    assert e.value.code == 2 and "superneurons" in capsys.readouterr().err


@pytest.mark.parametrize("budget", ["lots", "-5MiB", "0", "12 parsecs", "0.1"])
def test_cli_bad_budget(capsys, budget):
    with pytest.raises(SystemExit) as e:        # refused when parsed (neuron/cli/args.py)
        main(["plan", "resnet_cifar", "--depth", "8", f"--budget={budget}"])
    err = capsys.readouterr().err
    assert e.value.code == 2
    last = err.strip().splitlines()[-1]
    assert last.startswith("neuron plan: error: argument --budget:") and budget.strip() in last


def test_cli_deepest_json(capsys):
    rc = main(["deepest", "resnet_cifar", "--batch", "2", "--budget", "64MiB", "--json"])
    out = capsys.readouterr().out
    assert rc == 0
    r = _last_json(out)
    d = r["deepest"]
    assert isinstance(d, int) and d > 100 and (d - 2) % 6 == 0
    assert (r["model"], r["batch"], r["budget_bytes"], r["policy"]) == \
        ("resnet_cifar", 2, 64 * MiB, "superneurons")
    probes = {p["depth"]: p["fits"] for p in r["probes"]}
    assert probes[d] is True and probes.get(d + 6) is False
    assert f"| {d} | yes |" in out


def test_cli_widest_json(capsys):
    rc = main(["widest", "resnet_cifar", "--depth", "8", "--budget", "8MiB", "--json",
               "--policy", "liveness"])
    out = capsys.readouterr().out
    assert rc == 0
    r = _last_json(out)
    assert r["widest"] == widest("resnet_cifar", 8 * MiB, depth=8, policy="liveness",
                                 host_budget=128 << 30)["widest"]


def test_python_m_neuron_plan_subprocess():
    p = subprocess.run([sys.executable, "-m", "neuron", "plan", "resnet_cifar", "--depth", "8",
                        "--batch", "2", "--no-min-budget", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["policy"] == "superneurons" and r["min_budget_bytes"] is None
    p = subprocess.run([sys.executable, "-m", "neuron", "plan", "resnet_cifar", "--depth", "8",
                        "--policy", "nope"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert "invalid choice: 'nope'" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize("t", [1, 2, 37, 1000])
def test_search_max_in_parallel_finds_the_threshold(t):
    k, probes = search_max(lambda k: k <= t, start=1, limit=1 << 20, parallel=True)
    assert k == t
    assert all(p.fits == (p.value <= t) for p in probes)
