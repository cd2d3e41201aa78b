"""min_budget_bytes by policy (baseline -> liveness -> superneurons) and its ratio to
neuron's layer bound (its steps with their preferred workspaces) and to the ideal layer bound
(the mathematics: each layer's inputs, outputs, gradients and parameters, no temporaries, no
workspace), batch 32, planned on a virtual device (no GPU needed).

    python bench/plan_min_budget.py [--batch 32] [--models alexnet,vgg16,...]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import provenance, write  # noqa: E402
from neuron.models import build_model  # noqa: E402
from neuron.plan import plan  # noqa: E402

MODELS = ["alexnet", "vgg16", "resnet50", "resnet101", "resnet152", "densenet121"]
POLICIES = ["baseline", "liveness", "offload", "recompute", "superneurons"]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--models", default=",".join(MODELS))
    args = ap.parse_args()
    rows = []
    for m in args.models.split(","):
        g = build_model(m)
        for pol in POLICIES:
            t = time.perf_counter()
            r = plan(g, args.batch, policy=pol, trace=False, model=m)
            rows.append({k: r[k] for k in ("model", "batch", "policy", "unbounded_peak_bytes",
                                           "min_budget_bytes", "lower_bound_bytes",
                                           "ideal_bound_bytes", "extra_forward_steps")}
                        | {"ratio": r["min_budget_bytes"] / r["lower_bound_bytes"],
                           "ratio_ideal": r["min_budget_bytes"] / r["ideal_bound_bytes"],
                           "seconds": round(time.perf_counter() - t, 2)})
            print(m, pol, round(rows[-1]["ratio"], 3), round(rows[-1]["ratio_ideal"], 3),
                  flush=True)
    prov = provenance()
    md = [f"# Minimum budget by policy, batch {args.batch} (float32, MiB = 2^20 bytes)\n",
          f"Planned with `python bench/plan_min_budget.py` on {prov['device']}, {prov['date']}, "
          f"commit {prov['commit']}. Workspace = the CPU kernels' im2col sub-blocks (<= 4 MiB; "
          "a convolution runs without one when it does not fit). Gradients of tensors that feed "
          "several layers are accumulated in place. neuron's bound: its largest step with its "
          "preferred workspace, plus resident parameters and momentum; ideal bound: the same "
          "without workspace (the layer's inputs, outputs, gradients and parameters).\n",
          "| model | " + " | ".join(f"{p} min MiB" for p in POLICIES) +
          " | neuron's bound MiB | ideal bound MiB | superneurons / neuron's bound | "
          "superneurons / ideal bound |",
          "|---|" + "---|" * (len(POLICIES) + 4)]
    for m in args.models.split(","):
        rs = {r["policy"]: r for r in rows if r["model"] == m}
        md.append(f"| {m} | " + " | ".join(f"{rs[p]['min_budget_bytes'] / 2**20:,.0f}"
                                           for p in POLICIES) +
                  f" | {rs['superneurons']['lower_bound_bytes'] / 2**20:,.0f} | "
                  f"{rs['superneurons']['ideal_bound_bytes'] / 2**20:,.0f} | "
                  f"{rs['superneurons']['ratio']:.3f} | {rs['superneurons']['ratio_ideal']:.3f} |")
    write("plan_min_budget", {"provenance": prov, "rows": rows}, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
