"""HOME (issue 13): the particle-swarm planner against superneurons and the MILP optimum.

Part 1: resnet_cifar-20 and vgg11 at 32x32, batch 32 (budgets as in bench/planners.py part 2:
resident state + f x (liveness peak - resident state)): HOME's and superneurons' simulated
time against checkmate's. Target: HOME within 5% of the optimum.
Part 2: resnet50 and densenet121 at 224x224, batch 32, 0.3 x the liveness peak: HOME against
superneurons (target: no worse), search seconds (target for ResNet-50: under 60 s on 2 cores),
swarm size, iterations, evaluations, and the convergence curve (PNG); and HOME with COMPRESS
as a fourth code per tensor (``--compress 2|4``, FreeLunch): its time and how many tensors it
chose to compress.
Time from the analytic H100 cost model, as in bench/planners.py.

    nice python bench/home.py [--search-seconds 30] [--seed 0]
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import RESULTS, arg_parser, provenance, write  # noqa: E402

SMALL = [("resnet_cifar", 20), ("vgg11", None)]
SMALL_FRACTIONS = [1.0, 0.7, 0.5, 0.3]
BIG = [("resnet50", None), ("densenet121", None)]
MiB = 1 << 20


def row(graph, batch, planner, budget, cost):
    from neuron.executor import Executor
    from neuron.memory.clock import makespan, unlimited_time
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        ex = Executor(graph, batch, device="virtual", planner=planner, cost=cost, budget=budget)
    except ValueError as e:              # MemoryBudgetError is one
        return {"planner": planner, "budget_bytes": budget, "fits": False, "error": str(e)}
    r = ex.simulate(budget, trace=False, events=True)
    out = {"planner": planner, "budget_bytes": budget, "fits": r["fits"],
           "plan_s": round(time.perf_counter() - t0, 3),
           "plan_cpu_s": round(time.process_time() - c0, 3),
           "decisions": ex.decisions.counts(),
           "info": {k: v for k, v in ex.decisions.info.items()
                    if k not in ("search", "attempts")}}
    if r["fits"]:
        t = makespan(r["events"], ex.steps, batch, cost).makespan_s
        base = unlimited_time(ex.schedule.steps, batch, cost)
        out.update(peak_bytes=r["peak_bytes"], simulated_s=t, overhead_pct=100 * (t / base - 1))
    return out


def ms(r):
    return f"{r['simulated_s'] * 1e3:.3f} ms" if r["fits"] else "no"


def main(argv=None):
    ap = arg_parser(__doc__)
    ap.add_argument("--search-seconds", type=float, default=30.0,
                    help="HOME search limit in CPU seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--parts", default="small,big")
    args = ap.parse_args(argv)
    from neuron.executor import Executor
    from neuron.memory.costmodel import CostModel
    from neuron.models import build_model
    cost = CostModel.analytic("h100")
    home = f"home:seed={args.seed},search_seconds={args.search_seconds}"
    prov = provenance()
    out, md = [], ["# HOME: particle-swarm planner (simulated time, H100 analytic)", "",
                   f"{prov}", ""]
    if "small" in args.parts:
        md += ["## Gap to the checkmate MILP optimum, batch 32, 32x32", "",
               "| model | f | checkmate | superneurons | home | home vs optimum |",
               "|---|---|---|---|---|---|"]
        for name, depth in SMALL:
            graph = build_model(name, depth=depth, in_shape=(3, 32, 32), num_classes=10)
            ex = Executor(graph, 32, device="virtual", policy="liveness")
            live = ex.simulate(None, trace=False)["peak_bytes"]
            resident = sum(t.nbytes for t in ex.persistent)
            for f in SMALL_FRACTIONS:
                b = int(resident + f * (live - resident))
                rs = {p: row(graph, 32, p, b, cost) for p in ("checkmate", "superneurons", home)}
                opt, h = rs["checkmate"], rs[home]
                gap = (h["simulated_s"] / opt["simulated_s"] - 1) if opt["fits"] and h["fits"] \
                    else None
                for p, r in rs.items():
                    r.update(model=f"{name}{depth or ''}", fraction=f, part="gap",
                             gap_to_optimum=gap if p == home else None)
                    out.append(r)
                md.append(f"| {name}{depth or ''} | {f:g} | {ms(opt)} | "
                          f"{ms(rs['superneurons'])} | {ms(h)} | "
                          f"{'n/a' if gap is None else f'{100 * gap:+.1f}%'} |")
                print(md[-1], flush=True)
        md.append("")
    curves = {}
    if "big" in args.parts:
        md += ["## Large models, batch 32, 0.3 x liveness peak", "",
               "| model | superneurons | home | home search | swarm x iterations | "
               "evaluations | chosen | home, compress 2 | home, compress 4 |",
               "|---|---|---|---|---|---|---|---|---|"]
        for name, depth in BIG:
            graph = build_model(name, depth=depth)
            live = Executor(graph, 32, device="virtual",
                            policy="liveness").simulate(None, trace=False)["peak_bytes"]
            b = int(0.3 * live)
            sn, h = row(graph, 32, "superneurons", b, cost), row(graph, 32, home, b, cost)
            squeezed = [row(graph, 32, f"{home},compress={c}", b, cost) for c in (2, 4)]
            for r in (sn, h, *squeezed):
                r.update(model=name, fraction=0.3, part="big")
                out.append(r)
            comp = [f"{ms(r)} ({r.get('decisions', {}).get('compress', 0)} compressed)"
                    for r in squeezed]
            i = h.get("info", {})
            curves[name] = i.get("convergence", [])
            md.append(f"| {name} | {ms(sn)} | {ms(h)} | {i.get('search_s')} s wall, "
                      f"{i.get('search_cpu_s')} CPU s (limit {args.search_seconds:g} s) | "
                      f"{i.get('swarm')} x {i.get('iterations')} | {i.get('evaluations')} | "
                      f"{i.get('chosen')} | {comp[0]} | {comp[1]} |")
            print(md[-1], flush=True)
        md += ["", "Convergence: bench/results/home_convergence.png", ""]
        plot(curves)
    write("home", {"provenance": prov, "cost_model": cost.describe(), "rows": out},
          "\n".join(md) + "\n")


def plot(curves):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(curves), figsize=(5 * len(curves), 3.5), squeeze=False)
    for ax, (name, c) in zip(axes[0], curves.items()):
        it = [x["iteration"] for x in c]
        for key, label in (("best_s", "best so far"), ("mean_s", "mean (feasible)"),
                           ("worst_s", "worst (feasible)")):
            ax.plot(it, [None if x[key] is None else x[key] * 1e3 for x in c], label=label)
        ax.set(title=f"HOME on {name}", xlabel="swarm iteration",
               ylabel="simulated iteration (ms)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS, "home_convergence.png"), dpi=100)


if __name__ == "__main__":
    main()
