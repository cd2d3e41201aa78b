"""Stage `throughput` of the GPU contact kit: training img/s, neuron vs PyTorch eager, same GPU,
same job, same model and batch, NCHW, convolution algorithms by measurement on both sides
(cudnn.benchmark; cudnnFind*AlgorithmEx).

Configurations: ResNet-50 at batch 64 and 128, VGG16 at batch 64, each in strict float32 and in
TF32. Equal footing:

* the same memory: neuron's arena is ``--memory`` bytes (default 60% of the GPU) and PyTorch's
  caching allocator is capped at the same bytes (``set_per_process_memory_fraction``); each
  side's cuDNN workspaces come out of that memory;
* the same input path: the batch is a pageable NumPy array; every iteration copies it into a
  pinned staging buffer and from there to the GPU asynchronously (neuron's ``train_step`` does
  this inside; PyTorch does ``pinned.copy_(from_numpy(x)); x.to(cuda, non_blocking=True)``), and
  both read the loss back once per iteration;
* median over ``--runs`` (>= 5) timed runs of ``--iters`` (>= 10) iterations after ``--warmup``.

neuron runs each configuration once per replay mode (``--modes``, default off, tape and graph:
eager execution, the recorded iteration replayed as pre-bound calls, and as one CUDA graph),
each in an Executor of its own; a mode is passed only where the Executor takes ``replay=``, and
each run records the mode that actually ran. Without the argument, only "off" runs and the other
modes say why.

Mixed precision (issue 38): ``--precision bf16``, ``fp16`` or ``mixed`` (both) runs neuron at that
precision (``Executor(precision=)``: float32 masters, 2-byte feature maps) against PyTorch eager
under ``torch.autocast(dtype=torch.bfloat16 / float16)`` (fp16 with torch's GradScaler, as neuron
scales its loss), PyTorch measured in NCHW and in channels_last (``layouts`` in its result; the
ratio is against the faster, ``pytorch.layout``). The kit's ``throughput_mixed`` stage runs
``resnet50:128`` so (``--stage throughput_mixed``), inside the ``second`` command.

``--layout nhwc`` stores neuron's feature maps and convolution weights channels-last
(``Executor(layout=)``, neuron/memory/layout.py: cuDNN's NHWC tensor-core convolutions); the row
records the layout neuron ran in. Default nchw.

Each precision runs in a child process of its own: CuPy reads CUPY_TF32 once, when it sets up
cuBLAS. Writes <out>/throughput.json after every configuration (a stage stopped at its limit
keeps what finished), with per configuration ``neuron_over_pytorch``: the fastest neuron mode
that ran over PyTorch (the Executor's default is the fastest its device supports), and
``neuron_over_pytorch_by_mode``. Targets (issue 36): >= 1.1 in strict fp32, >= 1.2 with TF32.
``--device cpu --smoke`` runs the same code with a tiny network on the CPU (both sides).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from bench.gpu.kit import ROOT, device_name, median, stage_parser, write_stage

CONFIGS = [("resnet50", 64), ("resnet50", 128), ("vgg16", 64)]
MODES = ("off", "tape", "graph")
#: neuron / PyTorch img/s to reach, per precision (issue 36; bf16: issue 38, PyTorch in its
#: faster layout; fp16 has no target of its own: measured beside it)
TARGET = {"fp32": 1.1, "tf32": 1.2, "bf16": 1.1}
MIXED = ("bf16", "fp16")
PRECISION_SETS = {"both": ["fp32", "tf32"], "mixed": list(MIXED)}
LAYOUTS = ("nchw", "channels_last")
SMOKE_CONFIGS = [("resnet_cifar", 4)]
SMOKE_DEPTH = 8


def parse_args(argv=None):
    p = stage_parser(__doc__)
    p.add_argument("--precision", choices=["fp32", "tf32", "bf16", "fp16", "both", "mixed"],
                   default="both", help="both: fp32 and tf32; mixed: bf16 and fp16")
    p.add_argument("--layout", choices=["nchw", "nhwc"], default="nchw",
                   help="neuron's storage layout of 4-d maps and conv weights (Executor(layout=))")
    p.add_argument("--stage", default="throughput",
                   help="the stage name the JSON is written as (<out>/<stage>.json)")
    p.add_argument("--memory", default=None,
                   help="bytes for each side (e.g. 40GiB); default 60%% of the GPU")
    p.add_argument("--runs", type=int, default=None, help="timed runs (default 5; smoke 2)")
    p.add_argument("--iters", type=int, default=None,
                   help="iterations per run (default 10; smoke 2)")
    p.add_argument("--warmup", type=int, default=None, help="untimed iterations (default 4; "
                   "smoke 1)")
    p.add_argument("--modes", default=",".join(MODES),
                   help="neuron replay modes to run, comma-separated (off, tape, graph)")
    p.add_argument("--configs", default=None,
                   help="MODEL:BATCH,... (default resnet50:64,resnet50:128,vgg16:64)")
    p.add_argument("--fuse", choices=["off", "on", "both"], default="off",
                   help="neuron's BatchNorm+ReLU and Add+ReLU fusion (Executor(fuse=True)): "
                   "off, on, or both "
                   "(every mode also run fused, recorded as MODE+fuse beside MODE in the same "
                   "row) (default off)")
    p.add_argument("--child", action="store_true", help=argparse_hidden())
    args = p.parse_args(argv)
    # warm-up: algorithm choice, the two recorded iterations and a first replay (a graph's
    # capture) stay out of the timed runs
    for name, full, smoke in (("runs", 5, 2), ("iters", 10, 2), ("warmup", 4, 3)):
        if getattr(args, name) is None:
            setattr(args, name, smoke if args.smoke else full)
    return args


def argparse_hidden():
    import argparse
    return argparse.SUPPRESS


def _timed_runs(step, sync, warmup, runs, iters, batch) -> dict:
    for _ in range(warmup):
        step()
    sync()
    rates = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        sync()
        rates.append(batch * iters / (time.perf_counter() - t0))
    return {"img_per_s": median(rates), "runs_img_per_s": rates, "iters_per_run": iters}


def _data(name, batch, smoke):
    import numpy as np
    from neuron.models import build_model
    graph = build_model(name, depth=SMOKE_DEPTH if smoke else None)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, *graph.inputs[0].shape)).astype(np.float32)
    y = rng.integers(0, graph.outputs[0].shape[0], batch).astype(np.int64)
    return graph, x, y


def fused_modes(modes: list[str], fuse: str) -> list[str]:
    """--fuse: the neuron runs of a row, "MODE" unfused and "MODE+fuse" fused."""
    if fuse == "off":
        return list(modes)
    return ([] if fuse == "on" else list(modes)) + [f"{m}+fuse" for m in modes]


def run_neuron(name, batch, args, memory, tf32, mode="off", precision=None) -> dict:
    import inspect

    import neuron as nn
    from bench.gpu.kit import executor_has_replay, executor_kwargs, replay_of
    from neuron.executor import Executor
    mode, _, fused = mode.partition("+")            # "tape+fuse": replay tape, fused
    fuse = {}
    if fused:
        if "fuse" not in inspect.signature(Executor).parameters:
            return {"error": "fuse not run: the Executor has no fuse argument"}
        fuse = {"fuse": True}
    if mode != "off" and not executor_has_replay():
        return {"error": f"replay {mode} not run: the Executor has no replay argument"}
    graph, x, y = _data(name, batch, args.smoke)
    if args.device == "cuda":
        from neuron.kernels import conv_algos
        from neuron.kernels import cuda as K
        K.allow_tf32, K.deterministic, K.conv_algo_search = tf32, False, "find"
        conv_algos.conv_algo_trace.clear()      # this run's choices only
    mixed = {"precision": precision} if precision in MIXED else {}
    if args.layout != "nchw":
        mixed["layout"] = args.layout
    ex = Executor(graph, batch, device=args.device, policy="liveness", budget=memory,
                  optimizer=nn.SGD(lr=1e-6, momentum=0.9), **executor_kwargs(mode), **mixed,
                  **fuse)
    try:
        for _ in range(args.warmup):
            ex.train_step(x, y)
        # a replaying executor's batch buffers, filled in place as a loader would: the host's
        # time per step is then the replay's own (host_ms; issue 36's target: <= 1 ms)
        bufs = ex.batch_buffers() if hasattr(ex, "batch_buffers") else None
        xb, yb = x, y
        if bufs:
            xb, yb = list(bufs.values())[:2]
            xb[...], yb[...] = x, y
        res = _timed_runs(lambda: ex.train_step(xb, yb), ex.device.synchronize, 0,
                          args.runs, args.iters, batch)
        res["batch_in_place"] = bool(bufs)
        rep = ex.replay if isinstance(getattr(ex, "replay", None), dict) else {}
        res["host_ms"] = rep.get("host_ms")
        # the tape's operations (bench/graph_ops.py counts them by kind): what host_ms grows with
        res["tape_operations"] = rep.get("operations")
        res["replay"] = replay_of(ex)
        res["arena_bytes"] = ex.device.arena_bytes
        if args.device == "cuda":
            res["conv_choices"] = conv_choices()
        res["pool_peak_bytes"] = ex.pool.high_water
        res["fuse"] = bool(fuse)
        if fuse:
            res["fused_layers"] = len(ex.fused)
    finally:
        if hasattr(ex.device, "close"):
            ex.device.close()
        ex = None
        import gc
        gc.collect()            # the arena is freed with its last view: before PyTorch starts
    return res


def conv_choices() -> dict | None:
    """Which convolution algorithms ran against the fastest FindEx timed, per geometry
    (conv_algos.choice_report; None on a neuron without it): the sums are of one call per
    geometry, a diagnosis of the kernel gap, not a step time."""
    from neuron.kernels import conv_algos
    if not hasattr(conv_algos, "choice_report"):
        return None
    rows = conv_algos.choice_report()
    timed = [r for r in rows if r["chosen_ms"] is not None and r["fastest_ms"] is not None]
    return {"geometries": len(rows),
            "free_block_decided": sum(r["chosen_ms"] > r["fastest_ms"] for r in timed),
            "chosen_ms_sum": round(sum(r["chosen_ms"] for r in timed), 3),
            "fastest_ms_sum": round(sum(r["fastest_ms"] for r in timed), 3),
            "algorithms": sorted({f"{r['kind']}:{r['algo']}" for r in rows}),
            # cuDNN's backend engine plans (cudnn_engines.py): how many calls run one, and
            # why a geometry's engines were not timed (the first few reasons)
            "engine_plans": sum(str(r["algo"]).startswith("engine") for r in rows),
            # per geometry timed both ways: the fastest legacy algorithm against the fastest
            # engine plan, summed (what the engines are worth, one call per geometry)
            **_set_sums(rows),
            "engine_skips": len(getattr(conv_algos, "engine_skips", {})),
            "engine_skip_reasons": sorted(set(getattr(conv_algos, "engine_skips",
                                                      {}).values()))[:5],
            "rows": rows}


def _set_sums(rows) -> dict:
    both = [r for r in rows if r.get("legacy_fastest_ms") is not None
            and r.get("engine_fastest_ms") is not None]
    return {"timed_both_ways": len(both),
            "legacy_fastest_ms_sum": round(sum(r["legacy_fastest_ms"] for r in both), 3),
            "engine_fastest_ms_sum": round(sum(r["engine_fastest_ms"] for r in both), 3)}


def run_torch(name, batch, args, memory, tf32, precision=None, layout="nchw") -> dict:
    """PyTorch eager; ``precision`` bf16/fp16: under torch.autocast of that type (fp16 with a
    GradScaler), the model and batch in ``layout`` (nchw or channels_last)."""
    import contextlib

    import torch
    import torch.nn.functional as F
    from bench.gpu import runs as TM
    cuda = args.device == "cuda"
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    if cuda:
        TM.cap_torch(memory)
    _, x, y = _data(name, batch, args.smoke)
    model, _, _ = TM.build(name, SMOKE_DEPTH if args.smoke else None)
    dev = torch.device(args.device)
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    model = model.to(dev, memory_format=fmt).train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-6, momentum=0.9)
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    autocast = (lambda: torch.autocast(dev.type, dtype=amp_dtype)) if amp_dtype else \
        contextlib.nullcontext
    scaler = torch.amp.GradScaler(dev.type) if precision == "fp16" else None
    x_stage, y_stage = torch.empty(x.shape), torch.empty(y.shape, dtype=torch.int64)
    if cuda:
        x_stage, y_stage = x_stage.pin_memory(), y_stage.pin_memory()

    def step():
        x_stage.copy_(torch.from_numpy(x))      # pageable -> pinned, as neuron stages it
        y_stage.copy_(torch.from_numpy(y))
        xd = x_stage.to(dev, non_blocking=True).contiguous(memory_format=fmt)
        yd = y_stage.to(dev, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = F.cross_entropy(model(xd), yd)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        return loss.item()                      # one read of the loss per iteration

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    try:
        res = _timed_runs(step, sync, args.warmup, args.runs, args.iters, batch)
        res["layout"] = layout
        if amp_dtype is not None:
            res["autocast"] = str(amp_dtype)
        if cuda:
            res["peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
            res["cap_bytes"] = memory
    finally:
        model = opt = None
        TM.free_gpu()
    return res


def default_memory(device) -> int | None:
    if device != "cuda":
        return None
    import cupy as cp
    _, total = cp.cuda.runtime.memGetInfo()
    return int(0.6 * total) // (1 << 20) * (1 << 20)


def configs_of(args):
    if args.smoke:
        return SMOKE_CONFIGS
    if args.configs:
        return [(c.split(":")[0], int(c.split(":")[1])) for c in args.configs.split(",")]
    return CONFIGS


def run_torch_layouts(name, batch, args, memory, precision) -> dict:
    """PyTorch under autocast in each layout; the faster one's figures, with ``layouts``
    holding both (the ratio is taken against the faster, issue 38)."""
    layouts = {}
    for layout in LAYOUTS:
        try:
            layouts[layout] = run_torch(name, batch, args, memory, False, precision, layout)
        except Exception as e:              # noqa: BLE001 (keep the other layout's numbers)
            layouts[layout] = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
    return faster_layout(layouts)


def faster_layout(layouts: dict) -> dict:
    """The result of the layout with the most img/s, its ``layouts`` beside it; an error when
    none ran."""
    ran = {k: v for k, v in layouts.items() if v.get("img_per_s")}
    if not ran:
        return {"error": "; ".join(f"{k}: {v.get('error')}" for k, v in layouts.items()),
                "layouts": layouts}
    best = max(ran, key=lambda k: ran[k]["img_per_s"])
    return dict(ran[best], layout=best, layouts=layouts)


def child(args) -> int:
    """One precision, every configuration; prints one JSON line per configuration."""
    tf32 = args.precision == "tf32"
    mixed = args.precision in MIXED
    from neuron.units import parse_bytes
    memory = parse_bytes(args.memory) if args.memory else default_memory(args.device)
    modes = fused_modes([m for m in args.modes.split(",") if m], args.fuse)
    for name, batch in configs_of(args):
        row = {"model": name, "batch": batch, "precision": args.precision,
                "layout": args.layout, "memory_bytes": memory, "fuse": args.fuse,
                "neuron": {}}
        for mode in modes:
            try:
                row["neuron"][mode] = run_neuron(name, batch, args, memory, tf32, mode,
                                                 args.precision)
            except Exception as e:          # noqa: BLE001 (keep the other modes' numbers)
                row["neuron"][mode] = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
        try:
            row["pytorch"] = run_torch_layouts(name, batch, args, memory, args.precision) \
                if mixed else run_torch(name, batch, args, memory, tf32)
        except Exception as e:              # noqa: BLE001 (keep neuron's numbers)
            row["pytorch"] = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
        print("ROW " + json.dumps(ratios(row)), flush=True)
    return 0


def ratios(row: dict) -> dict:
    """neuron_over_pytorch per mode and for the fastest mode that ran; target and whether met."""
    t = (row.get("pytorch") or {}).get("img_per_s")
    by_mode = {m: r["img_per_s"] / t for m, r in (row.get("neuron") or {}).items()
               if r.get("img_per_s") and t}
    best = max(by_mode, key=by_mode.get) if by_mode else None
    target = TARGET.get(row.get("precision"))
    row.update(neuron_over_pytorch_by_mode=by_mode, neuron_mode=best,
               neuron_over_pytorch=by_mode.get(best), target=target,
               target_met=(by_mode[best] >= target) if best and target else None)
    return row


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        return child(args)
    if not args.smoke and (args.runs < 5 or args.iters < 10):
        sys.exit("throughput: at least 5 runs of 10 iterations (the issue's protocol)")
    precisions = PRECISION_SETS.get(args.precision, [args.precision])
    expected = len(precisions) * len(configs_of(args))
    rows = []
    for prec in precisions:
        env = dict(os.environ, CUPY_TF32="1" if prec == "tf32" else "0")
        cmd = [sys.executable, "-m", "bench.gpu.throughput", "--child", "--precision", prec,
               "--out", args.out, "--device", args.device, "--runs", str(args.runs),
               "--iters", str(args.iters), "--warmup", str(args.warmup), "--modes", args.modes,
                "--layout", args.layout, "--fuse", args.fuse]
        if args.memory:
            cmd += ["--memory", args.memory]
        if args.configs:
            cmd += ["--configs", args.configs]
        if args.smoke:
            cmd.append("--smoke")
        # each configuration's row is written as soon as the child prints it
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        got = 0
        for line in proc.stdout:
            sys.stdout.write(line)
            if line.startswith("ROW "):
                rows.append(json.loads(line[4:]))
                got += 1
                _write(args, rows, expected)
        rc = proc.wait()
        if rc != 0 and not got:
            rows.append({"precision": prec, "error": f"child exited {rc} (see the log)",
                         "neuron_over_pytorch": None})
        _write(args, rows, expected)
    _print_table(rows)
    return 0


def _write(args, rows, expected):
    ran = len(rows) == expected and all(r.get("neuron_over_pytorch") is not None for r in rows)
    from bench.gpu.kit import all_met, executor_has_replay
    target_met = all_met([r.get("target_met") for r in rows])
    if target_met and not ran:
        target_met = None       # what ran met its target, but not everything ran
    parts = [f"{r.get('model')}:{r.get('batch')} {r.get('precision')} "
             + (f"{r['neuron_over_pytorch']:.2f}x ({r['neuron_mode']})"
                if r.get("neuron_over_pytorch") else "failed") for r in rows]
    met = sum(bool(r.get("target_met")) for r in rows)
    targets = ", ".join(f"{p} >= {t}" for p, t in TARGET.items()
                        if any(r.get("precision") == p for r in rows))
    detail = ("neuron/PyTorch " + ", ".join(parts)
              + f"; {met}/{expected} at target ({targets or 'none'})"
              + ("" if len(rows) == expected else
                                      f"; {len(rows)}/{expected} configurations done"))
    host = [f"{r.get('model')}:{r.get('batch')} {r.get('precision')}"
            + ("" if m == "graph" else f" {m}") + f" {v['host_ms']:.2f} ms"
            for r in rows for m, v in (r.get("neuron") or {}).items()
            if m.partition("+")[0] == "graph" and v.get("host_ms") is not None]
    if host:
        detail += "; host per graph step (target <= 1 ms): " + ", ".join(host)
    missing = sorted({m for r in rows for m, v in (r.get("neuron") or {}).items()
                      if not v.get("img_per_s")})
    if missing:
        detail += f"; neuron modes without a figure: {', '.join(missing)}" + (
            "" if executor_has_replay() else " (the Executor has no replay argument)")
    layouts = [f"{r.get('model')}:{r.get('batch')} {r.get('precision')} PyTorch " + ", ".join(
        f"{k} {v['img_per_s']:.1f}" for k, v in (r.get("pytorch") or {}).get("layouts", {}).items()
        if v.get("img_per_s")) for r in rows if (r.get("pytorch") or {}).get("layouts")]
    if layouts:
        detail += "; img/s by layout: " + "; ".join(layouts)
    write_stage(args.out, args.stage, ran=ran, target_met=target_met, detail=detail,
                device=device_name(args.device), smoke=args.smoke, rows=rows,
                executor_has_replay=executor_has_replay(),
                protocol={"runs": args.runs, "iters": args.iters, "warmup": args.warmup,
                          "modes": args.modes.split(","),
                          "statistic": "median img/s over runs"})


def _print_table(rows):
    print("\n| model | batch | precision | neuron img/s (off / tape / graph) | PyTorch img/s "
          "| neuron / PyTorch |")
    print("|---|---:|---|---|---:|---:|")
    for r in rows:
        n = " / ".join(f"{v['img_per_s']:.1f}" if v.get("img_per_s") else "-"
                       for v in (r.get("neuron") or {}).values())
        t = (r.get("pytorch") or {}).get("img_per_s")
        q = r.get("neuron_over_pytorch")
        print(f"| {r.get('model')} | {r.get('batch')} | {r.get('precision')} | {n} | "
              f"{f'{t:.1f}' if t else '-'} | {f'{q:.2f}' if q else '-'} |")


if __name__ == "__main__":
    sys.exit(main())
