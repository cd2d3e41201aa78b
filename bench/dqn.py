"""The DQN planner (seed 000): train an agent (an ensemble of Q-networks), save it as the
bundled default, and evaluate it on the networks it was trained on and on networks it has
not seen.

Training: resnet_cifar-20 (7 budgets), -8, -14 and vgg11 at 32x32, batch 32, budgets
resident + f x (liveness peak - resident) for the fractions f in TRAIN (bench/planners.py
part 2's budgets), except problems where superneurons finds no fitting plan (no signal to
learn from). One Q-network per --members entry (seed:hidden units); in each training the
snapshot with the best selection score (the greedy plans' mean log time over superneurons' on
the training problems and the held-out VALIDATE graphs, never the reported unseen ones; the
untrained one, the greedy bound's policy, competes too) is kept, and the agent is all of
them (the planner rolls out each member). The agent is written to
neuron/memory/planners/dqn_default.npz, the best-scoring member's curve to
bench/results/dqn_training.png.
Evaluation (simulated time, analytic H100 cost model):
- seen: resnet_cifar-20, vgg11 at f in 1, 0.7, 0.5: DQN against the checkmate MILP optimum
  (target: within 5%) and superneurons;
- unseen: resnet_cifar-32 and -56 at 32x32 (f 0.7, 0.5; checkmate too), and resnet50 and
  densenet121 at 224x224, 0.3 x the liveness peak (target: no worse than superneurons).
"DQN (agent alone)" is the best agent rollout before the comparison with superneurons that
the planner makes; "dqn" is what the planner returns; "greedy bound" is the plan of the
agent's fixed part alone (its learned correction N = 0, dqn_agent.py), so that what the
learning adds is visible.

    nice python bench/dqn.py [--episodes 600] [--members 0:64,1:64,2:64,0:128]
                             [--parts train,small,unseen,big]
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import RESULTS, arg_parser, provenance, write  # noqa: E402
from bench.home import row  # noqa: E402

TRAIN = [(("resnet_cifar", 20), [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4]),
         (("resnet_cifar", 8), [1.0, 0.7, 0.5]),
         (("resnet_cifar", 14), [1.0, 0.8, 0.6, 0.4]),
         (("vgg11", None), [1.0, 0.85, 0.7, 0.5])]
# held-out graphs for picking the agent (never the reported unseen ones): every 50 episodes
# of the second half of training, and across the training seeds, the greedy policy is scored
# on the training problems and these, relative to superneurons; the best snapshot is kept
VALIDATE = [(("resnet_cifar", 26), [0.7, 0.5]), (("densenet_cifar", 22), [0.7, 0.5])]
SEEN = [("resnet_cifar", 20), ("vgg11", None)]
SEEN_FRACTIONS = [1.0, 0.7, 0.5]
UNSEEN_SMALL = [("resnet_cifar", 32), ("resnet_cifar", 56)]
BIG = [("resnet50", None), ("densenet121", None)]


def budgets(graph, fractions):
    from neuron.executor import Executor
    ex = Executor(graph, 32, device="virtual", policy="liveness")
    live = ex.simulate(None, trace=False)["peak_bytes"]
    resident = sum(t.nbytes for t in ex.persistent)
    return ex, [(f, int(resident + f * (live - resident))) for f in fractions]


def fmt(r):
    return f"{r['simulated_s'] * 1e3:.3f} ms" if r["fits"] else "no"


def pct(a, b):
    if not (a["fits"] and b["fits"]):
        return None
    return a["simulated_s"] / b["simulated_s"] - 1


def ms(t):
    return "no fit" if t is None else f"{t * 1e3:.3f} ms"


def bound_s(ex, budget, cost):
    """Simulated seconds of the greedy bound's plan (None: it does not fit)."""
    from neuron.memory.planners import PlanContext
    from neuron.memory.planners.dqn_agent import bound_rollout, score
    from neuron.memory.planners.dqn_features import TraceGraph
    ctx = PlanContext(ex, budget, cost)
    tg = TraceGraph(ctx)
    return score(ctx, tg, bound_rollout(tg), {})[1]


def cell(g):
    return "n/a" if g is None else f"{100 * g:+.1f}%"


def main(argv=None):
    ap = arg_parser(__doc__)
    ap.add_argument("--episodes", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--members", default="0:64,1:64,2:64,0:128",
                    help="the ensemble's members, seed:hidden units each (one training each)")
    ap.add_argument("--parts", default="train,small,unseen,big")
    args = ap.parse_args(argv)
    from neuron.memory.costmodel import CostModel
    from neuron.memory.planners import PlanContext
    from neuron.memory.planners.dqn import DEFAULT_AGENT
    from neuron.memory.planners.dqn_agent import plot_curve, train
    from neuron.memory.planners.dqn_features import TraceGraph
    from neuron.memory.planners.home import Home
    from neuron.memory.planners.superneurons import SuperNeurons
    from neuron.models import build_model
    cost = CostModel.analytic("h100")
    prov = provenance()
    md = ["# DQN planner (seed 000): trained on small CIFAR networks, evaluated on seen and "
          "unseen",
          "", f"{prov}", ""]
    out = {"provenance": prov, "cost_model": cost.describe(), "rows": []}
    names = []
    if "train" in args.parts:
        problems, dropped, select, held_out = [], [], [], []
        for (name, depth), fractions in TRAIN:
            graph = build_model(name, depth=depth, in_shape=(3, 32, 32), num_classes=10)
            ex, bs = budgets(graph, fractions)
            for f, b in bs:
                ctx = PlanContext(ex, b, cost)
                label = f"{name}{depth or ''} f={f:g}"
                if not ctx.evaluate(SuperNeurons().plan(ctx))["fits"]:
                    dropped.append(label)       # no plan fits: only noise to learn from
                    continue
                problems.append((ctx, TraceGraph(ctx)))
                names.append(label)
                sn_s = Home().fitness(ctx, SuperNeurons().plan(ctx))
                select.append((ctx, problems[-1][1], sn_s))
        for (name, depth), fractions in VALIDATE:
            graph = build_model(name, depth=depth, in_shape=(3, 32, 32), num_classes=10)
            ex, bs = budgets(graph, fractions)
            for f, b in bs:
                ctx = PlanContext(ex, b, cost)
                t = Home().fitness(ctx, SuperNeurons().plan(ctx))
                if t < 1e3:
                    select.append((ctx, TraceGraph(ctx), t))
                    held_out.append(f"{name}{depth or ''} f={f:g}")
        runs = []
        for member in args.members.split(","):
            seed, hidden = (int(x) for x in member.split(":"))
            agent, curve = train(problems, args.episodes, seed=seed, names=names,
                                 select=select, hidden=hidden)
            runs.append((agent.meta["selection_score"], member, agent, curve))
            print(f"member {member}: selection score {agent.meta['selection_score']} at "
                  f"episode "
                  f"{agent.meta['selected_episode']}, {agent.meta['train_s']} s", flush=True)
        runs.sort(key=lambda r: r[0])
        _, seed, agent, curve = runs[0]
        train_s = sum(r[2].meta["train_s"] for r in runs)
        # the ensemble: every seed's selected Q-network, the best-scoring first
        agent.others = [r[2] for r in runs[1:]]
        agent.meta["ensemble_members"] = [r[1] for r in runs]
        agent.meta["ensemble_scores"] = [r[0] for r in runs]
        agent.meta["networks"] = names
        agent.save(DEFAULT_AGENT)
        plot_curve(curve, os.path.join(RESULTS, "dqn_training.png"), names)
        m = agent.meta
        out["training"] = {"meta": m, "curve": curve}
        md += ["## Training", "",
               f"{m['episodes']} episodes on {', '.join(names)} (batch 32, 32x32; targets: "
               f"{m['target']}; dropped, no fitting superneurons plan: "
               f"{', '.join(dropped) or 'none'}), members (seed:hidden units) {args.members}: "
               f"{train_s:.2f} s in all on this machine's CPU (Q-network trained by neuron's "
               f"own Executor). Per seed, the snapshot with the best selection score (mean log of "
               f"the greedy plan's time over superneurons' on the training problems and the "
               f"held-out {', '.join(held_out)}; every 50 episodes, the untrained one included) "
               f"is kept; episode 0 means no snapshot beat the untrained one; the agent is the "
               f"ensemble of the {len(runs)} Q-networks (the planner rolls "
               f"out each; scores, best first: "
               + ", ".join(f"{r[1]} {r[0]} (episode {r[2].meta['selected_episode']})"
                           for r in runs) + f"). Member {seed}: {m['train_s']} s, "
               f"{m['simulations']} distinct simulations. Agent saved to "
               f"neuron/memory/planners/dqn_default.npz. Curve (member {seed}): "
               f"bench/results/dqn_training.png", ""]
        print(md[-2], flush=True)
    dqn = f"dqn:seed={args.seed}"
    if "small" in args.parts or "unseen" in args.parts:
        md += ["## Small graphs: gap to the checkmate MILP optimum (batch 32, 32x32)", "",
               "| model | seen in training | f | checkmate | superneurons | greedy bound | "
               "DQN (agent alone) | dqn (planner) | dqn vs optimum | chosen |",
               "|---|---|---|---|---|---|---|---|---|---|"]
        sets = ([(n, d, SEEN_FRACTIONS, "yes") for n, d in SEEN] if "small" in args.parts
                else []) + ([(n, d, [0.7, 0.5], "no") for n, d in UNSEEN_SMALL]
                            if "unseen" in args.parts else [])
        for name, depth, fractions, seen in sets:
            graph = build_model(name, depth=depth, in_shape=(3, 32, 32), num_classes=10)
            ex, bs = budgets(graph, fractions)
            for f, b in bs:
                rs = {p: row(graph, 32, p, b, cost) for p in ("checkmate", "superneurons", dqn)}
                bound = bound_s(ex, b, cost)
                d, opt = rs[dqn], rs["checkmate"]
                gap = pct(d, opt)
                for p, r in rs.items():
                    r.update(model=f"{name}{depth or ''}", fraction=f, seen=seen, part="small",
                             gap_to_optimum=gap if p == dqn else None,
                             greedy_bound_s=bound if p == dqn else None)
                    out["rows"].append(r)
                alone = d.get("info", {}).get("dqn_best_s")
                md.append(f"| {name}{depth or ''} | {seen} | {f:g} | {fmt(opt)} | "
                          f"{fmt(rs['superneurons'])} | {ms(bound)} | "
                          f"{'no fit' if alone is None else f'{alone * 1e3:.3f} ms'} | {fmt(d)} "
                          f"| {cell(gap)} | {d.get('info', {}).get('chosen')} |")
                print(md[-1], flush=True)
        md.append("")
    if "big" in args.parts:
        md += ["## Unseen large networks, batch 32, 224x224, 0.3 x liveness peak", "",
               "| model | superneurons | greedy bound | DQN (agent alone) | dqn (planner) | "
               "vs superneurons | plan time | chosen |", "|---|---|---|---|---|---|---|---|"]
        for name, depth in BIG:
            from neuron.executor import Executor
            graph = build_model(name, depth=depth)
            ex = Executor(graph, 32, device="virtual", policy="liveness")
            live = ex.simulate(None, trace=False)["peak_bytes"]
            b = int(0.3 * live)
            sn, d = row(graph, 32, "superneurons", b, cost), row(graph, 32, dqn, b, cost)
            bound = bound_s(ex, b, cost)
            for r in (sn, d):
                r.update(model=name, fraction=0.3, seen="no", part="big",
                         greedy_bound_s=bound if r is d else None)
                out["rows"].append(r)
            i = d.get("info", {})
            alone = i.get("dqn_best_s")
            md.append(f"| {name} | {fmt(sn)} | {ms(bound)} | "
                      f"{'no fit' if alone is None else f'{alone * 1e3:.3f} ms'} | {fmt(d)} | "
                      f"{cell(pct(d, sn))} | {d.get('plan_s')} s | {i.get('chosen')} |")
            print(md[-1], flush=True)
        md.append("")
    md += targets(out["rows"])
    md += ["\"greedy bound\": the plan of the agent's fixed part alone, W = -(completion "
           "cost), the learned correction left out, aiming at the budget; \"DQN (agent "
           "alone)\": the fastest of the members' rollouts, greedy and noisy, each aiming at "
           "the budget and 2, 5 and 10% below it (planners/dqn.py MARGINS); \"no fit\": its "
           "plan does not fit.", ""]
    write("dqn", out, "\n".join(md) + "\n")


def targets(rows):
    """The Targets section, computed from this run's rows."""
    md = ["## Targets (computed from the rows above)", ""]
    small = [r for r in rows if r.get("part") == "small" and r["planner"].startswith("dqn")]
    opt = {(r["model"], r["fraction"]): r for r in rows
           if r.get("part") == "small" and r["planner"] == "checkmate"}
    for seen, what in (("yes", "the small graphs seen in training"),
                       ("no", "the unseen small graphs")):
        gaps = []
        for r in small:
            o = opt[(r["model"], r["fraction"])]
            if r["seen"] != seen or not o["fits"]:
                continue
            a = r.get("info", {}).get("dqn_best_s")
            gaps.append((f"{r['model']} f={r['fraction']:g}", r.get("gap_to_optimum"),
                         None if a is None else a / o["simulated_s"] - 1))
        if not gaps:
            continue
        ok = all(g is not None and g <= 0.05 for _, g, _ in gaps)
        ok_alone = all(a is not None and a <= 0.05 for *_, a in gaps)
        md.append(f"- DQN planner within 5% of the checkmate optimum on {what} (where the "
                  f"optimum fits): {'met' if ok else 'NOT met'}; the agent alone (no "
                  f"superneurons fallback): {'met' if ok_alone else 'NOT met'}. Planner / "
                  "agent alone: " + ", ".join(f"{n} {cell(g)} / {cell(a)}"
                                               for n, g, a in gaps) + ".")
    big = [r for r in rows if r.get("part") == "big"]
    if big:
        parts, ok, ok_alone = [], True, True
        for m in dict.fromkeys(r["model"] for r in big):
            sn = next(r for r in big if r["model"] == m and r["planner"] == "superneurons")
            d = next(r for r in big if r["model"] == m and r["planner"].startswith("dqn"))
            a = d.get("info", {}).get("dqn_best_s")
            g = pct(d, sn)
            ga = None if a is None or not sn["fits"] else a / sn["simulated_s"] - 1
            ok &= g is not None and g <= 1e-9
            ok_alone &= ga is not None and ga <= 1e-9
            parts.append(f"{m} {cell(g)} / {cell(ga)}")
        md.append(f"- No worse than superneurons on the large unseen networks at 0.3 x "
                  f"liveness peak: {'met' if ok else 'NOT met'}; the agent alone: "
                  f"{'met' if ok_alone else 'NOT met'}. Planner / agent alone vs "
                  "superneurons: " + ", ".join(parts) + ".")
    return md + [""]


if __name__ == "__main__":
    main()
