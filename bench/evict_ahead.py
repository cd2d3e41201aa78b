"""Evictions on the plan's schedule (issue 37 item 3, memory/evict_ahead.py): how many of the
`superneurons` policy's LRU evictions still copy on demand, and the clock's prediction of the
copy time left exposed, with and without early copies, on the VirtualDevice (planning only:
no kernels run, the same executor code decides every move).

Iteration 1 records the evictions, iteration 2 copies them ahead; each iteration's log is timed
by the simulated clock (memory/clock.py) on a cost model: the analytic H100 one by default (no
GPU profile is committed, so the clock is its serial form, not the pipelined one). A prediction,
not a measurement. The moves of the two iterations are checked equal (bytes, tensors, order).

    python bench/evict_ahead.py                       # ResNet-50, batch 284, 12 GiB (issue 37)
    python bench/evict_ahead.py --batch 64 --budget 3GiB

Writes bench/results/evict_ahead.{json,md}.
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import arg_parser, provenance, write  # noqa: E402


def parse_args(argv=None):
    ap = arg_parser(__doc__)
    ap.add_argument("--model", default="resnet50", help="a name from neuron.models")
    ap.add_argument("--batch", type=int, default=284)
    ap.add_argument("--side", type=int, default=224, help="input image side")
    ap.add_argument("--budget", default="12GiB", help="arena bytes (e.g. 12GiB)")
    ap.add_argument("--policy", default="superneurons")
    ap.add_argument("--cost", default="h100", help="analytic cost model: h100 | h200")
    return ap.parse_args(argv)


def run(args) -> dict:
    from neuron.executor import Executor
    from neuron.memory.clock import makespan
    from neuron.memory.costmodel import DEVICES, CostModel
    from neuron.memory.traffic import moves
    from neuron.models import build_model
    from neuron.sizes import byte_size_arg
    budget = byte_size_arg(args.budget, "budget", "bench/evict_ahead.py")
    graph = build_model(args.model, in_shape=(3, args.side, args.side))
    cost = CostModel(DEVICES[args.cost])
    ex = Executor(graph, args.batch, device="virtual", policy=args.policy, budget=budget)
    ex.record_trace = False
    its = []
    for i in range(2):
        ex.pool.log = []
        before = ex.pool.counters()
        t0 = time.perf_counter()
        ex.train_step(None, None)
        wall = time.perf_counter() - t0
        c = {k: v - before[k] for k, v in ex.pool.counters().items()
             if isinstance(v, int) and k != "host_peak_bytes"}
        rep = makespan(ex.pool.log, ex.steps, args.batch, cost)
        # the same log without the evictions' copies: what the other copies leave exposed
        rest = makespan([e for e in ex.pool.log if e[0] not in ("offload", "precopy")],
                        ex.steps, args.batch, cost)
        its.append({"iteration": i + 1, "evictions": c["evictions"],
                    "evictions_on_demand": c["evictions"] - c["evictions_ahead"],
                    "evictions_ahead": c["evictions_ahead"], "fallbacks": c["ahead_fallbacks"],
                    "offload_bytes": c["offload_bytes"], "prefetch_bytes": c["prefetch_bytes"],
                    "predicted_s": rep.makespan_s, "predicted_exposed_copy_s": rep.exposed_copy_s,
                    "predicted_copy_s": rep.copy_s,
                    "predicted_exposed_by_evictions_s": rep.exposed_copy_s - rest.exposed_copy_s, "clock_bytes_moved": rep.bytes_moved,
                    "moves": moves(ex.pool.log), "plan_wall_s": round(wall, 2)})
    same = its[0].pop("moves") == its[1].pop("moves")
    return {"model": args.model, "batch": args.batch, "side": args.side,
            "budget_bytes": budget, "policy": args.policy,
            "cost_model": f"analytic {args.cost} ({'pipelined' if cost.pipelined else 'serial'}"
                          " clock)", "same_moves": same, "iterations": its}


def markdown(r) -> str:
    a, b = r["iterations"]
    gib = r["budget_bytes"] / 2**30
    rows = [f"# Evictions on the plan's schedule: {r['model']} batch {r['batch']} "
            f"({r['side']}x{r['side']}) in {gib:g} GiB, `--policy {r['policy']}`", "",
            f"VirtualDevice (planning only); times are predictions of the simulated clock on the "
            f"{r['cost_model']}, not measurements. Same moves in both iterations (bytes, "
            f"tensors, order): {r['same_moves']}.", "",
            "Exposed by evictions: the exposed copy time less that of the same log without the "
            "evictions' copies (what the prefetches alone leave exposed). The clock has one copy "
            "stream for both directions.", "",
            "| iteration | evictions | on demand | copied ahead | fallbacks | offload GiB | "
            "predicted exposed copy s | of which by evictions | predicted iteration s |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for it, name in ((a, "1 (on demand, recorded)"), (b, "2 (copies ahead)")):
        rows.append(f"| {name} | {it['evictions']} | {it['evictions_on_demand']} | "
                    f"{it['evictions_ahead']} | {it['fallbacks']} | "
                    f"{it['offload_bytes'] / 2**30:.2f} | {it['predicted_exposed_copy_s']:.4f} | "
                    f"{it['predicted_exposed_by_evictions_s']:.4f} | {it['predicted_s']:.4f} |")
    return "\n".join(rows) + "\n"


def main(argv=None):
    args = parse_args(argv)
    r = run(args)
    r["provenance"] = provenance()
    write("evict_ahead", r, markdown(r))


if __name__ == "__main__":
    main()
