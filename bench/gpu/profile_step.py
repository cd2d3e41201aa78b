"""Where a neuron training step spends its time on the GPU, beside PyTorch's: a diagnosis, not a
target. For one model and batch (default ResNet-50, 64):

* wall time per step (median of ``--iters``), with the step guard (undo record) on and off;
* a cProfile of the host side (what Python does, and how long it blocks on the GPU);
* every GPU activity of a step (kernels, copies, memsets), per stream, through torch.profiler
  (CUPTI sees every kernel of the process, CuPy's and cuDNN's included), for neuron and for
  PyTorch eager alike: read from the profiler's trace, device activities only. (Summing
  ``key_averages()`` counted PyTorch's kernels twice: once as the kernels and once as the
  device time of the aten operators that launched them; neuron has no aten operators, so only
  its side was right.) Per step: the sum over activities, the sum per stream, and the time the
  GPU was busy at all (the union of the intervals over streams, so overlapping streams are not
  counted twice). Every kernel is kept in the JSON; the console shows the largest.

``--fuse on`` profiles neuron with BatchNorm+ReLU and Add+ReLU fused (neuron/fuse.py);
``--fuse both`` profiles it both ways (``neuron`` and ``neuron_fused``), so the fused kernels
are seen beside cuDNN's BatchNorm and the separate ReLU and add passes.

Writes <out>/profile_step.json and prints the tables.

    python -m bench.gpu.profile_step --out DIR [--model resnet50 --batch 64 --fuse both]
"""
from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import sys
import time

from bench.gpu.kit import median, stage_parser, verdict_line


#: trace categories of device activities (Kineto's chrome trace); CPU-side events (operators,
#: runtime calls such as cudaLaunchKernel) have other categories and are never counted
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def device_time_table(trace_events, steps: int) -> dict:
    """Per-step device time of a profiler trace (chrome-trace ``traceEvents``): every device
    activity by (stream, name), the sum per stream, the total, and the busy time (union of the
    activity intervals across streams)."""
    rows: dict = {}
    intervals = []
    for e in trace_events:
        if e.get("ph") != "X" or e.get("cat") not in DEVICE_CATEGORIES:
            continue
        args = e.get("args") or {}
        stream = args.get("stream", "?")
        ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
        key = (str(stream), e.get("name", "?"))
        r = rows.setdefault(key, {"stream": str(stream), "name": e.get("name", "?"),
                                  "category": e["cat"], "count": 0, "us": 0.0})
        r["count"] += 1
        r["us"] += dur
        intervals.append((ts, ts + dur))
    kernels = sorted(({"stream": r["stream"], "name": r["name"], "category": r["category"],
                       "count_per_step": r["count"] / steps,
                       "ms_per_step": r["us"] / 1000.0 / steps} for r in rows.values()),
                     key=lambda r: -r["ms_per_step"])
    per_stream: dict = {}
    for k in kernels:
        st = per_stream.setdefault(k["stream"], {"ms_per_step": 0.0, "activities": 0})
        st["ms_per_step"] += k["ms_per_step"]
        st["activities"] += 1
    busy, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            busy += b - a
            end = b
        elif b > end:
            busy += b - end
            end = b
    return {"device_ms_per_step": sum(k["ms_per_step"] for k in kernels),
            "busy_ms_per_step": busy / 1000.0 / steps, "per_stream": per_stream,
            "kernels": kernels}


def _kernel_table(fn, steps, sync, cuda=True):
    """device_time_table of ``steps`` calls of fn under torch.profiler."""
    import tempfile

    from torch.profiler import ProfilerActivity, profile
    sync()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        for _ in range(steps):
            fn()
        sync()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    return device_time_table(trace.get("traceEvents", []), steps)


def _host_profile(fn, steps):
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(steps):
        fn()
    pr.disable()
    s = io.StringIO()
    st = pstats.Stats(pr, stream=s)
    st.sort_stats("tottime").print_stats(25)
    return s.getvalue()


def _wall(fn, sync, iters):
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return median(times) * 1000.0


def profile_neuron(args, x, y, graph, fuse=False):
    import neuron as nn
    from bench.gpu.kit import replay_of
    from neuron.executor import Executor
    cuda = args.device == "cuda"
    if cuda:
        from neuron.kernels import cuda as K
        K.allow_tf32, K.deterministic, K.conv_algo_search = False, False, "find"
    ex = Executor(graph, args.batch, device=args.device, policy="liveness",
                  budget=args.memory if cuda else None, fuse=fuse,
                  optimizer=nn.SGD(lr=1e-6, momentum=0.9))
    out = {}
    try:
        step = lambda: ex.train_step(x, y)     # noqa: E731
        sync = getattr(ex.device, "synchronize", lambda: None)
        for _ in range(3):
            step()
        sync()
        out["wall_ms_guard_on"] = _wall(step, sync, args.iters)
        ex.transactional = False
        out["wall_ms_guard_off"] = _wall(step, sync, args.iters)
        ex.transactional = True
        out["steps"] = len(ex.steps)
        out["host_profile"] = _host_profile(step, 3)
        sync()
        out["device"] = _kernel_table(step, 3, sync, cuda=cuda)
        out["replay"] = replay_of(ex)
        if cuda:
            from bench.gpu.throughput import conv_choices
            from neuron.kernels import conv_algos
            out["conv_algos"] = sorted({(r.kind, r.algo_name, r.source) for r in
                                        list(conv_algos.conv_algo_trace)[-400:]})
            out["conv_choices"] = conv_choices()
    finally:
        if hasattr(ex.device, "close"):
            ex.device.close()
        ex = None
        import gc
        gc.collect()
    return out


def profile_torch(args, name, x, y):
    import torch
    import torch.nn.functional as F
    from bench.gpu import runs as TM
    cuda = args.device == "cuda"
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    model, _, _ = TM.build(name, args.depth)
    model = model.to(args.device).train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-6, momentum=0.9)
    xd, yd = torch.from_numpy(x).to(args.device), torch.from_numpy(y).to(args.device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xd), yd)
        loss.backward()
        opt.step()
        return loss.item()
    for _ in range(3):
        step()
    out = {"wall_ms": _wall(step, sync, args.iters)}
    out["device"] = _kernel_table(step, 3, sync, cuda=cuda)
    return out


def main(argv=None):
    p = stage_parser(__doc__)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--iters", type=int, default=10, help="timed steps per measurement")
    p.add_argument("--memory", default="40GiB", help="neuron's arena")
    p.add_argument("--fuse", choices=["off", "on", "both"], default="off",
                   help="neuron with BatchNorm+ReLU and Add+ReLU fused: off, on, or both "
                   "(a second neuron profile, neuron_fused)")
    args = p.parse_args(argv)
    import numpy as np
    from neuron.models import build_model
    from neuron.units import parse_bytes
    args.memory = parse_bytes(args.memory)
    args.depth = None
    if args.smoke:      # the CPU check of this script: a tiny CIFAR ResNet, two steps
        args.model, args.depth, args.batch, args.iters = "resnet_cifar", 8, 2, 2
    graph = build_model(args.model, depth=args.depth)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, *graph.inputs[0].shape)).astype(np.float32)
    y = rng.integers(0, graph.outputs[0].shape[0], args.batch).astype(np.int64)
    res = {"model": args.model, "batch": args.batch, "fuse": args.fuse}
    sides = {"off": [("neuron", False)], "on": [("neuron", True)],
             "both": [("neuron", False), ("neuron_fused", True)]}[args.fuse]
    runs = [(name, (lambda f: lambda: profile_neuron(args, x, y, graph, fuse=f))(fuse))
            for name, fuse in sides]
    runs.append(("pytorch", lambda: profile_torch(args, args.model, x, y)))
    names = [n for n, _ in runs]
    for name, fn in runs:
        try:
            res[name] = fn()
        except Exception:               # noqa: BLE001 (one side's failure is its result)
            import traceback
            res[name] = {"error": traceback.format_exc()[-3000:]}
    # a diagnosis, not a target: it ran when both sides were profiled
    res["ran"] = all("error" not in res[n] for n in names)
    res["target_met"] = None
    res["verdict"] = verdict_line(res["ran"], None, "; ".join(
        f"{n}: " + ("ERROR" if "error" in res[n] else
                    f"GPU busy {res[n]['device']['busy_ms_per_step']:.2f} ms/step")
        for n in names) + " (a diagnosis)")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "profile_step.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    for name in names:
        r = res[name]
        if "error" in r:
            print(f"== {name}: ERROR\n{r['error']}")
            continue
        dv = r["device"]
        print(f"== {name}: " + ", ".join(f"{k} {v:.1f}" for k, v in r.items()
                                        if isinstance(v, float))
              + f", device ms/step {dv['device_ms_per_step']:.2f} (busy "
              f"{dv['busy_ms_per_step']:.2f}), {len(dv['kernels'])} activities; per stream: "
              + ", ".join(f"{st} {v['ms_per_step']:.2f} ms" for st, v in dv["per_stream"].items()))
        for k in dv["kernels"][:25]:        # the console's extract; the JSON keeps every one
            print(f"   {k['ms_per_step']:8.2f} ms  x{k['count_per_step']:6.1f}  stream "
                  f"{k['stream']:>4}  {k['name'][:90]}")
    if "host_profile" in res.get("neuron", {}):
        print(res["neuron"]["host_profile"][-6000:])
    if "conv_algos" in res.get("neuron", {}):
        print("conv algos:", res["neuron"]["conv_algos"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
