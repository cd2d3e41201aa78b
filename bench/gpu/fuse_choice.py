"""Whether the first command's stages run fused (BatchNorm+ReLU, Add+ReLU as one layer each),
decided from what the command measured before them. The throughput stage A/Bs fusion only
where the replay tests (the fused kernels' included) all passed: a fused kernel that faults
would poison the CUDA context of the rows after it. The deepest stage runs fused where,
besides, the throughput stage's fused graph replay beat the unfused one on ResNet-50: the
deepest run's kernels are small (batch 16), so fewer of them may matter most there, but a
fusion no GPU has shown to pay must not cost the command its deepest figure.

    python -m bench.gpu.fuse_choice RAW_DIR            # "--fuse" or nothing (deepest)
    python -m bench.gpu.fuse_choice --tests RAW_DIR    # "both" or "off" (throughput's --fuse)

Why goes to stderr (the stage's log).
"""
from __future__ import annotations

import sys

from bench._common import load_result


def tests_passed(raw: str) -> tuple[bool, str]:
    """(whether the replay tests all passed, why) from the stage files in ``raw``."""
    tests = load_result("replay_tests", raw)
    if not tests or tests.get("target_met") is not True:
        return False, "unfused: the replay tests did not all pass (or did not run)"
    return True, "the replay tests, the fused kernels' included, all passed"


def fuse_choice(raw: str) -> tuple[bool, str]:
    """(fuse, why) from the stage files in ``raw``."""
    ok, why = tests_passed(raw)
    if not ok:
        return False, why
    gains = []
    for row in (load_result("throughput", raw) or {}).get("rows", []):
        if row.get("model") != "resnet50":
            continue
        n = row.get("neuron") or {}
        plain, fused = (n.get("graph") or {}).get("img_per_s"), \
            (n.get("graph+fuse") or {}).get("img_per_s")
        if plain and fused:
            gains.append((f"{row.get('batch')} {row.get('precision')}", fused / plain))
    if not gains:
        return False, "unfused: no ResNet-50 row measured graph and graph+fuse"
    said = ", ".join(f"b{k} {g:.3f}x" for k, g in gains)
    if all(g > 1.0 for _, g in gains):
        return True, f"fused: fused graph replay over unfused, ResNet-50 {said}"
    return False, f"unfused: fused graph replay over unfused, ResNet-50 {said}"


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    tests = args[:1] == ["--tests"]
    if tests:
        args = args[1:]
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    if tests:
        ok, why = tests_passed(args[0])
        print(f"[fuse_choice] throughput: {'fused and unfused' if ok else why}", file=sys.stderr)
        print("both" if ok else "off")
        return 0
    fuse, why = fuse_choice(args[0])
    print(f"[fuse_choice] {why}", file=sys.stderr)
    if fuse:
        print("--fuse")
    return 0


if __name__ == "__main__":
    sys.exit(main())
