"""Byte sizes: parse what users type (12GiB, 512MiB, 12GB, 1e9) and print MiB/GiB labelled."""
from __future__ import annotations

import re
from fractions import Fraction

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1 << 10, "m": 1000 ** 2, "mb": 1000 ** 2,
          "mib": 1 << 20, "g": 1000 ** 3, "gb": 1000 ** 3, "gib": 1 << 30, "t": 1000 ** 4,
          "tb": 1000 ** 4, "tib": 1 << 40}


def parse_bytes(text) -> int:
    """'12GiB' -> 12884901888; '12GB' -> 12000000000; '4096' -> 4096. Errors name the input."""
    if isinstance(text, bool):
        raise ValueError(f"size must be a number of bytes, got {text!r}")
    if isinstance(text, int):
        if text <= 0:
            raise ValueError(f"size must be positive, got {text}")
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot parse size {text!r}: expected a positive number with an "
                         "optional unit B, KiB, MiB, GiB, TiB, KB, MB, GB, TB (e.g. 12GiB)")
    n = Fraction(m.group(1)) * _UNITS[m.group(2).lower()]     # exact, even past 2**53
    if n < 1:
        raise ValueError(f"size must be at least 1 byte, got {text!r}")
    return int(n)


def fmt_bytes(n: int) -> str:
    if n >= 1 << 30:
        return f"{n / (1 << 30):.2f} GiB"
    if n >= 1 << 20:
        return f"{n / (1 << 20):.1f} MiB"
    if n >= 1 << 10:
        return f"{n / (1 << 10):.1f} KiB"
    return f"{n} B"
