"""Per-step memory of one training iteration (SuperNeurons Figure 10): AlexNet at batch 200 under
liveness, + offload (liveness + unified tensor pool) and + recompute (all three = superneurons).

Offload only moves bytes when the arena is short (the LRU tensor cache), so the two offload
traces run under a budget below the liveness peak: --budget, or by default --fraction (0.6) of
the liveness peak when both policies fit in it, else the smallest budget in which both complete
(checked by planning; the table says which). Draws bench/results/memory_trace.png (the three
traces) and a table of peaks, next to the paper's Figure 10 numbers. --plan-only: planned traces
(no GPU). Without it (GPU): the same three runs for real (device="cuda"), their measured traces
drawn to memory_trace_gpu.png and their peaks next to the planned ones.

    python bench/memory_trace.py --plan-only               # CPU, seconds
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import arg_parser, RESULTS, gpu_setup, library_dirty, provenance, write  # noqa: E402,E501
from neuron.units import parse_bytes  # noqa: E402

MiB = 1 << 20
#: SuperNeurons Fig. 10 / Sec. 4.1.1 (AlexNet, batch 200; MB, activations as the paper counts)
PAPER = {"baseline": (2189.437, "36 tensors"), "liveness": (1489.355, "step 32, POOL5 backward"),
         "offload": (1132.155, "step 39, POOL2 backward"),
         "superneurons": (886.0, "step 44, LRN1 backward (= max l_i, 886.385)")}
NYM = "not yet measured"


def parse_args(argv=None):
    ap = arg_parser(__doc__)
    ap.add_argument("--plan-only", action="store_true",
                    help="planned traces only (no GPU); measured columns 'not yet measured'")
    ap.add_argument("--model", default="alexnet")
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--budget", default=None,
                    help="arena for the offload traces (default: --fraction of the liveness "
                    "peak if both policies fit, else the smallest that both fit)")
    ap.add_argument("--fraction", type=float, default=0.6,
                    help="default budget as a fraction of the liveness peak (default 0.6)")
    ap.add_argument("--iters", type=int, default=2, help="GPU iterations (default 2)")
    ap.add_argument("--out", default="memory_trace", help="result name under bench/results/")
    return ap.parse_args(argv)


def _peak_at(steps):
    i = max(range(len(steps)), key=lambda j: steps[j]["bytes_in_use"])
    return steps[i]


def _summary(label, r, budget):
    s = r.get("steps") or []
    pk = _peak_at(s) if s else None
    return {"label": label, "policy": r["policy"], "budget_bytes": budget, "fits": r["fits"],
            "peak_bytes": r["peak_bytes"] if r["fits"] else None,
            "unbounded_peak_bytes": r["unbounded_peak_bytes"],
            "min_budget_bytes": r["min_budget_bytes"], "lower_bound_bytes": r["lower_bound_bytes"],
            "offload_bytes": r["offload_bytes"], "prefetch_bytes": r["prefetch_bytes"],
            "extra_forward_steps": r["extra_forward_steps"],
            "bytes_by_kind": r["bytes_by_kind"], "num_steps": r["num_steps"],
            "peak_step": pk and {k: pk[k] for k in ("step", "layer", "phase", "live_tensors")},
            "max_live_tensors": max((x["live_tensors"] for x in s), default=None),
            "steps": s}


def choose_budget(g, args, liveness_peak):
    """--budget, or fraction * liveness peak if offload and superneurons both fit it, else the
    smallest budget both fit (rounded up to a MiB). Returns (budget, how)."""
    from neuron.plan import fits, plan
    if args.budget:
        return parse_bytes(args.budget), "given with --budget"
    cand = int(args.fraction * liveness_peak) // MiB * MiB
    ok = {p: fits(g, args.batch, cand, policy=p) for p in ("offload", "superneurons")}
    if all(ok.values()):
        return cand, f"{args.fraction} x the liveness peak (both policies fit, checked by plan)"
    mins = {p: plan(g, args.batch, policy=p, trace=False)["min_budget_bytes"]
            for p in ("offload", "superneurons")}
    b = -(-max(mins.values()) // MiB) * MiB
    bad = ", ".join(p for p, v in ok.items() if not v)
    return b, (f"{args.fraction} x the liveness peak = {cand / MiB:,.0f} MiB does not fit "
               f"({bad}; minimum budgets: offload {mins['offload'] / MiB:,.1f} MiB, "
               f"superneurons {mins['superneurons'] / MiB:,.1f} MiB), so the smallest budget "
               "both complete in, rounded up to a MiB")


def markdown(res, args, prov, gpu, png):
    where = (f"`{prov['command']}` on {prov['device']}, {prov['date']}, commit {prov['commit']}"
             + (" (library files modified since that commit)" if res["dirty"] else ""))
    b = res["budget_bytes"]
    L = [f"# Per-step memory, {args.model} batch {args.batch} (SuperNeurons Figure 10)\n",
         f"Produced by {where}. float32, SGD with momentum. Trace: bytes in use in the arena "
         "after each step (forward, recomputation and backward steps), "
         + ("measured on the GPU; " if gpu else
            "planned on a virtual device (the executor scheduling every step); ") +
         f"drawn to `{os.path.relpath(png, os.path.dirname(os.path.dirname(RESULTS)))}` (the "
         "trace is the usage *after* each step's frees, so a curve's maximum can sit below the "
         "peak, which is the high-water mark inside a step). Offload budget: "
         f"**{b / MiB:,.0f} MiB** ({res['budget_how']}). MiB = 2^20 bytes.\n",
         "| run | budget MiB | peak MiB | highest after-step usage at (step, layer, phase) | "
         "live tensors there / max | moved MiB (off + pre) | extra fwd | unbounded peak MiB | "
         "min budget MiB | params+momentum MiB at peak | peak without them MiB (cf. paper) | "
         "GPU measured peak MiB |",
         "|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["runs"]:
        pk = r["peak_step"]
        kinds = r.get("bytes_by_kind") or {}
        pm = sum(v for k, v in kinds.items() if k in ("param", "opt_state"))
        if not gpu:
            gcell = NYM if r["label"] in res["plotted"] else "-"
        else:
            g = r.get("gpu") or {}
            gcell = (f"{g['peak_bytes'] / MiB:,.1f}" if g.get("fits")
                     else (f"failed: {g.get('error', '')[:50]}" if g else "-"))
        moved = ((r["offload_bytes"] or 0) + (r["prefetch_bytes"] or 0)) / MiB
        bcell = "none" if r["budget_bytes"] is None else f"{r['budget_bytes'] / MiB:,.0f}"
        L.append(f"| {r['label']} | {bcell} | "
                 f"{r['peak_bytes'] / MiB:,.1f} | "
                 f"{pk['step']}, {pk['layer']}, {pk['phase']} | {pk['live_tensors']} / "
                 f"{r['max_live_tensors']} | {moved:,.1f} | {r['extra_forward_steps']} | "
                 f"{r['unbounded_peak_bytes'] / MiB:,.1f} | "
                 f"{r['min_budget_bytes'] / MiB:,.1f} | {pm / MiB:,.1f} | "
                 f"{(r['peak_bytes'] - pm) / MiB:,.1f} | {gcell} |")
    L += ["", "Paper (Fig. 10, K40, MB; the paper's accounting appears to cover activations "
          "and gradients only, not parameters or momentum): "
          + "; ".join(f"{k} {v[0]:,.3f} ({v[1]})" for k, v in PAPER.items()) + ".",
          "", "Rows drawn in the PNG: " + ", ".join(res["plotted"]) + ". *moved* = bytes "
          "offloaded + prefetched during the iteration; *min budget* = the smallest arena the "
          "policy completes in; *params+momentum at peak* = the resident state included in "
          "the peak.", ""]
    return "\n".join(L) + "\n"


def main(argv=None):
    args = parse_args(argv)
    gpu = not args.plan_only
    TM, device = gpu_setup("bench/memory_trace.py", args.plan_only)
    # provenance first: others may commit while this runs; this is the code it imports
    prov, dirty = provenance(device), library_dirty()
    from neuron.models import build_model
    from neuron.plan import plan
    from neuron.views.report import plot_trace
    g = build_model(args.model)

    def run(label, policy, budget):
        r = plan(g, args.batch, policy=policy, budget=budget, trace=True, model=args.model)
        if not r["fits"]:
            sys.exit(f"bench/memory_trace.py: {label} does not fit {budget} bytes: {r['error']}")
        s = _summary(label, r, budget)
        print(f"{label}: peak {s['peak_bytes'] / MiB:,.1f} MiB", flush=True)
        return s

    live = run("liveness", "liveness", None)
    budget, how = choose_budget(g, args, live["peak_bytes"])
    runs = [run("baseline", "baseline", None), live,
            run("+offload (liveness + UTP)", "offload", budget),
            run("+recompute (superneurons)", "superneurons", budget),
            run("recompute only (liveness + recompute)", "recompute", None),
            run("superneurons, unbounded arena", "superneurons", None)]
    plotted = ["liveness", "+offload (liveness + UTP)", "+recompute (superneurons)"]
    png = os.path.join(RESULTS, f"{args.out}.png")
    os.makedirs(RESULTS, exist_ok=True)

    def legend(r):
        b = r["budget_bytes"]
        return (f"{r['label'].split(' (')[0]} ({'no cap' if b is None else f'{b / MiB:,.0f} MiB'}"
                f"), peak {r['peak_bytes'] / MiB:,.0f} MiB")

    plot_trace({legend(r): r["steps"] for r in runs if r["label"] in plotted}, png,
               title=f"{args.model}, batch {args.batch}: bytes in use per step (planned)")
    if gpu:
        traces = {}
        for r in runs:
            if r["label"] in plotted:
                r["gpu"] = TM.neuron_run(g, args.batch, budget=r["budget_bytes"],
                                         policy=r["policy"], iters=args.iters, warmup=1,
                                         trace=True)
                if r["gpu"].get("trace"):
                    traces[legend(r) + " (measured)"] = r["gpu"]["trace"]
        if traces:
            plot_trace(traces, os.path.join(RESULTS, f"{args.out}_gpu.png"),
                       title=f"{args.model}, batch {args.batch}: bytes in use per step "
                       f"(measured on {device})")
    res = {"budget_bytes": budget, "budget_how": how, "plotted": plotted, "runs": runs,
           "dirty": dirty, "settings": vars(args)}
    if gpu:
        res["versions"] = TM.versions()
    write(args.out, {"provenance": prov, **res}, markdown(res, args, prov, gpu, png))


if __name__ == "__main__":
    main()
