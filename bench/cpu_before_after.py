"""neuron's CPU training step on the quick-start model with an older commit's NumPy kernels and
CpuDevice views ("before") against this tree's ("after"), in one process.

    python bench/cpu_before_after.py [--before dd7ff81] [--steps 30] [--threads 1]

The before commit's neuron/kernels/numpy_{ref,conv,pool,helpers}.py are read with ``git show``
into a temporary package; one Executor (resnet_cifar 20, 8x8 digits, batch 64, neuron train's
SGD) runs every step, its kernel functions and CpuDevice.view swapped for the before or after
versions, the two alternating step by step (the order flipping each round) so that both see
the same machine load. Reports the median wall and CPU (process_time) milliseconds per step.
Writes bench/results/cpu_before_after.json and .md.
"""
from __future__ import annotations

import importlib
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench._common import arg_parser, provenance, write  # noqa: E402

FILES = ("numpy_ref", "numpy_conv", "numpy_pool", "numpy_helpers")


def load_before_kernels(commit: str, into: str):
    """The numpy_ref module of ``commit``, imported from a package written under ``into``."""
    pkg = os.path.join(into, "before_kernels")
    os.makedirs(pkg)
    open(os.path.join(pkg, "__init__.py"), "w").close()
    for f in FILES:
        src = subprocess.run(["git", "show", f"{commit}:neuron/kernels/{f}.py"], cwd=ROOT,
                             capture_output=True, text=True)
        if src.returncode != 0:
            sys.exit(f"cpu_before_after: cannot read neuron/kernels/{f}.py at {commit}: "
                     f"{src.stderr.strip()}")
        with open(os.path.join(pkg, f + ".py"), "w") as fh:
            fh.write(src.stdout)
    sys.path.insert(0, into)
    return importlib.import_module("before_kernels.numpy_ref")


def view_before(self, offset, shape, dtype):
    """CpuDevice.view as it was before this series (slice, view, reshape; np.prod)."""
    import numpy as np
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return self.buffer[offset:offset + n].view(dtype).reshape(shape)


def main(argv=None) -> int:
    p = arg_parser(__doc__)
    p.add_argument("--before", default="dd7ff81", help="commit of the 'before' kernels")
    p.add_argument("--steps", type=int, default=30, help="timed steps per side")
    p.add_argument("--threads", type=int, default=1, help="NumPy BLAS threads")
    args = p.parse_args(argv)
    prov = provenance(device="CPU (x86_64, 2 cores), training on the CPU")
    import numpy  # noqa: F401  (threadpoolctl limits only the libraries already loaded)
    from threadpoolctl import threadpool_info, threadpool_limits
    threadpool_limits(args.threads, user_api="blas")
    blas = [i["num_threads"] for i in threadpool_info() if i.get("user_api") == "blas"]
    if blas != [args.threads]:
        sys.exit(f"cpu_before_after: NumPy's BLAS threads are {blas}, not [{args.threads}]")
    from neuron import devices
    from neuron.data import load_dataset
    from neuron.executor import Executor
    from neuron.kernels import numpy_ref as K
    from neuron.models import build_model
    from neuron.optim import SGD
    with tempfile.TemporaryDirectory() as tmp:
        old = load_before_kernels(args.before, tmp)
        tables = {"before": ({n: getattr(old, n) for n in K.__all__}, view_before),
                  "after": ({n: getattr(K, n) for n in K.__all__}, devices.CpuDevice.view)}

        def use(side):
            funcs, view = tables[side]
            for n, f in funcs.items():
                setattr(K, n, f)
            devices.CpuDevice.view = view

        split = load_dataset("digits", seed=0)
        graph = build_model("resnet_cifar", depth=20, in_shape=split.train.sample_shape,
                            num_classes=split.train.num_classes)
        ex = Executor(graph, 64, device="cpu", policy="liveness",
                      optimizer=SGD(lr=0.1, momentum=0.9, weight_decay=5e-4))
        tr = split.train
        batches = [(tr.x[i * 64:(i + 1) * 64], tr.y[i * 64:(i + 1) * 64]) for i in range(8)]
        wall = {"before": [], "after": []}
        cpu = {"before": [], "after": []}
        try:
            for r in range(3 + args.steps):
                for side in (("before", "after") if r % 2 == 0 else ("after", "before")):
                    use(side)
                    t, c = time.perf_counter(), time.process_time()
                    ex.train_step(*batches[r % len(batches)])
                    if r >= 3:                      # the first three are warm-up
                        wall[side].append(time.perf_counter() - t)
                        cpu[side].append(time.process_time() - c)
        finally:
            use("after")
    res = {s: {"wall_ms_median": round(1e3 * statistics.median(wall[s]), 1),
               "wall_ms_min": round(1e3 * min(wall[s]), 1),
               "cpu_ms_median": round(1e3 * statistics.median(cpu[s]), 1)} for s in wall}
    ratio = round(res["after"]["wall_ms_median"] / res["before"]["wall_ms_median"], 3)
    payload = {"provenance": prov, "before_commit": args.before, "steps": args.steps,
               "threads": args.threads, "model": "resnet_cifar", "depth": 20,
               "dataset": "digits", "batch": 64, **res, "after_over_before_wall": ratio}
    md = (f"# neuron CPU step, kernels before/after ({prov['date']}, commit {prov['commit']} "
          f"against {args.before})\n\nresnet_cifar 20, 8x8 digits, batch 64, {args.threads} "
          f"BLAS thread(s), {args.steps} steps per side alternating; load average "
          f"{prov['load_average_at_start']} at start.\n\n| kernels | wall ms/step (median) | "
          "wall min | CPU ms/step (median) |\n|---|---:|---:|---:|\n" +
          "\n".join(f"| {s} | {res[s]['wall_ms_median']} | {res[s]['wall_ms_min']} | "
                    f"{res[s]['cpu_ms_median']} |" for s in ("before", "after")) +
          f"\n\nafter / before (wall, median): {ratio}\n")
    write("cpu_before_after", payload, md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
