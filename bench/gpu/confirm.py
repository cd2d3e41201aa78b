"""Stage `confirm` of the GPU contact kit: the planner's answers checked by real GPU iterations.

1. The widest ResNet-50 under 12 GiB (superneurons), planned on the virtual device, then trained
   for real: the tensors' measured peak against the plan's, the arena's measured peak (tensors
   plus convolution workspaces, which take what is free at each step) against the plan's, and
   seconds per iteration.
2. The deepest Table-4 ResNet at batch 16 under 12 GiB, replanned with this machine's host memory
   (the pinned cap, neuron.memory.host_budget), then trained for real: the same figures.
3. PyTorch's deepest Table-4 ResNet under the same 12 GiB cap, eager and with
   ``checkpoint_sequential``, by bisection on depth with one iteration per probe (the PyTorch
   column of Table 4).

Each part writes the partial result at once, so a stage stopped at its time limit keeps what it
finished; ``--deadline`` seconds skips the parts that would start after it.
``--device cpu --smoke`` runs the same logic with small networks and budgets on the CPU.
"""
from __future__ import annotations

import os
import sys
import time

from bench.gpu.kit import device_name, stage_parser, write_stage


def parse_args(argv=None):
    p = stage_parser(__doc__)
    p.add_argument("--budget", default="12GiB")
    p.add_argument("--batch", type=int, default=16, help="Table-4 batch")
    p.add_argument("--max-torch-depth", type=int, default=20000)
    p.add_argument("--deadline", type=float,
                   default=0.85 * float(os.environ.get("NEURON_STAGE_LIMIT", 270)),
                   help="seconds after which no new part starts (default: 85%% of the kit's "
                   "stage limit)")
    return p.parse_args(argv)


def _check(run: dict) -> dict:
    """Measured vs planned peaks of a neuron_run result, reported apart: the tensors' (the
    target: equal to the byte) and the arena's (tensors + conv workspaces; on the GPU a step's
    workspace takes what is free at that moment, by design, so this one may exceed the plan)."""
    if not run.get("fits"):
        return {"tensor_equal": None}
    tp, tplan = run["tensor_peak_bytes"], run.get("planned_tensor_peak_bytes")
    ap, aplan = run["peak_bytes"], run.get("planned_peak_bytes")
    return {"tensor_equal": tplan is not None and tp == tplan,
            "tensor_peak_bytes": tp, "planned_tensor_peak_bytes": tplan,
            "tensor_measured_minus_planned": tp - tplan if tplan is not None else None,
            "arena_peak_bytes": ap, "planned_arena_peak_bytes": aplan,
            "arena_measured_minus_planned": ap - aplan if aplan is not None else None}


def main(argv=None) -> int:
    args = parse_args(argv)
    from bench.gpu import runs as TM
    from neuron import plan as P
    from neuron.memory.host_budget import default_host_cap
    from neuron.models import build_model
    from neuron.units import parse_bytes
    t_start = time.perf_counter()
    dev = args.device
    budget = parse_bytes(args.budget)
    host = default_host_cap()
    res: dict = {"budget_bytes": budget, "host_budget_bytes": host, "parts": {}}
    kw = {"policy": "superneurons", "host_budget": host}

    def save(ran=False, target_met=None, detail="partial: the stage is still running"):
        write_stage(args.out, "confirm", ran=ran, target_met=target_met, detail=detail,
                    device=device_name(dev), smoke=args.smoke, **res)

    def late(part):
        print(f"[confirm {time.perf_counter() - t_start:6.1f}s] {part}", flush=True)
        if time.perf_counter() - t_start > args.deadline:
            res["parts"][part] = {"skipped": f"deadline of {args.deadline:.0f}s passed"}
            save()
            return True
        return False

    if args.smoke:      # small stand-ins: a CIFAR ResNet, budgets of a few MiB
        wide_model, wide_kw, deep_family = "resnet_cifar", {"depth": 8}, "resnet_cifar"
        budget = res["budget_bytes"] = 5 << 20
    else:
        wide_model, wide_kw, deep_family = "resnet50", {}, "resnet"
    # 1. widest
    if not late("widest"):
        t0 = time.perf_counter()
        w = P.widest(wide_model, budget, depth=wide_kw.get("depth"), **kw)
        plan_s = time.perf_counter() - t0
        part = {"model": wide_model, "batch": w["widest"], "plan_seconds": round(plan_s, 1)}
        if w["widest"]:
            run = TM.neuron_run(build_model(wide_model, **wide_kw), w["widest"], budget=budget,
                                iters=1, warmup=1, device=dev, **kw)
            part.update(run=run, peak=_check(run))
        res["parts"]["widest"] = part
        save()
    # 2. deepest Table-4 ResNet
    if not late("deepest"):
        t0 = time.perf_counter()
        batch = 4 if args.smoke else args.batch
        d = P.deepest(deep_family, batch, budget, **kw)
        part = {"family": deep_family, "batch": batch, "depth": d["deepest"],
                "plan_seconds": round(time.perf_counter() - t0, 1)}
        if d["deepest"]:
            run = TM.neuron_run(build_model(deep_family, depth=d["deepest"]), batch,
                                budget=budget, iters=1, warmup=1, device=dev, **kw)
            part.update(run=run, peak=_check(run))
        res["parts"]["deepest"] = part
        save()
    # 3. PyTorch's deepest, eager and checkpointed
    from neuron.plan import DEPTH_FAMILIES
    to_depth, _ = DEPTH_FAMILIES[deep_family]
    kmax = max(1, next(k for k in range(1, 1 << 20) if to_depth(k + 1) > (
        14 if args.smoke else args.max_torch_depth)))
    if dev == "cuda":
        TM.cap_torch(budget)
    for mode in ("eager", "checkpoint"):
        if late(f"torch_{mode}"):
            continue
        batch = 4 if args.smoke else args.batch
        s = TM.torch_search(deep_family, mode=mode, limit=kmax, batch=batch, depth_of=to_depth,
                            device=dev)
        res["parts"][f"torch_{mode}"] = {"batch": batch,
                                         "depth": to_depth(s["k"]) if s["k"] else None, **s}
        save()
    parts = res["parts"]
    runs = [parts.get(p, {}) for p in ("widest", "deepest")]
    ran = all(r.get("run", {}).get("fits") for r in runs) and all(
        parts.get(f"torch_{m}", {}).get("depth") for m in ("eager", "checkpoint"))
    from bench.gpu.kit import all_met
    target_met = all_met([r.get("peak", {}).get("tensor_equal") for r in runs])

    def mib(b):
        return f"{b / (1 << 20):.1f} MiB"

    def neuron_cell(p, key):
        r = parts.get(p, {})
        run = r.get("run", {})
        if not run.get("fits"):
            return f"{p} {key} {r.get(key)}: " + (run.get("error", r.get("skipped", "not run"))
                                                 [:100])
        pk = r["peak"]
        arena = (f"arena peak {mib(pk['arena_peak_bytes'])} (plan "
                 f"{mib(pk['planned_arena_peak_bytes'])})"
                 if pk["planned_arena_peak_bytes"] is not None else
                 f"arena peak {mib(pk['arena_peak_bytes'])} (no plan)")
        return (f"{p} {key} {r.get(key)}: tensor peak {mib(pk['tensor_peak_bytes'])} "
                f"{'=' if pk['tensor_equal'] else '!='} plan, {arena}, "
                f"{run['seconds_per_iter']:.2f} s/iter")

    detail = "; ".join(
        [neuron_cell("widest", "batch"), neuron_cell("deepest", "depth")]
        + [f"PyTorch {m} deepest {parts.get(f'torch_{m}', {}).get('depth')}"
           for m in ("eager", "checkpoint")])
    save(ran, target_met, detail)
    return 0


if __name__ == "__main__":
    sys.exit(main())
