"""The DQN planner's view of a network (seed 000, other-seeds.md §1.2): the trace as a graph
of candidate tensors, 6 features per node, a structure2vec-style embedding with T = 4 rounds,
and the graph state an episode's Q-network reads.

Nodes: one per candidate (``droppable``: a forward activation backward reads), in forward
order. Edges: consecutive candidates (the trace order) and a candidate with every candidate
its producer reads (a shared step dependency: the same variable used by two operations).

Node features x_v (the paper's six), each normalised so that one agent serves any network:
 1. bytes / the largest candidate's bytes
 2. transfer time (out and back) / the iteration time with unlimited memory
 3. recompute time (the producer's forward) / the iteration time
 4. time until reuse (compute between last forward and first backward use) / iteration time
 5. action position: the node's place in forward order, 0..1
 6. validity: 1 while the node's action is still to be decided, 0 once decided

Deviation from the paper (stated): the message passing is fixed, not learned. With
Â = D^-1/2 (A + I) D^-1/2 (N(v) includes v, as in Eq. 1), the node state after T rounds is
[x, Âx, Â²x, ..., Â^T x] (SGC, Wu et al. 2019: Eq. 1 with the ReLUs dropped and W1..W4 fixed),
and only the Q-network on top (an MLP, dqn_agent.py) is learned. The edge weights w(u, v) (time
lags) are not used. Eq. 2 sums node states; here the mean is used, so that one agent's inputs
keep their scale across networks of 17 or 400 candidates.

Graph state g = [mean of node states, current node's state, dynamic features]: the bytes
still to free (the unbudgeted peak minus the budget, less the bytes of the candidates swapped
or recomputed so far, a cheap running account rather than a simulation) over the total to
free, that total over all candidate bytes, the fraction of candidates left, and the current
node's exposed swap time and recompute time over the iteration time (what its two actions
would cost, from tensor_costs), the bytes still to free over the bytes of this and the later
candidates (the share of the remaining capacity that must still go; 0 once nothing more must
be freed, e.g. at a budget >= the peak, where keeping is right; > 1 means no plan can fit any
more), the bytes still to free over this candidate's bytes (/10, capped at 1), and whether
any bytes are still to free at all.
"""
from __future__ import annotations

import numpy as np

from ..clock import unlimited_time
from .costs import tensor_costs
from .rewrite import droppable

T_ROUNDS = 4
N_FEATURES = 6
N_DYNAMIC = 8
NODE_DIM = N_FEATURES * (T_ROUNDS + 1)
STATE_DIM = 2 * NODE_DIM + N_DYNAMIC


class TraceGraph:
    """Candidates, their features and costs for one (network, budget) planning problem."""

    def __init__(self, ctx, cands=None, unbudgeted_peak: int | None = None):
        cands = droppable(ctx.schedule) if cands is None else cands
        costs = {c.tensor.id: c for c in tensor_costs(ctx, cands)}
        self.cands = [t for t in cands if t.id in costs]
        self.costs = [costs[t.id] for t in self.cands]
        n = self.n = len(self.cands)
        self.base_s = unlimited_time(ctx.schedule.steps, ctx.batch, ctx.cost)
        self.nbytes = np.array([t.nbytes for t in self.cands], np.float64)
        if unbudgeted_peak is None:
            from .capuchin import build
            unbudgeted_peak = ctx.simulate(build(ctx, self.cands, {}), None)["peak_bytes"]
        self.need = max(0.0, float(unbudgeted_peak) - float(ctx.budget or unbudgeted_peak))
        x = np.zeros((n, N_FEATURES))
        if n:
            x[:, 0] = self.nbytes / self.nbytes.max()
            x[:, 1] = [c.swap_s / self.base_s for c in self.costs]
            x[:, 2] = [c.recompute_s / self.base_s for c in self.costs]
            x[:, 3] = [c.free_s / self.base_s for c in self.costs]
            x[:, 4] = np.arange(n) / max(n - 1, 1)
            x[:, 5] = 1.0
        self.x = x
        self.exposed = np.array([c.exposed_s / self.base_s for c in self.costs])
        self.recompute = np.array([c.recompute_s / self.base_s for c in self.costs])
        self.rest = np.cumsum(self.nbytes[::-1])[::-1] if n else np.zeros(0)
        self.adj = self._adjacency()

    def _adjacency(self) -> np.ndarray:
        n = self.n
        a = np.eye(n)
        pos = {t.id: i for i, t in enumerate(self.cands)}
        for i in range(n - 1):
            a[i, i + 1] = a[i + 1, i] = 1.0
        for i, c in enumerate(self.costs):
            for tid in c.inputs:
                j = pos.get(tid)
                if j is not None:
                    a[i, j] = a[j, i] = 1.0
        d = 1.0 / np.sqrt(a.sum(1))
        return a * d[:, None] * d[None, :]

    def embed(self, x: np.ndarray) -> np.ndarray:
        """Node states [x, Âx, ..., Â^T x], shape (n, NODE_DIM)."""
        out, h = [x], x
        for _ in range(T_ROUNDS):
            h = self.adj @ h
            out.append(h)
        return np.concatenate(out, 1)


class Episode:
    """The state walk of one rollout: candidates in forward order, one action each."""

    def __init__(self, tg: TraceGraph):
        self.tg, self.i = tg, 0
        self.x = tg.x.copy()
        self.actions = np.zeros(tg.n, np.int8)
        self.freed = 0.0
        self._emb = None

    @property
    def done(self) -> bool:
        return self.i >= self.tg.n

    def state(self) -> np.ndarray:
        """g for the current node (zeros at the terminal state, whose Q is 0 anyway)."""
        tg = self.tg
        if self.done:
            return np.zeros(STATE_DIM)
        if self._emb is None:
            self._emb = tg.embed(self.x)
        emb, i = self._emb, self.i
        total = max(tg.nbytes.sum(), 1.0)
        left = max(tg.need - self.freed, 0.0)
        cap = max(tg.rest[i], 1.0)      # bytes of this and the later candidates
        dyn = [left / tg.need if tg.need else 0.0, tg.need / total, (tg.n - i) / tg.n,
               tg.exposed[i], tg.recompute[i],
               min(left / cap, 2.0),                   # share of what is left that must go
               min(left / tg.nbytes[i], 10.0) / 10.0 if tg.nbytes[i] else 0.0,
               1.0 if left > 0 else 0.0]               # still bytes to free: keep is wrong
        return np.concatenate([emb.mean(0), emb[i], dyn])

    def step(self, action: int) -> float:
        """Take ``action`` (0 keep, 1 swap, 2 recompute) at the current node; returns the
        shaped reward: minus that action's estimated cost over the iteration time."""
        tg, i = self.tg, self.i
        self.actions[i] = action
        if action:
            self.freed += tg.nbytes[i]
        self.x[i, 5] = 0.0
        self._emb = None
        self.i += 1
        return -(0.0, tg.exposed[i], tg.recompute[i])[action]
