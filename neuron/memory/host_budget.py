"""How much host memory offloaded tensors may use, by default.

Offloaded tensors live in page-locked (pinned) host memory on the GPU device. Pinned pages cannot
be swapped, so taking most of the machine's RAM for them starves everything else on it (the
Python heap, the data loader, the CUDA driver's own pinned staging). neuron caps them at
:data:`PINNED_FRACTION` of physical RAM unless told otherwise (``--host-budget`` / ``host_budget``
/ ``NEURON_HOST_FRACTION``); the plans of the benchmarks use the same cap, so a plan never counts
on host bytes the runtime would refuse.
"""
from __future__ import annotations

import os

#: default share of physical RAM that pinned buffers for offloaded tensors may take
PINNED_FRACTION = 0.5


def host_memory_bytes() -> int:
    """Physical RAM of this machine (0 if the OS does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def pinned_fraction(env=None) -> float:
    env = os.environ if env is None else env
    raw = env.get("NEURON_HOST_FRACTION")
    if raw is None:
        return PINNED_FRACTION
    try:
        f = float(raw)
    except ValueError:
        raise ValueError(f"NEURON_HOST_FRACTION={raw!r} is not a number") from None
    if not 0.0 < f <= 1.0:
        raise ValueError(f"NEURON_HOST_FRACTION={raw!r} must be in (0, 1]")
    return f


def default_host_cap(total: int | None = None, env=None) -> int:
    """Bytes of pinned host memory offloaded tensors may take: pinned_fraction() of RAM, rounded
    down to whole GiB (at least 1 GiB)."""
    gib = 1 << 30
    total = host_memory_bytes() if total is None else int(total)
    cap = int(pinned_fraction(env) * total) // gib * gib
    return max(cap, gib)


def describe_cap(cap: int, env=None) -> str:
    """Where a cap came from, for error messages."""
    total = host_memory_bytes()
    return (f"{cap} bytes ({cap / (1 << 30):.1f} GiB; the default is "
            f"{pinned_fraction(env):.0%} of this machine's {total / (1 << 30):.1f} GiB RAM, "
            "set by --host-budget or NEURON_HOST_FRACTION)")
