"""min_budget_bytes by policy (baseline -> liveness -> superneurons) and its ratio to the
layer-granularity lower bound, batch 32, planned on a virtual device (no GPU needed).

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
                                           "extra_forward_steps")}
                        | {"ratio": r["min_budget_bytes"] / r["lower_bound_bytes"],
                           "seconds": round(time.perf_counter() - t, 2)})
            print(m, pol, round(rows[-1]["ratio"], 3), flush=True)
    prov = provenance()
    md = [f"# Minimum budget by policy, batch {args.batch} (float32, MiB = 2^20 bytes)\n",
          f"Planned with `python bench/plan_min_budget.py` on {prov['device']}, {prov['date']}, "
          f"commit {prov['commit']}. Workspace = the CPU kernels' chunked im2col.\n",
          "| model | " + " | ".join(f"{p} min MiB" for p in POLICIES) +
          " | lower bound MiB | superneurons / bound |",
          "|---|" + "---|" * (len(POLICIES) + 2)]
    for m in args.models.split(","):
        rs = {r["policy"]: r for r in rows if r["model"] == m}
        md.append(f"| {m} | " + " | ".join(f"{rs[p]['min_budget_bytes'] / 2**20:,.0f}"
                                           for p in POLICIES) +
                  f" | {rs['superneurons']['lower_bound_bytes'] / 2**20:,.0f} | "
                  f"{rs['superneurons']['ratio']:.3f} |")
    write("plan_min_budget", {"provenance": prov, "rows": rows}, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
