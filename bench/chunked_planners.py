"""The superneurons planner against capuchin on chunked schedules (memory/chunking.py):
ResNet-50 and DenseNet-121 at batch 32, 2 and 4 chunks, budgets from below one layer's bytes to
2 GiB; simulated iteration time on the analytic H100 (no GPU needed) and planning seconds. The
README's sentence on chunked planning quotes this table.

    nice python bench/chunked_planners.py [--batch 32]
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import arg_parser, provenance, write  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = [("resnet50", c, b) for c in (2, 4)
         for b in ("300MiB", "450MiB", "700MiB", "1200MiB", "2000MiB")] + \
        [("densenet121", c, b) for c in (2, 4) for b in ("250MiB", "600MiB", "1000MiB")]
PLANNERS = ("superneurons", "capuchin")


def plan(model, batch, chunks, budget, planner) -> dict:
    cmd = [sys.executable, "-m", "neuron", "plan", model, "--batch", str(batch), "--budget",
           budget, "--chunks", str(chunks), "--planner", planner, "--time", "--json",
           "--no-min-budget"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": ROOT})
    if out.returncode not in (0, 1):        # 1: the plan does not fit (reported, in JSON)
        raise RuntimeError(f"{' '.join(cmd)}: exit {out.returncode}: {out.stderr.strip()}")
    d = json.loads(out.stdout.strip().splitlines()[-1])
    return {"fits": d["fits"], "ms": d["simulated_time_s"] * 1e3 if d["fits"] else None,
            "plan_s": d.get("plan_seconds"), "variant": d.get("planner_info", {}).get("variant")}


def main(argv=None):
    ap = arg_parser(__doc__)
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args(argv)
    rows = []
    for model, chunks, budget in CASES:
        row = {"model": model, "chunks": chunks, "budget": budget,
               **{p: plan(model, args.batch, chunks, budget, p) for p in PLANNERS}}
        a, b = row["superneurons"]["ms"], row["capuchin"]["ms"]
        row["superneurons_vs_capuchin"] = None if a is None or b is None else a / b - 1
        rows.append(row)
        print(json.dumps(row), flush=True)
    both = [r for r in rows if r["superneurons_vs_capuchin"] is not None]
    behind = [r for r in both if r["superneurons_vs_capuchin"] > 1e-9]
    md = ["# superneurons and capuchin on chunked schedules (simulated, H100 analytic)", "",
          str(provenance()), "",
          "| model | chunks | budget | superneurons ms (plan s) | capuchin ms (plan s) | "
          "superneurons vs capuchin |", "|---|---|---|---|---|---|"]
    for r in rows:
        cell = [f"{r[p]['ms']:.3f} ({r[p]['plan_s']:.1f})" if r[p]["fits"] else "no"
                for p in PLANNERS]
        v = r["superneurons_vs_capuchin"]
        md.append(f"| {r['model']} | {r['chunks']} | {r['budget']} | {cell[0]} | {cell[1]} | "
                  + ("n/a" if v is None else f"{100 * v:+.1f}%") + " |")
    md += ["", f"superneurons ahead or level in {len(both) - len(behind)} of {len(both)} cases "
               "where both fit" + (": behind at " + ", ".join(
                   f"{r['model']} {r['chunks']} chunks {r['budget']} "
                   f"({100 * r['superneurons_vs_capuchin']:+.1f}%)" for r in behind)
               if behind else ""), ""]
    write("chunked_planners", {"provenance": provenance(), "batch": args.batch, "rows": rows},
          "\n".join(md))


if __name__ == "__main__":
    main()
