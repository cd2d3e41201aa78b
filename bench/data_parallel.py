"""Data-parallel scaling: 1 vs K processes (MPI on CPU), and the cost of the data-parallel path.

Weak scaling, as data-parallel training is used: every rank trains --batch samples per iteration,
so K ranks process K x batch. Three runs of the same model on synthetic data:

- plain:     one process, no data parallelism (the executor alone);
- dp x 1:    one process through the data-parallel path (mpiexec -n 1: all-reduces of a world of
             one, loss gather, replica checks) -- its overhead against plain;
- dp x K:    K processes under mpiexec; scaling efficiency = throughput(K) / (K x throughput(1)).
- dp x K, no overlap: the same with a blocking all-reduce per layer (--no-overlap): the
             all-reduce overlapping backward in buckets (--bucket-mb) against none.

Each rank reports the time backward waited on gradient all-reduces (exposed) and the time the
collectives were in flight (start to seen complete). With --device cuda the ranks use NCCL,
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
    p.add_argument("--bucket-mb", type=float, default=0.05,
                   help="gradient bucket of the overlapping runs, MiB (default 0.05: several "
                   "buckets in resnet_cifar depth 8's 0.3 MiB of gradients; DDP's 25 would be "
                   "one bucket started at the last layer, i.e. no overlap)")
    p.add_argument("--launcher", choices=["auto", "mpiexec", "direct"], default="auto",
                   help="how data-parallel ranks start: mpiexec -n K, or direct (one rank, no "
                        "launcher; on cuda NCCL then needs no MPI at all); auto: mpiexec where "
                        "there is one, else direct for one rank")
    p.add_argument("--no-overlap", dest="overlap", action="store_false", help=argparse_hidden())
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
        # a direct launch is a world of one: NCCL bootstraps without MPI, MPI as a singleton
        comm = make_comm("auto", device=args.device,
                         bootstrap="local" if args.launcher == "direct" else "mpi")
    graph = build_model(args.model, depth=args.depth)
    overlap = comm is not None and args.overlap
    ex = Executor(graph, args.batch, device=args.device, seed=0,
                  grad_buckets=int(args.bucket_mb * 2**20) if overlap else None)
    if comm is not None:
        # a world of one runs the collectives too: the path's cost is what is measured
        dp = DataParallel(ex, comm, check_every=0, force_collectives=True)
    rank, world = (comm.rank, comm.world_size) if comm else (0, 1)
    rng = np.random.default_rng(0)
    gb = args.batch * world
    x = rng.standard_normal((gb, *graph.inputs[0].shape)).astype(np.float32)
    y = rng.integers(0, graph.outputs[0].shape[0], gb)
    sl = slice(rank * args.batch, (rank + 1) * args.batch)
    step = (lambda: dp.train_step(x[sl], y[sl])) if dp else (lambda: ex.train_step(x, y))
    for _ in range(args.warmup):
        step()
    if dp:
        dp.allreduce_wait_s = dp.allreduce_span_s = 0.0
        dp.allreduce_calls = 0
    ex.device.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.iters):
        step()
    ex.device.synchronize()
    seconds = time.perf_counter() - t0
    mine = [seconds, dp.allreduce_wait_s, dp.allreduce_span_s] if dp else [seconds, 0.0, 0.0]
    times = comm.allgather(np.array(mine), "timings") if comm else [np.array(mine)]
    if rank == 0:
        slowest = max(float(t[0]) for t in times)
        print(json.dumps({"world_size": world, "seconds": slowest,
                          "images_per_sec": args.iters * gb / slowest,
                          "seconds_per_iter": slowest / args.iters,
                          "allreduce_seconds_per_rank": [float(t[1]) for t in times],
                          "allreduce_inflight_seconds_per_rank": [float(t[2]) for t in times],
                          "overlap": bool(dp and dp.overlap),
                          "allreduce_calls_per_iter": (dp.allreduce_calls / args.iters
                                                       if dp else 0),
                          "device": ex.device.name}))


def launcher(choice: str, ranks: int) -> tuple[str, str | None]:
    """("mpiexec", its path) or ("direct", None) for a data-parallel run of ``ranks``."""
    mpiexec = (shutil.which("mpiexec", path=os.path.dirname(sys.executable))
               or shutil.which("mpiexec"))
    if choice == "direct" or (choice == "auto" and mpiexec is None and ranks == 1):
        if ranks != 1:
            sys.exit(f"bench/data_parallel.py: a direct launch runs one rank, not {ranks}")
        return "direct", None
    if mpiexec is None:
        sys.exit(f"bench/data_parallel.py: no mpiexec for {ranks} ranks; "
                 "pip install 'neuron-arena[mpi]'")
    return "mpiexec", mpiexec


def launch(args, mode: str, ranks: int, overlap: bool = True) -> dict:
    base = [sys.executable, os.path.abspath(__file__), "--worker", mode, "--model", args.model,
            "--depth", str(args.depth), "--batch", str(args.batch), "--warmup",
            str(args.warmup), "--iters", str(args.iters), "--device", args.device,
            "--bucket-mb", str(args.bucket_mb), *([] if overlap else ["--no-overlap"])]
    if mode == "dp":
        how, mpiexec = launcher(args.launcher, ranks)
        base += ["--launcher", how]
        if how == "mpiexec":
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
    payload, md = measure(args)
    write("data_parallel", payload, md)


def measure(args) -> tuple[dict, str]:
    """The interleaved runs: (the results' payload, their markdown)."""
    import numpy as np
    runs = {"plain": [], "dp1": [], "dpk": [], "dpk_blocking": []}
    for _ in range(args.repeats):
        runs["plain"].append(launch(args, "plain", 1))
        runs["dp1"].append(launch(args, "dp", 1))
        runs["dpk"].append(launch(args, "dp", args.ranks))
        runs["dpk_blocking"].append(launch(args, "dp", args.ranks, overlap=False))
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
               "bucket_mb": args.bucket_mb,
               "plain": plain, "dp_1": dp1, f"dp_{args.ranks}": dpk,
               f"dp_{args.ranks}_no_overlap": best["dpk_blocking"],
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
    md += ["| run | ranks | global batch | best img/s | median img/s | ms per iteration | "
           "all-reduce calls per iteration | exposed all-reduce s per rank (of the best run's "
           "s) | collectives in flight s per rank |", "|---|---|---|---|---|---|---|---|---|"]
    ov = f"overlap, {args.bucket_mb:g} MiB buckets"
    for name, key in [("plain", "plain"), (f"data-parallel, {ov}", "dp1"),
                      (f"data-parallel, {ov}", "dpk"),
                      ("data-parallel, blocking per layer", "dpk_blocking")]:
        r = best[key]
        ar = ", ".join(f"{s:.3f}" for s in r["allreduce_seconds_per_rank"]) or "-"
        fl = ", ".join(f"{s:.3f}" for s in r.get("allreduce_inflight_seconds_per_rank", ())) \
            or "-"
        md.append(f"| {name} | {r['world_size']} | {args.batch * r['world_size']} | "
                  f"{r['images_per_sec']:.1f} | {median[key]:.1f} | "
                  f"{1e3 * r['seconds_per_iter']:.1f} | {r['allreduce_calls_per_iter']:g} | "
                  f"{ar} (of {r['seconds']:.2f}) | {fl} |")
    md += ["", f"scaling efficiency {args.ranks} ranks vs 1 (img/s of {args.ranks} ranks / "
           f"({args.ranks} x img/s of 1 rank)): {100 * eff:.1f}% best, {100 * eff_median:.1f}% "
           "median",
           f"data-parallel path at world size 1 vs plain: {100 * overhead:+.1f}% time best, "
           f"{100 * overhead_median:+.1f}% median",
           f"overlap vs blocking at {args.ranks} ranks: {1e3 * dpk['seconds_per_iter']:.1f} vs "
           f"{1e3 * best['dpk_blocking']['seconds_per_iter']:.1f} ms per iteration (best), "
           f"{median['dpk'] / median['dpk_blocking']:.3f}x the blocking img/s (median)", ""]
    return payload, "\n".join(md)


if __name__ == "__main__":
    main()
