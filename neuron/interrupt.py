"""Stopping a training run on SIGINT/SIGTERM/SIGHUP without losing it.

SIGHUP (the terminal or ssh session closed) is treated like SIGTERM, unless the run was started
with it ignored (`nohup`), which is kept: nohup's promise is that hanging up does not stop it.

The first signal only asks the loop to stop after the current step (the step finishes, the
checkpoint is written). A second one, while a step runs, raises KeyboardInterrupt at once: the
step is undone (train_step is a transaction) and the loop still writes the checkpoint of the last
whole step. Outside a step (a checkpoint write, the loop's own bookkeeping) signals are only
recorded, so nothing is cut short half-way; the undo itself runs with the signals deferred.
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading

SIGNALS = tuple(s for s in (getattr(signal, "SIGINT", None), getattr(signal, "SIGTERM", None),
                            getattr(signal, "SIGHUP", None))
                if s is not None)
#: the signals a process started to ignore keeps ignoring (nohup)
_KEEP_IGNORED = tuple(s for s in (getattr(signal, "SIGHUP", None),) if s is not None)


class StopRequest:
    """Installs the handlers for the duration of a ``with`` block (main thread only; elsewhere
    the Python defaults stay and a KeyboardInterrupt is still undone and saved by the loop)."""

    def __init__(self, announce: bool = True):
        self.signum: int | None = None
        self.count = 0
        self.announce = announce
        self._in_step = False
        self._old = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else "interrupt"

    def _handle(self, signum, frame):
        self.count += 1
        if self.signum is None:
            self.signum = signum
        if self.count == 1 and self.announce:
            print(f"\n{signal.Signals(signum).name}: stopping after this step (again: undo it "
                  "and stop now)", file=sys.stderr, flush=True)
        if self.count >= 2 and self._in_step:
            raise KeyboardInterrupt(f"{signal.Signals(signum).name} received twice")

    @contextlib.contextmanager
    def step(self):
        """A training step runs inside: only there may a second signal interrupt."""
        self._in_step = True
        try:
            yield
        finally:
            self._in_step = False

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                if s in _KEEP_IGNORED and signal.getsignal(s) is signal.SIG_IGN:
                    continue
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc):
        for s, old in self._old.items():
            signal.signal(s, old)
        self._old.clear()
        return False


@contextlib.contextmanager
def signals_deferred():
    """SIGINT/SIGTERM/SIGHUP received inside the block reach their handlers when it ends: for the
    lines that put state back, which a KeyboardInterrupt must not cut in half. (Handlers, not
    a signal mask: any thread, e.g. a BLAS worker, may be the one the kernel delivers to.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    saved = {}
    for s in SIGNALS:
        old = signal.getsignal(s)
        if old is not None:         # None: installed outside Python, cannot be put back
            saved[s] = old
            signal.signal(s, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        for s, old in saved.items():
            signal.signal(s, old)
        for signum in pending:
            signal.raise_signal(signum)
