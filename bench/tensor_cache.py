"""Tensor cache (SuperNeurons Table 3): bytes moved between GPU and host per iteration with and
without the LRU tensor cache, AlexNet, batch 256 ... 1024, under a 12 GiB budget.

With the cache (tensor_cache=True) the unified tensor pool moves a tensor only when the arena is
short; without it (tensor_cache=False, vDNN-style) every activation backward needs is offloaded
right after its last forward use and prefetched back. Moved = offload_bytes + prefetch_bytes of
one iteration. --plan-only: planning only (no GPU), time columns "not yet measured". Without it
(GPU): real iterations (device="cuda") for both settings, with the measured bytes and img/s.

    python bench/tensor_cache.py --plan-only               # CPU, seconds
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import arg_parser, gpu_setup, library_dirty, provenance, write  # noqa: E402
from neuron.units import fmt_bytes, parse_bytes  # noqa: E402

GiB, GB, MiB = 1 << 30, 10 ** 9, 1 << 20
BATCHES = [256, 384, 512, 640, 768, 896, 1024]
#: SuperNeurons Table 3, "communications in GB" (no 768 column in the paper)
PAPER = {256: (2.56, 0), 384: (3.72, 0), 512: (4.88, 0), 640: (6.03, 0), 896: (8.35, 0),
         1024: (9.50, 0.88)}
NYM = "not yet measured"


def parse_args(argv=None):
    ap = arg_parser(__doc__)
    ap.add_argument("--plan-only", action="store_true",
                    help="planning columns only (no GPU); time columns 'not yet measured'")
    ap.add_argument("--budget", default="12GiB", help="arena (default 12GiB)")
    ap.add_argument("--model", default="alexnet")
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--policies", default="offload,superneurons",
                    help="offload (liveness + UTP) and/or superneurons (default both)")
    ap.add_argument("--host-budget", default="64GiB",
                    help="host memory for offloaded tensors (default 64GiB)")
    ap.add_argument("--iters", type=int, default=5, help="timed GPU iterations (default 5)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed GPU iterations (default 2)")
    ap.add_argument("--out", default="tensor_cache", help="result name under bench/results/")
    return ap.parse_args(argv)


def plan_row(model, batch, policy, cache, budget, host_budget):
    from neuron.models import build_model
    from neuron.plan import plan
    t0 = time.perf_counter()
    r = plan(build_model(model), batch, policy=policy, budget=budget, tensor_cache=cache,
             host_budget=host_budget, trace=False, model=model)
    row = {k: r[k] for k in ("model", "batch", "policy", "fits", "peak_bytes",
                             "unbounded_peak_bytes", "min_budget_bytes", "offload_bytes",
                             "prefetch_bytes", "cache_hits", "cache_misses", "host_peak_bytes",
                             "extra_forward_steps", "error")}
    row["tensor_cache"] = cache
    row["moved_bytes"] = (r["offload_bytes"] + r["prefetch_bytes"]) if r["fits"] else None
    row["seconds"] = round(time.perf_counter() - t0, 2)
    return row


def markdown(res, args, prov, gpu):
    budget = parse_bytes(args.budget)
    get = {(r["policy"], r["batch"], r["tensor_cache"]): r for r in res["rows"]}
    where = (f"`{prov['command']}` on {prov['device']}, {prov['date']}, commit {prov['commit']}"
             + (" (library files modified since that commit)" if res["dirty"] else ""))
    L = [f"# Bytes moved per iteration with and without the tensor cache, {args.model}, "
         f"{fmt_bytes(budget)} budget (SuperNeurons Table 3)\n",
         f"Produced by {where}. float32; moved = offloaded + prefetched bytes of one "
         "iteration, in GiB (2^30) and GB (10^9; the paper's unit is \"GB\"). Paper: 12 GB K40, "
         "SuperNeurons' offload with and without its tensor cache (the paper lists no 768 "
         "column). A batch whose plan does not fit "
         "the budget says so, with the smallest budget it needs.\n"]
    for pol in args.policies.split(","):
        L += [f"## policy `{pol}`\n",
              "| batch | with cache GiB | with cache GB | without cache GiB | without cache GB | "
              "peak GiB (with / without) | paper without GB | paper with GB | "
              "GPU s/iter with | GPU s/iter without | GPU moved GB with / without |",
              "|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---|"]
        for b in map(int, args.batches.split(",")):
            w, wo = get[(pol, b, True)], get[(pol, b, False)]

            def cell(r, unit):
                if not r["fits"]:
                    return (f"does not fit (needs {r['min_budget_bytes'] / GiB:.2f} GiB)"
                            if unit == GiB else "-")
                return f"{r['moved_bytes'] / unit:.2f}"

            def pk(r):
                return f"{r['peak_bytes'] / GiB:.2f}" if r["fits"] else "-"

            pw, pwo = PAPER.get(b, (None, None))
            if not gpu:
                gc = [NYM] * 3
            else:
                def t(r):
                    g = r.get("gpu") or {}
                    return f"{g['seconds_per_iter']:.3f}" if g.get("seconds_per_iter") else \
                        (f"failed: {g.get('error', '')[:40]}" if g else "-")

                def mv(r):
                    g = (r.get("gpu") or {}).get("moved_per_iter")
                    return "-" if not g else f"{sum(g.values()) / GB:.2f}"
                gc = [t(w), t(wo), f"{mv(w)} / {mv(wo)}"]
            L.append(f"| {b} | {cell(w, GiB)} | {cell(w, GB)} | {cell(wo, GiB)} | "
                     f"{cell(wo, GB)} | {pk(w)} / {pk(wo)} | "
                     f"{'n/a' if pw is None else pw} | {'n/a' if pwo is None else pwo} | "
                     + " | ".join(gc) + " |")
        L.append("")
    return "\n".join(L) + "\n"


def main(argv=None):
    args = parse_args(argv)
    gpu = not args.plan_only
    TM, device = gpu_setup("bench/tensor_cache.py", args.plan_only)
    budget, host_budget = parse_bytes(args.budget), parse_bytes(args.host_budget)
    # provenance first: others may commit while this runs; this is the code it imports
    prov = provenance(f"{device} (arena {args.budget})" if gpu else None)
    dirty = library_dirty()
    rows = []
    for pol in args.policies.split(","):
        for b in map(int, args.batches.split(",")):
            for cache in (True, False):
                r = plan_row(args.model, b, pol, cache, budget, host_budget)
                rows.append(r)
                print(f"{pol} batch {b} cache {cache}: "
                      + (f"{r['moved_bytes'] / GiB:.2f} GiB moved" if r["fits"]
                         else "does not fit") + f" ({r['seconds']} s)", flush=True)
    if gpu:
        from neuron.models import build_model
        g = build_model(args.model)
        for r in rows:
            if r["fits"]:
                r["gpu"] = TM.neuron_run(g, r["batch"], budget=budget, policy=r["policy"],
                                         tensor_cache=r["tensor_cache"], host_budget=host_budget,
                                         iters=args.iters, warmup=args.warmup)
    res = {"rows": rows, "dirty": dirty, "settings": vars(args) | {"budget_bytes": budget}}
    if gpu:
        res["versions"] = TM.versions()
    write(args.out, {"provenance": prov, **res}, markdown(res, args, prov, gpu))


if __name__ == "__main__":
    main()
