"""Going deeper (SuperNeurons Table 4): the deepest ResNet that trains under a memory budget.

* Table-4 family (bottleneck (6, 32, n3, 6), depth = 3*(44+n3)+2, 224x224, batch 16), under
  --budget (default 12 GiB, the paper's K40), for every neuron policy with and without
  --offload-params, PyTorch eager and PyTorch + checkpoint_sequential (sqrt(n) segments).
* CIFAR ResNet (6n+2): the deepest at --cifar-batch (default 64) and the largest batch of
  ResNet-1202 (DTR's table: PyTorch max batch 64 on a 12 GB Titan V).

neuron's answers come from planning (the executor's own scheduling on a virtual device: the same
search as `neuron deepest` / neuron.plan.deepest, search_max over neuron.plan.DEPTH_FAMILIES,
plus a depth cap and the reason the first failing probe failed). --plan-only stops there: no
GPU needed; time columns read "not yet measured". Without it (GPU): real neuron iterations
(device="cuda") at each answer, a reference run of the same network without memory pressure
(liveness, uncapped arena) where the card holds it, and PyTorch eager / checkpointed depth and
batch searches by real iterations under torch.cuda.set_per_process_memory_fraction(budget/total),
same batch, float32, in the same process.

    python bench/deepest.py --plan-only                    # CPU, ~6 min on 2 cores
    python bench/deepest.py --policies superneurons         # GPU
"""
from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import arg_parser, host_budget_for, gpu_setup, library_dirty, provenance, write  # noqa: E402
from neuron.units import fmt_bytes, parse_bytes  # noqa: E402

GiB = 1 << 30
POLICIES = ["liveness", "offload", "recompute", "superneurons"]
#: SuperNeurons Table 4 (12 GB K40, batch 16)
PAPER_T4 = [("SuperNeurons", 1920), ("TensorFlow", 592), ("MXNet", 480), ("Torch", 152),
            ("Caffe", 148)]
NYM = "not yet measured"
TORCH_MODES = [("eager", "PyTorch eager"),
               ("checkpoint", "PyTorch checkpoint_sequential (sqrt(n) segments)")]


def parse_args(argv=None):
    ap = arg_parser(__doc__)
    ap.add_argument("--plan-only", action="store_true",
                    help="planning columns only (no GPU); time columns 'not yet measured'")
    ap.add_argument("--budget", default="12GiB", help="arena / PyTorch cap (default 12GiB)")
    ap.add_argument("--batch", type=int, default=16, help="Table-4 batch (default 16)")
    ap.add_argument("--max-depth", type=int, default=20000,
                    help="cap of the Table-4 depth search (default 20000); a policy that "
                    "reaches it is reported as '>= cap'")
    ap.add_argument("--families", default="resnet,resnet_cifar",
                    help="resnet (Table 4) and/or resnet_cifar (default both)")
    ap.add_argument("--cifar-batch", type=int, default=64,
                    help="batch of the CIFAR depth search (default 64, DTR's)")
    ap.add_argument("--cifar-max-depth", type=int, default=12002,
                    help="cap of the CIFAR depth search (default 12002 = 10x ResNet-1202)")
    ap.add_argument("--cifar-widest-depth", type=int, default=1202,
                    help="CIFAR ResNet whose largest batch is searched (default 1202; 0: skip)")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--offload-params", choices=["both", "no", "yes"], default="both",
                    help="neuron rows without / with parameter offload (default both)")
    ap.add_argument("--host-budget", default=None,
                    help="host memory for offloaded tensors (default: the runtime's pinned cap, "
                    "50%% of RAM (neuron.memory.host_budget): of this machine on a GPU, of the "
                    "128 GiB GPU machine with --plan-only)")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                    help="planning processes (default: up to 2)")
    ap.add_argument("--iters", type=int, default=3, help="timed GPU iterations (default 3)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed GPU iterations (default 1)")
    ap.add_argument("--skip-torch", action="store_true", help="GPU: no PyTorch columns")
    ap.add_argument("--skip-reference", action="store_true",
                    help="GPU: no reference run without memory pressure")
    ap.add_argument("--out", default="deepest", help="result name under bench/results/")
    return ap.parse_args(argv)


# ---- planning (runs in worker processes) -----------------------------------------------------
def _fits(graph, batch, budget, kw):
    """neuron.plan.fits, keeping the error message."""
    from neuron.errors import MemoryBudgetError
    from neuron.executor import Executor
    try:
        ex = Executor(graph, batch, device="virtual", **kw)
    except MemoryBudgetError as e:
        return False, str(e), None, None
    r = ex.simulate(budget, trace=False)
    return r["fits"], (None if r["fits"] else str(r["error"])), (r if r["fits"] else None), ex


def limited_by(msg: str | None) -> str:
    if msg is None:
        return "-"
    if "host memory budget" in msg:
        return "host memory budget"
    if "parameters and optimizer state do not fit" in msg:
        return "parameters (arena)"
    return "arena"


def _kw(task) -> dict:
    return dict(policy=task["policy"], offload_params=task["offload_params"],
                host_budget=task["host_budget"])


def _log(task, text):
    print(f"[{task['label']}] {text}", flush=True)


def search_depth(task) -> dict:
    """Deepest member of a family by planning, capped; then the plan at the answer."""
    from neuron.executor import no_gc
    from neuron.models import build_model
    from neuron.plan import DEPTH_FAMILIES, search_max
    to_depth, _ = DEPTH_FAMILIES[task["family"]]
    kmax = max(1, next(k for k in range(1, 1 << 20) if to_depth(k + 1) > task["max_depth"]))
    fail_msgs = {}
    t0 = time.perf_counter()

    def ok(k):
        with no_gc():
            g = build_model(task["family"], depth=to_depth(k))
            fits, msg, _, _ = _fits(g, task["batch"], task["budget"], _kw(task))
        if not fits:
            fail_msgs[k] = msg
        _log(task, f"depth {to_depth(k)}: {'fits' if fits else 'does not fit'}")
        return fits

    k, probes = search_max(ok, 1, limit=kmax)
    out = {**{x: task[x] for x in ("family", "batch", "budget", "policy", "offload_params",
                                   "host_budget", "max_depth")},
           "deepest": to_depth(k) if k else None, "index": k,
           "capped": k is not None and k >= kmax,
           "probes": [{"depth": to_depth(p.value), "fits": p.fits,
                       "seconds": round(p.seconds, 2)} for p in probes]}
    above = sorted(x for x in fail_msgs if k is None or x > k)
    out["first_failure"] = fail_msgs[above[0]] if above else None
    out["limited_by"] = (f"cap (--max-depth {task['max_depth']})" if out["capped"]
                         else limited_by(out["first_failure"]))
    # the search assumes monotonicity in depth; with eviction it need not hold (pool
    # fragmentation): probe two deeper members (+2%, +5% of n) and report any that fit
    out["deeper_also_fit"] = []
    if k and not out["capped"]:
        for c in sorted({k + max(2, k // 50), k + max(4, k // 20)}):
            if c <= kmax:
                with no_gc():
                    g = build_model(task["family"], depth=to_depth(c))
                    if _fits(g, task["batch"], task["budget"], _kw(task))[0]:
                        out["deeper_also_fit"].append(to_depth(c))
    out["search_seconds"] = round(time.perf_counter() - t0, 1)
    if k:                                   # the plan at the answer, and the uncapped reference
        with no_gc():
            g = build_model(task["family"], depth=to_depth(k))
            from neuron.executor import Executor
            _, _, r, ex = _fits(g, task["batch"], task["budget"], _kw(task))
            rep = ex.recompute_report
            ref = Executor(g, task["batch"], device="virtual", policy="liveness")
            rr = ref.simulate(None, trace=False)
        out.update(peak_bytes=r["peak_bytes"], offload_bytes=r["offload_bytes"],
                   prefetch_bytes=r["prefetch_bytes"], host_peak_bytes=r["host_peak_bytes"],
                   extra_forward_steps=rep.extra_forward_steps if rep else 0,
                   num_layers=len(ex.train_graph.route), params=g.num_params(),
                   reference_liveness_peak_bytes=rr["peak_bytes"])
    _log(task, f"deepest {out['deepest']} ({out['limited_by']}), {out['search_seconds']} s")
    return out


def search_batch(task) -> dict:
    """Largest batch of one network by planning (neuron.plan.widest's search)."""
    from neuron.executor import no_gc
    from neuron.models import build_model
    from neuron.plan import search_max
    with no_gc():
        g = build_model(task["family"], depth=task["depth"])
    fail_msgs = {}
    t0 = time.perf_counter()

    def ok(b):
        with no_gc():
            fits, msg, _, _ = _fits(g, b, task["budget"], _kw(task))
        if not fits:
            fail_msgs[b] = msg
        _log(task, f"batch {b}: {'fits' if fits else 'does not fit'}")
        return fits

    b, probes = search_max(ok, 1, limit=1 << 20)
    above = sorted(x for x in fail_msgs if b is None or x > b)
    out = {**{x: task[x] for x in ("family", "depth", "budget", "policy", "offload_params",
                                   "host_budget")},
           "widest": b, "probes": [{"batch": p.value, "fits": p.fits,
                                    "seconds": round(p.seconds, 2)} for p in probes],
           "first_failure": fail_msgs[above[0]] if above else None,
           "search_seconds": round(time.perf_counter() - t0, 1)}
    out["limited_by"] = limited_by(out["first_failure"])
    if b:
        with no_gc():
            _, _, r, _ = _fits(g, b, task["budget"], _kw(task))
        out.update(peak_bytes=r["peak_bytes"],
                   moved_bytes=r["offload_bytes"] + r["prefetch_bytes"])
    _log(task, f"widest {b} ({out['limited_by']}), {out['search_seconds']} s")
    return out


def _run_task(task):
    return (search_depth if task["kind"] == "depth" else search_batch)(task)


def run_tasks(tasks, jobs):
    # slowest first (offload policies search deepest), so two workers finish together
    order = sorted(range(len(tasks)), key=lambda i: -tasks[i]["cost"])
    todo = [tasks[i] for i in order]
    if jobs > 1 and len(todo) > 1:
        with mp.get_context("fork").Pool(jobs) as pool:
            res = pool.map(_run_task, todo, chunksize=1)
    else:
        res = [_run_task(t) for t in todo]
    out = [None] * len(tasks)
    for i, r in zip(order, res):
        out[i] = r
    return out


# ---- GPU --------------------------------------------------------------------------------------
def gpu_neuron(rows, args, budget, TM, log=print):
    from neuron.executor import no_gc
    from neuron.models import build_model
    ref_cache = {}
    for r in rows:
        ans = r.get("deepest")
        if ans is None:
            continue
        batch = r["batch"]
        with no_gc():
            g = build_model(r["family"], depth=ans)
        log(f"neuron {r['policy']}{' +params' if r['offload_params'] else ''} "
            f"{r['family']} depth {ans} batch {batch} on the GPU ...")
        r["gpu"] = TM.neuron_run(g, batch, budget=budget, policy=r["policy"],
                                 offload_params=r["offload_params"],
                                 host_budget=r["host_budget"], iters=args.iters,
                                 warmup=args.warmup)
        log(f"  -> {r['gpu'].get('img_per_s') or r['gpu'].get('error')}")
        if args.skip_reference:
            continue
        key = (r["family"], ans, batch)
        if key not in ref_cache:
            need = r["reference_liveness_peak_bytes"]
            room = TM.gpu_total_bytes() - 4 * GiB
            if need > room:
                ref_cache[key] = {"fits": False, "error": f"the uncapped run needs "
                                  f"{need / GiB:.1f} GiB, more than this GPU holds"}
            else:
                log(f"  reference: liveness, no cap ({need / GiB:.1f} GiB) ...")
                ref_cache[key] = TM.neuron_run(g, batch, budget=None, policy="liveness",
                                               iters=args.iters, warmup=args.warmup)
        r["reference_gpu"] = ref_cache[key]
        if r["gpu"].get("img_per_s") and ref_cache[key].get("img_per_s"):
            r["throughput_ratio"] = r["gpu"]["img_per_s"] / ref_cache[key]["img_per_s"]


def gpu_torch(args, budget, families, TM, log=print) -> list[dict]:
    from neuron.plan import DEPTH_FAMILIES
    TM.cap_torch(budget)
    out = []
    for fam in families:
        to_depth, _ = DEPTH_FAMILIES[fam]
        cap = args.max_depth if fam == "resnet" else args.cifar_max_depth
        kmax = max(1, next(k for k in range(1, 1 << 20) if to_depth(k + 1) > cap))
        batch = args.batch if fam == "resnet" else args.cifar_batch
        for mode, _ in TORCH_MODES:
            s = TM.torch_search(fam, mode=mode, limit=kmax, batch=batch, depth_of=to_depth,
                                log=log)
            d = to_depth(s["k"]) if s["k"] else None
            row = {"family": fam, "kind": "depth", "mode": mode, "batch": batch,
                   "deepest": d, **s}
            if d:
                row["timed"] = TM.torch_run(fam, batch, depth=d, mode=mode, iters=args.iters,
                                            warmup=args.warmup)
            out.append(row)
        if fam == "resnet_cifar" and args.cifar_widest_depth:
            for mode, _ in TORCH_MODES:
                s = TM.torch_search(fam, mode=mode, limit=1 << 16,
                                    depth=args.cifar_widest_depth, log=log)
                row = {"family": fam, "kind": "batch", "mode": mode,
                       "depth": args.cifar_widest_depth, "widest": s["k"], **s}
                if s["k"]:
                    row["timed"] = TM.torch_run(fam, s["k"], depth=args.cifar_widest_depth,
                                                mode=mode, iters=args.iters,
                                                warmup=args.warmup)
                out.append(row)
    return out


# ---- report -----------------------------------------------------------------------------------
def gib(n, nd=2):
    return "-" if n is None else f"{n / GiB:,.{nd}f}"


def _name(r):
    return f"neuron {r['policy']}" + (" + offload-params" if r["offload_params"] else "")


def _gpu_cells(r, gpu: bool):
    if not gpu:
        return [NYM] * 4
    g = r.get("gpu")
    if not g:
        return ["-"] * 4
    if not g.get("fits"):
        return [f"failed: {g.get('error', '?')[:80]}"] + ["-"] * 3
    ref = r.get("reference_gpu") or {}
    ref_cell = (f"{ref['img_per_s']:.2f}" if ref.get("img_per_s")
                else (ref.get("error", "-")[:60] if ref else "-"))
    ratio = f"{r['throughput_ratio']:.2f}" if r.get("throughput_ratio") else "-"
    return [f"{g['seconds_per_iter']:.2f}", f"{g['img_per_s']:.2f}", ref_cell, ratio]


def _torch_depth_cells(t, gpu: bool):
    if not gpu:
        return [NYM] * 3
    if t is None:
        return ["skipped"] * 3
    if t.get("error"):
        return [f"error: {t['error'][:80]}", "-", "-"]
    d = t["deepest"]
    tm = t.get("timed") or {}
    return ["none" if d is None else (f">= {d} (cap)" if t["capped"] else str(d)),
            f"{tm['seconds_per_iter']:.2f}" if tm.get("seconds_per_iter") else "-",
            f"{tm['img_per_s']:.2f}" if tm.get("img_per_s") else "-"]


def markdown(res, args, prov, gpu: bool) -> str:
    budget = parse_bytes(args.budget)
    hb = res["host_budget"]
    where = (f"`{prov['command']}` on {prov['device']}, {prov['date']}, commit {prov['commit']}"
             + (" (library files modified since that commit)" if res["dirty"] else ""))
    how = ("neuron planned, then real iterations on the GPU" if gpu else
           "planned on a virtual device (the executor scheduling every step, no kernels)")
    ws = ("cuDNN algorithms chosen under the free bytes" if gpu else
          "the CPU kernels' im2col in fixed sub-blocks (<= 4 MiB of columns, or none when it does not fit); the GPU picks cuDNN "
          "algorithms under the free bytes, so GPU answers can differ slightly")
    L = [f"# Going deeper under a {fmt_bytes(budget)} budget (SuperNeurons Table 4)\n",
         f"Produced by {where}. float32, SGD with momentum (its state counts), {how}. "
         f"Host memory for offloaded tensors: {gib(hb, 0)} GiB. GiB = 2^30 bytes. "
         f"Workspaces: {ws}.\n"]
    t4 = [r for r in res["neuron"] if r["family"] == "resnet" and "deepest" in r]
    tt = {(t["family"], t["kind"], t["mode"]): t for t in res.get("torch", [])}
    if t4:
        L += [f"## Table-4 ResNet, 224x224, batch {args.batch}: depth = 3*(6+32+n3+6)+2\n",
              "| system | deepest depth | n3 | layers | limited by | peak GiB | moved GiB/iter "
              "| extra fwd steps | host peak GiB | uncapped peak GiB | search s | "
              "GPU s/iter | GPU img/s | same net, no pressure, img/s | ratio |",
              "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in t4:
            d = r["deepest"]
            dcell = "none" if d is None else (f">= {d}" if r["capped"] else str(d))
            if r.get("deeper_also_fit"):
                dcell += " *"
            L.append(f"| {_name(r)} | {dcell} | {r['index'] if d else '-'} | "
                     f"{r.get('num_layers', '-')} | {r['limited_by']} | "
                     f"{gib(r.get('peak_bytes'))} | "
                     f"{gib((r.get('offload_bytes') or 0) + (r.get('prefetch_bytes') or 0))} | "
                     f"{r.get('extra_forward_steps', '-')} | {gib(r.get('host_peak_bytes'))} | "
                     f"{gib(r.get('reference_liveness_peak_bytes'), 1)} | "
                     f"{r['search_seconds']} | " + " | ".join(_gpu_cells(r, gpu)) + " |")
        for mode, label in TORCH_MODES:
            c = _torch_depth_cells(tt.get(("resnet", "depth", mode)), gpu)
            L.append(f"| {label} | {c[0]} | | | | | | | | | | {c[1]} | {c[2]} | | |")
        for fw, d in PAPER_T4:
            L.append(f"| {fw} (paper, K40 12 GB) | {d} | {(d - 2) // 3 - 44} | | | | | | | | "
                     "| | | | |")
        L += ["",
              "Columns: *limited by* = what the smallest failing probe ran out of (arena, "
              "parameters in the arena, or the host budget); *peak* = arena high-water mark at "
              "the answer; *moved* = bytes offloaded + prefetched per iteration; *uncapped "
              "peak* = the same network under liveness with no cap, i.e. the memory the "
              "no-pressure reference run needs (an H100 has about 79 GiB, an H200 about 140); "
              "*ratio* = GPU img/s under the budget / img/s of that reference.\n",
              "Each answer is the last depth the search (exponential then bisection, as "
              "`neuron deepest`) verified to fit; the search assumes that fitting is monotonic "
              "in depth, which policies that evict do not guarantee (first-fit fragmentation). "
              "Two deeper members (+2% and +5% of n3) were probed too; \\* marks an answer "
              "where one of them also fits: "
              + ("; ".join(f"{_name(r)}: {', '.join(map(str, r['deeper_also_fit']))}"
                           for r in t4 if r.get("deeper_also_fit")) or "none did") + ".\n"]
    cif = [r for r in res["neuron"] if r["family"] == "resnet_cifar"]
    if cif:
        L += ["## CIFAR ResNet (6n+2, 32x32, option-B shortcuts)\n",
              f"Deepest at batch {args.cifar_batch}, and the largest batch of "
              f"ResNet-{args.cifar_widest_depth} (DTR's artifact: PyTorch's largest batch for "
              "ResNet-1202 on a 12 GB Titan V is 64 (8.9 GB, 89.8 img/s; 100 fails); DTR with a "
              "6 GB budget trains batch 140 at 100.5 img/s. DTR's ResNet-1202 may use option-A "
              "shortcuts (no parameters); neuron's has 1x1-conv projections).\n",
              f"| system | deepest depth at batch {args.cifar_batch} | limited by | search s "
              f"| GPU img/s at that depth | largest batch at depth {args.cifar_widest_depth} "
              f"| limited by | search s | GPU img/s at that batch |",
              "|---|---:|---|---:|---:|---:|---|---:|---:|"]
        for pol in args.policies.split(","):
            for op in res["op_variants"]:
                dr = next((r for r in cif if r["policy"] == pol and r["offload_params"] == op
                           and "deepest" in r), None)
                br = next((r for r in cif if r["policy"] == pol and r["offload_params"] == op
                           and "widest" in r), None)
                if dr is None and br is None:
                    continue
                any_r = dr or br

                def gcell(r):
                    if r is None:
                        return "-"
                    if not gpu:
                        return NYM
                    g = r.get("gpu") or {}
                    return f"{g['img_per_s']:.1f}" if g.get("img_per_s") else \
                        (f"failed: {g.get('error', '')[:60]}" if g else "-")

                dcell = "-" if dr is None else ("none" if dr["deepest"] is None else
                                                (f">= {dr['deepest']}" if dr["capped"]
                                                 else str(dr["deepest"])))
                if dr is not None and dr.get("deeper_also_fit"):
                    dcell += " * (also " + ", ".join(map(str, dr["deeper_also_fit"])) + ")"
                L.append(f"| {_name(any_r)} | {dcell} | "
                         f"{dr['limited_by'] if dr else '-'} | "
                         f"{dr['search_seconds'] if dr else '-'} | {gcell(dr)} | "
                         f"{br['widest'] if br else '-'} | {br['limited_by'] if br else '-'} | "
                         f"{br['search_seconds'] if br else '-'} | {gcell(br)} |")
        for mode, label in TORCH_MODES:
            td = tt.get(("resnet_cifar", "depth", mode))
            tb = tt.get(("resnet_cifar", "batch", mode))
            if not gpu:
                L.append(f"| {label} | {NYM} | | | {NYM} | {NYM} | | | {NYM} |")
                continue

            def tcell(t, key):
                if t is None:
                    return "skipped", "-"
                if t.get("error"):
                    return f"error: {t['error'][:60]}", "-"
                v = t[key]
                tm = t.get("timed") or {}
                return ("none" if v is None else (f">= {v} (cap)" if t["capped"] else str(v)),
                        f"{tm['img_per_s']:.1f}" if tm.get("img_per_s") else "-")
            a, ai = tcell(td, "deepest")
            b, bi = tcell(tb, "widest")
            L.append(f"| {label} | {a} | | | {ai} | {b} | | | {bi} |")
        L.append("| PyTorch (DTR artifact, Titan V 12 GB) | | | | | 64 | | | 89.8 |")
        L.append("| DTR, 6 GB budget (DTR artifact) | | | | | >= 140 (largest tried) | | | "
                 "100.5 |")
        L.append("")
    L += goals(res, args, gpu)
    return "\n".join(L) + "\n"


def goals(res, args, gpu) -> list[str]:
    t4 = {(r["policy"], r["offload_params"]): r for r in res["neuron"]
          if r["family"] == "resnet" and "deepest" in r}
    if not t4:
        return []
    L = ["## Goals\n"]
    target = 2 * 1920
    for key in (("superneurons", False), ("superneurons", True)):
        r = t4.get(key)
        if r is None or r["deepest"] is None:
            continue
        d = r["deepest"]
        met = d >= target
        if not met:
            tail = ""
        elif not gpu:
            tail = "; a GPU run at that depth would confirm it"
        elif (r.get("gpu") or {}).get("fits"):
            tail = "; confirmed by real GPU iterations"
        else:
            tail = "; the GPU run did NOT confirm it"
        L.append(f"- **Twice the paper's depth** ({target} = 2 x 1920 at batch 16 under 12 GB; "
                 f"TensorFlow's 592 doubled is 1184): {_name(r)} plans "
                 f"{'>= ' if r['capped'] else ''}{d} ({d / 1920:.2f}x the paper's SuperNeurons, "
                 f"{d / 592:.2f}x its TensorFlow) -> {'met' if met else 'NOT met'} by planning"
                 f"{tail}.")
    tck = next((t for t in res.get("torch", []) if t["family"] == "resnet"
                and t["kind"] == "depth" and t["mode"] == "checkpoint"), None)
    for key in (("superneurons", False), ("superneurons", True)):
        r = t4.get(key)
        if r is None or r["deepest"] is None:
            continue
        if not gpu or tck is None or not tck.get("deepest"):
            L.append(f"- **>= 3x PyTorch + checkpointing**: cannot be judged yet (needs the "
                     f"PyTorch search on a GPU); {_name(r)} meets it if PyTorch + "
                     f"checkpoint_sequential reaches depth <= {r['deepest'] // 3}.")
        elif tck.get("capped") or r.get("capped"):
            L.append(f"- **>= 3x PyTorch + checkpointing**: cannot be judged: "
                     f"{'PyTorch checkpointed' if tck.get('capped') else _name(r)} reached the "
                     f"search cap ({tck['deepest'] if tck.get('capped') else r['deepest']}); "
                     "raise --max-depth.")
        else:
            x = r["deepest"] / tck["deepest"]
            L.append(f"- **>= 3x PyTorch + checkpointing**: {_name(r)} {r['deepest']} / PyTorch "
                     f"checkpointed {tck['deepest']} = {x:.2f}x -> "
                     f"{'met' if x >= 3 else 'NOT met'}.")
    for key in (("superneurons", False), ("superneurons", True)):
        r = t4.get(key)
        if r is None or r["deepest"] is None:
            continue
        if not gpu:
            L.append(f"- **Throughput at most 25% below the same network without memory "
                     f"pressure**: cannot be judged yet (needs GPU timings); the reference run "
                     f"of depth {r['deepest']} needs "
                     f"{gib(r['reference_liveness_peak_bytes'], 1)} GiB uncapped.")
        elif r.get("throughput_ratio"):
            L.append(f"- **Throughput**: {_name(r)} at depth {r['deepest']} runs at "
                     f"{r['throughput_ratio']:.2f}x the uncapped run -> "
                     f"{'met' if r['throughput_ratio'] >= 0.75 else 'NOT met'} (goal >= 0.75).")
        else:
            ref = (r.get("reference_gpu") or {}).get("error", "no reference run")
            L.append(f"- **Throughput**: {_name(r)}: no ratio ({ref}).")
    return L + [""]


def main(argv=None):
    args = parse_args(argv)
    gpu = not args.plan_only
    TM = None
    device = None
    TM, device = gpu_setup("bench/deepest.py", args.plan_only)
    budget = parse_bytes(args.budget)
    # provenance first: others may commit while this runs; this is the code it imports
    prov = provenance(f"{device} (arena / PyTorch cap {args.budget})" if gpu else None)
    dirty = library_dirty()
    # load the planner before forking the workers, so every worker runs that commit's code
    import neuron.executor
    import neuron.models
    import neuron.plan
    del neuron
    host_budget = host_budget_for(args.host_budget, TM if gpu else None)
    families = [f for f in args.families.split(",") if f]
    for f in families:
        if f not in ("resnet", "resnet_cifar"):
            sys.exit(f"bench/deepest.py: unknown family {f!r} (resnet, resnet_cifar)")
    ops = {"both": [False, True], "no": [False], "yes": [True]}[args.offload_params]
    tasks = []
    for fam in families:
        for pol in args.policies.split(","):
            for op in ops:
                base = dict(family=fam, budget=budget, policy=pol, offload_params=op,
                            host_budget=host_budget,
                            label=f"{fam} {pol}{' +params' if op else ''}")
                cost = (3 if "offload" in pol or pol == "superneurons" else 1) * (1 + op)
                if fam == "resnet":
                    tasks.append({**base, "kind": "depth", "batch": args.batch,
                                  "max_depth": args.max_depth, "cost": 10 * cost})
                else:
                    tasks.append({**base, "kind": "depth", "batch": args.cifar_batch,
                                  "max_depth": args.cifar_max_depth, "cost": 5 * cost})
                    if args.cifar_widest_depth:
                        tasks.append({**base, "kind": "batch", "depth": args.cifar_widest_depth,
                                      "label": base["label"] + " widest", "cost": cost})
    t0 = time.perf_counter()
    rows = run_tasks(tasks, args.jobs)
    plan_seconds = round(time.perf_counter() - t0, 1)
    res = {"neuron": rows, "host_budget": host_budget, "op_variants": ops,
           "plan_seconds": plan_seconds, "dirty": dirty,
           "settings": vars(args) | {"budget_bytes": budget}}
    if gpu:
        gpu_neuron([r for r in rows if "deepest" in r], args, budget, TM)
        for r in rows:                       # CIFAR widest answers: real iterations too
            if "widest" in r and r["widest"]:
                from neuron.models import build_model
                g = build_model(r["family"], depth=r["depth"])
                r["gpu"] = TM.neuron_run(g, r["widest"], budget=budget, policy=r["policy"],
                                         offload_params=r["offload_params"],
                                         host_budget=host_budget, iters=args.iters,
                                         warmup=args.warmup)
        if not args.skip_torch:
            res["torch"] = gpu_torch(args, budget, families, TM)
        res["versions"] = TM.versions()
    md = markdown(res, args, prov, gpu)
    print(f"planning took {plan_seconds} s with {args.jobs} process(es)")
    write(args.out, {"provenance": prov, **res}, md)


if __name__ == "__main__":
    main()
