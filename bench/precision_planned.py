"""Mixed precision, planned: how much wider and deeper bf16 trains than fp32 under one budget.

Planned figures only (neuron.plan on a VirtualDevice: the executor's own scheduling, no GPU, no
kernels): the widest batch of ResNet-50, VGG16 and DenseNet-121 (224x224, no chunking) and the
deepest SuperNeurons Table-4 ResNet at batch 16, with and without --offload-params, under a
12 GiB arena, at fp32 and bf16 (policy superneurons). Targets (issue 38): widest at bf16 >= 1.9x
the fp32 answer for each model. Nothing here is measured on a device.

    python bench/precision_planned.py                # CPU, a few minutes
    python bench/precision_planned.py --no-deepest   # the widest rows only
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import arg_parser, host_budget_for, library_dirty, provenance, write  # noqa: E402
from neuron.units import fmt_bytes, parse_bytes  # noqa: E402

WIDEST_MODELS = ["resnet50", "vgg16", "densenet121"]
PRECISIONS = ["fp32", "bf16"]
TARGET = 1.9            # widest batch at bf16 over fp32


def parse_args(argv=None):
    ap = arg_parser(__doc__)
    ap.add_argument("--budget", default="12GiB", help="arena (default 12GiB)")
    ap.add_argument("--models", default=",".join(WIDEST_MODELS))
    ap.add_argument("--no-deepest", action="store_true", help="skip the deepest rows")
    ap.add_argument("--host-budget", default=None,
                    help="host memory for offloaded tensors (default: the runtime's pinned cap "
                    "of the 128 GiB GPU machine, as bench/deepest.py)")
    ap.add_argument("--out", default="precision_planned", help="result name under bench/results/")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    from neuron.plan import deepest, widest
    args = parse_args(argv)
    budget = parse_bytes(args.budget)
    host = host_budget_for(args.host_budget)
    t0 = time.perf_counter()
    wide = []
    for model in args.models.split(","):
        row = {"model": model}
        for p in PRECISIONS:
            t = time.perf_counter()
            r = widest(model, budget, policy="superneurons", precision=p, host_budget=host)
            row[p] = r["widest"]
            row[f"{p}_seconds"] = round(time.perf_counter() - t, 1)
        row["ratio"] = round(row["bf16"] / row["fp32"], 3) if row["fp32"] else None
        row["meets_target"] = row["ratio"] is not None and row["ratio"] >= TARGET
        print(row, flush=True)
        wide.append(row)
    deep = []
    if not args.no_deepest:
        for offload in (False, True):
            row = {"family": "resnet", "batch": 16, "offload_params": offload}
            for p in PRECISIONS:
                t = time.perf_counter()
                r = deepest("resnet", 16, budget, policy="superneurons", precision=p,
                            offload_params=offload,
                            host_budget=host)
                row[p] = r["deepest"]
                row[f"{p}_seconds"] = round(time.perf_counter() - t, 1)
            row["ratio"] = round(row["bf16"] / row["fp32"], 3) if row["fp32"] else None
            print(row, flush=True)
            deep.append(row)
    payload = {"provenance": provenance(), "kind": "planned (VirtualDevice), not measured",
               "policy": "superneurons", "budget_bytes": budget, "host_budget_bytes": host,
               "chunks": 1, "target_widest_ratio": TARGET, "widest": wide, "deepest": deep,
               "dirty": library_dirty(), "plan_seconds": round(time.perf_counter() - t0, 1),
               "settings": vars(args)}
    pv = payload["provenance"]
    md = [f"# Mixed precision, planned: bf16 against fp32 under {fmt_bytes(budget)}", "",
          f"Planned on a VirtualDevice (neuron.plan: the executor's scheduling, no kernels), "
          f"policy superneurons, no chunking; **planned figures, not measured on a GPU**. "
          f"{pv['date']}, commit {pv['commit']}, {pv['device']}; command `python "
          f"{pv['command']}`.", "",
          "## Widest batch (224x224)", "",
          f"| model | fp32 | bf16 | bf16 / fp32 | target >= {TARGET}x |", "|---|---|---|---|---|"]
    for r in wide:
        md.append(f"| {r['model']} | {r['fp32']} | {r['bf16']} | {r['ratio']} | "
                  f"{'met' if r['meets_target'] else 'MISSED'} |")
    if deep:
        md += ["", f"## Deepest Table-4 ResNet, batch 16 (host budget {fmt_bytes(host)})", "",
               "| offload-params | fp32 | bf16 | bf16 / fp32 |", "|---|---|---|---|"]
        for r in deep:
            md.append(f"| {'yes' if r['offload_params'] else 'no'} | {r['fp32']} | {r['bf16']} "
                      f"| {r['ratio']} |")
    md += ["", "bf16 stores feature maps, their gradients and a per-step bf16 copy of every conv/linear "
           "weight in 2 bytes; master weights, their gradients, momentum, BatchNorm statistics "
           "and the loss stay float32 (docs/precision.md). The deepest network at batch 16 is "
           "bound by its resident float32 parameters and momentum, which mixed precision does "
           "not shrink: bf16 gains little there until --offload-params moves them to the host.",
           ""]
    write(args.out, payload, "\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
