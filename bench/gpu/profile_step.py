"""Where a neuron training step spends its time on the GPU, beside PyTorch's: a diagnosis, not a
target. For one model and batch (default ResNet-50, 64):

* wall time per step (median of ``--iters``), with the step guard (undo record) on and off;
* a cProfile of the host side (what Python does, and how long it blocks on the GPU);
* the sum of GPU kernel time per step and the top kernels, through torch.profiler (CUPTI sees
  every kernel of the process, CuPy's and cuDNN's included), for neuron and for PyTorch eager.

Writes <out>/profile_step.json and prints the tables.

    python -m bench.gpu.profile_step --out DIR [--model resnet50 --batch 64]
"""
from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import sys
import time

from bench.gpu.kit import median, stage_parser


def _kernel_table(fn, steps, sync):
    """(GPU kernel ms per step, top kernels) of ``steps`` calls of fn under torch.profiler."""
    from torch.profiler import ProfilerActivity, profile
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        sync()
    rows = []
    total = 0.0
    for e in prof.key_averages():
        dev_us = getattr(e, "self_device_time_total", None)
        if dev_us is None:
            dev_us = getattr(e, "self_cuda_time_total", 0.0)
        if dev_us and dev_us > 0:
            rows.append((e.key[:90], e.count / steps, dev_us / 1000.0 / steps))
            total += dev_us / 1000.0 / steps
    rows.sort(key=lambda r: -r[2])
    return total, rows[:25]


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


def profile_neuron(args, x, y, graph):
    import neuron as nn
    from neuron.executor import Executor
    from neuron.kernels import cuda as K
    K.allow_tf32, K.deterministic, K.conv_algo_search = False, False, "find"
    ex = Executor(graph, args.batch, device="cuda", policy="liveness", budget=args.memory,
                  optimizer=nn.SGD(lr=1e-6, momentum=0.9))
    out = {}
    try:
        step = lambda: ex.train_step(x, y)     # noqa: E731
        sync = ex.device.synchronize
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
        out["gpu_kernel_ms"], out["top_kernels"] = _kernel_table(step, 3, sync)
        from neuron.kernels import conv_algos
        out["conv_algos"] = sorted({(r.kind, r.algo_name, r.source) for r in
                                    list(conv_algos.conv_algo_trace)[-400:]})
    finally:
        ex.device.close()
        ex = None
        import gc
        gc.collect()
    return out


def profile_torch(args, name, x, y):
    import torch
    import torch.nn.functional as F
    from bench.gpu import runs as TM
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    model, _, _ = TM.build(name, None)
    model = model.cuda().train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-6, momentum=0.9)
    xd, yd = torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xd), yd)
        loss.backward()
        opt.step()
        return loss.item()
    for _ in range(3):
        step()
    out = {"wall_ms": _wall(step, torch.cuda.synchronize, args.iters)}
    out["gpu_kernel_ms"], out["top_kernels"] = _kernel_table(step, 3, torch.cuda.synchronize)
    return out


def main(argv=None):
    p = stage_parser(__doc__)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--iters", type=int, default=10, help="timed steps per measurement")
    p.add_argument("--memory", default="40GiB", help="neuron's arena")
    args = p.parse_args(argv)
    import numpy as np
    from neuron.models import build_model
    from neuron.units import parse_bytes
    args.memory = parse_bytes(args.memory)
    graph = build_model(args.model)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, *graph.inputs[0].shape)).astype(np.float32)
    y = rng.integers(0, graph.outputs[0].shape[0], args.batch).astype(np.int64)
    res = {"model": args.model, "batch": args.batch}
    for name, fn in (("neuron", lambda: profile_neuron(args, x, y, graph)),
                     ("pytorch", lambda: profile_torch(args, args.model, x, y))):
        try:
            res[name] = fn()
        except Exception:               # noqa: BLE001 (one side's failure is its result)
            import traceback
            res[name] = {"error": traceback.format_exc()[-3000:]}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "profile_step.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    for name in ("neuron", "pytorch"):
        r = res[name]
        if "error" in r:
            print(f"== {name}: ERROR\n{r['error']}")
            continue
        print(f"== {name}: " + ", ".join(f"{k} {v:.1f}" for k, v in r.items()
                                        if isinstance(v, float)))
        for key, count, ms in r["top_kernels"]:
            print(f"   {ms:8.2f} ms  x{count:6.1f}  {key}")
    if "host_profile" in res.get("neuron", {}):
        print(res["neuron"]["host_profile"][-6000:])
    if "conv_algos" in res.get("neuron", {}):
        print("conv algos:", res["neuron"]["conv_algos"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
