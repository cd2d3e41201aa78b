"""One check for every size argument of the API (channels, kernels, strides, shapes, batch).

A float such as 4.7 or 2.5 used to be truncated silently by int(); a size must be an integer
(Python or NumPy), and anything else is a TypeError that names the argument and its owner.
"""
from __future__ import annotations

import numbers


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
