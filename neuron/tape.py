"""The tape: one planned training iteration recorded as device operations, then replayed.

Every iteration starts from the same pool state and the plan fixes every address, move and
workspace, so the executor's iteration is a fixed program. Recording runs it once through a
proxy of the device's kernels and of the device's copy methods: each call is kept with its
arguments resolved (arena views, host buffers, scalars). A replay calls them again in order: no
planning, pool bookkeeping or view building. What changes per iteration is either in fixed
buffers written before the replay (the batch) or a ``Varying`` argument resolved again (the
dropout seed, the learning rate). plan (virtual device) -> record (real device) -> replay.

A record is trusted only when two consecutive iterations record the same operations on the same
addresses (so the iteration is a fixed point of the executor), and only while the pool is in the
state it was recorded from; otherwise the executor runs eagerly and says why (neuron/replay.py).
"""
from __future__ import annotations

import contextlib

import numpy as np

from .recording import Varying

#: device methods that issue work (copies, codecs, stream ordering): recorded like kernels
DEVICE_OPS = ("copy_to_host", "copy_to_device", "move", "encode", "decode", "offload",
              "prefetch", "snapshot", "compute_wait", "record_compute", "order_after", "wait",
              "synchronize", "carry_copies")
#: the device's copy/compute timeline (memory/overlap.py): its events are device work too, so
#: a replayed iteration is measured like an eager one
TIMELINE_OPS = ("step_start", "step_end", "iteration_end")
#: device methods whose answer is a run-time decision: is_done(event) found True lets the pool
#: reuse what the event's copy read; a replay cannot ask, so it orders later work after the
#: event instead (device.order_after): the same guarantee, given on the device
DEVICE_DECISIONS = ("is_done",)

_RESOLVE, _PRODUCES = 1, 2


class _Ref:
    """An argument that is the result of an earlier operation of the same iteration."""
    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


class RecordingKernels:
    """The device's kernel module, each call kept on the tape as well as run."""
    records = True

    def __init__(self, kernels, tape: "Tape"):
        self._kernels, self._tape = kernels, tape

    def module(self, module) -> "RecordingKernels":
        """Another kernel module (recording.kernel_module), recorded on the same tape."""
        cache = self.__dict__.setdefault("_modules", {})
        if id(module) not in cache:
            cache[id(module)] = RecordingKernels(module, self._tape)
        return cache[id(module)]

    def host_call(self, fn, args):
        """A host operation of the iteration (recording.host_call), kept on the tape."""
        return self._tape.call(fn, args, {})

    def __getattr__(self, name):
        fn = getattr(self._kernels, name)
        if not callable(fn):
            return fn
        tape = self._tape

        def call(*args, **kwargs):
            return tape.call(fn, args, kwargs)
        call.__name__ = name
        self.__dict__[name] = call
        return call


class Tape:
    """The operations of one iteration, in issue order, ready to call again."""

    def __init__(self, iteration: int):
        self.iteration = iteration          # the iteration it was recorded at
        self.ops: list[tuple] = []          # (fn, args, kwargs, flags)
        self.losses: list[tuple] = []       # (op index, loss name, chunk)
        self.saved: list[tuple] = []        # (block, op index after which its snapshot is done)
        self.counters: dict[str, int] = {}  # the pool's traffic of the recorded iteration
        self.temporaries: list = []         # (bytes, pointer) of the device's temporaries
        self.pool_log: list = []            # the pool's events (its moves) while recording
        self.start_state = None             # the pool's state it was recorded from
        self.diverged: str | None = None    # why it cannot be replayed
        self._produced: dict[int, int] = {}  # id(result) -> op index
        self._results: list = []            # every result, alive while recording: ids unique
        self._inside = False                # an operation is running (its own calls are not)

    # ---- recording ---------------------------------------------------------------------
    def kernels(self, kernels) -> RecordingKernels:
        return RecordingKernels(kernels, self)

    def call(self, fn, args, kwargs):
        if self._inside:                    # called by a recorded operation: part of it
            return fn(*args, **kwargs)
        conv, flags = self._convert(args)
        kconv, kflags = self._convert(kwargs) if kwargs else (kwargs, 0)
        flags |= kflags
        if flags:
            real_args, real_kw = _resolved(conv, kconv, self.iteration, self._results)
        else:
            real_args, real_kw = args, kwargs
        self._inside = True
        try:
            result = fn(*real_args, **real_kw)
        finally:
            self._inside = False
        index = len(self.ops)
        self.ops.append((fn, conv, kconv, flags))
        self._results.append(result)
        if result is not None and not isinstance(result, (bool, int, float, str)):
            self._produced[id(result)] = index
        return result

    def _convert(self, a):
        """(argument with earlier results as _Ref, flags): _RESOLVE where a replay must
        compute it again. Most calls hold neither: a scan that builds nothing says so."""
        if not self._holds_refs(a):
            return a, 0
        flags = 0

        def leaf(x):
            nonlocal flags
            if isinstance(x, Varying):
                flags |= _RESOLVE
                return x
            index = self._earlier(x)
            if index is not None:
                self._mark_produces(index)
                flags |= _RESOLVE
                return _Ref(index)
            return x
        out = map_args(a, leaf)
        return (out if flags else a), flags

    def _holds_refs(self, a) -> bool:
        """Whether ``a`` holds an earlier result of this iteration or a Varying."""
        t = type(a)
        if t is tuple or t is list:
            return any(self._holds_refs(x) for x in a) if a else False
        if t is dict:
            return any(self._holds_refs(x) for x in a.values()) if a else False
        if t in _PLAIN:
            return False
        return isinstance(a, Varying) or self._earlier(a) is not None

    def _earlier(self, x) -> int | None:
        """The index of the operation of this iteration whose result ``x`` is (None: none)."""
        index = self._produced.get(id(x))
        return index if index is not None and self._results[index] is x else None

    def _mark_produces(self, index: int) -> None:
        fn, args, kw, flags = self.ops[index]
        self.ops[index] = (fn, args, kw, flags | _PRODUCES)

    def mark_loss(self, name: str, chunk) -> None:
        """The last operation returned the loss ``name`` (of ``chunk``, None: the batch)."""
        if not self.ops:
            self.diverge(f"loss {name!r} was not computed by a recorded kernel")
            return
        self._mark_produces(len(self.ops) - 1)
        self.losses.append((len(self.ops) - 1, name, chunk))

    def mark_saved(self, block) -> None:
        """The step guard's snapshot of ``block`` is complete once the last operation is."""
        self.saved.append((block, len(self.ops) - 1))

    def diverge(self, reason: str) -> None:
        if self.diverged is None:
            self.diverged = reason

    @contextlib.contextmanager
    def recording(self, device):
        """Record ``device``'s copy and ordering calls (the pool's and the step guard's) while
        they run; a call that decides at run time marks the tape as not replayable."""
        patched = []                        # (name, the instance attribute it shadowed)

        def op(fn):
            return lambda *a, **kw: self.call(fn, a, kw)

        order_after = device.order_after        # the device's own, not the recording one

        def decision(fn, name):
            def call(event):
                done = fn(event)
                if done:
                    self.call(order_after, (event,), {})
                return done
            return call
        try:
            for name in DEVICE_OPS + DEVICE_DECISIONS:
                fn = getattr(device, name, None)
                if fn is None:
                    continue
                patched.append((name, vars(device).get(name), device))
                setattr(device, name, op(fn) if name in DEVICE_OPS else decision(fn, name))
            timeline = getattr(device, "timeline", None)
            for name in TIMELINE_OPS if timeline is not None else ():
                patched.append((name, vars(timeline).get(name), timeline))
                setattr(timeline, name, op(getattr(timeline, name)))
            device.recording_tape = self        # recording.unrecordable reports to it
            with device.recording_temporaries(self.temporaries):
                yield self
        finally:
            vars(device).pop("recording_tape", None)
            for name, old, obj in patched:
                if old is None:
                    delattr(obj, name)
                else:
                    setattr(obj, name, old)
            self._produced.clear()
            self._results = []

    # ---- checking ----------------------------------------------------------------------
    def signature(self) -> list:
        """What must be equal for two records to be the same program: each call's function,
        and its arguments by address (arrays), position (earlier results) or value. Kept once
        computed: a record is compared with the one before it and the one after it (on a
        deep network a signature takes seconds)."""
        sig = self.__dict__.get("_signature")
        if sig is None or len(sig) != len(self.ops):
            sig = self._signature = [(_fn_key(fn), arg_key(args), arg_key(kw))
                                     for fn, args, kw, _ in self.ops]
        return sig

    # ---- replaying ---------------------------------------------------------------------
    def replay(self, iteration: int, device) -> list:
        """Run the operations again for ``iteration`` on ``device``; returns the results of
        those whose result is used (by index; others None). On an exception, ``stopped_at`` is
        the operation that raised (those before it are done)."""
        with device.replaying_temporaries(self.temporaries):
            return self.run_ops(self.ops, iteration)

    def run_ops(self, ops: list, iteration: int) -> list:
        """The replay loop over ``ops`` (this tape's, or a transformed copy of the same
        length and order: devices/cuda_graph.py)."""
        results = [None] * len(ops)
        resolve = _resolved
        i = 0
        try:
            for i, (fn, args, kw, flags) in enumerate(ops):
                if not flags:
                    fn(*args, **kw)
                    continue
                if flags & _RESOLVE:
                    args, kw = resolve(args, kw, iteration, results)
                r = fn(*args, **kw)
                if flags & _PRODUCES:
                    results[i] = r
        except BaseException:
            self.stopped_at = i
            raise
        self.stopped_at = len(ops)
        return results

    def saved_before(self, stop: int) -> list:
        """The blocks whose snapshot a replay stopped at operation ``stop`` has completed."""
        return [b for b, j in self.saved if j < stop]


def map_args(a, leaf):
    """``a`` with every leaf (not a list, tuple or dict) replaced by ``leaf(x)``."""
    if isinstance(a, (list, tuple)):
        out = [map_args(x, leaf) for x in a]
        return tuple(out) if isinstance(a, tuple) else out
    if isinstance(a, dict):
        return {k: map_args(v, leaf) for k, v in a.items()}
    return leaf(a)


def _resolved(args, kw, iteration, results):
    """A recorded call's arguments for ``iteration``: Varying values and earlier results."""
    def leaf(x):
        if isinstance(x, Varying):
            return x.resolve(iteration)
        if isinstance(x, _Ref):
            return results[x.index]
        return x
    return map_args(args, leaf), (map_args(kw, leaf) if kw else kw)


def _fn_key(fn):
    return getattr(fn, "__self__", None) and id(fn.__self__), getattr(fn, "__func__", fn)


#: types that are never a recorded result or a Varying (ints, floats, strings, None)
_PLAIN = frozenset((int, float, bool, str, type(None)))


def arg_key(a):
    """An argument as a signature compares it: arrays by address, shape, strides and type,
    earlier results by position, Varying by its function, the rest by value (scalars) or
    identity. The key's form is found once per type (a signature keys every argument of
    every operation: millions on the deepest ResNet)."""
    key = _KEY_OF_TYPE.get(type(a))
    return key(a) if key is not None else _key_of_new_type(a)


def _scalar_key(a):
    return ("s", type(a).__name__, a)


def _array_key(a):
    return ("a", a.__array_interface__["data"][0], a.shape, a.strides, a.dtype.str)


def _device_array_key(a):
    return ("a", a.data.ptr, getattr(a, "shape", None), getattr(a, "strides", None),
            str(getattr(a, "dtype", "")))


def _sequence_key(a):
    return (type(a).__name__, tuple([arg_key(x) for x in a]))


def _object_key(a):
    return ("o", id(a))


def _other_key(a):
    """Mappings, sets, Varying and earlier results (their keys depend on more than type)."""
    if isinstance(a, dict):
        return ("d", tuple((k, arg_key(v)) for k, v in a.items()))
    if isinstance(a, (set, frozenset)):         # e.g. the inputs whose gradient accumulates
        return ("set", tuple(sorted(arg_key(x) for x in a)))
    if isinstance(a, Varying):
        return ("v", a.fn.__code__)
    return ("r", a.index)


_KEY_OF_TYPE: dict = {t: _scalar_key for t in _PLAIN}
_KEY_OF_TYPE.update({np.ndarray: _array_key, tuple: _sequence_key, list: _sequence_key})


def _key_of_new_type(a):
    t = type(a)
    if isinstance(a, np.ndarray):
        key = _array_key
    elif isinstance(a, np.generic):
        key = _scalar_key
    elif isinstance(a, (list, tuple)):
        key = _sequence_key
    elif isinstance(a, (dict, set, frozenset, Varying, _Ref)):
        key = _other_key
    elif getattr(getattr(a, "data", None), "ptr", None) is not None:
        key = _device_array_key             # a device array: its address
    else:
        key = _object_key
    _KEY_OF_TYPE[t] = key
    return key(a)


def difference(a: Tape, b: Tape) -> str | None:
    """Why two records are not the same program (None: they are)."""
    if a.start_state != b.start_state:
        return "consecutive iterations started from different pool states"
    sa, sb = a.signature(), b.signature()
    for i, (x, y) in enumerate(zip(sa, sb)):
        if x != y:
            name = getattr(x[0][1], "__name__", "?")
            return f"consecutive iterations differ at operation {i} ({name})"
    if len(sa) != len(sb):
        return f"consecutive iterations issued {len(sa)} and {len(sb)} operations"
    if a.temporaries != b.temporaries:
        return "consecutive iterations placed the kernels' temporaries differently"
    if [(b_.id, j) for b_, j in a.saved] != [(b_.id, j) for b_, j in b.saved]:
        return "consecutive iterations snapshotted different blocks"
    return None
