"""One check for every size argument of the API (channels, kernels, strides, shapes, batch,
byte budgets), and for its other numbers and flags (a layer's eps, momentum, p; bias flags).

A float such as 4.7 or 2.5 used to be truncated silently by int(); a size must be an integer
(Python or NumPy), and anything else is a TypeError that names the argument and its owner.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from .units import parse_bytes


def size_arg(value, argument: str, owner: str) -> int:
    """``value`` as an int, or TypeError naming ``owner``'s ``argument``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{owner}: {argument} must be an integer, got {value!r} "
                        f"({type(value).__name__})")
    return int(value)


def shape_arg(shape, argument: str, owner: str,
              expected: str = "a tuple of integers") -> tuple[int, ...]:
    """A shape: an integer or a tuple/list of integers."""
    if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
        return (int(shape),)
    if not isinstance(shape, (tuple, list)):
        raise TypeError(f"{owner}: {argument} must be {expected}, got {shape!r} "
                        f"({type(shape).__name__})")
    return tuple(size_arg(s, f"{argument}[{i}]", owner) for i, s in enumerate(shape))


def byte_size_arg(value, argument: str, owner: str) -> int | None:
    """A byte count: an integer or a size string such as '64MiB' or '12GB' (units.parse_bytes);
    None stays None. TypeError/ValueError naming ``owner``'s ``argument`` otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, numbers.Real)):
        raise TypeError(f"{owner}: {argument} must be a number of bytes or a size such as "
                        f"'64MiB', got {value!r} ({type(value).__name__})")
    try:
        return parse_bytes(value if isinstance(value, (str, numbers.Integral)) else
                           _float_bytes(value))
    except ValueError as e:
        raise ValueError(f"{owner}: {argument}: {e}") from None


def _float_bytes(value) -> str:
    """A float byte count (1e9) as text parse_bytes reads; NaN and infinities stay refused."""
    return repr(float(value))


def number_arg(value, argument: str, owner: str, *, low=None, high=None,
               low_open: bool = False, high_open: bool = False, error=ValueError) -> float:
    """A finite real number within [low, high] (open ends with ``low_open``/``high_open``), as
    a float; TypeError (not a number) or ``error`` (NaN, infinite, out of range; a ValueError
    class: layers give GraphError) naming ``owner``'s ``argument``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{owner}: {argument} must be a number, got {value!r} "
                        f"({type(value).__name__})")
    v = float(value)
    bounds = " and ".join(b for b in (
        None if low is None else f"{'>' if low_open else '>='} {low:g}",
        None if high is None else f"{'<' if high_open else '<='} {high:g}") if b)
    if not math.isfinite(v) or (low is not None and (v <= low if low_open else v < low)) or \
            (high is not None and (v >= high if high_open else v > high)):
        raise error(f"{owner}: {argument} must be a finite number"
                         f"{' ' + bounds if bounds else ''}, got {value!r}")
    return v


def flag_arg(value, argument: str, owner: str) -> bool:
    """True or False (NumPy's bool too): a string such as 'no' would otherwise read as True."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{owner}: {argument} must be True or False, got {value!r} "
                        f"({type(value).__name__})")
    return bool(value)


def callable_arg(value, argument: str, owner: str):
    """None or a callable (initializers)."""
    if value is not None and not callable(value):
        raise TypeError(f"{owner}: {argument} must be a function or None, got {value!r} "
                        f"({type(value).__name__})")
    return value
