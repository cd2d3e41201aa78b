"""How fast planning answers at extreme depth (no GPU): `neuron plan resnet --depth 9998
--batch 16 --offload-params --json` and `neuron deepest resnet --batch 16 --budget 12GiB
--offload-params`, each timed as a subprocess, wall clock.

    python bench/plan_speed.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import provenance, write  # noqa: E402

COMMANDS = [
    ["plan", "resnet", "--depth", "9998", "--batch", "16", "--offload-params", "--json"],
    ["deepest", "resnet", "--batch", "16", "--budget", "12GiB", "--offload-params", "--json"],
    ["deepest", "resnet", "--batch", "16", "--budget", "12GiB", "--json"],
]
TARGETS = {"plan": 30.0, "deepest": 120.0}


def main():
    rows = []
    for cmd in COMMANDS:
        t = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "neuron", *cmd], capture_output=True, text=True)
        secs = time.perf_counter() - t
        last = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode in (0, 1) else {}
        answer = (f"deepest {last['deepest']}" if "deepest" in last else
                  f"min budget {last.get('min_budget_bytes')} B, fits {last.get('fits')}")
        rows.append({"command": "neuron " + " ".join(cmd), "seconds": round(secs, 1),
                     "target_seconds": TARGETS[cmd[0]], "returncode": p.returncode,
                     "answer": answer, "min_budget_bytes": last.get("min_budget_bytes")})
        print(rows[-1], flush=True)
    prov = provenance()
    md = ["# Planning speed at extreme depth\n",
          f"`python bench/plan_speed.py` on {prov['device']}, {prov['date']}, commit "
          f"{prov['commit']}.\n", "| command | seconds | target | answer |", "|---|---|---|---|"]
    for r in rows:
        md.append(f"| `{r['command']}` | {r['seconds']} | < {r['target_seconds']:.0f} | "
                  f"{r['answer']} |")
    write("plan_speed", {"provenance": prov, "rows": rows}, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
