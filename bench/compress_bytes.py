"""FreeLunch compression's effect on bytes (issue 13), planning only: bytes offloaded per
iteration and host memory with and without ``--compress``, and (``--deepest``) the deepest
Table-4 ResNet under a 12 GiB arena with --offload-params and a host budget.
Target: rate 2 cuts the bytes offloaded per iteration by >= 1.9x.

    nice python bench/compress_bytes.py [--deepest]
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import arg_parser, provenance, write  # noqa: E402

GiB = 1 << 30
CASES = [("resnet50", None, 32, 1 * GiB), ("densenet121", None, 32, 1 * GiB)]
PLANNERS = ["superneurons", "vdnn"]


def main(argv=None):
    ap = arg_parser(__doc__)
    ap.add_argument("--deepest", action="store_true",
                    help="also search the deepest Table-4 ResNet with and without compression "
                    "(minutes)")
    ap.add_argument("--host-budget", default="64GiB",
                    help="host memory for offloaded tensors in --deepest (default 64GiB, the "
                    "pinned cap bench/deepest.py uses)")
    args = ap.parse_args(argv)
    from neuron.executor import Executor
    from neuron.memory.clock import makespan
    from neuron.memory.costmodel import CostModel
    from neuron.models import build_model
    from neuron.units import parse_bytes
    cost = CostModel.analytic("h100")
    prov = provenance()
    rows, md = [], ["# FreeLunch compression: bytes moved and host memory (planning, H100 "
                    "analytic time)", "", f"{prov}", "",
                    "| model | batch | budget | planner | compress | offloaded / iter | "
                    "reduction | host peak | simulated iteration |",
                    "|---|---|---|---|---|---|---|---|---|"]
    for name, depth, batch, budget in CASES:
        graph = build_model(name, depth=depth)
        for planner in PLANNERS:
            base = None
            for rate in (None, 2, 4):
                spec = planner + (f":compress={rate}" if rate else "")
                ex = Executor(graph, batch, device="virtual", planner=spec, cost=cost,
                              budget=budget)
                r = ex.simulate(budget, trace=False, events=True)
                if not r["fits"]:
                    md.append(f"| {name} | {batch} | {budget / GiB:g} GiB | {planner} | "
                              f"{rate or 'none'} | does not fit | | | |")
                    continue
                t = makespan(r["events"], ex.steps, batch, cost).makespan_s
                base = base or r
                red = base["offload_bytes"] / max(r["offload_bytes"], 1)
                rows.append({"model": name, "batch": batch, "budget_bytes": budget,
                             "planner": planner, "compress": rate,
                             "offload_bytes": r["offload_bytes"],
                             "host_peak_bytes": r["host_peak_bytes"], "reduction": red,
                             "simulated_s": t})
                md.append(f"| {name} | {batch} | {budget / GiB:g} GiB | {planner} | "
                          f"{rate or 'none'} | {r['offload_bytes'] / GiB:.2f} GiB | {red:.2f}x "
                          f"| {r['host_peak_bytes'] / GiB:.2f} GiB | {t * 1e3:.1f} ms |")
                print(md[-1], flush=True)
    ok = all(r["reduction"] >= 1.9 for r in rows if r["compress"] == 2)
    md += ["", f"Target rate 2 cuts offloaded bytes >= 1.9x: {'met' if ok else 'NOT met'}", ""]
    if args.deepest:
        from neuron.plan import deepest
        hb = parse_bytes(args.host_budget)
        md += [f"## Deepest Table-4 ResNet, batch 16, 12 GiB arena, --offload-params, host "
               f"budget {args.host_budget}, planner superneurons", "",
               "| compress | deepest depth | search s |", "|---|---|---|"]
        for rate in (None, 2, 4):
            spec = "superneurons" + (f":compress={rate}" if rate else "")
            t0 = time.perf_counter()
            r = deepest("resnet", 16, 12 * GiB, planner=spec, offload_params=True,
                        host_budget=hb)
            r.update(compress=rate, seconds=time.perf_counter() - t0, part="deepest")
            rows.append({k: v for k, v in r.items() if k != "probes"})
            md.append(f"| {rate or 'none'} | {r.get('deepest')} | {r['seconds']:.0f} |")
            print(md[-1], flush=True)
        md.append("")
    write("compress_bytes", {"provenance": prov, "rows": rows}, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
