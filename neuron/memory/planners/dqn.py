"""The DQN planner (Chen, seed 000): a learned Q-network decides keep / swap / recompute per
candidate tensor (features, embedding: dqn_features.py; agent, training: dqn_agent.py).

``--planner dqn [--agent FILE]``: without --agent the agent bundled with the package
(``dqn_default.npz``, trained by bench/dqn.py) is used; if it is missing the planner trains a
brief agent on the target graph itself. At plan time, for each member of the agent (an ensemble
of Q-networks trained with different seeds or sizes, dqn_agent.Agent.members) and each aim
(the budget and MARGINS below it), its greedy rollout and ``rollouts`` - 1 noisy rollouts are
simulated (the greedy ones first, then the noisy ones a round at a time, until
``search_seconds`` of CPU time are used: the cover bound's rollouts take seconds on a large
network at a tight budget). A noisy rollout takes a random action ``explore`` times per
rollout on average (epsilon = explore / candidates): a fixed epsilon of 0.2 made 21 random
choices on ResNet-50's 104 candidates, and its best rollout was 24.9 ms at 0.3x the liveness
peak against 22.5 with 2, while on resnet_cifar 20 to 56 at 0.7 and 0.5 of their peaks 2
random actions found plans as fast or faster (+1.6% to +2.8% over the MILP, against +2.1%
to +3.4%). The best of all is compared with the superneurons plan: the better one is
returned, so the DQN planner is never worse than superneurons (as HOME). ``Decisions.info``
says which agent and which plan were used. No budget: every tensor kept (nothing moved or
recomputed).
"""
from __future__ import annotations

import os
import time

import numpy as np

from .base import KEEP, Planner
from .choice import CODES, build
from .dqn_agent import Agent, score, train
from .dqn_features import T_ROUNDS, TraceGraph
from .home import Home
from .rewrite import droppable
from .superneurons import SuperNeurons

#: the episodes also aim this far below the budget (a share of it): the per-step account
#: (dqn_features.Episode) does not see the arena's fragmentation, and plans that just fit
#: by it compact the arena and evict (ResNet-50 at resident + 0.3 x (liveness peak -
#: resident): the greedy bound aiming at the budget, 1 MiB under it by the account, ran
#: 33.9 ms with 365 compactions and 20 evictions). Not monotonic: at 0.3x the liveness
#: peak the bound runs 23.8, 23.3, 35.6 and 34.6 ms aiming 0, 2, 5 and 10% below.
MARGINS = (0.0, 0.02, 0.05, 0.1)

#: above this the planner returns superneurons' plan without building the agent's view
MAX_STATE_BYTES = 1 << 30


def state_bytes(n: int, steps: int) -> int:
    """The dense part of the agent's view of ``n`` candidates over ``steps`` steps
    (dqn_features.TraceGraph): the propagation's powers, n x n each, and two which-candidate-
    is-absent-at-which-step masks: CIFAR ResNet-1202, 2,405 candidates over 8,422 steps, 0.25
    GiB (built in 4 s); ResNet-10004, 20,012 over 66,712, 17.4 GiB."""
    return (T_ROUNDS + 1) * 8 * n * n + 2 * n * steps


DEFAULT_AGENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dqn_default.npz")


class Dqn(Planner):
    name = "dqn"
    description = "deep Q-network over keep/swap/recompute per tensor, never worse than superneurons"

    def __init__(self, agent: str | None = None, seed: int = 0, rollouts: int = 8,
                 explore: float = 2.0, episodes: int = 150, search_seconds: float = 10.0):
        if rollouts < 1 or explore < 0 or episodes < 1 or search_seconds <= 0:
            raise ValueError(f"dqn: rollouts >= 1, explore >= 0, episodes >= 1 and "
                             f"search_seconds > 0, got rollouts={rollouts} explore={explore} "
                             f"episodes={episodes} search_seconds={search_seconds}")
        self.agent_path = agent or None
        self.seed, self.rollouts, self.explore = int(seed), int(rollouts), float(explore)
        self.search_seconds = float(search_seconds)
        self.episodes = int(episodes)
        self._agent = Agent.load(agent) if agent else None    # a bad file fails here, early

    def agent(self, ctx, tg):
        """(agent, where it came from)."""
        if self._agent is not None:
            return self._agent, self.agent_path
        if os.path.exists(DEFAULT_AGENT):
            self._agent = Agent.load(DEFAULT_AGENT)
            return self._agent, "bundled default (" + os.path.basename(DEFAULT_AGENT) + ")"
        a, _ = train([(ctx, tg)], self.episodes, seed=self.seed, progress=False,
                     names=["target graph"])
        return a, f"trained on the target graph ({self.episodes} episodes; no bundled agent)"

    def plan(self, ctx):
        t0 = time.perf_counter()
        if ctx.budget is None:          # nothing to fit: nothing moved or recomputed
            d = build(ctx, droppable(ctx.schedule), {})
            d.info["chosen"] = "keep all (no budget)"
            return d
        sn = SuperNeurons().plan(ctx)
        n, steps = len(droppable(ctx.schedule)), len(ctx.schedule.steps)
        need = state_bytes(n, steps)
        if need > MAX_STATE_BYTES:
            sn.info["chosen"] = "superneurons"
            sn.info["dqn_skipped"] = (f"the agent's view of {n} candidates over {steps} steps "
                                      f"would take {need / 2**30:.1f} GiB (limit "
                                      f"{MAX_STATE_BYTES / 2**30:.1f} GiB)")
            return sn
        tg = TraceGraph(ctx)
        if not tg.n:
            return sn
        agent, source = self.agent(ctx, tg)
        rng, cache = np.random.default_rng(self.seed), {}
        best_vec, best_t = None, None
        # the episodes aim at the budget and at MARGINS below it; each plan is simulated at
        # the budget itself
        aims = [tg] + [tg.aimed(int(ctx.budget * (1 - m))) for m in MARGINS[1:]]
        pairs = [(member, g) for g in aims for member in agent.members]
        # an ensemble: each (member, aim)'s greedy rollout, then noisy ones, round after
        # round, until each has made ``rollouts`` or the search has used search_seconds of CPU
        eps = min(1.0, self.explore / tg.n)
        c0, done, timed_out = time.process_time(), 0, False
        for i in range(self.rollouts):
            if i and time.process_time() - c0 > self.search_seconds:
                timed_out = True
                break
            for member, g in pairs:
                vec = member.rollout(g, 0.0 if i == 0 else eps, rng)
                done += 1
                _, t = score(ctx, tg, vec, cache)
                if t is not None and (best_t is None or t < best_t):
                    best_vec, best_t = vec, t
        home = Home()
        sn_fit = home.fitness(ctx, sn)
        sn_t = sn_fit if sn_fit < 1e3 else None
        # a tie goes to the agent: it is this planner's own answer
        if best_t is not None and (sn_t is None or best_t <= sn_t):
            d, chosen = home.decisions(ctx, tg.cands, best_vec), "dqn"
        else:
            d, chosen = sn, "superneurons"
        greedy = np.array([CODES.index(d.tensors.get(t.name, KEEP)) for t in tg.cands])
        d.info.update({"agent": source, "chosen": chosen, "rollouts": done,
                       "rollouts_limit": self.rollouts * len(pairs),
                       "search_seconds_limit": self.search_seconds,
                       "stopped_by_time": timed_out,
                       "dqn_best_s": best_t, "superneurons_s": sn_t, "tensors": tg.n,
                       "agent_members": len(agent.members), "margins": list(MARGINS),
                       "agent_networks": getattr(agent, "meta", {}).get("networks"),
                       "plan_s": round(time.perf_counter() - t0, 3),
                       "decided": {c: int((greedy == i).sum()) for i, c in enumerate(CODES)}})
        return d
