"""Allocation cost: neuron's Heap vs cudaMalloc/cudaFree vs CuPy's MemoryPool (GPU only).

For each network, the exact sequence of allocations and frees of one training iteration is taken
from neuron's own schedule (liveness policy: a tensor is freed after its last use; persistent
parameters and optimizer state allocated once, outside the timed loop), then replayed against
three allocators:

* ``neuron-heap``: neuron.memory.heap.Heap over the arena (offsets; the pointer is base+offset);
* ``cudaMalloc``: cupy.cuda.runtime.malloc/free for every tensor (what a framework without a pool
  pays; cudaFree also synchronizes the device);
* ``cupy-pool``: CuPy's default MemoryPool (a caching allocator, like PyTorch's).

Optionally (``--train``), images/s of a real training iteration with the arena versus the same
executor with one cudaMalloc per tensor.

Prints a markdown table and writes the raw numbers with device, date and git commit to
bench/results/pool_vs_malloc-<date>.json.  ``python bench/pool_vs_malloc.py --help`` works
without a GPU.
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

#: (model name for neuron.models.build_model, batch) as in the SuperNeurons evaluation
MODELS = [("alexnet", 128), ("vgg16", 16), ("inception_v4", 16), ("resnet50", 16),
          ("resnet101", 16), ("resnet152", 16)]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", default=[m for m, _ in MODELS],
                   help="networks to replay (default: %(default)s)")
    p.add_argument("--batch", type=int, default=None,
                   help="override every model's batch (default: 128 AlexNet, 16 the others)")
    p.add_argument("--repeats", type=int, default=3, help="timed replays per allocator")
    p.add_argument("--train", action="store_true",
                   help="also time a training iteration: arena vs per-tensor cudaMalloc")
    p.add_argument("--train-model", default="resnet50", help="network for --train")
    p.add_argument("--train-iters", type=int, default=5)
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results"),
                   help="directory for the raw JSON")
    return p.parse_args(argv)


def build_model(name: str):
    """neuron.models.build_model(name), or the model module's function when the registry is not
    there yet (the model zoo is written separately); None if the network does not exist."""
    try:
        from neuron.models import build_model as registry
        return registry(name)
    except ImportError:
        pass
    except (KeyError, ValueError):
        return None
    import importlib
    family = {"alexnet": "alexnet", "vgg16": "vgg", "inception_v4": "inception_v4",
              "resnet50": "resnet", "resnet101": "resnet", "resnet152": "resnet"}.get(name)
    try:
        mod = importlib.import_module(f"neuron.models.{family}")
        return getattr(mod, name)()
    except (ImportError, AttributeError):
        return None


def alloc_trace(graph, batch):
    """[(op, tensor key, bytes)] of one iteration (op: 'a' alloc, 'f' free), plus the
    persistent tensors, in the executor's order."""
    import numpy as np
    from neuron.executor import with_loss
    from neuron.memory.liveness import frees_for
    from neuron.memory.schedule import build_schedule
    sched = build_schedule(with_loss(graph), batch, np.float32, ("momentum",))
    persistent = [(t.id, t.nbytes) for t in sched.persistent()]
    ops = []
    for step, dead in zip(sched.steps, frees_for(sched.steps, True)):
        for t in step.writes:
            ops.append(("a", t.id, max(t.nbytes, 1)))
        if step.workspace_bytes:
            ops.append(("a", ("ws", step.index), step.workspace_bytes))
            ops.append(("f", ("ws", step.index), 0))
        for t in dead:
            ops.append(("f", t.id, 0))
    live = set()
    for op, key, _ in ops:                      # whatever is still live at the end is freed
        live.add(key) if op == "a" else live.discard(key)
    ops += [("f", k, 0) for k in live]
    return persistent, ops


def replay_heap(ops, arena_bytes):
    from neuron.memory.heap import Heap
    heap = Heap(arena_bytes)
    where = {}
    t0 = time.perf_counter()
    for op, key, n in ops:
        if op == "a":
            off = heap.try_alloc(n)
            if off < 0:
                raise MemoryError(f"heap of {arena_bytes} bytes too small")
            where[key] = off
        else:
            heap.free(where.pop(key))
    return time.perf_counter() - t0, heap.high_water


def replay_cudamalloc(cp, ops):
    rt = cp.cuda.runtime
    where = {}
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for op, key, n in ops:
        if op == "a":
            where[key] = rt.malloc(n)
        else:
            rt.free(where.pop(key))
    cp.cuda.Device().synchronize()
    return time.perf_counter() - t0


def replay_cupy_pool(cp, ops):
    pool = cp.cuda.MemoryPool()
    where = {}
    for op, key, n in ops:                      # warm the cache: a framework's steady state
        if op == "a":
            where[key] = pool.malloc(n)
        else:
            del where[key]
    t0 = time.perf_counter()
    for op, key, n in ops:
        if op == "a":
            where[key] = pool.malloc(n)
        else:
            del where[key]
    dt = time.perf_counter() - t0
    pool.free_all_blocks()
    return dt


def train_images_per_second(cp, name, batch, iters):
    """Arena vs one cudaMalloc per tensor, same executor and kernels."""
    import numpy as np
    import neuron as nn
    from neuron.executor import Executor
    from neuron.memory.pool import Pool

    class MallocPool(Pool):
        """Every tensor its own cudaMalloc, freed (cudaFree) at its last use."""

        def __init__(self, device, **kw):
            super().__init__(device, **kw)
            self.mem = {}

        def alloc(self, t, step=None):
            self.mem[t.id] = cp.cuda.Memory(max(t.nbytes, 1))
            self.live[t.id] = t
            self.offset[t.id] = 0
            return self.view(t)

        def view(self, t):
            return cp.ndarray(t.shape, t.dtype, memptr=cp.cuda.MemoryPointer(self.mem[t.id], 0))

        def free(self, t):
            del self.mem[t.id], self.live[t.id], self.offset[t.id]

        def alloc_bytes(self, nbytes, what, step=None):
            key = ("raw", len(self.mem), what)
            self.mem[key] = cp.cuda.Memory(nbytes)
            return key

        def free_bytes(self, key):
            del self.mem[key]

        def raw_view(self, key, shape, dtype):
            """Stands in for device.view: the executor views workspaces by their 'offset'."""
            return cp.ndarray(shape, dtype, memptr=cp.cuda.MemoryPointer(self.mem[key], 0))

    graph = build_model(name)
    if graph is None:
        return {"error": f"neuron.models has no {name}"}
    shape = graph.inputs[0].shape
    classes = graph.outputs[0].shape[0]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, *shape)).astype(np.float32)
    y = rng.integers(0, classes, batch)
    out = {}
    for mode in ("arena", "cudaMalloc"):
        ex = Executor(graph, batch, device="cuda", optimizer=nn.SGD(lr=0.01, momentum=0.9))
        if mode == "cudaMalloc":
            # the same executor on a pool without an arena (private API: a benchmark only)
            ex.pool = MallocPool(ex.device)
            ex._alloc_persistent()
            ex.device.view = ex.pool.raw_view
        ex.train_step(x, y)                     # warm-up: algorithm search, kernel compilation
        ex.device.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            ex.train_step(x, y)
        ex.device.synchronize()
        out[mode] = batch * iters / (time.perf_counter() - t0)
        ex.device.close()
        del ex
    return out


def main(argv=None):
    args = parse_args(argv)
    import cupy as cp
    if not cp.cuda.is_available():
        sys.exit("pool_vs_malloc needs a CUDA GPU (cupy.cuda.is_available() is False)")
    props = cp.cuda.runtime.getDeviceProperties(0)
    device = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    batches = dict(MODELS)
    rows = []
    for name in args.models:
        batch = args.batch or batches.get(name, 16)
        graph = build_model(name)
        if graph is None:
            print(f"skipping {name}: not available in neuron.models", file=sys.stderr)
            rows.append({"model": name, "batch": batch, "error": "model not available"})
            continue
        persistent, ops = alloc_trace(graph, batch)
        arena = sum(n for _, n in persistent) + 2 * sum(n for op, _, n in ops if op == "a")
        res = {"model": name, "batch": batch, "ops": len(ops),
               "allocs": sum(op == "a" for op, _, _ in ops)}
        for alloc, fn in (("neuron-heap", lambda: replay_heap(ops, arena)[0]),
                          ("cudaMalloc", lambda: replay_cudamalloc(cp, ops)),
                          ("cupy-pool", lambda: replay_cupy_pool(cp, ops))):
            times = [fn() for _ in range(args.repeats)]
            res[alloc + "_ms"] = 1e3 * min(times)
            res[alloc + "_us_per_op"] = 1e6 * min(times) / max(len(ops), 1)
        res["heap_peak_bytes"] = replay_heap(ops, arena)[1]
        rows.append(res)
    train = None
    if args.train:
        try:
            train = train_images_per_second(cp, args.train_model,
                                            args.batch or batches.get(args.train_model, 16),
                                            args.train_iters)
        except Exception as e:                  # report, do not lose the replay numbers
            train = {"error": f"{type(e).__name__}: {e}"}

    print(f"\nAllocation cost per training iteration on {device} (min of {args.repeats})\n")
    print("| model | batch | alloc+free ops | neuron heap ms | cudaMalloc ms | CuPy pool ms "
          "| heap µs/op | cudaMalloc µs/op | CuPy µs/op |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['model']} | {r['batch']} | {r['error']} | | | | | | |")
            continue
        print(f"| {r['model']} | {r['batch']} | {r['ops']} | {r['neuron-heap_ms']:.2f} | "
              f"{r['cudaMalloc_ms']:.2f} | {r['cupy-pool_ms']:.2f} | "
              f"{r['neuron-heap_us_per_op']:.2f} | {r['cudaMalloc_us_per_op']:.2f} | "
              f"{r['cupy-pool_us_per_op']:.2f} |")
    if train is not None:
        print(f"\nTraining {args.train_model}: {json.dumps(train)}")
        if "arena" in train:
            print("\n| allocator | img/s |\n|---|---:|")
            for k, v in train.items():
                print(f"| {k} | {v:.1f} |")

    now = _dt.datetime.now(_dt.timezone.utc)
    result = {"bench": "pool_vs_malloc", "device": device, "date": now.isoformat(),
              "git_commit": git_commit(), "cupy": cp.__version__, "rows": rows, "train": train}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"pool_vs_malloc-{now.strftime('%Y%m%dT%H%M%SZ')}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    print(f"\nraw results: {path}")


if __name__ == "__main__":
    main()
