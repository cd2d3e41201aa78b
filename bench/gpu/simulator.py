"""Stage `simulator` of the GPU contact kit: simulated against measured iteration time on the
device (bench/simulator_error.py's measurement, run by the kit instead of by hand).

For each model of bench/simulator_error.py (ResNet-50 and DenseNet-121, batch 8 at 112x112):
profile its kernels with ``neuron.memory.profile.Profiler`` (on a GPU the profile is pipelined:
host issue times and CUDA-event kernel times), run liveness and superneurons iterations
round-robin with the profiling rounds, and compare each measured iteration with the makespan of
the simulated clock. Each row also has ``simulated_serial_s`` / ``serial_rel_error``: the older
serial model (every step between two synchronizations) on the same profile.

Writes ``<out>/simulator.json`` (the kit's contract plus ``rows``, ``provenance``, ``profiles``,
``errors``, ``target``, ``max_abs_rel_error``, ``max_abs_serial_rel_error``) and
the profiles beside it as ``<out>/profile_<model>_b<batch>_<side>_<device>.json``;
bench/gpu/import_results.py turns them into bench/results/simulator_error.{json,md} (the "gpu"
list) and bench/results/profile_*.json. ``ran`` means every model was measured; ``target_met``
whether the error is within the target (5% on a GPU, 10% on the CPU).

    bash bench/gpu/contact.sh $OUT simulator       # on the GPU machine (limit 150 s)

``--smoke`` (CPU tests): ResNet-20's little sibling (resnet_cifar depth 8) at 16x16, batch 2,
one round, in seconds.
"""
from __future__ import annotations

import os
import sys
import time

from bench.gpu.kit import device_name, stage_parser, write_stage

from bench import simulator_error as SE

#: --smoke: (name, batch, side, build_model kwargs)
SMOKE = [("resnet_cifar", 2, 16, {"depth": 8})]
TARGET = {"cuda": 0.05, "cpu": 0.10}


def verdict_of(rows, errors, target: float) -> tuple[bool, str, dict]:
    """(ran, detail line, summary fields with ``target_met``) of a run's rows."""
    if not rows:
        why = "; ".join(f"{e['model']}: {e['error']}" for e in errors)[:300]
        return False, f"no model measured ({why or 'no models'})", {
            "max_abs_rel_error": None, "max_abs_serial_rel_error": None, "target_met": None}
    worst = max(abs(r["rel_error"]) for r in rows)
    serial = [abs(r["serial_rel_error"]) for r in rows if r.get("serial_rel_error") is not None]
    worst_serial = max(serial) if serial else None
    met = worst <= target
    kind = rows[0].get("cost_model", "serial")
    line = (f"{kind} model: max |error| {100 * worst:.1f}%"
            + (f" (serial {100 * worst_serial:.1f}%)" if worst_serial is not None else "")
            + f"; target {100 * target:.0f}%: {'met' if met else 'NOT met'}"
            + f"; {len(rows)} rows")
    if errors:
        line += f"; {len(errors)} model(s) failed: " + ", ".join(e["model"] for e in errors)
    return not errors, line, {"max_abs_rel_error": worst, "max_abs_serial_rel_error": worst_serial,
                              "target_met": met}


def main(argv=None) -> int:
    p = stage_parser(__doc__)
    p.add_argument("--repeat", type=int, default=None,
                   help="profiling rounds and timed iterations per policy (default 3; 1 smoke)")
    p.add_argument("--models", default=None,
                   help="comma-separated subset of bench/simulator_error.py's models")
    p.add_argument("--deadline", type=float,
                   default=0.85 * float(os.environ.get("NEURON_STAGE_LIMIT", 300)),
                   help="seconds after which no further model is started")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    if args.smoke:
        models, repeat = SMOKE, args.repeat or 1
    else:
        models, repeat = SE.MODELS, args.repeat or 3
    if args.models:
        wanted = args.models.split(",")
        models = [m for m in models if m[0] in wanted]
    errors: list = []
    rows, prov = SE.measure(models, repeat, args.device, args.out, clock="cpu",
                            deadline=t0 + args.deadline, errors=errors)
    target = TARGET[args.device]
    ran, detail, summary = verdict_of(rows, errors, target)
    profiles = sorted({r["profile"] for r in rows})
    summary = dict(summary)
    met = summary.pop("target_met")
    write_stage(args.out, "simulator", ran=ran, target_met=met, detail=detail,
                device=device_name(args.device),
                smoke=args.smoke, rows=rows, provenance=prov, profiles=profiles, errors=errors,
                target=target, repeat=repeat,
                models=[f"{m[0]} b{m[1]} {m[2]}x{m[2]}" for m in models],
                seconds=round(time.perf_counter() - t0, 1), **summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
