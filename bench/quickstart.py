"""The README's quick start, measured: its training command run as printed (plus --json),
wall clock, test accuracy, img/s and the pool's peak next to the planned peak.

    python bench/quickstart.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import provenance, write  # noqa: E402

COMMAND = ["train", "resnet_cifar", "--depth", "20", "--dataset", "digits", "--epochs", "15",
           "--batch", "64", "--lr", "0.1"]


def main():
    prov = provenance(device="CPU (x86_64, 2 cores), training on the CPU")
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "neuron", *COMMAND, "--json"],
                       capture_output=True, text=True)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        sys.exit(f"quickstart: `neuron {' '.join(COMMAND)}` failed:\n{p.stderr[-2000:]}")
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    row = {"command": "neuron " + " ".join(COMMAND), "wall_seconds": round(wall, 1),
           "summary": summary}
    s = summary
    md = (f"# Quick start ({prov['date']}, {prov['device']}, commit {prov['commit']})\n\n"
          f"`{row['command']}`: test accuracy {100 * s['test_accuracy']:.2f}%, "
          f"{s['iterations']} iterations, {s['images_per_sec']:.0f} img/s, "
          f"{wall:.0f} s wall clock, pool peak {s['peak_bytes'] / 2**20:.1f} MiB "
          f"(planned {s['planned_peak_bytes'] / 2**20:.1f} MiB); load average "
          f"{prov['load_average_at_start']} at start.\n")
    write("quickstart", {"provenance": prov, "rows": [row]}, md)


if __name__ == "__main__":
    main()
