"""What one replayed iteration asks of the device, counted on the CPU: the tape's operations by
kind, the copies and cross-stream waits its CUDA graph captures, and the CuPy temporaries it
takes. CudaDevice's own code runs over the CUDA stand-ins (tests/kernels/cuda_standins), with
cuBLAS's GEMM stood in by NumPy writing its output in place, so the counts are the GPU path's; their cost on a GPU (the host time per launch, issue 36's <= 1 ms) is
measured by the GPU kit (bench/gpu/throughput.py's ``host_ms``), not here.

A graph's launch costs the host time per node and per dependency, and the step guard alone
used to add two nodes per parameter block (a snapshot copy and a finiteness check) and an edge
between streams for each: this counts them, per model, unfused and fused.
"""
from __future__ import annotations

import collections
import os
import pathlib
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "kernels"))

import numpy as np  # noqa: E402

from bench._common import arg_parser, library_dirty, load_result, provenance, write  # noqa: E402

#: (model, input shape): small images, since the counts do not depend on the image size
MODELS = {"resnet50": (3, 32, 32), "vgg16": (3, 32, 32), "densenet121": (3, 32, 32)}
GUARD_OPS = ("snapshot", "compute_wait", "nonfinite_flag_update", "nonfinite_flag_update_many",
             "nonfinite_flag_clear")


def count(model: str, fuse: bool, precision: str = "fp32", batch: int = 2,
          steps: int = 5) -> dict:
    """Train ``steps`` iterations with graph replay on CudaDevice over the stand-ins; the last
    capture's stream log and the tape's operations."""
    import pytest

    import cuda_standins
    import neuron as nn
    from neuron.devices.cuda import CudaDevice
    from neuron.executor import Executor
    from neuron.kernels import cublas
    from neuron.models import build_model

    logs, mp = [], pytest.MonkeyPatch()
    cuda_standins.install(mp, pathlib.Path(tempfile.mkdtemp(prefix="graph_ops_")))
    real = CudaDevice.capture

    class Rerun:
        def __init__(self, work):
            self.work = work

        def launch(self, stream=None):
            self.work()

    def capture(self, work):
        restore = cuda_standins.memory_snapshot()
        cuda_standins.runtime._Stream.issued = []       # this capture's operations only
        try:
            real(self, work)
        finally:
            restore()
        logs.append(list(cuda_standins.runtime._Stream.issued))
        return Rerun(work)
    mp.setattr(CudaDevice, "capture", capture)
    # as the GPU's: no float32 copies of 2-byte operands
    mp.setattr(cublas, "gemm", cuda_standins.cublas_gemm)
    temps = []
    try:
        g = build_model(model, in_shape=MODELS[model], num_classes=10)
        cuda_standins.log_streams()     # before the device makes its streams
        dev = CudaDevice(1 << 30, headroom_bytes=0)
        malloc = dev.allocator.malloc
        from neuron.devices.cuda import kernel_context

        def counted(n, device_id=0):
            temps.append((int(n), "%s@%s" % kernel_context()))
            return malloc(n, device_id)
        dev.allocator.malloc = counted
        try:
            ex = Executor(g, batch, device=dev, seed=1, replay="graph", fuse=fuse,
                          precision=precision,
                          optimizer=nn.SGD(lr=0.01, momentum=0.9, weight_decay=1e-4))
            rng = np.random.default_rng(0)
            x = rng.standard_normal((batch, *MODELS[model])).astype(np.float32)
            y = rng.integers(0, 10, batch)
            for i in range(steps):
                if i == steps - 1:
                    temps.clear()
                ex.train_step(x, y)
            rep = ex.replay
            tape = ex._replay.tape
            kinds = collections.Counter(getattr(fn, "__name__", str(fn)) for fn, *_ in tape.ops)
        finally:
            dev.close()
    finally:
        mp.undo()
        cuda_standins.uninstall()
    if rep["ran"] != "graph":
        raise RuntimeError(f"{model}: the iteration did not replay as a graph: {rep}")
    copies, cross = collections.Counter(), 0
    for item in logs[-1]:
        if item[0] == "host":
            continue
        stream, i = item
        op = stream.ops[i]
        if op[0] in ("d2h", "h2d", "d2d"):
            copies[op[0]] += 1
        elif op[0] == "wait" and op[2] is not None and op[2][0] is not stream:
            cross += 1
    return {"model": model, "fuse": fuse, "precision": precision, "operations": len(tape.ops),
            "by_kind": dict(kinds.most_common()),
            "guard_operations": sum(kinds.get(k, 0) for k in GUARD_OPS),
            "update_launches": kinds.get("sgd_update", 0) + kinds.get("sgd_update_many", 0),
            "graph_copies": dict(copies), "graph_cross_stream_waits": cross,
            "temporaries_per_replay": len(temps),
            "temporary_bytes_per_replay": sum(n for n, _ in temps),
            "temporaries_by_kernel": dict(collections.Counter(k for _, k in temps))}


def main():
    ap = arg_parser(__doc__)
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated: "
                    + ", ".join(MODELS))
    ap.add_argument("--fuse", default="off,on", help="off, on or off,on (BatchNorm+ReLU and "
                    "Add+ReLU fused)")
    ap.add_argument("--precision", default="fp32,bf16", help="comma-separated: fp32, bf16, "
                    "fp16 (each model and fusion at each)")
    ap.add_argument("--out", default="graph_ops", help="results name under bench/results/")
    args = ap.parse_args()
    import cuda_standins
    if not cuda_standins.have_compiler():
        sys.exit("graph_ops: the CUDA stand-ins compile the raw kernels with g++; install it")
    rows = []
    for m in args.models.split(","):
        if m not in MODELS:
            sys.exit(f"graph_ops: unknown model {m!r}; expected one of {', '.join(MODELS)}")
        for f in args.fuse.split(","):
            if f not in ("off", "on"):
                sys.exit(f"graph_ops: --fuse takes off, on or off,on, not {f!r}")
            for p in args.precision.split(","):
                if p not in ("fp32", "bf16", "fp16"):
                    sys.exit(f"graph_ops: --precision takes fp32, bf16, fp16, not {p!r}")
                print(f"graph_ops: {m} fuse={f} precision={p} ...", flush=True)
                rows.append(count(m, f == "on", p))
    prov = provenance("CPU: CudaDevice over the CUDA stand-ins (counts, no timing)")
    prov["library_dirty"] = library_dirty()
    measured = _gpu_host_ms()
    md = ["# Device operations per replayed iteration", "",
          f"{prov['date']}, commit {prov['commit']}, {prov['device']}, `{prov['command']}`. "
          "Counted, not timed: a graph's launch cost on a GPU is the kit's `host_ms`.", "",
          *_table(rows)]
    before = load_result(args.out + "_before")
    if before is not None:      # the same count at an earlier commit (`--out NAME_before`)
        bp = before["provenance"]
        md += ["", f"The same count at commit {bp['commit']} ({bp['date']}):", "",
               *_table(before["rows"])]
    if measured:
        md += ["", "Last measured on a GPU (before this count's changes where the commits "
               "differ): " + "; ".join(f"{k} {v}" for k, v in measured.items()) + "."]
    write(args.out, {"provenance": prov, "rows": rows, "gpu_host_ms": measured},
          "\n".join(md) + "\n")
    print("\n".join(md))


def _table(rows) -> list[str]:
    out = ["| model | fused | precision | tape operations | step guard's | update launches "
           "| graph copies | cross-stream waits | temporaries per replay |",
           "|---|---|---|---:|---:|---:|---|---:|---:|"]
    for r in rows:
        cp = ", ".join(f"{k} {v}" for k, v in sorted(r["graph_copies"].items())) or "none"
        out.append(f"| {r['model']} | {'yes' if r['fuse'] else 'no'} | {r['precision']} | "
                   f"{r['operations']} | {r['guard_operations']} | {r['update_launches']} | "
                   f"{cp} | {r['graph_cross_stream_waits']} | {r['temporaries_per_replay']} "
                   f"({r['temporary_bytes_per_replay']} B) |")
    return out


def _gpu_host_ms() -> dict:
    """The GPU's host time per graph launch from bench/results/throughput.json, where any."""
    tp = load_result("throughput") or {}
    out = {}
    for name, cfg in (tp.get("configs") or {}).items():
        v = (cfg.get("host_ms_by_mode") or {}).get("graph")
        if v is not None:
            out[name] = f"{v} ms ({cfg.get('device')}, commit {str(cfg.get('commit'))[:12]})"
    return out


if __name__ == "__main__":
    main()
