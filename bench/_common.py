"""Shared bits of the benchmark scripts: where a number came from, and writing results."""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def git_commit() -> str:
    """HEAD, with -dirty when the tree has uncommitted changes. ``NEURON_SOURCE_COMMIT`` wins
    when set: a device machine receives the working tree with the .git of the session's start,
    so its own HEAD names an older commit (seen 2026-11-23); put the commit sent in the
    command, e.g. ``NEURON_SOURCE_COMMIT=5cfa70a bash bench/gpu/contact.sh ...``."""
    if os.environ.get("NEURON_SOURCE_COMMIT"):
        return os.environ["NEURON_SOURCE_COMMIT"]
    root = os.path.dirname(RESULTS)
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                             text=True, check=True).stdout.strip()
        # results written by other benchmarks do not make the code that produced this dirty
        dirty = subprocess.run(["git", "status", "--porcelain", "--", ":(top)",
                                ":(top,exclude)bench/results"],
                               cwd=root, capture_output=True, text=True).stdout.strip()
        return out + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def provenance(device: str | None = None) -> dict:
    """Where a result came from. The load average says how shared the cores were: timings
    taken under load are slower than on a quiet machine."""
    commit = git_commit()
    commit = commit[:12] + ("-dirty" if commit.endswith("-dirty") else "")   # keep the mark
    return {"date": datetime.date.today().isoformat(), "commit": commit,
            "device": device or f"CPU ({platform.processor() or platform.machine()}, "
                                f"{os.cpu_count()} cores), planning only",
            "python": platform.python_version(), "command": " ".join(sys.argv),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}


def load_result(name: str, results: str = RESULTS) -> dict | None:
    """``results``/NAME.json, or None where there is none."""
    path = os.path.join(results, name + ".json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def write(name: str, payload: dict, markdown: str) -> None:
    os.makedirs(RESULTS, exist_ok=True)
    if isinstance(payload.get("provenance"), dict):
        payload["provenance"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    with open(os.path.join(RESULTS, name + ".json"), "w") as f:
        json.dump(payload, f, indent=1)
    with open(os.path.join(RESULTS, name + ".md"), "w") as f:
        f.write(markdown)
    print(markdown)


def library_dirty() -> bool:
    """Whether the library code a result came from has uncommitted changes."""
    root = os.path.dirname(RESULTS)
    try:
        return bool(subprocess.run(["git", "status", "--porcelain", "--", "neuron", "setup.py"],
                                   capture_output=True, text=True, cwd=root).stdout.strip())
    except OSError:
        return False


def gpu_setup(script: str, plan_only: bool):
    """(bench.gpu.runs module, device description) for a GPU run, (None, None) with --plan-only;
    exits with a clear message when PyTorch or CUDA is missing."""
    if plan_only:
        return None, None
    try:
        from bench.gpu import runs as TM
    except ImportError as e:
        sys.exit(f"{script}: the GPU path needs PyTorch and CuPy ({e}); use --plan-only without "
                 "a GPU")
    return TM, TM.require_cuda(script)


def arg_parser(doc: str) -> argparse.ArgumentParser:
    """A parser whose help is the script's docstring (first paragraph, then the rest)."""
    return argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                   epilog="\n\n".join(doc.split("\n\n")[1:]),
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def host_budget_for(arg: str | None, TM=None) -> int:
    """Host bytes offloaded tensors may use: --host-budget if given; else the runtime's own
    pinned-memory cap (neuron.memory.host_budget: PINNED_FRACTION of RAM) of this GPU machine,
    or, planning without a GPU, of the 128 GiB GPU machine. A plan never counts on host bytes
    the runtime would refuse to pin."""
    from neuron.memory.host_budget import default_host_cap
    from neuron.units import parse_bytes
    gib = 1 << 30
    if arg:
        return parse_bytes(arg)
    if TM is not None and TM.host_memory_bytes():
        return default_host_cap(TM.host_memory_bytes())
    return default_host_cap(128 * gib)
