"""Stage `tests` of the GPU contact kit: ``pytest tests/gpu tests/kernels -rs --junitxml=...``.

Every cuDNN/CuPy kernel against the NumPy reference, and the binding's CPU checks. The counts
(passed, failed, skipped, errors) and the failing and skipped test ids go into tests.json; its
target is met when nothing failed or errored and, on the GPU, when the GPU tests ran (a GPU run
in which they were all skipped means CuPy did not see the GPU). ``--name`` with ``--paths`` and
``-k`` runs another selection as a stage of its own (replay_tests: ``tests/gpu -k replay``;
codec_tests: ``tests/gpu/test_cuda_codecs.py``).
``--smoke`` runs a handful of CPU tests, to check the stage's plumbing.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

from bench.gpu.kit import ROOT, device_name, junit_counts, stage_parser, write_stage

SMOKE_SELECTION = ["tests/kernels/test_cudnn_binding.py", "-k", "dropout_mask"]
# the CPU stand-ins of the GPU path ran in CI already: the GPU's minutes go to the real thing
STANDINS = ["--ignore=tests/kernels/test_cuda_on_standins.py",
            "--ignore=tests/kernels/test_cuda_raw_source.py"]


def parse_args(argv=None):
    p = stage_parser(__doc__)
    p.add_argument("--name", default="tests",
                   help="the stage's name (<name>.json, <name>.xml): tests, replay_tests, ...")
    p.add_argument("--paths", nargs="+", default=None,
                   help="test files or folders (default: tests/gpu tests/kernels, without the "
                        "CPU stand-ins)")
    p.add_argument("-k", dest="keyword", default=None, help="pytest -k expression")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    name = args.name
    xml = os.path.join(os.path.abspath(args.out), f"{name}.xml")
    if args.paths:          # a named selection runs as given, --smoke too (it skips on a CPU)
        sel = list(args.paths) + (["-k", args.keyword] if args.keyword else [])
    else:
        sel = SMOKE_SELECTION if args.smoke else ["tests/gpu", "tests/kernels", *STANDINS]
    cmd = [sys.executable, "-m", "pytest", *sel, "-rs", "-q", "-p", "no:cacheprovider",
           f"--junitxml={xml}"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT)
    secs = round(time.perf_counter() - t0, 1)
    common = dict(device=device_name(args.device), smoke=args.smoke, selection=sel,
                  pytest_rc=r.returncode, seconds=secs)
    if not os.path.exists(xml):
        write_stage(args.out, name, ran=False, target_met=None,
                    detail=f"pytest exited {r.returncode} without a junit file", tests=None,
                    **common)
        return 0
    c = junit_counts(xml)
    counts = {k: c[k] for k in ("passed", "failed", "skipped", "errors")}
    gpu_skipped = [s for s in c["skips"] if "tests.gpu" in s["test"] or "gpu" in s["reason"]]
    if sum(counts.values()) == 0:
        write_stage(args.out, name, ran=True, target_met=None,
                    detail=f"no test selected by {' '.join(sel)}", tests=counts,
                    failures=[], skips=[], **common)
        return 0
    met = counts["failed"] == 0 and counts["errors"] == 0 and r.returncode in (0, 5)
    if args.device == "cuda" and not args.smoke and gpu_skipped:
        met = False     # on the GPU machine nothing may skip for want of a GPU
    elif met and counts["passed"] == 0:
        met = None      # everything skipped (a CPU run of GPU tests): nothing was judged
    detail = (f"{counts['passed']} passed, {counts['failed']} failed, "
              f"{counts['skipped']} skipped, {counts['errors']} errors in {secs}s")
    if c["failures"]:
        detail += f"; first failure: {c['failures'][0]['test']}"
    write_stage(args.out, name, ran=True, target_met=met, detail=detail, tests=counts,
                failures=c["failures"], skips=c["skips"], **common)
    return 0


if __name__ == "__main__":
    sys.exit(main())
