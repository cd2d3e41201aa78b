"""The DQN planner's agent (seed 000, Algorithm 1): a Q-network trained by neuron itself.

Q(s, a) = r(s, a) + W(g'_a) for the current candidate's three actions (keep, swap, recompute):
r is minus the action's estimated cost, W the value of the afterstate g'_a (dqn_features.py).
W = -b(g') + N(g'): b is the afterstate's completion cost (a greedy cover of the per-step excess
still over the budget by the later candidates, one of its features), N a learned correction, a
neuron Graph (Linear-ReLU-Linear-ReLU-Linear, one output, its output layer zero at the start,
so the untrained agent is the greedy bound's policy) trained by neuron's own Executor on the
CPU with the MSE loss (layers/loss.py) and SGD with momentum: the framework trains its own
planner. N learns what the bound misses (swaps that queue behind each other on the copy stream,
the transient tensors a recompute re-runs, the recomputes' inserted steps, the tensor cache).
Acting uses a NumPy copy of the weights (the same Linear arithmetic). Why the bound: agents
that learned all of W from the paper's node features dropped costly tensors and kept cheap ones
(+5 to +7% over the MILP optimum on resnet_cifar 20 and 32 at half the peak); learning a
correction to a sound estimate is the easier problem.

Training (Algorithm 1, with the choices the paper leaves open stated):
- episodes walk the candidates in forward order; epsilon-greedy with epsilon = ``eps_start`` x
  (1 - episode/l), floored at ``eps_min``: 0.1 to 0.03 by default, small because the untrained
  agent already follows the greedy bound and the Monte Carlo targets value the exploring
  policy, not the greedy one (measured with bench/dqn.py's problems, 600 episodes, on version
  4's one-number bound: from epsilon 1 and lr 1e-3 no snapshot beat the untrained agent's
  selection score, 0.105; from 0.3 or 0.1 with lr 1e-4 to 3e-4 the best ones reached 0.070 to
  0.078, and later ones drifted back up, hence the selection); each episode plans one (network,
  budget) problem, in turn;
- reward: each step minus its action's estimated cost over the iteration time (tensor_costs:
  exposed swap time, recompute time; keep 0), and at the terminal step the correction that
  makes the episode's return exactly minus the simulated overhead, time / unlimited - 1
  (``ctx.evaluate`` via HOME's fitness), or, if the plan does not fit, -(2 + bytes over the
  budget / bytes to free, capped at 1: the returns stay in [-3, 0] so that the small cost
  differences between fitting plans are not drowned in the fit error of large penalties);
  gamma = 1 (episodic, so the return is the objective); keep-all at a budget >= the peak
  returns 0, every other plan less;
- experience replay of (afterstate, Monte Carlo return after the action): the return of a
  41-step episode reaches every step at once (1-step bootstrapping, tried first, carries the
  terminal correction back one step per update and learned worse plans);
- deviations: afterstates (Q is not one network output per action; the immediate cost is
  known, not learned), ``sgd_steps`` minibatch steps per episode rather than one per
  transition (each executor step costs milliseconds), no target network (Monte Carlo targets
  need none). Simulations are cached by decision vector.
Inputs are standardised with means and deviations of afterstates from random rollouts, saved
with the weights.
"""
from __future__ import annotations

import datetime
import json
import time

import numpy as np

from .dqn_features import STATE_DIM, Episode, TraceGraph, dynamic

VERSION = 6
ACTIONS = ("keep", "swap", "recompute")
INFEASIBLE = 2.0


class AgentFileError(ValueError):
    """An agent file that cannot be read or does not match this planner."""


def q_graph(hidden: int):
    from ...graph import Graph
    from ...layers import Linear, ReLU, input_tensor
    x = input_tensor((STATE_DIM,), name="state")
    h = ReLU(name="q.r1")(Linear(hidden, name="q.l1")(x))
    h = ReLU(name="q.r2")(Linear(hidden, name="q.l2")(h))
    return Graph([x], [Linear(1, name="q.out")(h)], name="dqn")


LAYERS = ("q.l1", "q.l2", "q.out")


class Agent:
    """Weights (NumPy), input standardisation and metadata; ``q`` evaluates states.

    ``others``: further Q-networks (agents trained with other seeds) saved in the same file;
    ``members`` is this agent and those, an ensemble the planner rolls out one by one (each
    member's plans decided by its own Q-values; the best simulated plan is kept)."""

    def __init__(self, weights: dict, mean, std, meta: dict, others=()):
        self.w = {k: np.asarray(v, np.float64) for k, v in weights.items()}
        self.mean, self.std = np.asarray(mean, np.float64), np.asarray(std, np.float64)
        self.meta = meta
        self.others = list(others)

    @property
    def members(self) -> list:
        return [self] + self.others

    def q(self, states) -> np.ndarray:
        h = (np.atleast_2d(states) - self.mean) / self.std
        for i, name in enumerate(LAYERS):
            h = h @ self.w[name + ".weight"].T + self.w[name + ".bias"]
            if i < len(LAYERS) - 1:
                h = np.maximum(h, 0.0)
        return h

    def values(self, ep: Episode) -> np.ndarray:
        """Q(s, a) for the three actions at the episode's current node: the action's reward
        (minus its estimated cost) plus the value W of its afterstate."""
        return q_values(ep, ep.afterstates(), self.q)

    def rollout(self, tg: TraceGraph, eps: float = 0.0, rng=None) -> np.ndarray:
        ep = Episode(tg)
        while not ep.done:
            if eps and rng.random() < eps:
                ep.step(int(rng.integers(0, 3)))
            else:
                ep.step(int(np.argmax(self.values(ep))))
        return ep.actions

    def save(self, path: str) -> None:
        arrays = {"w:" + k: v for k, v in self.w.items()}
        for i, o in enumerate(self.others, 1):
            arrays.update({f"m{i}/w:{k}": v for k, v in o.w.items()})
            arrays.update({f"m{i}/mean": o.mean, f"m{i}/std": o.std})
        np.savez(path, mean=self.mean, std=self.std,
                 meta=np.array(json.dumps(self.meta)), **arrays)

    @classmethod
    def load(cls, path: str) -> "Agent":
        try:
            with np.load(path, allow_pickle=False) as z:
                data = {k: z[k] for k in z.files}
        except FileNotFoundError:
            raise AgentFileError(f"dqn agent {path}: no such file") from None
        except Exception as e:      # not a zip / npz, truncated, pickled objects
            raise AgentFileError(f"dqn agent {path}: not a readable .npz agent file ({e})") \
                from None
        try:
            meta = json.loads(str(data["meta"]))
            mean, std = data["mean"], data["std"]
            w = {k[2:]: v for k, v in data.items() if k.startswith("w:")}
            parts = [(w, mean, std)]
            for i in range(1, 1 + len({k.split("/")[0] for k in data if k.startswith("m")
                                       and "/" in k})):
                pre = f"m{i}/"
                parts.append(({k[len(pre) + 2:]: v for k, v in data.items()
                               if k.startswith(pre + "w:")},
                              data[pre + "mean"], data[pre + "std"]))
        except (KeyError, ValueError) as e:
            raise AgentFileError(f"dqn agent {path}: missing or bad entry ({e})") from None
        if meta.get("version") != VERSION or meta.get("state_dim") != STATE_DIM:
            raise AgentFileError(f"dqn agent {path}: version {meta.get('version')} / state "
                                 f"size {meta.get('state_dim')}, this planner reads version "
                                 f"{VERSION} / {STATE_DIM}; retrain it (bench/dqn.py)")
        need = [f"{n}.{p}" for n in LAYERS for p in ("weight", "bias")]
        for w, mean, std in parts:
            if any(k not in w for k in need) or mean.shape != (STATE_DIM,) \
                    or std.shape != (STATE_DIM,) or w["q.l1.weight"].shape[1] != STATE_DIM \
                    or w["q.out.weight"].shape[0] != 1:
                raise AgentFileError(f"dqn agent {path}: weights missing or of the wrong shape")
            if not all(np.isfinite(v).all() for v in [mean, std, *w.values()]):
                raise AgentFileError(f"dqn agent {path}: contains NaN or infinity")
        return cls(*parts[0], meta, [cls(*p, meta) for p in parts[1:]])


def baseline(after) -> np.ndarray:
    """-b(g'): minus each afterstate's completion cost (one of its features), W's fixed part."""
    return -np.atleast_2d(after)[:, dynamic("completion")]


def bound_rollout(tg: TraceGraph) -> np.ndarray:
    """The greedy bound's own plan: the rollout of an agent whose correction N is 0."""
    ep = Episode(tg)
    while not ep.done:
        ep.step(int(np.argmax(q_values(ep, ep.afterstates(), lambda s: np.zeros((len(s), 1))))))
    return ep.actions


def q_values(ep: Episode, after, q) -> np.ndarray:
    """r(s, a) + W(g'_a) = -cost(a) - b(g'_a) + N(g'_a), with N evaluated by ``q``."""
    return -ep.costs() + baseline(after) + q(after)[:, 0]


def score(ctx, tg: TraceGraph, actions, cache: dict):
    """(return, simulated seconds or None) of a decision vector; cached by vector."""
    key = actions.tobytes()
    if key not in cache:
        from .home import INFEASIBLE_S, Home
        h = Home()
        f = h.fitness(ctx, h.decisions(ctx, tg.cands, actions))
        if f < INFEASIBLE_S:
            cache[key] = (-(f / tg.base_s - 1.0), f)
        else:
            over = (f - INFEASIBLE_S) * 1e9 if f < 2 * INFEASIBLE_S else tg.need
            cache[key] = (-(INFEASIBLE + min(over / max(tg.need, 1.0), 1.0)), None)
    return cache[key]


def train(problems, episodes: int = 300, *, hidden: int = 64, lr: float = 1e-4,
          batch: int = 64, sgd_steps: int = 8, replay: int = 20000, eps_start: float = 0.1,
          eps_min: float = 0.03, seed: int = 0, progress: bool = True, names=None,
          select=None, select_every: int = 50, select_from: float = 0.0):
    """Train on ``problems``, a list of (PlanContext, TraceGraph); returns (Agent, curve).

    ``select``: a list of (PlanContext, TraceGraph, reference seconds) problems (the training
    problems, held-out validation graphs, or both) on which, every ``select_every`` episodes
    from the fraction ``select_from`` of training on, the greedy policy is scored: the mean of
    log(simulated time / reference), a plan that does not fit counting log 2 + 1. The
    snapshot with the best score, the untrained one (N = 0: the greedy bound's policy)
    included, is returned (the last one without ``select``)."""
    from ...executor import Executor
    from ...optim import SGD
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    # input standardisation from random rollouts (states need no simulation)
    sample = []
    for _, tg in problems:
        for _ in range(8):
            ep = Episode(tg)
            while not ep.done:
                a = int(rng.integers(0, 3))
                sample.append(ep.afterstates()[a])
                ep.step(a)
    sample = np.array(sample)
    mean, std = sample.mean(0), sample.std(0) + 1e-3
    ex = Executor(q_graph(hidden), batch, loss="mse", seed=seed,
                  optimizer=SGD(lr=lr, momentum=0.9))
    # N = 0 at the start: the untrained agent follows the greedy bound
    out = {k: v for k, v in ex.parameters().items() if k.startswith("q.out.")}
    ex.load_state_dict({k: np.zeros_like(v) for k, v in out.items()}, strict=False)
    meta = {"version": VERSION, "state_dim": STATE_DIM, "hidden": hidden,
            "networks": list(names or []), "episodes": episodes, "lr": lr, "gamma": 1.0,
            "date": datetime.date.today().isoformat(), "seed": seed,
            "target": "monte carlo, afterstates, correction to the greedy bound"}

    def snapshot():
        return Agent(ex.parameters(), mean, std, meta)

    agent = snapshot()
    caches = [dict() for _ in problems]
    sel_caches = [dict() for _ in (select or [])]
    best = (np.inf, None, None)

    def sel_score(ag):
        out = []
        for (sctx, stg, ref), c in zip(select, sel_caches):
            _, t = score(sctx, stg, ag.rollout(stg), c)
            out.append(np.log(2.0) + 1.0 if t is None else np.log(t / ref))
        return float(np.mean(out))
    if select:      # the starting point competes too (untrained: the greedy bound's policy)
        best = (sel_score(agent), agent, 0)
    D_s, D_g = [], []
    curve, bar = [], None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=episodes, desc="dqn training", unit="episode", leave=False)
    for e in range(episodes):
        k = e % len(problems)
        ctx, tg = problems[k]
        eps = max(eps_min, eps_start * (1.0 - e / episodes))
        ep, traj = Episode(tg), []
        while not ep.done:
            after = ep.afterstates()
            a = int(rng.integers(0, 3)) if rng.random() < eps \
                else int(np.argmax(q_values(ep, after, agent.q)))
            r = ep.step(a)
            traj.append([after[a], r])
        ret, t = score(ctx, tg, ep.actions, caches[k])
        # the afterstate's value: the return after its action (Monte Carlo): the later
        # steps' rewards and the terminal correction, ret - (the rewards up to this step);
        # N's target is what that value adds to the fixed part -b(g')
        spent = np.cumsum([r for _, r in traj])
        for (s, _), c in zip(traj, spent):
            D_s.append(s)
            D_g.append(ret - c - baseline(s)[0])
        if len(D_s) > replay:
            del D_s[:len(D_s) - replay]
            del D_g[:len(D_g) - replay]
        losses = []
        if len(D_s) >= batch:
            S, G = np.array(D_s), np.array(D_g)
            for _ in range(sgd_steps):
                idx = rng.integers(0, len(S), batch)
                xs = ((S[idx] - mean) / std).astype(np.float32)
                # the executor sees standardised states; the snapshot standardises itself
                losses.append(ex.train_step(xs, G[idx, None].astype(np.float32)))
        agent = snapshot()
        sel = None
        if select and (e + 1) >= select_from * episodes and \
                ((e + 1) % select_every == 0 or e + 1 == episodes):
            sel = sel_score(agent)
            if sel < best[0]:
                best = (sel, agent, e + 1)
        curve.append({"episode": e + 1, "problem": k, "epsilon": round(eps, 4),
                      "return": float(ret), "fits": t is not None, "time_s": t,
                      "overhead": None if t is None else t / tg.base_s - 1.0,
                      "loss": float(np.mean(losses)) if losses else None,
                      "select": sel, "elapsed_s": round(time.perf_counter() - t0, 3)})
        if bar is not None:
            bar.update(1)
            bar.set_postfix(eps=f"{eps:.2f}", ret=f"{ret:.3f}")
    if bar is not None:
        bar.close()
    if best[1] is not None:
        agent = best[1]
        meta["selected_episode"], meta["selection_score"] = best[2], round(best[0], 5)
    meta["train_s"] = round(time.perf_counter() - t0, 2)
    meta["simulations"] = sum(len(c) for c in caches)
    return agent, curve


def plot_curve(curve, path: str, names=None) -> None:
    """The learning curve: each episode's overhead (fitting plans) per training problem, with
    a running mean, and the exploration rate."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    colours = plt.get_cmap("tab10")
    for k in sorted({c["problem"] for c in curve}):
        pts = [(c["episode"], c["return"]) for c in curve if c["problem"] == k]
        ep, ret = zip(*pts)
        run = np.convolve(ret, np.ones(10) / 10, mode="valid") if len(ret) >= 10 else ret
        label = names[k] if names and k < len(names) else f"problem {k}"
        ax.plot(ep, ret, ".", alpha=0.25, ms=3, color=colours(k % 10))
        ax.plot(ep[len(ep) - len(run):], run, color=colours(k % 10),
                label=f"{label} (running mean of 10)")
    ax.set(xlabel="episode", ylabel="return = -(overhead) or infeasible penalty",
           title="DQN planner training")
    ax.set_ylim(bottom=max(ax.get_ylim()[0], -3.5))
    ax2 = ax.twinx()
    ax2.plot([c["episode"] for c in curve], [c["epsilon"] for c in curve], "k:", lw=1)
    ax2.set_ylabel("epsilon (dotted)")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
