"""The README's quick start at each precision, on the CPU: test accuracy at bf16 against fp32
(issue 38's target: within 1 point), wall clock, img/s. Trained, not planned: the CPU reference
(mixed_cpu.py) runs every kernel on float32 copies of 2-byte tensors, so it is slower than fp32
there; its speed says nothing about a GPU's.

    python bench/precision_quickstart.py                       # fp32 and bf16, ~6 minutes
    python bench/precision_quickstart.py --precisions fp32,bf16,fp16
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import arg_parser, provenance, write  # noqa: E402
from bench.quickstart import COMMAND  # noqa: E402

TARGET_POINTS = 1.0


def main(argv=None) -> int:
    ap = arg_parser(__doc__)
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--out", default="precision_quickstart")
    args = ap.parse_args(argv)
    prov = provenance(device="CPU (x86_64, 2 cores), training on the CPU")
    rows = []
    for p in args.precisions.split(","):
        cmd = [*COMMAND, "--precision", p, "--no-progress", "--json"]
        t = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "neuron", *cmd], capture_output=True,
                             text=True)
        if out.returncode != 0:
            sys.exit(f"`neuron {' '.join(cmd)}` failed:\n{out.stderr[-2000:]}")
        r = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append({"precision": p, "command": "neuron " + " ".join(cmd),
                     "wall_seconds": round(time.perf_counter() - t, 1),
                     "test_accuracy": r["test_accuracy"], "final_loss": r["final_loss"],
                     "images_per_sec": r["images_per_sec"], "peak_bytes": r["peak_bytes"]})
        print(rows[-1], flush=True)
    base = next((r for r in rows if r["precision"] == "fp32"), None)
    for r in rows:
        r["points_vs_fp32"] = None if base is None else \
            round(100 * (r["test_accuracy"] - base["test_accuracy"]), 2)
        r["within_target"] = None if base is None else abs(r["points_vs_fp32"]) <= TARGET_POINTS
    md = ["# The quick start at each precision (CPU)", "",
          f"`neuron {' '.join(COMMAND)} --precision P`, trained on the CPU; {prov['date']}, "
          f"commit {prov['commit']}, {prov['device']}; command `python {prov['command']}`. "
          f"Target: test accuracy within {TARGET_POINTS:g} point of fp32.", "",
          "| precision | test accuracy | vs fp32 (points) | final loss | img/s | pool peak | wall s |",
          "|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['precision']} | {100 * r['test_accuracy']:.2f}% | "
                  f"{r['points_vs_fp32']} | {r['final_loss']:.4f} | {r['images_per_sec']:.1f} | "
                  f"{r['peak_bytes'] / 2**20:.1f} MiB | {r['wall_seconds']} |")
    md += ["", "The CPU's bf16/fp16 path casts around every kernel and runs without tape replay: "
           "its img/s is a reference implementation's, not a speed claim.", ""]
    write(args.out, {"provenance": prov, "rows": rows, "target_points": TARGET_POINTS},
          "\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
