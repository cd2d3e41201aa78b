"""What layers and optimizers do so that a tape can record their iteration (neuron/tape.py).

A kernel argument that changes from one iteration to the next (a dropout seed, the learning
rate) is given through ``per_iteration``: eagerly a plain value, while recording a ``Varying``
marker that every replay resolves for its own iteration. A helper kernel module that is not the
device's kernel set (bn_chunks, sync-BN) is called through ``kernel_module`` so its calls are
recorded, and a host operation of the iteration (a data-parallel all-reduce) through
``host_call``.
"""
from __future__ import annotations


class TapeDiverged(RuntimeError):
    """A replay met something its record did not have: the executor undoes the step and runs
    it eagerly instead (and from then on)."""


class Varying:
    """``fn(iteration) -> value``: the argument's value at a given iteration."""
    __slots__ = ("fn",)

    def __init__(self, fn):
        self.fn = fn

    def resolve(self, iteration: int):
        return self.fn(iteration)


def per_iteration(k, fn, iteration: int):
    """The value of ``fn`` at ``iteration`` for kernels ``k`` that run now; a marker for a tape
    that records ``k``'s calls (so its replays compute the value of their own iteration)."""
    if getattr(k, "records", False):
        return Varying(fn)
    return fn(iteration)


def kernel_module(k, module):
    """``module``'s functions as ``k`` calls them: recorded when ``k`` records."""
    if getattr(k, "records", False):
        return k.module(module)
    return module


def collective(fn):
    """Marks a host operation of the iteration's program that talks to other processes (a
    data-parallel all-reduce): recorded and replayed like a kernel, but a CUDA graph cannot
    hold it (devices/cuda_graph.py replays the tape instead)."""
    fn.collective = True
    return fn


def host_call(k, fn, *args):
    """``fn(*args)``, a host operation that is part of the iteration (a collective): recorded
    on the tape when ``k`` records, so that every replay calls it again at the same point."""
    if getattr(k, "records", False):
        return k.host_call(fn, args)
    return fn(*args)


def unrecordable(device, why: str) -> None:
    """Host work on the iteration's data outside the device's operations: a tape recording
    this iteration could not repeat it, so it is not replayed (the executor runs eagerly)."""
    tape = getattr(device, "recording_tape", None)
    if tape is not None:
        tape.diverge(why)
