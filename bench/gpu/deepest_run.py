"""Stages `deepest` and `deepest_offload` of the GPU contact kit: the deepest Table-4 ResNet
trained for real under a memory cap, and PyTorch timed beside it at its own deepest.

neuron: the Table-4 ResNet (SuperNeurons' bottleneck (6, 32, n3, 6)) at ``--depth`` (rounded up
to the family's next depth), ``--batch``, in a ``--budget`` arena, the superneurons policy or
``--planner NAME`` (with ``--compress N``: the superneurons planner with FreeLunch compression),
parameters and optimizer state in the arena or, with ``--offload-params``, on the host between
uses (prefetched ``--prefetch-ahead`` steps ahead), with ``--replay`` passed to the Executor
where it takes the argument.

``--warmup`` untimed iterations (algorithm choice, the recording), then
``--iters`` timed ones: seconds per iteration (the median), the tensors' peak against the plan's.
Where the Executor records its tape during an iteration after the first, give ``--warmup`` room
for it, or the timed iteration is the recording one (the row keeps warmup and iters).

Why the kit's ``deepest`` stage runs ``--offload-params --resident-params 8GiB --planner
sublinear-sqrt``: at depth 4,292 the parameters and momentum take 12.7 of the 12.9 GB, so with
them in the arena every saved activation goes to the host and back, 50 GB each way per
iteration (planned; 49.3 GB moved on the H200, 2026-11-27), at most ~55 GB/s per direction:
about a second of copying in forward and another in backward, whatever overlaps. With the
parameters on the host the arena holds sqrt(n) checkpoints and one segment's recomputation
(planned peak 1.9 GB), and what moves is the parameter blocks, 12.8 GB out and 38.2 GB in per
iteration, which can be prefetched as far ahead as wanted, for one more forward of compute;
keeping 8 GiB of them in the arena (the last layers') leaves 4.2 GB out and 12.4 GB in
(planned peak 10.5 GB). ``--no-offload-params --planner policy --prefetch-ahead 1`` runs the
configuration of before.

PyTorch: ``--torch MODE:DEPTH,...`` (default eager 611 and checkpoint_sequential 2,153, the
depths PyTorch reached under the same 12 GiB cap on the H100, 2026-11-23) timed for ``--iters``
iterations each under the same cap, deepest first searched by bench/gpu/confirm.py.

Writes ``<out>/<name>.json``: the kit's contract plus ``runs`` (one row in the shape of
bench/results/deepest_gpu.json's ``runs``) and ``pytorch`` ([{mode, depth, seconds_per_iter}]).
Target (issue 36): depth >= 4,292 at <= 1.5 s/iteration; with ``--offload-params --compress``
(issue 37): depth >= 10,000 trains. ``--device cpu --smoke``: a CIFAR-sized Table-4 ResNet.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from bench.gpu.kit import (all_met, device_name, executor_has_replay, now_utc, stage_parser,
                           write_stage)

GIB = 1 << 30


def parse_args(argv=None):
    p = stage_parser(__doc__)
    p.add_argument("--name", default="deepest", help="stage name (deepest, deepest_offload)")
    p.add_argument("--depth", type=int, default=4292, help="target depth (default 4292)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--budget", default="12GiB")
    p.add_argument("--offload-params", action=argparse.BooleanOptionalAction, default=False,
                   help="parameters and optimizer state on the host between uses")
    p.add_argument("--planner", default="policy",
                   help="a planner (e.g. sublinear-sqrt, superneurons) or 'policy' for the "
                   "superneurons policy alone (default); --compress implies "
                   "superneurons:compress=N")
    p.add_argument("--resident-params", default=None,
                   help="with --offload-params: bytes of parameter blocks kept in the arena "
                   "(e.g. 8GiB; default none)")
    p.add_argument("--prefetch-ahead", default=None,
                   help="steps ahead tensors on the host are prefetched (default: the "
                   "Executor's, 1)")
    p.add_argument("--compress", type=int, choices=[2, 4], default=None)
    p.add_argument("--replay", choices=["off", "tape", "graph"], default="graph")
    p.add_argument("--warmup", type=int, default=4,
                   help="untimed iterations: algorithm choice, the two records a replay is "
                   "trusted after, a graph's capture (default 4)")
    p.add_argument("--iters", type=int, default=1)
    p.add_argument("--tf32", action="store_true",
                   help="TF32 tensor-core math for both frameworks' convolutions and matmuls "
                   "(default: strict fp32, as the paper's tables)")
    p.add_argument("--fuse", action="store_true",
                   help="neuron's BatchNorm+ReLU and Add+ReLU as one layer each (fewer kernels "
                   "per step: at batch 16 the deepest run's kernels are small)")
    p.add_argument("--torch", default="eager:611,checkpoint:2153",
                   help="PyTorch MODE:DEPTH pairs to time under the same cap ('' for none)")
    p.add_argument("--max-seconds-per-iter", type=float, default=1.5,
                   help="the target's time per iteration (issue 36); with --compress none")
    p.add_argument("--min-depth", type=int, default=None,
                   help="the target's depth (default 4292; 10000 with --compress)")
    p.add_argument("--deadline", type=float,
                   default=0.85 * float(os.environ.get("NEURON_STAGE_LIMIT", 300)),
                   help="seconds after which PyTorch's timings are not started")
    return p.parse_args(argv)


def table4_depth(at_least: int) -> int:
    """The smallest Table-4 ResNet depth >= at_least (3 * (6 + 32 + n3 + 6) + 2)."""
    from neuron.plan import DEPTH_FAMILIES
    to_depth, _ = DEPTH_FAMILIES["resnet"]
    k = max(1, -(-(at_least - to_depth(0)) // 3))
    while to_depth(k) < at_least:
        k += 1
    return to_depth(k)


def _oom(torch_row: dict) -> bool:
    return "OutOfMemoryError" in (torch_row.get("error") or "")


def main(argv=None) -> int:
    args = parse_args(argv)
    from bench.gpu import runs as TM
    from neuron.memory.host_budget import default_host_cap
    from neuron.models import build_model
    from neuron.units import fmt_bytes, parse_bytes
    t_start = time.perf_counter()
    dev = args.device
    budget = parse_bytes(args.budget)
    planner = f"superneurons:compress={args.compress}" if args.compress else \
        (None if args.planner == "policy" else args.planner)
    ahead = None if args.prefetch_ahead is None else \
        (args.prefetch_ahead if args.prefetch_ahead == "auto" else int(args.prefetch_ahead))
    resident = parse_bytes(args.resident_params) if args.resident_params else None
    if args.smoke:          # CPU check of the logic: a small CIFAR ResNet in a few MiB
        family, depth, batch = "resnet_cifar", 14, 2
        from neuron.plan import plan
        graph = build_model(family, depth=depth, in_shape=(3, 16, 16))
        # the least arena this configuration fits in (a compressing planner's: the policy's)
        kw = dict(policy="superneurons", offload_params=args.offload_params,
                  **({} if planner is None or args.compress else {"planner": planner}),
                  **({} if ahead is None else {"prefetch_ahead": ahead}),
                  **({} if resident is None else {"resident_params": resident}))
        budget = plan(graph, batch, trace=False, **kw)["min_budget_bytes"]
        torch_pairs = [("eager", 8), ("checkpoint", 14)] if args.torch else []
        torch_family = "resnet_cifar"
    else:
        family, batch = "resnet", args.batch
        depth = table4_depth(args.depth)
        graph = build_model(family, depth=depth)
        torch_family = "resnet"
        torch_pairs = [(m, int(d)) for m, d in (x.split(":") for x in args.torch.split(",") if x)]
    # smoke: the depth it trains is its target, so on the CPU only the peak's check decides
    min_depth = depth if args.smoke else args.min_depth or (10000 if args.compress else 4292)
    res: dict = {"family": family, "budget_bytes": budget, "runs": [], "pytorch": [],
                 "executor_has_replay": executor_has_replay()}

    def save(ran=False, target_met=None, detail="partial: the stage is still running"):
        write_stage(args.out, args.name, ran=ran, target_met=target_met, detail=detail,
                    device=device_name(dev), smoke=args.smoke, **res)

    replay = args.replay
    if dev == "cpu" and replay == "graph":      # a CUDA graph is the GPU's; the CPU's is the tape
        replay = "tape"
        res["replay_note"] = "--replay graph asked on the CPU: tape requested instead"
    print(f"[{args.name}] neuron {family} depth {depth} batch {batch} in {budget / GIB:.2f} GiB, "
          f"replay {replay}", flush=True)
    r = TM.neuron_run(graph, batch, budget=budget, policy="superneurons",
                      offload_params=args.offload_params, planner=planner,
                      host_budget=default_host_cap(), iters=args.iters, warmup=args.warmup,
                      device=dev, replay=replay, allow_tf32=args.tf32, prefetch_ahead=ahead,
                      resident_params=resident, fuse=args.fuse)
    row = {"device": device_name(dev), "date": now_utc(), "commit": None, "depth": depth,
           "batch": batch, "budget_bytes": budget, "offload_params": args.offload_params,
           "compress": args.compress, "replay": r.get("replay"),
           "seconds_per_iter": r.get("seconds_per_iter"),
           "tensor_peak_bytes": r.get("tensor_peak_bytes"),
           "planned_tensor_peak_bytes": r.get("planned_tensor_peak_bytes"),
           "fits": r.get("fits"), "error": r.get("error"), "warmup": args.warmup,
           "iters": args.iters, "precision": "tf32" if args.tf32 else "fp32",
           "planner": planner or "policy:superneurons", "prefetch_ahead": ahead,
           "resident_params_bytes": resident,
           "moved_bytes_per_iter": r.get("moved_bytes"), "fuse": args.fuse, "detail": r}
    from bench._common import git_commit
    row["commit"] = git_commit()
    res["runs"].append(row)
    save()
    if dev == "cuda":
        TM.cap_torch(budget)
    for mode, d in torch_pairs:
        if time.perf_counter() - t_start > args.deadline:
            res["pytorch"].append({"mode": mode, "depth": d, "seconds_per_iter": None,
                                   "skipped": f"deadline of {args.deadline:.0f}s passed"})
            continue
        t = TM.torch_run(torch_family, batch, depth=d, mode=mode, iters=max(1, args.iters),
                         device=dev, allow_tf32=args.tf32)
        res["pytorch"].append({"mode": mode, "depth": d, "tf32": args.tf32,
                               "seconds_per_iter": t.get("seconds_per_iter"),
                               "fits": t.get("fits"), "error": t.get("error")})
        save()
    fits = bool(r.get("fits"))
    # PyTorch running out of memory at its depth is a finding, not a stage that did not run
    ran = fits and not any(p.get("skipped") for p in res["pytorch"])
    if fits:
        checks = [depth >= min_depth,
                  r["tensor_peak_bytes"] == r["planned_tensor_peak_bytes"]]
        if not args.compress and not args.smoke:
            checks.append(r["seconds_per_iter"] <= args.max_seconds_per_iter)
        met = all_met(checks)
        detail = (f"depth {depth} batch {batch} in {budget / (1 << 20):.1f} MiB"
                  + (", --offload-params" if args.offload_params else "")
                  + (f", planner {planner}" if planner and not args.compress else "")
                  + (f", prefetch ahead {ahead}" if ahead is not None else "")
                  + (f", {fmt_bytes(resident)} of parameters resident" if resident else "")
                  + (f", --compress {args.compress}" if args.compress else "")
                  + (", TF32" if args.tf32 else "") + (", fused" if args.fuse else "")
                  + f", replay {r['replay']}: {r['seconds_per_iter']:.2f} s/iter"
                  + ("" if args.compress or args.smoke
                     else f" (target <= {args.max_seconds_per_iter:g})")
                  + f", depth target >= {min_depth}, tensor peak "
                  + ("=" if checks[1] else "!=") + " plan")
    else:
        met = False if r.get("error", "").startswith("MemoryBudgetError") else None
        detail = f"depth {depth} did not train: {(r.get('error') or '?')[:200]}"
    detail += "; PyTorch " + ", ".join(
        f"{p['mode']} {p['depth']}: " + (f"{p['seconds_per_iter']:.2f} s/iter"
                                         if p.get("seconds_per_iter") else
                                         "does not fit (out of memory)" if _oom(p) else
                                         (p.get("skipped") or p.get("error") or "?")[:80])
        for p in res["pytorch"])
    save(ran, met, detail)
    return 0


if __name__ == "__main__":
    sys.exit(main())
