"""Shared plumbing of the GPU contact kit (bench/gpu/contact.sh and its stage scripts).

Every stage script writes one JSON file ``<out>/<stage>.json`` with at least::

    {"stage": ..., "ran": bool, "target_met": bool | None, "verdict": "one line",
     "device": ..., "date": ..., "commit": ..., "smoke": bool, ...stage fields}

``ran``: the stage measured everything it set out to (no part crashed, none skipped);
``target_met``: whether those measurements meet the stage's target (None: the stage has no
target, or nothing was measured to judge). The two are separate so that a stage that ran and
missed every target reads as such: the verdict line starts with both (``verdict_line``), and the
shell driver prints it. The stage scripts also run on the CPU in a tiny
``--smoke`` mode, so tests/bench/ exercises each stage's logic and JSON contract before any GPU
minute is spent on it.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench._common import git_commit  # noqa: E402


def stage_parser(doc: str) -> argparse.ArgumentParser:
    """--out, --device, --smoke: what every stage script takes."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                epilog="\n\n".join(doc.split("\n\n")[1:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="directory for <stage>.json")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cuda (the real run) or cpu (checks the stage's logic without a GPU)")
    p.add_argument("--smoke", action="store_true",
                   help="tiny sizes, for testing the stage itself (CI runs it on the CPU)")
    return p


def device_name(device: str) -> str:
    """The GPU's name (via CuPy) or a CPU description."""
    if device == "cuda":
        try:
            import cupy as cp
            props = cp.cuda.runtime.getDeviceProperties(0)
            name = props["name"]
            return name.decode() if isinstance(name, bytes) else str(name)
        except Exception as e:          # noqa: BLE001 (reported, not fatal)
            return f"cuda (name unavailable: {type(e).__name__})"
    return f"CPU ({platform.machine()}, {os.cpu_count()} cores)"


def now_utc() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def verdict_line(ran: bool, target_met: bool | None, detail: str) -> str:
    """'RAN, TARGET MET: detail' / 'RAN, TARGET NOT MET: ...' / 'RAN, NO TARGET: ...' /
    'DID NOT RUN, ...': both facts first, never one word that could stand for either."""
    target = {True: "TARGET MET", False: "TARGET NOT MET", None: "NO TARGET JUDGED"}[target_met]
    return f"{'RAN' if ran else 'DID NOT RUN'}, {target}: {detail}"


def all_met(flags) -> bool | None:
    """A stage's target_met from its parts' (None for a part without a verdict): False if any
    part missed, True if every judged part met, None if none was judged."""
    flags = [f for f in flags if f is not None]
    if not flags:
        return None
    return all(flags)


def write_stage(out_dir: str, stage: str, *, ran: bool, target_met: bool | None, detail: str,
                device: str, smoke: bool, **fields) -> dict:
    """Write <out_dir>/<stage>.json (contract in this module's docstring); returns the dict."""
    if target_met is not None:
        target_met = bool(target_met)
    payload = {"stage": stage, "ran": bool(ran), "target_met": target_met,
               "verdict": verdict_line(bool(ran), target_met, detail), "device": device,
               "date": now_utc(), "commit": git_commit(), "smoke": bool(smoke),
               "command": " ".join([os.path.basename(sys.executable), *sys.argv]), **fields}
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{stage}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(payload, f, indent=1, default=_jsonable)
    os.replace(path + ".tmp", path)
    print(f"{stage}: {payload['verdict']}", flush=True)
    return payload


def executor_kwargs(replay: str | None) -> dict:
    """``{"replay": replay}`` when the Executor takes a ``replay`` argument (the replay feature:
    "off" | "tape" | "graph") and a mode was asked for, {} otherwise: the stages run with or
    without it and record which mode ran (``replay_of``)."""
    if replay is None or not executor_has_replay():
        return {}
    return {"replay": replay}


def executor_has_replay() -> bool:
    import inspect

    from neuron.executor import Executor
    return "replay" in inspect.signature(Executor.__init__).parameters


def replay_of(executor) -> str:
    """The replay mode an executor actually ran: its own record when it keeps one (``replay``
    or ``replay_mode`` attribute), "off" for an Executor without the feature (the stages also
    record ``executor_has_replay()`` beside it)."""
    if not executor_has_replay():
        return "off"
    r = getattr(executor, "replay", None)       # {"ran": off|tape|graph, ...}
    if isinstance(r, dict) and "ran" in r:
        why = r.get("eager_because") or r.get("tape_because")
        return r["ran"] + (f" ({why})" if why else "")
    return "unknown (Executor took replay= but exposes no mode)"


def _jsonable(o):
    try:
        import numpy as np
        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
    except ImportError:
        pass
    return str(o)


def junit_counts(path: str) -> dict:
    """{passed, failed, skipped, errors} from a pytest --junitxml file, plus the failing and
    skipped test ids (with the reason) so the imported result says what broke."""
    root = ET.parse(path).getroot()
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    failures, skips = [], []
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        kinds = {child.tag: child for child in case}
        if "failure" in kinds:
            counts["failed"] += 1
            failures.append({"test": name, "message": (kinds["failure"].get("message") or "")
                             [:300]})
        elif "error" in kinds:
            counts["errors"] += 1
            failures.append({"test": name, "message": (kinds["error"].get("message") or "")
                             [:300]})
        elif "skipped" in kinds:
            counts["skipped"] += 1
            skips.append({"test": name, "reason": (kinds["skipped"].get("message") or "")[:200]})
        else:
            counts["passed"] += 1
    return {**counts, "failures": failures, "skips": skips}


def median(xs):
    s = sorted(xs)
    n = len(s)
    if n == 0:
        return None
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def rel_err(a, b) -> float:
    """||a - b|| / ||b|| in float64 (|a - b| when b is all zeros: then any difference counts)."""
    import numpy as np
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return float("inf")
    d = float(np.linalg.norm((a - b).ravel()))
    n = float(np.linalg.norm(b.ravel()))
    return d / n if n > 0 else d
