"""Data-parallel scaling: 1 vs K processes (MPI on CPU), and the cost of the data-parallel path.

Weak scaling, as data-parallel training is used: every rank trains --batch samples per iteration,
so K ranks process K x batch. Three runs of the same model on synthetic data:

- plain:     one process, no data parallelism (the executor alone);
- dp x 1:    one process through the data-parallel path (mpiexec -n 1: all-reduces of a world of
             one, loss gather, replica checks) -- its overhead against plain;
- dp x K:    K processes under mpiexec; scaling efficiency = throughput(K) / (K x throughput(1)).

Each rank reports its time inside gradient all-reduces. With --device cuda the ranks use NCCL,
one GPU each (world size 1 on a one-GPU machine: the overhead of the NCCL path).

On a shared machine run it under `nice` and say so: the efficiency then also measures the other
load on the cores. Writes bench/results/data_parallel.{json,md}.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))
sys.path.insert(0, ROOT)
from bench._common import arg_parser, provenance, write  # noqa: E402


def parse_args(argv=None):
    p = arg_parser(__doc__)
    p.add_argument("--model", default="resnet_cifar")
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--batch", type=int, default=32, help="per rank")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--ranks", type=int, default=2, help="K")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--threads", type=int, default=1,
                   help="BLAS/OpenMP threads per rank (default 1: one core per rank, so K "
                   "ranks use K cores and ideal scaling is K x)")
    p.add_argument("--repeats", type=int, default=3,
                   help="run the three configurations this many times, interleaved; keep each "
                   "one's best (the least disturbed by other load)")
    p.add_argument("--note", default="", help="free text kept with the result (e.g. shared "
                   "cores, nice level)")
    p.add_argument("--worker", choices=["plain", "dp"], default=None, help=argparse_hidden())
    return p.parse_args(argv)


def argparse_hidden():
    import argparse
    return argparse.SUPPRESS


def worker(args) -> None:
    """One rank: time --iters training steps after --warmup; rank 0 prints a JSON line."""
    import numpy as np
    from neuron.executor import Executor
    from neuron.models import build_model
    dp = comm = None
    if args.worker == "dp":
        from neuron.distributed import DataParallel, make_comm
        if args.device == "cuda":
            from neuron.distributed.nccl import select_local_gpu
            select_local_gpu()
        comm = make_comm("auto", device=args.device)
    graph = build_model(args.model, depth=args.depth)
    ex = Executor(graph, args.batch, device=args.device, seed=0)
    comm_s = [0.0]
    if comm is not None:
        dp = DataParallel(ex, comm, check_every=0)
        reduce = comm.allreduce_sum

        def timed(arrays, what):
            t = time.perf_counter()
            reduce(arrays, what)
            comm_s[0] += time.perf_counter() - t
        comm.allreduce_sum = timed
    rank, world = (comm.rank, comm.world_size) if comm else (0, 1)
    rng = np.random.default_rng(0)
    gb = args.batch * world
    x = rng.standard_normal((gb, *graph.inputs[0].shape)).astype(np.float32)
    y = rng.integers(0, graph.outputs[0].shape[0], gb)
    sl = slice(rank * args.batch, (rank + 1) * args.batch)
    step = (lambda: dp.train_step(x[sl], y[sl])) if dp else (lambda: ex.train_step(x, y))
    for _ in range(args.warmup):
        step()
    comm_s[0] = 0.0
    ex.device.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.iters):
        step()
    ex.device.synchronize()
    seconds = time.perf_counter() - t0
    times = comm.allgather(np.array([seconds, comm_s[0]]), "timings") if comm else [
        np.array([seconds, 0.0])]
    if rank == 0:
        slowest = max(float(t[0]) for t in times)
        print(json.dumps({"world_size": world, "seconds": slowest,
                          "images_per_sec": args.iters * gb / slowest,
                          "allreduce_seconds_per_rank": [float(t[1]) for t in times],
                          "allreduce_calls": dp.allreduce_calls if dp else 0,
                          "device": ex.device.name}))


def launch(args, mode: str, ranks: int) -> dict:
    base = [sys.executable, os.path.abspath(__file__), "--worker", mode, "--model", args.model,
            "--depth", str(args.depth), "--batch", str(args.batch), "--warmup",
            str(args.warmup), "--iters", str(args.iters), "--device", args.device]
    if mode == "dp":
        mpiexec = (shutil.which("mpiexec", path=os.path.dirname(sys.executable))
                   or shutil.which("mpiexec"))
        if mpiexec is None:
            sys.exit("bench/data_parallel.py: no mpiexec; pip install 'neuron[mpi]'")
        base = [mpiexec, "-n", str(ranks), *base]
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[v] = str(args.threads)
    r = subprocess.run(base, capture_output=True, text=True, env=env, cwd=ROOT)
    if r.returncode != 0:
        sys.exit(f"{mode} x {ranks} failed:\n{r.stderr[-3000:]}")
    return json.loads([s for s in r.stdout.splitlines() if s.startswith("{")][-1])


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    import numpy as np
    runs = {"plain": [], "dp1": [], "dpk": []}
    for _ in range(args.repeats):
        runs["plain"].append(launch(args, "plain", 1))
        runs["dp1"].append(launch(args, "dp", 1))
        runs["dpk"].append(launch(args, "dp", args.ranks))
    best = {k: max(v, key=lambda r: r["images_per_sec"]) for k, v in runs.items()}
    median = {k: float(np.median([r["images_per_sec"] for r in v])) for k, v in runs.items()}
    plain, dp1, dpk = best["plain"], best["dp1"], best["dpk"]
    eff = dpk["images_per_sec"] / (args.ranks * dp1["images_per_sec"])
    eff_median = median["dpk"] / (args.ranks * median["dp1"])
    overhead = plain["images_per_sec"] / dp1["images_per_sec"] - 1
    overhead_median = median["plain"] / median["dp1"] - 1
    prov = provenance(device=f"{plain['device']} ({os.cpu_count()} cores)")
    payload = {**prov, "note": args.note, "model": args.model, "depth": args.depth,
               "batch_per_rank": args.batch, "iters": args.iters, "warmup": args.warmup,
               "threads_per_rank": args.threads, "repeats": args.repeats, "all_runs": runs,
               "plain": plain, "dp_1": dp1, f"dp_{args.ranks}": dpk,
               "median_images_per_sec": median, "scaling_efficiency": eff,
               "scaling_efficiency_median": eff_median, "dp_path_overhead": overhead,
               "dp_path_overhead_median": overhead_median}
    md = [f"# Data-parallel scaling ({args.model} depth {args.depth}, batch {args.batch} per "
          "rank, weak scaling)", "",
          f"device: {prov['device']}; date {prov['date']}; commit {prov['commit']}",
          f"command: `{prov['command']}`",
          f"{args.threads} BLAS thread(s) per rank; best of {args.repeats} interleaved runs "
          f"of {args.iters} timed iterations after {args.warmup} warm-up", ""]
    if args.note:
        md += [f"note: {args.note}", ""]
    md += ["| run | ranks | global batch | best img/s | median img/s | all-reduce s per rank "
           "(of the best run's s) |", "|---|---|---|---|---|---|"]
    for name, key in [("plain", "plain"), ("data-parallel", "dp1"), ("data-parallel", "dpk")]:
        r = best[key]
        ar = ", ".join(f"{s:.3f}" for s in r["allreduce_seconds_per_rank"]) or "-"
        md.append(f"| {name} | {r['world_size']} | {args.batch * r['world_size']} | "
                  f"{r['images_per_sec']:.1f} | {median[key]:.1f} | {ar} (of {r['seconds']:.2f}) |")
    md += ["", f"scaling efficiency {args.ranks} ranks vs 1 (img/s of {args.ranks} ranks / "
           f"({args.ranks} x img/s of 1 rank)): {100 * eff:.1f}% best, {100 * eff_median:.1f}% "
           "median",
           f"data-parallel path at world size 1 vs plain: {100 * overhead:+.1f}% time best, "
           f"{100 * overhead_median:+.1f}% median", ""]
    write("data_parallel", payload, "\n".join(md))


if __name__ == "__main__":
    main()
