"""Training throughput, neuron vs PyTorch eager, same process, same GPU (GPU only).

ResNet-50 at batch 64 and ResNet-152 at batch 32, float32, SGD with momentum, synthetic ImageNet
batches (3x224x224, 1000 classes). Both sides use the same TF32 setting (``--tf32``, off by
default: exact float32 convolutions and GEMMs) and pick convolution algorithms by measurement
(torch: ``cudnn.benchmark = True``; neuron: cudnnFind*AlgorithmEx). neuron runs first and gives
its arena back before PyTorch starts, so neither side inherits the other's cached memory.

Prints a markdown table (img/s and the neuron/torch ratio) and writes the raw numbers with device,
date and git commit to bench/results/throughput-<date>.json. ``python bench/throughput.py --help``
works without a GPU.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))
sys.path.insert(0, ROOT)
from bench._common import git_commit  # noqa: E402

CASES = [("resnet50", 64), ("resnet152", 32)]
BLOCKS = {"resnet50": [3, 4, 6, 3], "resnet101": [3, 4, 23, 3], "resnet152": [3, 8, 36, 3]}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", nargs="*", default=[f"{m}:{b}" for m, b in CASES],
                   help="model:batch pairs (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=3, help="untimed iterations")
    p.add_argument("--iters", type=int, default=10, help="timed iterations")
    p.add_argument("--tf32", action="store_true",
                   help="allow TF32 on both sides (convolutions and matmuls)")
    p.add_argument("--policy", default="liveness", help="neuron memory policy")
    p.add_argument("--skip-torch", action="store_true")
    p.add_argument("--skip-neuron", action="store_true")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    return p.parse_args(argv)


def _time(step, warmup, iters, sync) -> float:
    for _ in range(warmup):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    sync()
    return time.perf_counter() - t0


def run_neuron(name, batch, args, x, y):
    import neuron as nn
    from neuron.executor import Executor
    from neuron.kernels import cuda as K
    from neuron.models import build_model
    K.allow_tf32 = args.tf32
    K.deterministic = False
    K.conv_algo_search = "find"
    graph = build_model(name)
    ex = Executor(graph, batch, device="cuda", policy=args.policy,
                  optimizer=nn.SGD(lr=0.01, momentum=0.9))
    try:
        dt = _time(lambda: ex.train_step(x, y), args.warmup, args.iters, ex.device.synchronize)
        info = ex.device.memory_info()
    finally:
        ex.device.close()
    return {"img_per_s": batch * args.iters / dt, "arena_bytes": info["arena_bytes"]}


def torch_resnet(name, num_classes=1000):
    """torchvision's ResNet when installed, else the same architecture written out here
    (Bottleneck v1.5: stride on the 3x3, as torchvision)."""
    import torch.nn as tnn
    try:
        import torchvision
        return getattr(torchvision.models, name)(num_classes=num_classes)
    except (ImportError, AttributeError):
        pass

    class Bottleneck(tnn.Module):
        def __init__(self, cin, width, stride):
            super().__init__()
            cout = width * 4
            self.body = tnn.Sequential(
                tnn.Conv2d(cin, width, 1, bias=False), tnn.BatchNorm2d(width), tnn.ReLU(True),
                tnn.Conv2d(width, width, 3, stride, 1, bias=False), tnn.BatchNorm2d(width),
                tnn.ReLU(True), tnn.Conv2d(width, cout, 1, bias=False), tnn.BatchNorm2d(cout))
            self.short = None
            if stride != 1 or cin != cout:
                self.short = tnn.Sequential(tnn.Conv2d(cin, cout, 1, stride, bias=False),
                                            tnn.BatchNorm2d(cout))
            self.relu = tnn.ReLU(True)

        def forward(self, x):
            s = x if self.short is None else self.short(x)
            return self.relu(self.body(x) + s)

    layers = [tnn.Conv2d(3, 64, 7, 2, 3, bias=False), tnn.BatchNorm2d(64), tnn.ReLU(True),
              tnn.MaxPool2d(3, 2, 1)]
    cin = 64
    for i, (n, width) in enumerate(zip(BLOCKS[name], (64, 128, 256, 512))):
        for j in range(n):
            layers.append(Bottleneck(cin, width, 2 if (j == 0 and i > 0) else 1))
            cin = width * 4
    layers += [tnn.AdaptiveAvgPool2d(1), tnn.Flatten(), tnn.Linear(cin, num_classes)]
    return tnn.Sequential(*layers)


def run_torch(name, batch, args, x, y):
    import torch
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = args.tf32
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    model = torch_resnet(name).cuda().train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    xt = torch.from_numpy(x).cuda()
    yt = torch.from_numpy(y).cuda()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(xt), yt)
        loss.backward()
        opt.step()
        return loss.item()          # one host sync per step, as neuron's train_step has

    dt = _time(step, args.warmup, args.iters, torch.cuda.synchronize)
    peak = torch.cuda.max_memory_allocated()
    return {"img_per_s": batch * args.iters / dt, "peak_allocated_bytes": int(peak)}


def main(argv=None):
    args = parse_args(argv)
    # CuPy reads CUPY_TF32 when it sets up cuBLAS: decide before importing it
    os.environ["CUPY_TF32"] = "1" if args.tf32 else "0"
    import numpy as np
    import cupy as cp
    if not cp.cuda.is_available():
        sys.exit("throughput needs a CUDA GPU (cupy.cuda.is_available() is False)")
    props = cp.cuda.runtime.getDeviceProperties(0)
    device = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    rows = []
    for case in args.cases:
        name, batch = case.split(":")
        batch = int(batch)
        rng = np.random.default_rng(0)
        x = rng.standard_normal((batch, 3, 224, 224)).astype(np.float32)
        y = rng.integers(0, 1000, batch).astype(np.int64)
        row = {"model": name, "batch": batch, "dtype": "float32", "tf32": args.tf32}
        for side, fn, skip in (("neuron", run_neuron, args.skip_neuron),
                               ("torch", run_torch, args.skip_torch)):
            if skip:
                continue
            try:
                row[side] = fn(name, batch, args, x, y)
            except Exception as e:      # keep the other side's numbers
                row[side] = {"error": f"{type(e).__name__}: {e}"}
            if side == "torch":         # the model is gone with run_torch's frame
                import torch
                torch.cuda.empty_cache()
        n, t = row.get("neuron", {}), row.get("torch", {})
        if "img_per_s" in n and "img_per_s" in t:
            row["ratio"] = n["img_per_s"] / t["img_per_s"]
        rows.append(row)

    print(f"\nTraining throughput on {device}, float32, TF32 {'on' if args.tf32 else 'off'}, "
          f"{args.iters} timed iterations after {args.warmup} warm-up\n")
    print("| model | batch | neuron img/s | PyTorch img/s | neuron / PyTorch |")
    print("|---|---:|---:|---:|---:|")

    def cell(d):
        return f"{d['img_per_s']:.1f}" if "img_per_s" in d else d.get("error", "-")[:60]

    for r in rows:
        ratio = f"{r['ratio']:.2f}" if "ratio" in r else "-"
        print(f"| {r['model']} | {r['batch']} | {cell(r.get('neuron', {}))} | "
              f"{cell(r.get('torch', {}))} | {ratio} |")

    import importlib.metadata as md
    versions = {}
    for pkg in ("cupy-cuda13x", "torch", "nvidia-cudnn-cu13"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    now = _dt.datetime.now(_dt.timezone.utc)
    result = {"bench": "throughput", "device": device, "date": now.isoformat(),
              "git_commit": git_commit(), "versions": versions, "rows": rows}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"throughput-{now.strftime('%Y%m%dT%H%M%SZ')}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    print(f"\nraw results: {path}")


if __name__ == "__main__":
    main()
