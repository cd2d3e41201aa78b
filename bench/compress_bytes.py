"""FreeLunch compression's effect on bytes (issue 13), planning only: bytes offloaded per
iteration and host memory with and without ``--compress``, and (``--deepest``) the deepest
Table-4 ResNet under a 12 GiB arena with --offload-params and a host budget.
Target: rate 2 cuts the bytes of the tensors a plan offloads by >= 1.9x ("per offload": their
full size over the bytes sent). The compressed plan is the planner's own with compressed
copies (planners/compress.py), so it may offload other tensors than the plain plan, more
where compressed swaps beat recomputes: "vs plain" compares the two plans' bytes.

A second table, tight budgets (resnet_cifar 20 at batch 32 in 0.2 and 0.3 of its liveness
peak, where the arena is full at every eviction): compressed must move no more bytes than plain
and be no slower than plain beyond its codec time (at 0.2, compressed superneurons once moved
more, while a prefetched tensor held its block and its staging block until its reader); and
how many compressed tensors went to the host as they are, for want of a staging block.

    nice python bench/compress_bytes.py [--deepest]
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import arg_parser, provenance, write  # noqa: E402

GiB, MiB = 1 << 30, 1 << 20
CASES = [("resnet50", None, 32, 1 * GiB), ("densenet121", None, 32, 1 * GiB)]
PLANNERS = ["superneurons", "vdnn"]
TIGHT = [0.2, 0.3]                  # fractions of resnet_cifar 20's liveness peak, batch 32
TIGHT_PLANNERS = ["superneurons", "vdnn", "capuchin"]


def full_size(events, steps, compress) -> float:
    """The bytes a simulation's offloads would have sent uncompressed (its event log: an
    offload right after its encode is compressed, possibly one slice of the tensor)."""
    from neuron.memory.codecs import get_codec
    tensors = {t.id: t for s in steps for t in s.reads + s.writes}
    total, last = 0.0, None
    for e in events:
        if e[0] in ("offload", "offload_async"):
            t = tensors[e[1]]
            if last == e[1]:
                n = get_codec(compress[e[1]]).nbytes(t.nbytes // t.dtype.itemsize)
                total += e[2] * t.nbytes / n
            else:
                total += e[2]
        last = e[1] if e[0] == "encode" else None
    return total


def tight(cost) -> tuple[list, list]:
    """The tight-budget table: rows and markdown lines."""
    from neuron.executor import Executor
    from neuron.memory.clock import makespan
    from neuron.memory.compressed_swap import sent_uncompressed
    from neuron.models import build_model
    g = build_model("resnet_cifar", depth=20, in_shape=(3, 32, 32))
    peak = Executor(g, 32, device="virtual", policy="liveness").simulate(
        None, trace=False)["peak_bytes"]
    rows, md = [], ["## Tight budgets: resnet_cifar 20, batch 32", "",
                    "| budget | planner | compress | offloaded / iter | simulated iteration | "
                    "codec | sent uncompressed |", "|---|---|---|---|---|---|---|"]
    for frac in TIGHT:
        budget = int(peak * frac)
        for planner in TIGHT_PLANNERS:
            for rate in (None, 2, 4):
                spec = planner + (f":compress={rate}" if rate else "")
                ex = Executor(g, 32, device="virtual", planner=spec, cost=cost, budget=budget)
                r = ex.simulate(budget, trace=False, events=True)
                if not r["fits"]:
                    md.append(f"| {frac:g}x | {planner} | {rate or 'none'} | does not fit "
                              "| | | |")
                    continue
                rep = makespan(r["events"], ex.steps, 32, cost)
                fell = sent_uncompressed(r["events"], ex.decisions.compress)
                rows.append({"model": "resnet_cifar20", "batch": 32, "budget_bytes": budget,
                             "budget_fraction_of_liveness_peak": frac, "planner": planner,
                             "compress": rate, "offload_bytes": r["offload_bytes"],
                             "simulated_s": rep.makespan_s, "codec_s": rep.codec_s,
                             "sent_uncompressed": fell, "part": "tight"})
                md.append(f"| {frac:g}x | {planner} | {rate or 'none'} | "
                          f"{r['offload_bytes'] / MiB:.1f} MiB | {rep.makespan_s * 1e3:.2f} ms "
                          f"| {rep.codec_s * 1e3:.2f} ms | {fell if rate else ''} |")
                print(md[-1], flush=True)
    by = {(r["budget_bytes"], r["planner"], r["compress"]): r for r in rows}
    ok = all(r["offload_bytes"] <= by[k[0], k[1], None]["offload_bytes"] and
             r["simulated_s"] <= by[k[0], k[1], None]["simulated_s"] + r["codec_s"]
             for k, r in by.items() if k[2] and (k[0], k[1], None) in by)
    md += ["", "Target, compressed moves no more bytes than plain and is no slower beyond its "
           f"codec time: {'met' if ok else 'NOT met'}", ""]
    return rows, md


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
                    "vs plain | per offload | host peak | simulated iteration |",
                    "|---|---|---|---|---|---|---|---|---|---|"]
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
                              f"{rate or 'none'} | does not fit | | | | |")
                    continue
                t = makespan(r["events"], ex.steps, batch, cost).makespan_s
                base = base or r
                red = base["offload_bytes"] / max(r["offload_bytes"], 1)
                per = full_size(r["events"], ex.steps, ex.decisions.compress) / max(r["offload_bytes"], 1)
                rows.append({"model": name, "batch": batch, "budget_bytes": budget,
                             "planner": planner, "compress": rate,
                             "offload_bytes": r["offload_bytes"],
                             "host_peak_bytes": r["host_peak_bytes"], "reduction": red,
                             "reduction_per_offload": per, "simulated_s": t})
                md.append(f"| {name} | {batch} | {budget / GiB:g} GiB | {planner} | "
                          f"{rate or 'none'} | {r['offload_bytes'] / GiB:.2f} GiB | {red:.2f}x "
                          f"| {per:.2f}x | {r['host_peak_bytes'] / GiB:.2f} GiB | "
                          f"{t * 1e3:.1f} ms |")
                print(md[-1], flush=True)
    ok = all(r["reduction_per_offload"] >= 1.9 for r in rows if r["compress"] == 2)
    md += ["", "Target rate 2 cuts the bytes of the tensors offloaded >= 1.9x (per offload): "
           f"{'met' if ok else 'NOT met'}", ""]
    more, lines = tight(cost)
    rows += more
    md += lines
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
