"""Stage `install` of the GPU contact kit: ``pip install --no-build-isolation --no-deps -e .``.

The GPU machine has no network, but it has the build tools (setuptools, pybind11, g++), so the
heap extension is compiled there, in place, and stays in the working tree for later commands on
the same machine (the kit rebuilds it first if a later command lands on a fresh one). The stage
ran when ``neuron.memory._heap`` imports afterwards and ``import neuron`` did not pull in CuPy.
``--smoke`` skips pip (CI must not reinstall the package under test) and only checks the import.
"""
from __future__ import annotations

import subprocess
import sys
import time

from bench.gpu.kit import ROOT, device_name, stage_parser, write_stage

CHECK = ("import sys, neuron, neuron.memory._heap as h, neuron.kernels.cuda; "
         "assert 'cupy' not in sys.modules, 'import neuron pulled in cupy'; print(h.__file__)")


def main(argv=None) -> int:
    args = stage_parser(__doc__).parse_args(argv)
    steps = []
    if not args.smoke:
        for cmd in ([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                     "-e", "."],):
            t0 = time.perf_counter()
            r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            print(r.stdout[-3000:], r.stderr[-3000:], sep="\n")
            steps.append({"cmd": " ".join(cmd[1:]), "rc": r.returncode,
                          "seconds": round(time.perf_counter() - t0, 1),
                          "tail": (r.stdout + r.stderr)[-1500:]})
    check = subprocess.run([sys.executable, "-c", CHECK], cwd=ROOT, capture_output=True,
                           text=True)
    if check.returncode != 0 and not args.smoke:
        # an editable install that did not leave the .so in the tree: build it in place
        r = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=ROOT,
                           capture_output=True, text=True)
        steps.append({"cmd": "setup.py build_ext --inplace", "rc": r.returncode,
                      "tail": (r.stdout + r.stderr)[-1500:]})
        check = subprocess.run([sys.executable, "-c", CHECK], cwd=ROOT, capture_output=True,
                               text=True)
    ok = check.returncode == 0
    why = check.stderr.strip().splitlines()[-1] if check.stderr.strip() else "?"
    verdict = (f"extension at {check.stdout.strip()}" if ok else
               f"the extension does not import: {why}")
    if args.smoke:
        verdict += " (smoke: pip skipped)"
    write_stage(args.out, "install", ran=ok, target_met=None, detail=verdict,
                device=device_name(args.device),
                smoke=args.smoke, steps=steps, python=sys.executable)
    return 0


if __name__ == "__main__":
    sys.exit(main())
