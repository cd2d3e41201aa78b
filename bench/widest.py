"""Going wider (SuperNeurons Table 5): the largest batch that trains under a memory budget.

AlexNet (227x227), VGG16, Inception-v4 (299x299), ResNet-50/101/152, DenseNet-121 (224x224),
float32, SGD with momentum, under --budget (default 12 GiB, the paper's K40): every neuron policy
(with and without --offload-params) against PyTorch eager and PyTorch + checkpoint_sequential
(sqrt(n) segments).

neuron's answers come from planning (neuron.plan.widest: exponential then bisection search,
each probe the executor's own scheduling on a virtual device); --plan-only stops there (no GPU;
img/s columns "not yet measured"). Without it (GPU): real neuron iterations (device="cuda") at
each answer, and PyTorch's largest batches by real iterations under
torch.cuda.set_per_process_memory_fraction(budget/total), img/s at each answer, same process.

With chunking (`--chunks auto`, memory/chunking.py) the superneurons columns are repeated
with every layer split along the batch into the smallest chunk count that fits.

    python bench/widest.py --plan-only                      # CPU, a few minutes
    python bench/widest.py --models resnet50,resnet101      # GPU
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import arg_parser, host_budget_for, gpu_setup, library_dirty, provenance, write  # noqa: E402
from neuron.units import fmt_bytes, parse_bytes  # noqa: E402

GiB = 1 << 30
MODELS = ["alexnet", "vgg16", "inception_v4", "resnet50", "resnet101", "resnet152",
          "densenet121"]
POLICIES = ["liveness", "offload", "recompute", "superneurons"]
#: SuperNeurons Table 5 (12 GB K40): SuperNeurons and the best other framework (TensorFlow)
PAPER = {"alexnet": (1792, 1408), "vgg16": (224, 80), "inception_v4": (240, 64),
         "resnet50": (384, 128), "resnet101": (256, 80), "resnet152": (176, 48),
         "densenet121": (None, None)}
NYM = "not yet measured"
TORCH_MODES = [("eager", "PyTorch eager"), ("checkpoint", "PyTorch ckpt (sqrt n)")]


def parse_args(argv=None):
    ap = arg_parser(__doc__)
    ap.add_argument("--plan-only", action="store_true",
                    help="planning columns only (no GPU); img/s columns 'not yet measured'")
    ap.add_argument("--budget", default="12GiB", help="arena / PyTorch cap (default 12GiB)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--offload-params", choices=["both", "no", "yes"], default="both",
                    help="neuron columns without / with parameter offload (default both)")
    ap.add_argument("--chunking", choices=["both", "no", "yes"], default="both",
                    help="superneurons columns without / with sub-layer chunking (default both)")
    ap.add_argument("--host-budget", default=None,
                    help="host memory for offloaded tensors (default: the runtime's pinned cap, "
                    "50%% of RAM (neuron.memory.host_budget): of this machine on a GPU, of the "
                    "128 GiB GPU machine with --plan-only)")
    ap.add_argument("--iters", type=int, default=5, help="timed GPU iterations (default 5)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed GPU iterations (default 2)")
    ap.add_argument("--skip-torch", action="store_true", help="GPU: no PyTorch columns")
    ap.add_argument("--out", default="widest", help="result name under bench/results/")
    return ap.parse_args(argv)


def limited_by(msg):
    if msg is None:
        return "-"
    if "host memory budget" in msg:
        return "host budget"
    if "parameters and optimizer state do not fit" in msg:
        return "parameters"
    return "arena"


def plan_widest(model, budget, policy, op, host_budget, chunks=1, log=print) -> dict:
    from neuron.executor import Executor, no_gc
    from neuron.memory.chunking import CHUNK_COUNTS
    from neuron.models import build_model
    from neuron.plan import plan, widest
    t0 = time.perf_counter()
    kw = dict(policy=policy, offload_params=op, host_budget=host_budget, chunks=chunks)
    r = widest(model, budget, **kw)
    b = r["widest"]
    out = {"model": model, "policy": policy, "offload_params": op, "chunking": chunks,
           "widest": b, "chunks": r["chunks"], "probes": r["probes"]}
    g = build_model(model)
    at_b = {**kw, "chunks": r["chunks"] or 1}
    # b + 1 fails with every chunk count: report its error at the largest one tried
    at_next = {**kw, "chunks": chunks if chunks != "auto"
               else max(k for k in CHUNK_COUNTS if k <= (b or 0) + 1)}
    with no_gc():                           # why b + 1 fails, and the plan at b
        try:
            ex = Executor(g, (b or 0) + 1, device="virtual", **at_next)
            s = ex.simulate(budget, trace=False)
            out["next_error"] = None if s["fits"] else str(s["error"])
        except Exception as e:              # noqa: BLE001 (parameters not fitting at all)
            out["next_error"] = str(e)
        if b:
            p = plan(g, b, budget=budget, search_min=False, trace=False, model=model, **at_b)
            out.update(peak_bytes=p["peak_bytes"],
                       moved_bytes=(p["offload_bytes"] or 0) + (p["prefetch_bytes"] or 0),
                       extra_forward_steps=p["extra_forward_steps"],
                       host_peak_bytes=p["host_peak_bytes"])
    out["limited_by"] = limited_by(out["next_error"])
    # the search assumes "fits" is monotonic in the batch; with eviction it need not be (pool
    # fragmentation), so probe a few larger batches and report any that fit too
    out["larger_also_fit"] = []
    if b and chunks == 1:           # (with chunking each probe is up to 8 plans: not probed)
        from neuron.plan import fits
        for f in (1.01, 1.02, 1.05, 1.1, 1.25):
            c = int(b * f)
            if c > b + 1 and fits(g, c, budget, **kw):
                out["larger_also_fit"].append(c)
    out["seconds"] = round(time.perf_counter() - t0, 1)
    log(f"{model} {_label(policy, op, chunks)}: widest {b} ({out['limited_by']}"
        f"{', ' + str(r['chunks']) + ' chunks' if chunks != 1 else ''}), {out['seconds']} s")
    return out


def cross_check(rows, budget, host_budget):
    """Probe each answer's policy at the larger answers other policies found for the same model
    (non-monotonic fitting shows up as e.g. +offload-params answering less than without)."""
    from neuron.models import build_model
    from neuron.plan import fits
    for r in rows:
        if not r["widest"]:
            continue
        others = sorted({o["widest"] for o in rows if o["model"] == r["model"] and o["widest"]
                         and o["chunking"] == r["chunking"]
                         and o["widest"] > r["widest"] + 1} - set(r["larger_also_fit"]))
        if not others:
            continue
        g = build_model(r["model"])
        kw = dict(policy=r["policy"], offload_params=r["offload_params"],
                  host_budget=host_budget, chunks=r["chunking"])
        r["larger_also_fit"] = sorted(r["larger_also_fit"]
                                      + [c for c in others if fits(g, c, budget, **kw)])


def _label(policy, op, chunks=1):
    return policy + ("+op" if op else "") + ("+chunks" if chunks != 1 else "")


def markdown(res, args, prov, gpu) -> str:
    budget = parse_bytes(args.budget)
    rows = res["neuron"]
    models = args.models.split(",")
    variants = [(p, op, ch) for ch in res["chunk_variants"] for p in args.policies.split(",")
                for op in res["op_variants"] if ch == 1 or (p == "superneurons" and not op)]
    tt = {(t["model"], t["mode"]): t for t in res.get("torch", [])}
    get = {(r["model"], r["policy"], r["offload_params"], r["chunking"]): r for r in rows}
    where = (f"`{prov['command']}` on {prov['device']}, {prov['date']}, commit {prov['commit']}"
             + (" (library files modified since that commit)" if res["dirty"] else ""))
    L = [f"# Going wider: largest batch under a {fmt_bytes(budget)} budget "
         "(SuperNeurons Table 5)\n",
         f"Produced by {where}. float32, SGD with momentum (its state counts). neuron's "
         + ("batches are planned, then run on the GPU; " if gpu else "batches are planned on "
            "a virtual device (the executor scheduling every step, no kernels); ") +
         f"host memory for offloaded tensors {res['host_budget'] / GiB:.0f} GiB. "
         "`+op` = with --offload-params (parameters and momentum on the host between uses). "
         "Paper columns: 12 GB K40, the best other framework is TensorFlow in every row. "
         + "`+chunks` = every layer split along the batch into the smallest chunk count that fits "
         "(sub-layer chunking, superneurons without --offload-params; the count is in the second "
         "table; larger batches not probed). "
         + ("" if gpu else "Workspaces: the CPU kernels' im2col sub-blocks (<= 4 MiB, none "
            "when they do not fit); on the GPU cuDNN algorithms are chosen under the free bytes, "
            "so GPU answers can differ.") + "\n",
         "| model | paper SuperNeurons | paper TensorFlow | "
         + " | ".join(f"neuron {_label(*v)}" for v in variants)
         + " | " + " | ".join(lbl for _, lbl in TORCH_MODES) + " |",
         "|---|" + "---:|" * (2 + len(variants) + len(TORCH_MODES))]

    def tb(m, mode):
        if not gpu:
            return NYM
        t = tt.get((m, mode))
        if t is None:
            return "skipped"
        if t.get("error"):
            return f"error: {t['error'][:50]}"
        return "none" if t["k"] is None else str(t["k"])

    for m in models:
        sn, tf = PAPER.get(m, (None, None))
        cells = []
        for v in variants:
            r = get.get((m, *v))
            cells.append("-" if r is None else ("none" if r["widest"] is None
                                                else str(r["widest"])
                                                + (" *" if r.get("larger_also_fit") else "")))
        L.append(f"| {m} | {sn or 'n/a'} | {tf or 'n/a'} | " + " | ".join(cells) + " | "
                 + " | ".join(tb(m, mode) for mode, _ in TORCH_MODES) + " |")
    L += ["", "\\* a larger batch fits too (see *larger that also fit* below): under the "
          "policies that evict, whether a batch fits is not monotonic in the batch (first-fit "
          "fragmentation of the arena), so the search's answer (exponential then bisection, "
          "which assumes monotonicity) is a batch verified to fit, not necessarily the largest. "
          "Probed above each answer: +1, 2, 5, 10 and 25%, and the larger answers of the other "
          "neuron columns for the same model.",
          "", "## What limits each answer, and the plan at it\n",
          "| model | neuron | largest batch | chunks | next batch fails on | peak GiB | "
          "moved GiB/iter | extra fwd steps | host peak GiB | larger that also fit | search s |",
          "|---|---|---:|---:|---|---:|---:|---:|---:|---|---:|"]
    for m in models:
        for v in variants:
            r = get.get((m, *v))
            if r is None:
                continue

            def g(k):
                return "-" if r.get(k) is None else f"{r[k] / GiB:.2f}"
            L.append(f"| {m} | {_label(*v)} | {r['widest']} | {r.get('chunks') or '-'} | "
                     f"{r['limited_by']} | "
                     f"{g('peak_bytes')} | {g('moved_bytes')} | "
                     f"{r.get('extra_forward_steps', '-')} | {g('host_peak_bytes')} | "
                     f"{', '.join(map(str, r.get('larger_also_fit') or [])) or '-'} | "
                     f"{r['seconds']} |")
    L += ["", "## Training speed at each answer (img/s)\n",
          "| model | " + " | ".join(f"neuron {_label(*v)}" for v in variants) + " | "
          + " | ".join(lbl for _, lbl in TORCH_MODES) + " |",
          "|---|" + "---:|" * (len(variants) + len(TORCH_MODES))]
    for m in models:
        cells = []
        for v in variants:
            r = get.get((m, *v))
            if not gpu:
                cells.append(NYM)
            elif r is None or not r.get("gpu"):
                cells.append("-")
            elif r["gpu"].get("img_per_s"):
                cells.append(f"{r['gpu']['img_per_s']:.1f}")
            else:
                cells.append(f"failed: {r['gpu'].get('error', '')[:50]}")
        for mode, _ in TORCH_MODES:
            t = tt.get((m, mode))
            if not gpu:
                cells.append(NYM)
            elif t is None or not (t.get("timed") or {}).get("img_per_s"):
                cells.append("-")
            else:
                cells.append(f"{t['timed']['img_per_s']:.1f}")
        L.append(f"| {m} | " + " | ".join(cells) + " |")
    for ch in res["chunk_variants"]:
        key = lambda m: (m, "superneurons", False, ch)      # noqa: E731
        L += ["", f"Paper comparison (neuron superneurons{' + chunks' if ch != 1 else ''} vs "
              "the paper's SuperNeurons): "
              + "; ".join(f"{m} {get[key(m)]['widest']} vs {PAPER[m][0]} "
                          f"({get[key(m)]['widest'] / PAPER[m][0]:.2f}x)"
                          for m in models if PAPER.get(m, (None,))[0]
                          and key(m) in get and get[key(m)]["widest"]) + "."]
    L.append("")
    return "\n".join(L) + "\n"


def main(argv=None):
    args = parse_args(argv)
    gpu = not args.plan_only
    TM, device = gpu_setup("bench/widest.py", args.plan_only)
    budget = parse_bytes(args.budget)
    # provenance first: others may commit while this runs; this is the code it imports
    prov = provenance(f"{device} (arena / PyTorch cap {args.budget})" if gpu else None)
    dirty = library_dirty()
    host_budget = host_budget_for(args.host_budget, TM if gpu else None)
    ops = {"both": [False, True], "no": [False], "yes": [True]}[args.offload_params]
    t0 = time.perf_counter()
    chs = {"both": [1, "auto"], "no": [1], "yes": ["auto"]}[args.chunking]
    rows = [plan_widest(m, budget, p, op, host_budget, ch)
            for m in args.models.split(",") for ch in chs for p in args.policies.split(",")
            for op in ops if ch == 1 or (p == "superneurons" and not op)]
    cross_check(rows, budget, host_budget)
    res = {"neuron": rows, "host_budget": host_budget, "op_variants": ops,
           "chunk_variants": chs, "dirty": dirty,
           "plan_seconds": round(time.perf_counter() - t0, 1),
           "settings": vars(args) | {"budget_bytes": budget}}
    if gpu:
        from neuron.models import build_model
        for r in rows:
            if r["widest"]:
                print(f"neuron {r['model']} {_label(r['policy'], r['offload_params'], r['chunking'])} batch "
                      f"{r['widest']} on the GPU ...", flush=True)
                r["gpu"] = TM.neuron_run(build_model(r["model"]), r["widest"], budget=budget,
                                         policy=r["policy"], offload_params=r["offload_params"],
                                         host_budget=host_budget, iters=args.iters,
                                         warmup=args.warmup, chunks=r["chunks"] or 1)
        if not args.skip_torch:
            TM.cap_torch(budget)
            res["torch"] = []
            for m in args.models.split(","):
                for mode, _ in TORCH_MODES:
                    s = TM.torch_search(m, mode=mode, limit=1 << 16)
                    t = {"model": m, "mode": mode, **s}
                    if s["k"]:
                        t["timed"] = TM.torch_run(m, s["k"], mode=mode, iters=args.iters,
                                                  warmup=args.warmup)
                    res["torch"].append(t)
        res["versions"] = TM.versions()
    write(args.out, {"provenance": prov, **res}, markdown(res, args, prov, gpu))
    print(f"planning took {res['plan_seconds']} s")


if __name__ == "__main__":
    main()
