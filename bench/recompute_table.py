"""Recomputation strategies (SuperNeurons Table 1): extra forward computations and peak memory of
the speed-centric, memory-centric and cost-aware strategies.

Policy "recompute" (liveness + recomputation of the cheap segments, no offload) on AlexNet,
ResNet-50 and ResNet-101 at --batch (default 32). For each strategy: the extra forward steps
per iteration (recomputations), the peak with an unbounded arena (plan's unbounded_peak_bytes)
and the smallest arena the plan completes in (min_budget_bytes), next to the paper's Table 1 and
to liveness alone. Without offload every checkpoint stays resident all forward, so the peak is
set by the checkpoints and the strategies cannot differ in it; the paper's peak_m is the
recomputation cost once checkpoints are offloaded, so the same table is also given for policy
"superneurons" (offload + recompute), whose min_budget_bytes is where the strategies differ.

--plan-only: planning only (no GPU), time columns "not yet measured". Without it (GPU): real
iterations for each strategy (device="cuda"; arena = the planned extent for recompute, the
minimum budget for superneurons).

    python bench/recompute_table.py --plan-only            # CPU, seconds
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import arg_parser, gpu_setup, library_dirty, provenance, write  # noqa: E402

MiB = 1 << 20
MODELS = ["alexnet", "resnet50", "resnet101"]
STRATEGIES = [("speed", "speed-centric"), ("memory", "memory-centric"), ("cost", "cost-aware")]
#: SuperNeurons Table 1: (extra, peak_m in MB) per strategy; the paper does not state the batch
PAPER = {"alexnet": {"speed": (14, 993.018), "memory": (23, 886.23), "cost": (17, 886.23)},
         "resnet50": {"speed": (84, 455.125), "memory": (118, 401), "cost": (85, 401)},
         "resnet101": {"speed": (169, 455.125), "memory": (237, 401), "cost": (170, 401)}}
NYM = "not yet measured"


def parse_args(argv=None):
    ap = arg_parser(__doc__)
    ap.add_argument("--plan-only", action="store_true",
                    help="planning columns only (no GPU); time columns 'not yet measured'")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--policies", default="recompute,superneurons",
                    help="policies with recomputation (default recompute,superneurons)")
    ap.add_argument("--iters", type=int, default=5, help="timed GPU iterations (default 5)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed GPU iterations (default 2)")
    ap.add_argument("--out", default="recompute_table", help="result name under bench/results/")
    return ap.parse_args(argv)


def plan_row(model, batch, strategy, policy="recompute"):
    from neuron.executor import Executor
    from neuron.models import build_model
    from neuron.plan import plan
    t0 = time.perf_counter()
    g = build_model(model)
    r = plan(g, batch, policy=policy, recompute_strategy=strategy, trace=False, model=model)
    rep = Executor(g, batch, device="virtual", policy=policy,
                   recompute_strategy=strategy).recompute_report
    row = {k: r[k] for k in ("model", "batch", "policy", "recompute_strategy",
                             "extra_forward_steps", "unbounded_peak_bytes", "min_budget_bytes",
                             "lower_bound_bytes", "max_step_bytes", "num_steps", "num_layers")}
    row.update(report={k: getattr(rep, k) for k in ("strategy", "extra_forward_steps",
                                                    "dropped_tensors", "dropped_bytes",
                                                    "segments", "speed_segments",
                                                    "memory_segments", "l_peak")},
               bytes_by_kind=r["bytes_by_kind"], seconds=round(time.perf_counter() - t0, 2))
    return row


def liveness_row(model, batch):
    from neuron.models import build_model
    from neuron.plan import plan
    r = plan(build_model(model), batch, policy="liveness", trace=False, model=model)
    return {k: r[k] for k in ("unbounded_peak_bytes", "min_budget_bytes", "num_steps")}


def markdown(res, args, prov, gpu):
    rows = {(r["policy"], r["model"], r["recompute_strategy"]): r for r in res["rows"]}
    models = args.models.split(",")
    where = (f"`{prov['command']}` on {prov['device']}, {prov['date']}, commit {prov['commit']}"
             + (" (library files modified since that commit)" if res["dirty"] else ""))
    L = [f"# Recomputation strategies, batch {args.batch} (SuperNeurons Table 1)\n",
         f"Produced by {where}. float32, SGD with momentum; peaks include parameters, momentum, "
         "gradients and workspaces (the CPU kernels' im2col in fixed sub-blocks, <= 4 MiB), MiB = 2^20 "
         "bytes. *extra* = forward steps re-run per iteration; *peak* = arena high-water mark "
         "with an unbounded arena (unbounded_peak_bytes); *min* = the smallest arena the plan "
         "completes in (min_budget_bytes: without offload, the unbounded run's extent, which can "
         "exceed the peak by fragmentation; with offload, a search to within 1%).\n"]
    for pol in args.policies.split(","):
        what = {"recompute": "liveness + recomputation, no offload: checkpoints stay resident, "
                "so the peak is theirs and the same for every strategy",
                "superneurons": "liveness + offload + recomputation: with the checkpoints "
                "offloaded, *min* is the paper's peak_m analogue"}.get(pol, pol)
        L += [f"## policy `{pol}` ({what})\n",
              "| model | " + " | ".join(f"{lbl} extra | {lbl} peak MiB | {lbl} min MiB"
                                       for _, lbl in STRATEGIES)
              + " | liveness peak MiB | lower bound MiB |",
              "|---|" + "---:|" * (3 * len(STRATEGIES) + 2)]
        for m in models:
            cells = []
            for s, _ in STRATEGIES:
                r = rows[(pol, m, s)]
                cells += [str(r["extra_forward_steps"]),
                          f"{r['unbounded_peak_bytes'] / MiB:,.1f}",
                          f"{r['min_budget_bytes'] / MiB:,.1f}"]
            lv = res["liveness"][m]
            L.append(f"| {m} | " + " | ".join(cells)
                     + f" | {lv['unbounded_peak_bytes'] / MiB:,.1f}"
                     f" | {rows[(pol, m, 'cost')]['lower_bound_bytes'] / MiB:,.1f} |")
        L.append("")
    L += ["The paper's Table 1 (K40; batch not stated; peak_m in MB, which the text equates with "
          "max l_i for the memory-centric and cost-aware strategies, i.e. without parameters):\n",
          "| model | " + " | ".join(f"{lbl} extra | {lbl} peak_m MB" for _, lbl in STRATEGIES)
          + " |", "|---|" + "---:|" * (2 * len(STRATEGIES))]
    for m in models:
        if m in PAPER:
            L.append(f"| {m} | " + " | ".join(f"{PAPER[m][s][0]} | {PAPER[m][s][1]}"
                                             for s, _ in STRATEGIES) + " |")
    L += ["", "Segments (from the recompute report): dropped tensors / bytes, segments "
          "recomputed speed-centric / memory-centric, and l_peak (the largest step, MiB); GPU: "
          "real iterations in an arena of the planned extent (recompute) or of *min* "
          "(superneurons):\n",
          "| policy | model | strategy | dropped tensors | dropped MiB | segments | speed seg. | "
          "memory seg. | l_peak MiB | steps | GPU s/iter | GPU img/s | GPU peak MiB (planned) |",
          "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for pol in args.policies.split(","):
        for m in models:
            for s, lbl in STRATEGIES:
                r = rows[(pol, m, s)]
                rep = r["report"]
                if not gpu:
                    gc = [NYM] * 3
                elif not (r.get("gpu") or {}).get("fits"):
                    gc = [f"failed: {(r.get('gpu') or {}).get('error', '')[:60]}", "-", "-"]
                else:
                    g = r["gpu"]
                    gc = [f"{g['seconds_per_iter']:.3f}", f"{g['img_per_s']:.1f}",
                          f"{g['peak_bytes'] / MiB:,.1f} "
                          f"({(g['planned_peak_bytes'] or 0) / MiB:,.1f})"]
                L.append(f"| {pol} | {m} | {lbl} | {rep['dropped_tensors']} | "
                         f"{rep['dropped_bytes'] / MiB:,.1f} | {rep['segments']} | "
                         f"{rep['speed_segments']} | {rep['memory_segments']} | "
                         f"{rep['l_peak'] / MiB:,.1f} | {r['num_steps']} | "
                         + " | ".join(gc) + " |")
    return "\n".join(L) + "\n"


def main(argv=None):
    args = parse_args(argv)
    gpu = not args.plan_only
    TM, device = gpu_setup("bench/recompute_table.py", args.plan_only)
    # provenance first: others may commit while this runs; this is the code it imports
    prov, dirty = provenance(device), library_dirty()
    rows, liveness = [], {}
    for m in args.models.split(","):
        liveness[m] = liveness_row(m, args.batch)
        for pol in args.policies.split(","):
            for s, _ in STRATEGIES:
                rows.append(plan_row(m, args.batch, s, pol))
                print(f"{m} {pol} {s}: extra {rows[-1]['extra_forward_steps']}, peak "
                      f"{rows[-1]['unbounded_peak_bytes'] / MiB:,.1f} MiB, min "
                      f"{rows[-1]['min_budget_bytes'] / MiB:,.1f} MiB, {rows[-1]['seconds']} s",
                      flush=True)
    if gpu:
        from neuron.models import build_model
        for r in rows:
            # recompute: arena = the planned extent; superneurons: its minimum budget
            b = r["min_budget_bytes"] if r["policy"] != "recompute" else None
            r["gpu"] = TM.neuron_run(build_model(r["model"]), args.batch, budget=b,
                                     policy=r["policy"],
                                     recompute_strategy=r["recompute_strategy"],
                                     iters=args.iters, warmup=args.warmup)
    res = {"rows": rows, "liveness": liveness, "dirty": dirty, "settings": vars(args)}
    if gpu:
        res["versions"] = TM.versions()
    write(args.out, {"provenance": prov, **res}, markdown(res, args, prov, gpu))


if __name__ == "__main__":
    main()
