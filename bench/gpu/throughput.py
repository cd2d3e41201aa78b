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

The two precisions run in separate child processes: CuPy reads CUPY_TF32 once, when it sets up
cuBLAS. Writes <out>/throughput.json with one ``neuron_over_pytorch`` per configuration.
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
SMOKE_CONFIGS = [("resnet_cifar", 4)]
SMOKE_DEPTH = 8


def parse_args(argv=None):
    p = stage_parser(__doc__)
    p.add_argument("--precision", choices=["fp32", "tf32", "both"], default="both")
    p.add_argument("--memory", default=None,
                   help="bytes for each side (e.g. 40GiB); default 60%% of the GPU")
    p.add_argument("--runs", type=int, default=None, help="timed runs (default 5; smoke 2)")
    p.add_argument("--iters", type=int, default=None,
                   help="iterations per run (default 10; smoke 2)")
    p.add_argument("--warmup", type=int, default=None, help="untimed iterations (default 3; "
                   "smoke 1)")
    p.add_argument("--child", action="store_true", help=argparse_hidden())
    args = p.parse_args(argv)
    for name, full, smoke in (("runs", 5, 2), ("iters", 10, 2), ("warmup", 3, 1)):
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


def run_neuron(name, batch, args, memory, tf32) -> dict:
    import neuron as nn
    from neuron.executor import Executor
    graph, x, y = _data(name, batch, args.smoke)
    if args.device == "cuda":
        from neuron.kernels import cuda as K
        K.allow_tf32, K.deterministic, K.conv_algo_search = tf32, False, "find"
    ex = Executor(graph, batch, device=args.device, policy="liveness", budget=memory,
                  optimizer=nn.SGD(lr=1e-6, momentum=0.9))
    try:
        res = _timed_runs(lambda: ex.train_step(x, y), ex.device.synchronize, args.warmup,
                          args.runs, args.iters, batch)
        res["arena_bytes"] = ex.device.arena_bytes
        res["pool_peak_bytes"] = ex.pool.high_water
    finally:
        if hasattr(ex.device, "close"):
            ex.device.close()
        ex = None
        import gc
        gc.collect()            # the arena is freed with its last view: before PyTorch starts
    return res


def run_torch(name, batch, args, memory, tf32) -> dict:
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
    model = model.to(dev).train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-6, momentum=0.9)
    x_stage, y_stage = torch.empty(x.shape), torch.empty(y.shape, dtype=torch.int64)
    if cuda:
        x_stage, y_stage = x_stage.pin_memory(), y_stage.pin_memory()

    def step():
        x_stage.copy_(torch.from_numpy(x))      # pageable -> pinned, as neuron stages it
        y_stage.copy_(torch.from_numpy(y))
        xd = x_stage.to(dev, non_blocking=True)
        yd = y_stage.to(dev, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xd), yd)
        loss.backward()
        opt.step()
        return loss.item()                      # one read of the loss per iteration

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    try:
        res = _timed_runs(step, sync, args.warmup, args.runs, args.iters, batch)
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


def child(args) -> int:
    """One precision, every configuration; prints one JSON line per configuration."""
    tf32 = args.precision == "tf32"
    from neuron.units import parse_bytes
    memory = parse_bytes(args.memory) if args.memory else default_memory(args.device)
    for name, batch in (SMOKE_CONFIGS if args.smoke else CONFIGS):
        row = {"model": name, "batch": batch, "precision": args.precision,
               "memory_bytes": memory}
        for side, fn in (("neuron", run_neuron), ("pytorch", run_torch)):
            try:
                row[side] = fn(name, batch, args, memory, tf32)
            except Exception as e:          # noqa: BLE001 (keep the other side's numbers)
                row[side] = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
        n, t = row["neuron"].get("img_per_s"), row["pytorch"].get("img_per_s")
        row["neuron_over_pytorch"] = n / t if n and t else None
        print("ROW " + json.dumps(row), flush=True)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        return child(args)
    if not args.smoke and (args.runs < 5 or args.iters < 10):
        sys.exit("throughput: at least 5 runs of 10 iterations (the issue's protocol)")
    precisions = ["fp32", "tf32"] if args.precision == "both" else [args.precision]
    rows = []
    for prec in precisions:
        env = dict(os.environ, CUPY_TF32="1" if prec == "tf32" else "0")
        cmd = [sys.executable, "-m", "bench.gpu.throughput", "--child", "--precision", prec,
               "--out", args.out, "--device", args.device, "--runs", str(args.runs),
               "--iters", str(args.iters), "--warmup", str(args.warmup)]
        if args.memory:
            cmd += ["--memory", args.memory]
        if args.smoke:
            cmd.append("--smoke")
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
        sys.stdout.write(r.stdout)
        sys.stderr.write(r.stderr[-4000:])
        got = [json.loads(l[4:]) for l in r.stdout.splitlines() if l.startswith("ROW ")]
        if r.returncode != 0 and not got:
            got = [{"precision": prec, "error": f"child exited {r.returncode}: "
                    f"{r.stderr.strip()[-300:]}", "neuron_over_pytorch": None}]
        rows += got
        _write(args, rows, partial=prec != precisions[-1])
    _print_table(rows)
    return 0


def _write(args, rows, partial):
    ratios = [r.get("neuron_over_pytorch") for r in rows]
    ok = bool(rows) and all(x is not None for x in ratios) and not partial
    parts = [f"{r.get('model')}:{r.get('batch')} {r.get('precision')} "
             f"{r['neuron_over_pytorch']:.2f}x" if r.get("neuron_over_pytorch") else
             f"{r.get('model')}:{r.get('batch')} {r.get('precision')} failed" for r in rows]
    met = [x for x in ratios if x is not None and x >= 1.0]
    verdict = (f"{'OK' if ok else 'FAIL' if not partial else 'PARTIAL'}: neuron/PyTorch "
               + ", ".join(parts) + f" ({len(met)}/{len(rows)} at >= 1.0)")
    write_stage(args.out, "throughput", ok, verdict, device=device_name(args.device),
                smoke=args.smoke, rows=rows,
                protocol={"runs": args.runs, "iters": args.iters, "warmup": args.warmup,
                          "statistic": "median img/s over runs"})


def _print_table(rows):
    print("\n| model | batch | precision | neuron img/s | PyTorch img/s | neuron / PyTorch |")
    print("|---|---:|---|---:|---:|---:|")
    for r in rows:
        n = r.get("neuron", {}).get("img_per_s")
        t = r.get("pytorch", {}).get("img_per_s")
        q = r.get("neuron_over_pytorch")
        print(f"| {r.get('model')} | {r.get('batch')} | {r.get('precision')} | "
              f"{f'{n:.1f}' if n else '-'} | {f'{t:.1f}' if t else '-'} | "
              f"{f'{q:.2f}' if q else '-'} |")


if __name__ == "__main__":
    sys.exit(main())
