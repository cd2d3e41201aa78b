"""The DQN planner (seed 000): fits where superneurons fits, never worse than superneurons,
trains bit-identically to liveness, round-trips its agent file, and fails clearly on a bad
one. A tiny agent (few episodes) keeps the tests fast."""
from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from neuron.cli.main import main
from neuron.cli.planning import add_planner_arg, planner_spec
from neuron.executor import Executor
from neuron.memory.planners import PlanContext, get_planner
from neuron.memory.planners.dqn import Dqn
from neuron.memory.planners.dqn_agent import (Agent, AgentFileError, bound_rollout, score,
                                               train)
from neuron.memory.planners.dqn_features import STATE_DIM, Episode, TraceGraph, dynamic
from neuron.models import build_model

from planner_training import make, train as two_steps  # noqa: E402


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    graph = build_model("resnet_cifar", depth=20, in_shape=(3, 8, 8))
    ex = Executor(graph, 4, device="virtual", policy="liveness")
    peak = ex.simulate(None, trace=False)["peak_bytes"]
    budget = int(peak * 0.9)
    ctx = PlanContext(ex, budget)
    tg = TraceGraph(ctx)
    agent, curve = train([(ctx, tg)], 12, progress=False, names=["resnet_cifar20 8x8"])
    path = str(tmp_path_factory.mktemp("dqn") / "agent.npz")
    agent.save(path)
    return graph, ex, budget, ctx, tg, agent, curve, path


def test_features_and_states(setup):
    tg = setup[4]
    assert tg.n > 0 and tg.x.shape == (tg.n, 8) and np.isfinite(tg.x).all()
    ep = Episode(tg)
    s0 = ep.afterstates()
    assert s0.shape == (3, STATE_DIM) and np.isfinite(s0).all()
    left = dynamic("left")
    assert s0[0, left] > s0[1, left] and s0[0, left] > s0[2, left]   # dropping frees bytes
    # the afterstate shortcut equals embedding the changed features from scratch
    x = tg.x.copy()
    x[0, 5], x[0, 7] = 0.0, tg.cover[0]   # recompute flag: the share of the deficit covered
    emb = tg.embed(x)
    np.testing.assert_allclose(s0[2, :2 * emb.shape[1]],
                               np.concatenate([emb.mean(0), emb[0]]), atol=1e-12)
    ep.step(1)
    cl = dynamic("candidates_left")
    assert ep.afterstates()[0, cl] < s0[0, cl]  # fraction of candidates left goes down


def test_training_curve_and_meta(setup):
    *_, agent, curve, _ = setup
    assert len(curve) == 12 and curve[0]["epsilon"] == 0.1
    assert agent.meta["networks"] == ["resnet_cifar20 8x8"] and agent.meta["episodes"] == 12


def test_plan_fits_and_is_never_worse_than_superneurons(setup):
    _, ex, budget, ctx, _, _, _, path = setup
    d = Dqn(agent=path).plan(ctx)
    sn = ctx.evaluate(get_planner("superneurons").plan(ctx))
    mine = ctx.evaluate(d)
    assert sn["fits"] and mine["fits"] and mine["peak_bytes"] <= budget
    assert mine["time_s"] <= sn["time_s"]
    assert d.info["agent"] == path and d.info["chosen"] in ("dqn", "superneurons")
    free = Dqn(agent=path).plan(PlanContext(ex, None))
    assert free.counts()["keep"] == len(free.tensors) == len(d.tensors)


def test_plan_trains_bit_identically_to_liveness(setup):
    graph, _, budget, *_, path = setup
    ref = two_steps(make(graph, 4, policy="liveness"), graph, 4)
    mine = two_steps(make(graph, 4, planner=f"dqn:agent={path}", budget=budget), graph, 4)
    assert ref[0] == mine[0]
    for k, v in ref[1].items():
        np.testing.assert_array_equal(v, mine[1][k], err_msg=k)


def test_save_load_round_trip_gives_identical_q(setup, tmp_path):
    *_, tg, agent, _, path = setup
    again = Agent.load(path)
    states = Episode(tg).afterstates()
    np.testing.assert_array_equal(agent.q(states), again.q(states))
    assert again.meta == json.loads(json.dumps(agent.meta))


def test_ensemble_round_trip_and_plan(setup, tmp_path):
    """An agent file with further members (other seeds' Q-networks): each member comes back
    identical, a wrong-shaped member is refused, and the planner rolls out every member."""
    _, _, budget, ctx, tg, agent, _, _ = setup
    other = Agent({k: v * 0.5 for k, v in agent.w.items()}, agent.mean, agent.std, agent.meta)
    ens = Agent(agent.w, agent.mean, agent.std, agent.meta, [other])
    path = str(tmp_path / "ens.npz")
    ens.save(path)
    again = Agent.load(path)
    assert len(again.members) == 2
    states = Episode(tg).afterstates()
    for a, b in zip(ens.members, again.members):
        np.testing.assert_array_equal(a.q(states), b.q(states))
    d = Dqn(agent=path, rollouts=2).plan(ctx)
    assert d.info["agent_members"] == 2 and ctx.evaluate(d)["peak_bytes"] <= budget
    bad = Agent(agent.w, agent.mean, agent.std, agent.meta,
                [Agent({**agent.w, "q.l1.weight": agent.w["q.l1.weight"][:, :5]},
                       agent.mean, agent.std, agent.meta)])
    bad.save(str(tmp_path / "bad_member.npz"))
    with pytest.raises(AgentFileError, match="wrong shape"):
        Agent.load(str(tmp_path / "bad_member.npz"))


def test_training_selects_the_best_snapshot(setup):
    """With ``select`` the snapshot with the best held-out score is returned, the untrained
    one (the greedy bound's policy, episode 0) included."""
    ctx, tg = setup[3], setup[4]
    ref = ctx.evaluate(get_planner("superneurons").plan(ctx))["time_s"]
    agent, curve = train([(ctx, tg)], 8, progress=False, select=[(ctx, tg, ref)],
                         select_every=2)
    scores = {c["episode"]: c["select"] for c in curve if c["select"] is not None}
    t = score(ctx, tg, bound_rollout(tg), {})[1]
    scores[0] = np.log(2.0) + 1.0 if t is None else float(np.log(t / ref))
    assert sorted(scores) == [0, 2, 4, 6, 8]
    best = min(scores.values())
    assert agent.meta["selection_score"] == round(best, 5)
    assert scores[agent.meta["selected_episode"]] == best


def test_excess_is_each_steps_peak_over_the_budget(setup):
    """The per-step excess the drops must cover: its maximum is the unbudgeted peak over the
    budget (need), and nothing is over where the budget is the peak."""
    ex, budget, ctx, tg = setup[1], setup[2], setup[3], setup[4]
    assert len(tg.excess) == len(ctx.schedule.steps)
    assert tg.need == pytest.approx(tg.excess.max()) and tg.need > 0
    assert tg.excess.max() + budget == ex.simulate(None, trace=False)["peak_bytes"]


def test_a_swap_changes_the_excess_exactly_as_simulated(setup):
    """The episode's account of one swap (absent from the step after next to its prefetch)
    equals the simulator's per-step peaks with that swap planned."""
    from neuron.memory.planners.home import Home
    ctx, tg = setup[3], setup[4]
    for i in np.linspace(0, tg.n - 1, 6).astype(int):
        acts = np.zeros(tg.n, np.int8)
        acts[i] = 1
        rows = ctx.simulate(Home().decisions(ctx, tg.cands, acts), None, trace=True)["trace"]
        ep = Episode(tg)
        ep.i = i
        np.testing.assert_array_equal(ep._after(1)[0],
                                      np.array([r.peak_bytes for r in rows]) - ctx.budget)


def test_completion_cost_is_the_greedy_cover(setup):
    """b(i, excess): an excess at one step is covered by the later candidates absent there,
    cheapest per byte first; one no later candidate can cover is priced as evicted; nothing
    over costs nothing; keeping leaves more to cover than dropping."""
    tg = setup[4]
    cost = np.minimum(tg.exposed, tg.recompute)
    i, t = 2, int(np.argmax(tg.excess))
    absent = [j for j in range(i + 1, tg.n) if tg.lo[j] <= t < tg.hi[j]]
    assert absent
    absent.sort(key=lambda j: cost[j] / tg.nbytes[j])
    x = 0.4 * tg.nbytes[absent].sum()
    covered, expect = 0.0, 0.0
    for j in absent:
        expect += cost[j]
        covered += tg.nbytes[j]
        if covered >= x:
            break
    one = np.zeros_like(tg.excess)
    one[t] = x
    assert tg.completion(i, one) == pytest.approx(min(expect, 1.0), rel=1e-12)
    assert tg.completion(i, one - x) == 0.0
    first = np.zeros_like(tg.excess)      # step 0 (the data layer): no candidate is absent
    first[0] = 2 ** 20
    assert tg.completion(i, first) == pytest.approx(tg.evict_per_byte * 2 ** 20, rel=1e-12)
    s = Episode(tg).afterstates()
    col = dynamic("completion")
    assert s[0, col] >= s[1, col] and s[0, col] >= s[2, col]


def test_a_recompute_through_a_recomputed_input_holds_it_again_from_its_own_use(setup):
    """rewrite.py keeps a recomputed version until backward has used it: recomputing k after
    its input p puts p back from k's first backward use (Episode.chain)."""
    tg = setup[4]
    k = next(k for k in range(tg.n) if tg.parents[k] and tg.fb[k] < tg.fb[tg.parents[k][0]])
    p = tg.parents[k][0]
    ep = Episode(tg)
    while ep.i < k:
        ep.step(2 if ep.i == p else 0)
    before = ep.excess.copy()
    assert ep.chain(k) == [(p, int(tg.fb[k]))]
    ep.step(2)
    delta = ep.excess - before
    expect = np.zeros_like(delta)
    expect[tg.lf[k] + 1:tg.fb[k]] -= tg.nbytes[k]
    expect[tg.fb[k]:tg.fb[p]] += tg.nbytes[p]
    np.testing.assert_allclose(delta, expect)
    assert ep.back[p] == tg.fb[k]


def test_an_untrained_agent_follows_the_greedy_bound(setup):
    """N starts at 0 (its output layer zero): before any update the agent's plan is the
    greedy bound's, which fits here (the learning corrects it, it does not start from noise)."""
    ctx, tg = setup[3], setup[4]
    agent, _ = train([(ctx, tg)], 1, progress=False)     # too few samples for an update
    assert not agent.w["q.out.weight"].any() and not agent.w["q.out.bias"].any()
    plan = bound_rollout(tg)
    np.testing.assert_array_equal(agent.rollout(tg), plan)
    assert plan.any() and score(ctx, tg, plan, {})[1] is not None


def test_bad_agent_files_are_clear_errors(setup, tmp_path):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip file at all")
    with pytest.raises(AgentFileError, match="not a readable"):
        Dqn(agent=str(bad))
    with pytest.raises(AgentFileError, match="no such file"):
        Dqn(agent=str(tmp_path / "missing.npz"))
    agent = setup[5]
    wrong = Agent({**agent.w, "q.l1.weight": agent.w["q.l1.weight"][:, :5]}, agent.mean,
                  agent.std, agent.meta)
    wrong.save(str(tmp_path / "wrong.npz"))
    with pytest.raises(AgentFileError, match="wrong shape"):
        Agent.load(str(tmp_path / "wrong.npz"))
    old = Agent(agent.w, agent.mean, agent.std, {**agent.meta, "version": 0})
    old.save(str(tmp_path / "old.npz"))
    with pytest.raises(AgentFileError, match="retrain"):
        Agent.load(str(tmp_path / "old.npz"))


def test_options_and_their_errors():
    with pytest.raises(ValueError, match="dqn"):
        get_planner("dqn:colour=3")
    with pytest.raises(ValueError, match="rollouts"):
        get_planner("dqn:rollouts=0")
    with pytest.raises(ValueError, match="search_seconds"):
        get_planner("dqn:search_seconds=0")
    with pytest.raises(ValueError, match="explore"):
        get_planner("dqn:explore=-1")
    with pytest.raises(ValueError, match="noise"):     # now ``explore``: actions, not epsilon
        get_planner("dqn:noise=0.2")
    assert get_planner("dqn:explore=3").explore == 3.0
    p = argparse.ArgumentParser()
    add_planner_arg(p)
    args = p.parse_args(["--planner", "dqn", "--seed", "2", "--agent", "a.npz"])
    assert planner_spec(args) == "dqn:seed=2,agent=a.npz"
    args = p.parse_args(["--planner", "dqn", "--search-seconds", "4"])
    assert get_planner(planner_spec(args)).search_seconds == 4.0


def test_the_noisy_rollouts_stop_at_the_search_limit(setup):
    """Every (member, aim)'s greedy rollout always runs; the noisy ones stop once the CPU
    limit is spent (a round at a time), and the plan says so."""
    from neuron.memory.planners.dqn import MARGINS
    ctx, path = setup[3], setup[7]
    aims = len(MARGINS)
    full = Dqn(agent=path, rollouts=3).plan(ctx).info
    assert (full["rollouts"], full["stopped_by_time"]) == (3 * aims, False)
    short = Dqn(agent=path, rollouts=3, search_seconds=1e-9).plan(ctx).info
    assert (short["rollouts"], short["stopped_by_time"]) == (aims, True)
    assert short["rollouts_limit"] == 3 * aims and short["search_seconds_limit"] == 1e-9


def test_cli_plan_with_dqn(setup, capsys):
    path = setup[-1]
    graph = build_model("resnet_cifar", depth=20)
    peak = Executor(graph, 8, device="virtual",
                    policy="liveness").simulate(None, trace=False)["peak_bytes"]
    rc = main(["plan", "resnet_cifar", "--depth", "20", "--batch", "8", "--planner", "dqn",
               "--agent", path, "--budget", str(int(peak * 0.9)), "--no-min-budget", "--json"])
    out = capsys.readouterr().out.strip().splitlines()[-1]
    r = json.loads(out)
    assert rc == 0 and r["planner"].startswith("dqn:") and r["fits"]


def test_bundled_agent_keeps_everything_at_the_liveness_peak():
    """At a budget >= the liveness peak nothing must be freed: the bundled agent's greedy
    rollout keeps every tensor (its Q-values, not a rule), so the plan costs nothing."""
    from neuron.memory.costmodel import CostModel
    from neuron.memory.planners.dqn import DEFAULT_AGENT
    graph = build_model("resnet_cifar", depth=20, in_shape=(3, 32, 32), num_classes=10)
    ex = Executor(graph, 32, device="virtual", policy="liveness")
    peak = ex.simulate(None, trace=False)["peak_bytes"]
    ctx = PlanContext(ex, peak, CostModel.analytic("h100"))
    tg = TraceGraph(ctx)
    assert tg.need == 0
    assert (Agent.load(DEFAULT_AGENT).rollout(tg) == 0).all()
    d = Dqn().plan(ctx)
    assert d.info["chosen"] == "dqn" and d.counts()["keep"] == len(d.tensors)


def test_an_agent_path_that_breaks_the_option_string_is_refused():
    import argparse
    from neuron.cli.planning import add_planner_arg, planner_spec
    p = argparse.ArgumentParser()
    add_planner_arg(p)
    assert planner_spec(p.parse_args(["--planner", "dqn", "--agent", "a.npz"])) == \
        "dqn:seed=0,agent=a.npz"
    with pytest.raises(ValueError, match="may not contain"):
        planner_spec(p.parse_args(["--planner", "dqn", "--agent", "x,y=1.npz"]))


def test_swaps_queue_on_one_copy_stream_as_simulated(setup):
    """A swap is priced by the wait it adds on the copy stream it shares with the episode's
    earlier swaps (copy_walk of both against the first alone), and two swaps change the
    per-step excess exactly as the simulator's peaks with both planned."""
    from neuron.memory.planners.home import Home
    from neuron.memory.planners.swap import copy_walk
    ctx, tg = setup[3], setup[4]
    checked = queued = 0
    for i in range(tg.n - 1):
        k = i + 1
        acts = np.zeros(tg.n, np.int8)
        acts[[i, k]] = 1
        ep = Episode(tg)
        while ep.i < k:
            ep.step(1 if ep.i == i else 0)
        alone = sum(w for _, w in copy_walk(tg.cum, [tg.walk_args[i]]).values())
        both = sum(w for _, w in copy_walk(tg.cum, [tg.walk_args[i], tg.walk_args[k]]).values())
        assert ep.costs()[1] == pytest.approx((both - alone + 2 * tg.walk_args[k][6]) / tg.base_s)
        k_alone = sum(w for _, w in copy_walk(tg.cum, [tg.walk_args[k]]).values())
        queued += not np.isclose(both - alone, k_alone, rtol=0, atol=1e-12)
        rows = ctx.simulate(Home().decisions(ctx, tg.cands, acts), None, trace=True)["trace"]
        np.testing.assert_array_equal(ep._after(1)[0],
                                      np.array([r.peak_bytes for r in rows]) - ctx.budget)
        checked += 1
    assert checked == tg.n - 1 and queued > 0   # some pairs do share the stream


def test_aiming_below_the_budget_only_moves_the_excess(setup):
    """``aimed``: the same problem, each step's excess larger by the margin, the deficit and
    the share each drop covers from it; the problem aimed from is unchanged. Aimed lower,
    the greedy bound frees at least as many bytes."""
    ctx, tg = setup[3], setup[4]
    before = tg.excess.copy()
    margin = int(0.1 * ctx.budget)
    low = tg.aimed(ctx.budget - margin)
    np.testing.assert_array_equal(low.excess, before + margin)
    np.testing.assert_array_equal(tg.excess, before)
    assert low.need == pytest.approx(tg.need + margin)
    np.testing.assert_allclose(low.cover, np.minimum(tg.nbytes / low.need, 1.0))
    assert low.x is tg.x and low.costs is tg.costs
    freed = [tg.nbytes[bound_rollout(g) > 0].sum() for g in (tg, low)]
    assert freed[1] >= freed[0] > 0


def test_a_graph_too_large_for_the_agent_gets_superneurons_plan_with_the_reason(setup,
                                                                                monkeypatch):
    """The agent's view is dense in candidates x candidates and candidates x steps: past
    MAX_STATE_BYTES the planner does not build it and returns superneurons' plan, saying
    why, instead of running out of memory."""
    import neuron.memory.planners.dqn as dqn
    ctx, tg, path = setup[3], setup[4], setup[7]
    need = dqn.state_bytes(tg.n, len(ctx.schedule.steps))
    assert need == 5 * 8 * tg.n ** 2 + 2 * tg.n * len(ctx.schedule.steps)
    monkeypatch.setattr(dqn, "MAX_STATE_BYTES", need - 1)
    d = Dqn(agent=path).plan(ctx)
    assert d.info["chosen"] == "superneurons" and f"{tg.n} candidates" in d.info["dqn_skipped"]
    sn = get_planner("superneurons").plan(ctx)
    assert d.tensors == sn.tensors
    monkeypatch.setattr(dqn, "MAX_STATE_BYTES", need)
    assert "dqn_skipped" not in Dqn(agent=path).plan(ctx).info
