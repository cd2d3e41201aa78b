"""The DQN planner's view of a network (seed 000, other-seeds.md §1.2): the trace as a graph
of candidate tensors with per-node features, a fixed structure2vec-style embedding, and the
afterstate an episode's Q-network reads.

Nodes: one per candidate (``droppable``: a forward activation backward reads), in forward
order; edges: consecutive candidates, and a candidate with every candidate its producer reads.
Features (normalised so that one agent serves any network): the paper's six (bytes, transfer
time, recompute time, time until reuse, position, validity) plus the decided swap and recompute
shares of the bytes to free.

Deviations from the paper (stated): the message passing is fixed, not learned (SGC: the node
state after T = 4 rounds is [x, Âx, ..., Â^T x], Â = D^-1/2 (A + I) D^-1/2), only the MLP on
top (dqn_agent.py) is learned, and graph states are means, not sums, so inputs keep their scale
across networks. Q(s, a) = r(s, a) + W(g'_a) over afterstates: r is the action's known cost (a
recompute's time, a swap's wait on the copy stream shared with the episode's earlier swaps), so
only what an action does for the rest of the episode is learned. The afterstate reads a
per-step account of the excess over the budget (what each swap and recompute removes, step by
step, recompute chains holding tensors again) and the completion cost of covering what is
left with the later candidates. Why these features and their measured effect: docs/planners.md
and bench/results/dqn.md.
"""
from __future__ import annotations

import copy

import numpy as np

from ..clock import unlimited_time
from .costs import book, tensor_costs, walk_entry
from .rewrite import droppable

T_ROUNDS = 4
N_FEATURES = 8
ACTION_FLAGS = True     # False: ablation without features 7, 8 (drops not recorded per node)
DYNAMIC = ("left", "need", "candidates_left", "left_over_rest", "any_left", "completion")
N_DYNAMIC = len(DYNAMIC)
NODE_DIM = N_FEATURES * (T_ROUNDS + 1)
STATE_DIM = 2 * NODE_DIM + N_DYNAMIC


def dynamic(name: str) -> int:
    """The column of an afterstate's dynamic feature ``name`` (the last N_DYNAMIC columns)."""
    return 2 * NODE_DIM + DYNAMIC.index(name)


class TraceGraph:
    """Candidates, their features and costs for one (network, budget) planning problem."""

    def __init__(self, ctx, cands=None):
        from .choice import build
        cands = droppable(ctx.schedule) if cands is None else cands
        # swaps priced busy (each copy hiding under one step): priced alone, as if the copy
        # stream were idle, the retrained agent was 57.7% and 163.8% slower than superneurons
        # on ResNet-50 and DenseNet-121 at 0.3x their peaks, against 46.6% and 8.9%
        costs = {c.tensor.id: c for c in tensor_costs(ctx, cands, busy=True)}
        self.cands = [t for t in cands if t.id in costs]
        self.costs = [costs[t.id] for t in self.cands]
        n = self.n = len(self.cands)
        self.base_s = unlimited_time(ctx.schedule.steps, ctx.batch, ctx.cost)
        self.nbytes = np.array([t.nbytes for t in self.cands], np.float64)
        # each step's peak with every candidate kept, over the budget: what drops must cover
        rows = ctx.simulate(build(ctx, self.cands, {}), None, trace=True)["trace"]
        self.peaks = np.array([r.peak_bytes for r in rows], np.float64)
        self._aim(ctx.budget)
        self._windows(ctx)
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
        # the completion cost's ingredients: each candidate's cheaper way out and its price
        self.drop_cost = np.minimum(self.exposed, self.recompute)
        price = np.where(self.nbytes > 0, self.drop_cost / np.maximum(self.nbytes, 1.0), np.inf)
        self.by_price = np.argsort(price, kind="stable")
        swap_first = self.exposed <= self.recompute
        self.lo = np.where(swap_first, self.swap_lo, self.lf + 1)
        self.hi = np.where(swap_first, self.swap_hi, self.fb)
        # which candidates are absent at which step, taken their cheaper way; and per step,
        # in price order (completion takes the first one still free at the step furthest over)
        steps = np.arange(len(self.excess))
        self.absent = (self.lo[:, None] <= steps) & (self.hi[:, None] > steps)  # (n, steps)
        self.absent_by_price = np.ascontiguousarray(self.absent[self.by_price].T)   # (steps, n)
        self._way = list(zip(self.lo.tolist(), self.hi.tolist(), self.nbytes.tolist(),
                             self.drop_cost.tolist()))     # plain numbers: the loop's speed
        # an excess no later candidate can cover is left to the tensor cache: its bytes go
        # out and back, exposed (per byte, over the iteration time)
        self.evict_per_byte = ctx.evict_s_per_byte() / self.base_s
        # what an episode's swaps are priced and held by: the copy stream shared with the
        # swaps before them (Episode.swap), on the compute clock ``cum``
        self.queued = bool(ctx.cost.spec.async_copies)
        self.cum = ctx.cum_time(ctx.schedule.steps)
        self.walk_args = [walk_entry(c) for c in self.costs]
        self.adj = self._adjacency()
        # Â^k for k = 0..T: the embedding is linear in x, so an afterstate (one row of x
        # changed) is the current embedding plus that row's change times column i of Â^k
        p, self.powers = np.eye(n), []
        for _ in range(T_ROUNDS + 1):
            self.powers.append(p)
            p = self.adj @ p
        # per node i, column i's mean and diagonal entry of each power: how a change of row i
        # moves the mean node state and node i's own state (afterstates read these per step)
        self.col_mean = np.array([P.mean(0) for P in self.powers]).T if n else \
            np.zeros((0, T_ROUNDS + 1))
        self.diag = np.array([np.diag(P) for P in self.powers]).T if n else \
            np.zeros((0, T_ROUNDS + 1))

    def _aim(self, budget) -> None:
        """What the drops must cover: each step's peak with every candidate kept over
        ``budget`` (None: nothing), the largest of those (need), and the share of it a drop
        of each candidate covers (0 when nothing must go)."""
        self.excess = self.peaks - float(budget or self.peaks.max())
        self.need = max(0.0, float(self.excess.max()))
        self.cover = np.minimum(self.nbytes / self.need, 1.0) if self.need else \
            np.zeros(self.n)

    def aimed(self, budget: int) -> "TraceGraph":
        """This problem with the episodes aiming at ``budget`` instead (below the real one:
        a margin for the arena's fragmentation, which the per-step account does not see)."""
        tg = copy.copy(self)
        tg._aim(budget)
        return tg

    def _windows(self, ctx) -> None:
        """The steps over which each candidate is absent: a swap's from after the step its
        planned offload holds its block to (its copy done, alone on the copy stream:
        TensorCost.held_after) up to its prefetch; a recompute's from its last forward use up
        to its first backward use, cut short by a later recompute that re-runs it on the way
        (Episode.chain)."""
        c = self.costs
        self.lf = np.array([x.last_fwd for x in c], np.int64)
        self.fb = np.array([x.first_bwd for x in c], np.int64)
        self.swap_lo = np.array([x.held_after for x in c], np.int64) + 1
        self.swap_hi = np.array([x.prefetch_after for x in c], np.int64) + 1
        pos = {t.id: i for i, t in enumerate(self.cands)}
        self.parents = [[pos[t] for t in x.inputs if t in pos] for x in c]

    def _adjacency(self) -> np.ndarray:
        n = self.n
        a = np.eye(n)
        for i in range(n - 1):
            a[i, i + 1] = a[i + 1, i] = 1.0
        for i, js in enumerate(self.parents):       # the candidates its recompute reads
            for j in js:
                a[i, j] = a[j, i] = 1.0
        d = 1.0 / np.sqrt(a.sum(1))
        return a * d[:, None] * d[None, :]

    def completion(self, i: int, excess: np.ndarray) -> float:
        """The cost (over the iteration time, capped at 1) of covering the per-step
        ``excess`` with the candidates after ``i``: at the step furthest over, the cheapest
        per byte of those absent there, each its cheaper way out, until no step is over;
        what none of them can cover is priced as evicted (out and back, exposed)."""
        r = np.array(excess, np.float64)
        later = np.arange(self.n) > i
        free = later[self.by_price]             # by price: still to take
        left = self.absent[later].sum(0)        # per step, how many of those are absent there
        cost = uncovered = 0.0
        lo, hi = 0, len(r)                      # where the last take changed things
        while True:
            out = (left[lo:hi] == 0) & (r[lo:hi] > 0)   # over, with nothing left to take there
            if out.any():
                uncovered = max(uncovered, float(r[lo:hi][out].max()))
                r[lo:hi][out] = 0.0
            t = int(r.argmax())
            if r[t] <= 0:
                break
            k = int((self.absent_by_price[t] & free).argmax())
            free[k] = False
            lo, hi, nbytes, drop_cost = self._way[self.by_price[k]]
            r[lo:hi] -= nbytes
            left[lo:hi] -= 1
            cost += drop_cost
            if cost >= 1.0:
                return 1.0
        return min(cost + self.evict_per_byte * uncovered, 1.0)

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
        self.excess = tg.excess.copy()      # per step, after the actions taken so far
        self.back = tg.fb.copy()            # a recomputed tensor is held again from here
        self.booked, self.waits = [], 0.0   # the swaps taken so far; compute's wait for them
        self._emb = self._swap = None

    @property
    def done(self) -> bool:
        return self.i >= self.tg.n

    def afterstates(self) -> np.ndarray:
        """The three afterstates of the current node (keep, swap, recompute): g as it would
        be once that action is taken, shape (3, STATE_DIM)."""
        tg, i = self.tg, self.i
        if self._emb is None:
            self._emb = tg.embed(self.x)
        emb, n = self._emb, tg.n
        mean, node = emb.mean(0), emb[i]
        total = max(tg.nbytes.sum(), 1.0)
        rest = tg.rest[i + 1] if i + 1 < n else 0.0     # bytes of the later candidates
        out = np.empty((3, STATE_DIM))
        for a in range(3):
            d = np.zeros(N_FEATURES)
            d[5] = -self.x[i, 5]
            if a and ACTION_FLAGS:
                d[5 + a] = tg.cover[i]
            dm = np.outer(tg.col_mean[i], d).ravel()
            dn = np.outer(tg.diag[i], d).ravel()
            excess, _ = self._after(a)
            left = max(float(excess.max(initial=0.0)), 0.0)
            dyn = [left / tg.need if tg.need else 0.0, tg.need / total, (n - i - 1) / n,
                   min(left / rest, 2.0) if rest else (2.0 if left > 0 else 0.0),
                   1.0 if left > 0 else 0.0, tg.completion(i, excess)]
            out[a] = np.concatenate([mean + dm, node + dn, dyn])
        return out

    def chain(self, k: int) -> list:
        """(ancestor, step) for each recomputed tensor a recompute of ``k`` re-runs on the way
        and keeps from fb[k] on, earlier than it is held again now (rewrite.py: a recomputed
        version is kept until backward has used it)."""
        tg, out, seen = self.tg, [], set()
        stack = list(tg.parents[k])
        while stack:
            j = stack.pop()
            if j in seen or self.actions[j] != 2:
                continue
            seen.add(j)
            if tg.fb[k] < self.back[j]:
                out.append((j, int(tg.fb[k])))
            stack.extend(tg.parents[j])
        return out

    def swap(self) -> tuple:
        """A swap of the current node on the copy stream shared with the swaps taken so far
        (costs.book, as ``costs.queued`` prices capuchin's and the MILP's): (the swaps with
        it, compute's wait for all of them, its cost over the iteration time: the wait it
        adds and its codec passes, the step after which its block is released). Without a
        copy stream: its cost alone (both copies exposed) and the step after its offload."""
        tg, i = self.tg, self.i
        if self._swap is None or self._swap[0] != i:
            if not tg.queued:
                out = (self.booked, self.waits, tg.exposed[i], int(tg.swap_lo[i]) - 1)
            else:
                trial, waits, added, held = book(tg.cum, self.booked, self.waits,
                                                 tg.walk_args[i])
                out = (trial, waits, added / tg.base_s, held)
            self._swap = (i,) + out
        return self._swap[1:]

    def _after(self, action: int) -> tuple[np.ndarray, list]:
        """The per-step excess once ``action`` is taken at the current node, and the chain
        that a recompute holds again (Episode.chain; empty for keep and swap)."""
        tg, i = self.tg, self.i
        e, chain = self.excess.copy(), []
        if action == 1:
            e[self.swap()[3] + 1:tg.swap_hi[i]] -= tg.nbytes[i]
        elif action == 2:
            e[tg.lf[i] + 1:tg.fb[i]] -= tg.nbytes[i]
            chain = self.chain(i)
            for j, step in chain:
                e[step:self.back[j]] += tg.nbytes[j]
        return e, chain

    def costs(self) -> np.ndarray:
        """The three actions' estimated costs at the current node over the iteration time."""
        return np.array([0.0, self.swap()[2], self.tg.recompute[self.i]])

    def step(self, action: int) -> float:
        """Take ``action`` (0 keep, 1 swap, 2 recompute) at the current node; returns the
        shaped reward: minus that action's estimated cost over the iteration time."""
        tg, i = self.tg, self.i
        r = -self.costs()[action]
        self.excess, chain = self._after(action)
        if action == 1:
            self.booked, self.waits = self.swap()[:2]
        for j, step in chain:
            self.back[j] = step
        self.actions[i] = action
        d = np.zeros(N_FEATURES)
        d[5] = -self.x[i, 5]
        if action and ACTION_FLAGS:
            d[5 + action] = tg.cover[i]
        self.x[i] += d
        if self._emb is not None:       # linear: add row i's change times column i of Â^k
            self._emb += np.concatenate([np.outer(P[:, i], d) for P in tg.powers], 1)
        self.i += 1
        return r
