"""The command line's side of data parallelism: options, communicator set-up before the device
exists (a GPU rank must pick its GPU first), and stopping every rank when one fails."""
from __future__ import annotations

import argparse
import contextlib
import sys

from ..cli.args import count, numeric, positive_int, positive_number
from .comm import DEFAULT_TIMEOUT_S
from .overlap import DEFAULT_BUCKET_BYTES, DEFAULT_LAG


def add_train_arguments(p) -> None:
    p.add_argument("--data-parallel", action="store_true",
                   help="one replica per process, launched by `mpirun -n K` (CPU: MPI; GPU: "
                   "NCCL, one process per GPU); --batch is per rank")
    p.add_argument("--sync-bn", action="store_true",
                   help="with --data-parallel: BatchNorm statistics of the global batch "
                   "(default: per replica, as PyTorch DDP)")
    p.add_argument("--dp-engine", choices=["auto", "mpi", "nccl"], default="auto",
                   help="collectives: nccl on cuda, mpi on cpu (auto)")
    p.add_argument("--dp-timeout", type=positive_number("--dp-timeout"), default=DEFAULT_TIMEOUT_S,
                   help="seconds a collective waits for the other ranks before stopping "
                   f"(default {DEFAULT_TIMEOUT_S:g})")
    p.add_argument("--dp-check-every", type=count("--dp-check-every"), default=100,
                   help="check that all ranks hold identical parameters every N iterations "
                   "(0: never; default 100)")
    add_overlap_arguments(
        p, "with --data-parallel: all-reduce gradient buckets while backward goes on, each "
        "bucket's optimizer updates deferred a few backward steps (its gradients stay live "
        "until then, counted in the plan); --no-overlap: a blocking all-reduce per layer, "
        "updated at once (default: overlap)",
        "with --data-parallel --overlap: consecutive layers' gradients (in backward order) "
        "grouped into one collective of at least MB MiB; 0: one per layer (default "
        f"{DEFAULT_BUCKET_BYTES / 2**20:g}, as PyTorch DDP)")


def add_overlap_arguments(p, overlap_help: str, bucket_help: str) -> None:
    """--overlap/--no-overlap and --bucket-mb, the same defaults for `train` and `plan`."""
    p.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=True,
                   help=overlap_help)
    p.add_argument("--bucket-mb", type=numeric("--bucket-mb", low=0), default=DEFAULT_BUCKET_BYTES / 2**20,
                   metavar="MB", help=bucket_help)
    p.add_argument("--dp-lag", type=numeric("--dp-lag", int, low=0, words=("auto",)), default=DEFAULT_LAG, metavar="N|auto",
                   help="with --data-parallel --overlap: a bucket's optimizer updates run N "
                   "backward steps after its all-reduce starts, waiting for it there; more "
                   "hides a slower link, and its gradients live longer (in the plan's bytes; "
                   f"default {DEFAULT_LAG}); `plan ... --time --dp-lag auto` chooses N on the "
                   "simulated clock")


def grad_lag(args) -> int:
    """--dp-lag as a number of steps (`auto` is resolved by `plan --time` alone)."""
    if args.dp_lag == "auto":
        raise ValueError("--dp-lag auto chooses the lag on the simulated clock: run `neuron "
                         "plan ... --data-parallel K --time --dp-lag auto` and train with the "
                         "--dp-lag N it reports")
    if args.dp_lag < 0:
        raise ValueError(f"--dp-lag must be >= 0 backward steps, got {args.dp_lag}")
    return args.dp_lag


def train_grad_buckets(args):
    """The executor's ``grad_buckets`` for `neuron train`: bucket bytes when the all-reduce
    overlaps backward, None otherwise (no data parallelism, or --no-overlap)."""
    if args.bucket_mb < 0:
        raise ValueError(f"--bucket-mb must be >= 0, got {args.bucket_mb}")
    if not args.data_parallel or not args.overlap:
        return None
    return int(args.bucket_mb * 2**20)


def comm_report(dp, seconds: float) -> tuple[dict, str]:
    """`neuron train --json` fields and a line on the collectives of this rank (rank 0)."""
    st = dp.comm_stats()
    st["allreduce_exposed_fraction"] = st["allreduce_wait_s"] / seconds if seconds else None
    line = (f"all-reduce ({'overlapping backward' if st['overlap'] else 'blocking, per layer'}):"
            f" {st['allreduce_calls']} calls, {st['allreduce_bytes'] / 2**20:.2f} MiB; waited "
            f"{st['allreduce_wait_s']:.3f} s of {seconds:.3f} s training (collectives in "
            f"flight {st['allreduce_span_s']:.3f} s)")
    return st, line


def add_plan_arguments(p) -> None:
    p.add_argument("--data-parallel", type=positive_int("--data-parallel"), default=None,
                   metavar="K",
                   help="add the ring all-reduce time of K data-parallel ranks per iteration")
    p.add_argument("--link-gbps", type=positive_number("--link-gbps"), default=100.0,
                   help="per-link bandwidth for --data-parallel in Gbit/s (default 100)")
    add_overlap_arguments(
        p, "with --data-parallel: plan the all-reduce as `train --data-parallel` runs it, "
        "overlapping backward with each bucket's updates deferred a few steps (their "
        "gradients live until then, in the plan's bytes; the clock waits for a collective at "
        "its due step); --no-overlap: the plan without deferred updates, the all-reduce timed "
        "as if it hid under backward (default: overlap)",
        "with --data-parallel: consecutive layers' gradients (in backward order) as one "
        "collective of at least MB MiB; 0: one per layer (default "
        f"{DEFAULT_BUCKET_BYTES / 2**20:g}, as `train` and PyTorch DDP)")


def plan_grad_buckets(args):
    """The executor's ``grad_buckets`` for `neuron plan --data-parallel K`: what `train
    --data-parallel` would run (None: no data parallelism, one rank, or --no-overlap)."""
    comm = plan_comm_model(args)
    if comm is None or comm.world_size < 2 or not args.overlap:
        return None
    return comm.bucket_bytes


def plan_lag(args, graph, budget, cost, **kw) -> tuple[int, list | None]:
    """`plan`'s --dp-lag: (the lag, None), or with `auto` the one distributed/lag.py chooses
    and the lags it tried."""
    if args.dp_lag != "auto":
        return grad_lag(args), None
    buckets = plan_grad_buckets(args)
    if buckets is None or not args.time:
        raise ValueError("--dp-lag auto needs --time and --data-parallel K (K > 1) with "
                         "--overlap: it chooses on the simulated clock")
    from .lag import choose_lag
    return choose_lag(graph, args.batch, cost=cost, comm=plan_comm_model(args),
                      grad_buckets=buckets, budget=budget, **kw)


def make_train_comm(args):
    """The communicator for `neuron train --data-parallel` (None without it). On cuda the
    process is first restricted to its local rank's GPU, before CuPy touches CUDA."""
    if not args.data_parallel:
        if args.sync_bn:
            raise ValueError("--sync-bn needs --data-parallel")
        return None
    from ..devices import cuda_available
    if args.dp_engine == "nccl" or args.device in ("cuda", "auto"):
        from .nccl import select_local_gpu
        select_local_gpu()      # before CUDA initializes: this rank sees only its GPU
    engine = args.dp_engine
    if engine == "auto":
        gpu = args.device == "cuda" or (args.device == "auto" and cuda_available())
        engine = "nccl" if gpu else "mpi"
    from .comm import make_comm
    return make_comm(engine, timeout_s=args.dp_timeout)


@contextlib.contextmanager
def stop_all_ranks_on_error(comm, command: str):
    """A rank that fails must not leave the others blocked in a collective: print the error
    here (only this rank knows it) and abort the whole job."""
    try:
        yield
    except BaseException as e:
        if comm is not None and comm.world_size > 1:
            print(f"neuron {command}: error on rank {comm.rank}: {e}", file=sys.stderr,
                  flush=True)
            comm.abort(2)
        raise


def plan_comm_model(args):
    """The collective model of `plan --data-parallel K` (None without it), checked before the
    plan runs: the clock (`--time`) replays the all-reduces with it."""
    if args.data_parallel is None:
        return None
    if args.data_parallel < 1:
        raise ValueError(f"--data-parallel must be >= 1 ranks, got {args.data_parallel}")
    if args.link_gbps <= 0:
        raise ValueError(f"--link-gbps must be positive, got {args.link_gbps}")
    if args.bucket_mb < 0:
        raise ValueError(f"--bucket-mb must be >= 0, got {args.bucket_mb}")
    from .cost import RingModel
    return RingModel(args.data_parallel, args.link_gbps,
                     bucket_bytes=int(args.bucket_mb * 2**20))


def plan_allreduce(args, graph, result: dict) -> None:
    """Add the all-reduce time model of `plan --data-parallel K` to a plan's result."""
    comm = plan_comm_model(args)
    if comm is None:
        return
    import numpy as np
    from .cost import allreduce_plan
    dp = allreduce_plan(graph, np.float32, comm.world_size, comm.link_gbps, comm.latency_s,
                        bucket_bytes=comm.bucket_bytes)
    result["data_parallel"] = dp
    # the clock's comm stream (--time) says the same for float32; it is the one that was timed
    result.setdefault("allreduce_time_s", dp["allreduce_time_s"])
