"""Stage `nccl` of the GPU contact kit: the data-parallel path on NCCL at world size 1 (issue 15:
the one-GPU NCCL run through the same code path, its overhead against plain training, and
gradient all-reduces overlapping backward against blocking ones).

First a probe, each part in a subprocess so that a missing or broken library is a finding, not
a crash: mpi4py and its MPI library, mpiexec, CuPy's NCCL. Then bench/data_parallel.py's
measurement with ``--ranks 1``: plain training, the data-parallel path (NCCL all-reduces in
buckets overlapping backward) and the same with a blocking all-reduce per layer, interleaved.
Without mpiexec the one rank starts directly and NCCL bootstraps without MPI
(``make_comm("nccl", bootstrap="local")``).

Writes ``<out>/nccl.json`` (the kit's contract plus ``probe``, ``result``: data_parallel's
payload, and ``markdown``). ``ran`` means the three runs finished (no target is judged); the
verdict gives the overhead of the data-parallel path at world size 1 and overlap against
blocking.

    bash bench/gpu/contact.sh $OUT nccl            # on the GPU machine (limit 100 s)

``--smoke`` / ``--device cpu`` (CPU tests): MPI instead of NCCL, resnet_cifar depth 8 at batch
4, one repeat of 2 iterations.
"""
from __future__ import annotations

import subprocess
import sys

from bench.gpu.kit import device_name, stage_parser, write_stage

from bench import data_parallel as DP

PROBES = {
    "mpi4py": "from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0])",
    "nccl": "from cupy.cuda import nccl; print(nccl.get_version())",
}


def probe(device: str) -> dict:
    """What the machine has for data parallelism, each found or the error it gave."""
    out = {"mpiexec": DP.launcher("auto", 1)[1]}
    for name, code in PROBES.items():
        if name == "nccl" and device != "cuda":
            continue
        try:
            r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               timeout=60)
            out[name] = r.stdout.strip() if r.returncode == 0 else \
                "error: " + (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1]
        except subprocess.TimeoutExpired:
            out[name] = "error: timed out after 60 s"
    return out


def main(argv=None) -> int:
    p = stage_parser(__doc__)
    p.add_argument("--model", default=None, help="default resnet50 (smoke: resnet_cifar)")
    p.add_argument("--depth", type=int, default=None, help="default 50 (smoke: 8)")
    p.add_argument("--batch", type=int, default=None, help="default 64 (smoke: 4)")
    p.add_argument("--repeats", type=int, default=None, help="default 2 (smoke: 1)")
    args = p.parse_args(argv)
    smoke = args.smoke
    found = probe(args.device)
    dp_argv = ["--model", args.model or ("resnet_cifar" if smoke else "resnet50"),
               "--depth", str(args.depth or (8 if smoke else 50)),
               "--batch", str(args.batch or (4 if smoke else 64)),
               "--repeats", str(args.repeats or (1 if smoke else 2)),
               "--iters", "2" if smoke else "10", "--warmup", "1" if smoke else "3",
               "--ranks", "1", "--device", args.device, "--bucket-mb", "25",
               "--note", "gpu contact kit, stage nccl"]
    fields = {"probe": found, "argv": dp_argv}
    try:
        payload, md = DP.measure(DP.parse_args(dp_argv))
    except SystemExit as e:         # data_parallel's own failure report (a rank's stderr)
        write_stage(args.out, "nccl", ran=False, target_met=None, detail=str(e)[:300],
                    device=args.device,
                    smoke=smoke, **fields)
        return 1
    over = payload["dp_path_overhead"]
    dp1, blocking = payload["dp_1"], payload["dp_1_no_overlap"]
    verdict = (f"{payload['plain']['device']}: data-parallel path at world size 1 "
               f"{100 * over:+.1f}% time vs plain (best of {payload['repeats']}); overlapped "
               f"{1e3 * dp1['seconds_per_iter']:.1f} vs blocking "
               f"{1e3 * blocking['seconds_per_iter']:.1f} ms/iter; "
               f"launcher {'mpiexec' if found['mpiexec'] else 'direct'}")
    write_stage(args.out, "nccl", ran=True, target_met=None, detail=verdict, device=args.device,
                smoke=smoke,
                device_name=device_name(args.device), result=payload, markdown=md, **fields)
    return 0


if __name__ == "__main__":
    sys.exit(main())
