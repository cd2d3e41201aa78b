"""Stage `tests` of the GPU contact kit: ``pytest tests/gpu tests/kernels -rs --junitxml=...``.

Every cuDNN/CuPy kernel against the NumPy reference, and the binding's CPU checks. The counts
(passed, failed, skipped, errors) and the failing and skipped test ids go into tests.json; the
stage is ok when nothing failed or errored and, on the GPU, when the GPU tests ran (a GPU run in
which they were all skipped means CuPy did not see the GPU: that is a failure of the stage).
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


def main(argv=None) -> int:
    args = stage_parser(__doc__).parse_args(argv)
    xml = os.path.join(os.path.abspath(args.out), "tests.xml")
    sel = SMOKE_SELECTION if args.smoke else ["tests/gpu", "tests/kernels", *STANDINS]
    cmd = [sys.executable, "-m", "pytest", *sel, "-rs", "-q", "-p", "no:cacheprovider",
           f"--junitxml={xml}"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT)
    secs = round(time.perf_counter() - t0, 1)
    if not os.path.exists(xml):
        write_stage(args.out, "tests", False, f"FAIL: pytest exited {r.returncode} without a "
                    "junit file", device=device_name(args.device), smoke=args.smoke,
                    tests=None, pytest_rc=r.returncode)
        return 0
    c = junit_counts(xml)
    counts = {k: c[k] for k in ("passed", "failed", "skipped", "errors")}
    gpu_skipped = [s for s in c["skips"] if "tests.gpu" in s["test"] or "gpu" in s["reason"]]
    ok = counts["failed"] == 0 and counts["errors"] == 0 and r.returncode in (0, 5)
    if args.device == "cuda" and not args.smoke and gpu_skipped:
        ok = False      # on the GPU machine nothing may skip for want of a GPU
    verdict = (f"{'OK' if ok else 'FAIL'}: {counts['passed']} passed, {counts['failed']} failed, "
               f"{counts['skipped']} skipped, {counts['errors']} errors in {secs}s")
    if c["failures"]:
        verdict += f"; first failure: {c['failures'][0]['test']}"
    write_stage(args.out, "tests", ok, verdict, device=device_name(args.device), smoke=args.smoke,
                tests=counts, failures=c["failures"], skips=c["skips"], pytest_rc=r.returncode,
                seconds=secs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
