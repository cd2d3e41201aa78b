"""The analytic clock against measured GPU iterations: how far the planners' default cost model
(memory/costmodel.py: stated peaks, FLOPs and bytes per layer) is from the GPU it plans for.

On a GPU machine the planners time iterations with ``CostModel.analytic(<the GPU's kind>)``
unless given a measured profile. This script takes the iterations the contact kit measured
(bench/results/throughput.json: strict fp32, graph replay, no budget; pressure.json: the run
without a budget) and simulates each cell with the analytic model of the same card. No GPU is
needed: the measured side is read, the simulated side is planned here. A prediction beside a
result; bench/gpu/simulator.py (the kit's `simulator` stage) checks the clock on measured
per-layer profiles instead.

    python bench/analytic_clock_vs_gpu.py

Writes bench/results/analytic_clock_vs_gpu.{json,md}: {"rows": [{"config", "device",
"measured_s", "simulated_s", "rel_error", "measured_at": {date, commit}}], "provenance"}.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import RESULTS, arg_parser, load_result, provenance, write  # noqa: E402

#: the kit's device names -> the analytic model's kinds
KINDS = {"NVIDIA H100 80GB HBM3": "h100", "NVIDIA H200": "h200"}


def measured_cells() -> list[dict]:
    """(model, batch, device, measured seconds per iteration, when) of each strict-fp32 cell
    with no budget the kit measured on a known card."""
    cells = []
    for key, c in (load_result("throughput", RESULTS) or {}).get("configs", {}).items():
        model, batch, prec = key.split(":")
        img_s = (c.get("neuron_img_per_s_by_mode") or {}).get("graph")
        if prec == "fp32" and img_s and c.get("device") in KINDS:
            cells.append({"config": f"{model}:{batch}", "model": model, "batch": int(batch),
                          "device": c["device"], "measured_s": int(batch) / img_s,
                          "what": "throughput, graph replay",
                          "measured_at": {"date": c.get("date"), "commit": c.get("commit")}})
    p = load_result("pressure", RESULTS) or {}
    for key, c in (p.get("configs") or {}).items():
        model, batch = key.split(":")
        if c.get("unbudgeted_s") and p.get("device") in KINDS:
            cells.append({"config": key, "model": model, "batch": int(batch),
                          "device": p["device"], "measured_s": c["unbudgeted_s"],
                          "what": "pressure, no budget",
                          "measured_at": {"date": p.get("date"), "commit": p.get("commit")}})
    return cells


def simulated_s(model: str, batch: int, kind: str) -> float:
    from neuron.memory.costmodel import CostModel
    from neuron.models import build_model
    from neuron.plan import plan
    r = plan(build_model(model), batch, policy="liveness", search_min=False, trace=False,
             cost=CostModel.analytic(kind))
    return r["simulated_time_s"]


def markdown(rows) -> str:
    md = ["# The analytic clock against measured GPU iterations", "",
          "Strict fp32, no budget; measured by the GPU contact kit, simulated here with the "
          "analytic model of the same card (a prediction beside a result).", "",
          "| configuration | device | measured (s) | analytic (s) | error | measured in |",
          "|---|---|---:|---:|---:|---|"]
    for r in rows:
        md.append(f"| {r['config']} | {r['device']} | {r['measured_s']:.4f} | "
                  f"{r['simulated_s']:.4f} | {r['rel_error']:+.0%} | {r['what']}, "
                  f"{(r['measured_at']['date'] or '?')[:10]}, "
                  f"`{(r['measured_at']['commit'] or '?')[:12]}` |")
    return "\n".join(md) + "\n"


def main(argv=None) -> int:
    arg_parser(__doc__).parse_args(argv)
    rows = []
    for c in measured_cells():
        sim = simulated_s(c["model"], c["batch"], KINDS[c["device"]])
        rows.append({**c, "simulated_s": sim, "rel_error": sim / c["measured_s"] - 1.0})
        print(f"{c['config']} on {c['device']}: measured {c['measured_s']:.4f} s, analytic "
              f"{sim:.4f} s ({rows[-1]['rel_error']:+.0%})", flush=True)
    if not rows:
        print("no measured fp32 cell without a budget in bench/results: nothing to compare",
              file=sys.stderr)
        return 1
    write("analytic_clock_vs_gpu", {"rows": rows, "provenance": provenance()}, markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
