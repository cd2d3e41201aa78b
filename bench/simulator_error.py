"""Simulated against measured iteration time (issue 12): is the simulated clock right?

For each model: profile its kernels (`neuron profile`: liveness, per-layer times, the executor's per-step
overhead, memcpy bandwidth) and, round-robin with the profiling iterations, run real training
iterations of each policy on the device; compare the measured iteration with the makespan the
simulated clock computes from that policy's event log on the profile. On shared cores the
minimum over repeats is used for both (uncontended times), per kernel and per iteration, and
by default the clock is the process's CPU time with single-threaded BLAS (--clock cpu): on
cores shared with other jobs, wall time varied by 2x between consecutive runs here. Policies: liveness
(unbounded arena) and superneurons at half the liveness peak (or at its own minimum budget
where the resident parameters alone exceed that) (offload, recompute and
compaction all exercised). Target: within 10% on the CPU device, 5% on a GPU. On a GPU the
profile is pipelined (host issue + CUDA-event kernel times, memory/costmodel.py) and the serial
model (each step between two synchronizations) is reported beside it.

    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 nice python bench/simulator_error.py   # CPU
    python bench/simulator_error.py --device cuda           # GPU (unverified in this session)

On a GPU machine the contact kit runs the same measurement as its stage `simulator`
(bench/gpu/simulator.py: ``bash bench/gpu/contact.sh $OUT simulator``), and
bench/gpu/import_results.py writes its rows here as the "gpu" list.

Writes bench/results/simulator_error.{json,md}: {"cpu": [{"model", "policy", "simulated_s",
"measured_s", "rel_error"}, ...], "gpu": [...]} (a device's list is kept from an earlier run
when this run is on the other device).
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import RESULTS, arg_parser, provenance, write  # noqa: E402

#: (name, model, batch, input side): DenseNet-121 at 112 too, to keep the CPU run in minutes
MODELS = [("resnet50", 8, 112), ("densenet121", 8, 112)]


def parse_args(argv=None):
    ap = arg_parser(__doc__)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--repeat", type=int, default=3, help="timed iterations per case")
    ap.add_argument("--models", default=",".join(m[0] for m in MODELS))
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                    help="CPU device: the process's CPU seconds (default; single-threaded BLAS, "
                    "so that other users of shared cores do not inflate them) or wall seconds")
    return ap.parse_args(argv)


def markdown(payload) -> str:
    """One table per device that has rows (the other device's rows are kept from its run)."""
    md = []
    for key in ("cpu", "gpu"):
        rows = payload.get(key) or []
        if not rows:
            continue
        target = 0.10 if key == "cpu" else 0.05
        serial = any(r.get("simulated_serial_s") is not None for r in rows)
        md += [f"# Simulated vs measured iteration time ({key})", "",
               f"{payload.get(f'{key}_provenance')}", "",
               "| model | policy | budget | simulated s | measured s | error | within target |"
               + (" serial model s | serial error |" if serial else ""),
               "|---|---|---|---|---|---|---|" + ("---|---|" if serial else "")]
        for r in rows:
            b = "unbounded" if r["budget_bytes"] is None else f"{r['budget_bytes'] / 2**20:.0f} MiB"
            extra = ""
            if serial and r.get("simulated_serial_s") is not None:
                extra = f" {r['simulated_serial_s']:.3f} | {100 * r['serial_rel_error']:+.1f}% |"
            elif serial:
                extra = " | |"
            md.append(f"| {r['model']} | {r['policy']} | {b} | {r['simulated_s']:.3f} | "
                      f"{r['measured_s']:.3f} | {100 * r['rel_error']:+.1f}% | "
                      f"{'yes' if abs(r['rel_error']) <= target else 'NO'} (±{100 * target:.0f}%) |"
                      + extra)
        md.append("")
    return "\n".join(md)


def _gpu_name() -> str:
    from bench.gpu.kit import device_name
    return device_name("cuda")


def make_case(graph, batch, policy, budget, device):
    from neuron.executor import Executor
    from neuron.memory.profile import random_batch, timing_optimizer
    ex = Executor(graph, batch, device=device, policy=policy, budget=budget,
                  optimizer=timing_optimizer())
    x, y = random_batch(graph, batch)
    ex.train_step(x, y)                                  # warm-up
    return {"ex": ex, "x": x, "y": y, "policy": policy, "budget": budget, "times": []}


def finish_case(case, batch, cost):
    from neuron.memory.clock import makespan
    ex, budget = case["ex"], case["budget"]
    measured = min(case["times"])                        # uncontended, as the profile
    sim = ex.simulate(budget, trace=False, events=True)
    rep = makespan(sim["events"], ex.steps, batch, cost)
    # a GPU profile is pipelined (host issue + event-timed kernels); the serial model it
    # replaced (each step timed between synchronizations) is kept beside it for comparison
    serial = makespan(sim["events"], ex.steps, batch, cost.serial()).makespan_s \
        if cost.pipelined else None
    return {"policy": case["policy"], "budget_bytes": budget, "simulated_s": rep.makespan_s,
            "cost_model": "pipelined" if cost.pipelined else "serial",
            "simulated_serial_s": serial,
            "serial_rel_error": None if serial is None else serial / measured - 1.0,
            "measured_s": measured, "rel_error": rep.makespan_s / measured - 1.0,
            "bytes_moved": rep.bytes_moved, "recompute_s": rep.recompute_s,
            "compaction_s": rep.compaction_s, "copy_s": rep.copy_s,
            "measured_all_s": case["times"]}


def _spec(m):
    """(name, batch, side, build_model kwargs) from a MODELS-style tuple (the kwargs optional)."""
    name, batch, side, *rest = m
    return name, batch, side, (rest[0] if rest else {})


def measure(models, repeat: int, device: str, profile_dir: str, *, clock: str = "cpu",
            deadline: float | None = None, errors: list | None = None):
    """The measurement: for each ``(name, batch, side[, build_model kwargs])`` of ``models``,
    profile it on ``device`` round-robin with ``repeat`` timed iterations of each policy, write
    the profile to ``profile_dir/profile_<name>_b<batch>_<side>_<device>.json`` and compare the
    simulated makespans with the measured iterations. Returns ``(rows, provenance)``.

    ``clock`` applies to the CPU device only (a GPU is timed in wall seconds). ``deadline``
    (a ``time.perf_counter()`` value): models that would start after it are skipped. With
    ``errors`` (a list), a model that raises is recorded there as ``{"model", "error"}`` and the
    next one runs; without it the exception propagates (the script's behaviour)."""
    import time

    from neuron.memory.costmodel import cpu_detail
    clock = clock if device == "cpu" else "wall"
    rows = []
    for m in models:
        name, batch, side, kwargs = _spec(m)
        if deadline is not None and time.perf_counter() > deadline:
            if errors is not None:
                errors.append({"model": name, "error": "skipped: the stage's deadline passed"})
            continue
        try:
            rows += _measure_one(name, batch, side, kwargs, repeat, device, profile_dir, clock)
        except Exception as e:          # noqa: BLE001 (recorded when asked to, else raised)
            if errors is None:
                raise
            errors.append({"model": name, "error": f"{type(e).__name__}: {str(e)[:500]}"})
    prov = provenance(
        f"CPU ({cpu_detail()}, {os.cpu_count()} cores shared with other jobs), clock {clock}"
        if device == "cpu" else _gpu_name())
    return rows, prov


def _measure_one(name, batch, side, kwargs, repeat, device, profile_dir, clock) -> list:
    from neuron.executor import Executor
    from neuron.memory.costmodel import CostModel
    from neuron.memory.profile import Profiler, measure_iterations
    from neuron.models import build_model
    from neuron.plan import plan
    graph = build_model(name, in_shape=(3, side, side), **kwargs)
    live_peak = Executor(graph, batch, device="virtual",
                         policy="liveness").simulate(None, trace=False)["peak_bytes"]
    # half the liveness peak, or superneurons' minimum where parameters alone exceed it
    sn_min = plan(graph, batch, policy="superneurons", trace=False)["min_budget_bytes"]
    cases = [make_case(graph, batch, "liveness", None, device),
             make_case(graph, batch, "superneurons", max(live_peak // 2, sn_min), device)]
    prof = Profiler(graph, batch, device=device, clock=clock, model=name)
    for _ in range(repeat):             # round-robin: every run sees the same contention
        prof.round()
        for c in cases:
            c["times"] += measure_iterations(c["ex"], c["x"], c["y"], 1, clock)
    prof = prof.result()
    path = os.path.join(profile_dir, f"profile_{name}_b{batch}_{side}_{prof['device']}.json")
    os.makedirs(profile_dir, exist_ok=True)
    with open(path, "w") as f:
        json.dump(prof, f, indent=1)
    cost = CostModel.from_profile(path)
    rows = []
    for c in cases:
        r = finish_case(c, batch, cost)
        r.update(model=f"{name} b{batch} {side}x{side}", profile=os.path.basename(path),
                 clock=clock)
        rows.append(r)
        print(f"{r['model']} {r['policy']}: simulated {r['simulated_s']:.3f} s, measured "
              f"{r['measured_s']:.3f} s ({100 * r['rel_error']:+.1f}%)", flush=True)
    del cases
    return rows


def merge(old: dict | None, key: str, rows: list, prov: dict) -> dict:
    """simulator_error.json's payload: ``old``'s lists and provenances, ``key``'s replaced."""
    payload = {"cpu": [], "gpu": []}
    if old:
        payload.update({k: old.get(k, []) for k in ("cpu", "gpu")})
        payload.update({f"{k}_provenance": old[f"{k}_provenance"] for k in ("cpu", "gpu")
                        if f"{k}_provenance" in old})
    payload[key] = rows
    payload[f"{key}_provenance"] = prov
    return payload


def main(argv=None):
    args = parse_args(argv)
    wanted = args.models.split(",")
    rows, prov = measure([m for m in MODELS if m[0] in wanted], args.repeat, args.device,
                         RESULTS, clock=args.clock)
    key = "cpu" if args.device == "cpu" else "gpu"
    out_path = os.path.join(RESULTS, "simulator_error.json")
    old = None
    if os.path.exists(out_path):
        with open(out_path) as f:
            old = json.load(f)
    payload = merge(old, key, rows, prov)
    write("simulator_error", payload, markdown(payload))


if __name__ == "__main__":
    main()
