"""Shared bits of the benchmark scripts: where a number came from, and writing results."""
from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def provenance(device: str | None = None) -> dict:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=os.path.dirname(RESULTS)).stdout.strip()
    except OSError:
        commit = "unknown"
    return {"date": datetime.date.today().isoformat(), "commit": commit or "unknown",
            "device": device or f"CPU ({platform.processor() or platform.machine()}, "
                                f"{os.cpu_count()} cores), planning only",
            "python": platform.python_version(), "command": " ".join(sys.argv)}


def write(name: str, payload: dict, markdown: str) -> None:
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, name + ".json"), "w") as f:
        json.dump(payload, f, indent=1)
    with open(os.path.join(RESULTS, name + ".md"), "w") as f:
        f.write(markdown)
    print(markdown)
