"""The one check of every numeric command-line option: type, finiteness and range.

Each numeric option of every command is declared with ``type=numeric(...)`` (or one of the
helpers below), so that a value the run cannot use is a usage error (exit 2) naming the option
("argument --NAME:", argparse's prefix) and what it accepts, before any work: NaN and infinities are refused everywhere (they pass
``float()`` and every ``<`` comparison that would catch them), as are integers written as
fractions. Byte sizes (``--budget``), precisions, layouts and paths are checked here too. Imports
nothing of neuron but units, precision and memory.layout (leaves), so any module that declares
options may use it.
"""
from __future__ import annotations

import argparse
import math

from ..memory.layout import LAYOUTS
from ..precision import PRECISIONS
from ..units import parse_bytes


def _bound(kind: type, low, high, low_open: bool, high_open: bool) -> str:
    if kind is int and low == 1 and not low_open and high is None:
        return "positive"
    parts = []
    if low is not None:
        parts.append(f"{'>' if low_open else '>='} {low:g}")
    if high is not None:
        parts.append(f"{'<' if high_open else '<='} {high:g}")
    return " and ".join(parts)


def numeric(name: str, kind: type = float, *, low=None, high=None, low_open: bool = False,
            high_open: bool = False, words: tuple[str, ...] = ()):
    """An argparse ``type`` for option ``name``: a finite ``kind`` (int or float) within
    [low, high] (open ends with ``low_open``/``high_open``), or one of ``words`` as given."""
    if kind not in (int, float):
        raise TypeError(f"numeric({name!r}): kind must be int or float, got {kind!r}")
    rng = _bound(kind, low, high, low_open, high_open)
    what = ("an integer" if kind is int else "a number") + (f" ({rng})" if rng else "")
    alternatives = "".join(f" or '{w}'" for w in words)

    def convert(text: str):
        if text in words:
            return text
        s = str(text).strip()
        try:
            v = int(s) if kind is int else float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}{alternatives}, got {text!r}") \
                from None
        if kind is float and not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"must be finite: {what}, got {text!r}")
        if (low is not None and (v <= low if low_open else v < low)) or \
                (high is not None and (v >= high if high_open else v > high)):
            raise argparse.ArgumentTypeError(f"must be {rng}{alternatives}, got {text!r}")
        return v
    convert.__name__ = name.lstrip("-").replace("-", "_")
    convert.kind, convert.low, convert.high = kind, low, high     # for the tests
    convert.low_open, convert.high_open, convert.words = low_open, high_open, words
    return convert


def positive_int(name: str, words: tuple[str, ...] = ()):
    """An integer >= 1 (counts: batch, depth, iterations)."""
    return numeric(name, int, low=1, words=words)


def count(name: str):
    """An integer >= 0 (seeds, warm-up iterations, 0 meaning 'never')."""
    return numeric(name, int, low=0)


def positive_number(name: str):
    """A finite number > 0 (rates, seconds, bandwidths)."""
    return numeric(name, float, low=0, low_open=True)


def byte_size(name: str):
    """A size such as 12GiB, 512MiB, 3GB or 1000000 bytes; checked here, kept as typed (the
    commands parse it with units.parse_bytes where they use it)."""
    def convert(text: str) -> str:
        try:
            parse_bytes(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return text
    convert.__name__ = name.lstrip("-").replace("-", "_")
    return convert


def precision_arg(name: str):
    """One of precision.PRECISIONS (fp32, tf32, bf16, fp16), else a usage error naming the
    option and the choices."""
    def convert(text: str) -> str:
        if text not in PRECISIONS:
            raise argparse.ArgumentTypeError(f"must be one of {', '.join(PRECISIONS)}, got "
                                             f"{text!r}")
        return text
    convert.__name__ = name.lstrip("-").replace("-", "_")
    return convert


#: the help text of --precision (every command that plans or trains)
PRECISION_HELP = ("storage and arithmetic type: fp32 (default), tf32 (float32 storage; a GPU "
                  "tensor-core math mode), bf16 or fp16 (mixed precision: feature maps, their "
                  "gradients and conv/linear weight copies in 2 bytes; master weights, their "
                  "gradients, optimizer state, BatchNorm statistics and the loss in float32; "
                  "fp16 with dynamic loss scaling); see docs/precision.md")


def precision_option(p) -> None:
    """--precision on a command that plans or trains."""
    p.add_argument("--precision", default="fp32", type=precision_arg("--precision"),
                   metavar="{" + ",".join(PRECISIONS) + "}", help=PRECISION_HELP)


#: the help text of --layout (every command that plans or trains)
LAYOUT_HELP = ("storage layout of 4-d feature maps and convolution weights: nchw (default) or "
               "nhwc (channels last, what cuDNN's tensor-core convolutions want). Shapes, planned "
               "bytes and checkpoints (NCHW order) are the same in both; a network without 4-d "
               "maps runs the same either way")


def layout_arg(name: str):
    """One of memory.layout.LAYOUTS, else a usage error naming the option and the choices."""
    def convert(text: str) -> str:
        if text.lower() not in LAYOUTS:
            raise argparse.ArgumentTypeError(f"must be one of {', '.join(LAYOUTS)}, got "
                                             f"{text!r}")
        return text.lower()
    convert.__name__ = name.lstrip("-").replace("-", "_")
    return convert


def layout_option(p) -> None:
    """--layout on a command that plans or trains."""
    p.add_argument("--layout", default="nchw", type=layout_arg("--layout"),
                   metavar="{" + ",".join(LAYOUTS) + "}", help=LAYOUT_HELP)


def path_arg(name: str):
    """A file path that is not empty (an empty one would read as 'not given')."""
    def convert(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError("needs a file name, got an empty string")
        return text
    convert.__name__ = name.lstrip("-").replace("-", "_")
    return convert


def fuse_option(p) -> None:
    """--fuse (train, plan, memory, deepest, widest, profile): neuron/fuse.py."""
    p.add_argument("--fuse", action="store_true",
                   help="run every BatchNorm or Add whose only reader is a ReLU as one fused "
                   "BNReLU or AddReLU layer: fewer passes over the feature maps, no BN or Add "
                   "output or its gradient in memory, same parameter names and checkpoints "
                   "(default: off, the layers as the model defines them)")


def fuse_kw(args) -> dict:
    """The Executor/plan keyword for --fuse: nothing when it is off, so calls are unchanged."""
    return {"fuse": True} if getattr(args, "fuse", False) else {}
