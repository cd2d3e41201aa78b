"""When an executor records its iteration, trusts the record, and replays it: as a tape
(neuron/tape.py) or as one CUDA graph (neuron/devices/cuda_graph.py)."""
from __future__ import annotations

import statistics
import warnings
from collections import deque

from .devices.cuda_graph import GraphReplay, GraphUnavailable
from .layers.loss import record_loss
from .tape import Tape, arg_key, difference

MODES = ("off", "tape", "graph")


#: the Pool's traffic counters (attributes) a replayed iteration adds to, as its record did
_TRAFFIC = ("offload_bytes", "prefetch_bytes", "offload_count", "prefetch_count", "evictions",
            "evicted_bytes", "evictions_ahead", "ahead_fallbacks", "hits", "misses",
            "compactions", "moved_bytes", "clean_drops", "clean_bytes")


def pool_state(pool) -> tuple:
    """Where every tensor is between iterations: arena offsets and host buffer addresses."""
    host = tuple((tid, arg_key(buf)) for tid, (_, buf) in pool.host.items())
    return tuple(pool.offset.items()), host


def traffic(pool) -> dict:
    return {a: getattr(pool, a) for a in _TRAFFIC}


class _LossContext:
    """What loss.record_loss writes into, outside a step."""
    tape = None

    def __init__(self):
        self.losses, self.chunk = {}, None


class Replay:
    """When an executor records its iteration, when it trusts the record, and its replays.

    A record is trusted once two consecutive iterations recorded the same program from the same
    pool state and ended in it; it is replayed while the pool stays in that state (evaluate()
    or a failed step may move tensors: then it records again). ``reason`` says why the executor
    is not replaying, None while it is (or still recording)."""

    #: records compared before giving up (each is one eager iteration)
    ATTEMPTS = 4

    def __init__(self, mode: str):
        self.mode = mode
        self.tape: Tape | None = None
        self._last: Tape | None = None
        self._attempts = 0                  # settled records that did not repeat the last one
        self._moved = True                  # the pool may have moved since ready() last looked
        self._unsettled = 0                 # records in a row that ended elsewhere
        self.reason: str | None = None
        self.replayed = self.recorded = 0
        self.graph = None                   # the tape as a CUDA graph (mode "graph")
        self.graph_reason: str | None = None    # why the tape is replayed instead
        self.last_ran = "off"           # what the last train_step ran: "off" (eager) or mode
        self.host_seconds = deque(maxlen=64)    # per replayed step: wall time less device waits

    def pool_moved(self) -> None:
        """An eager iteration or evaluate() ended: tensors may be elsewhere now (a replay moves
        none, so between replays the pool's state is not read again)."""
        self._moved = True

    def ready(self, pool) -> bool:
        tape = self.tape
        if tape is None:
            return False
        if not self._moved:
            return True
        self._moved = False
        if pool_state(pool) == tape.start_state:
            return True
        self.tape, self._last, self._attempts, self.graph = None, None, 0, None
        return False

    def graph_for(self, device, staging):
        """The trusted tape as a CUDA graph (devices/cuda_graph.py), in graph mode while capturing
        works; None: replay the tape."""
        if self.mode != "graph" or self.graph_reason is not None:
            return None
        if self.graph is None or self.graph.tape is not self.tape:
            try:
                self.graph = GraphReplay(device, self.tape, staging)
            except GraphUnavailable as e:
                self.no_graph(str(e))
        return self.graph

    def run(self, graph, iteration: int, device) -> list:
        """One replay's results: through ``graph`` when there is one (falling back to the tape
        when it cannot be captured: nothing has run then), else the tape."""
        if graph is not None:
            try:
                return graph.run(iteration)
            except GraphUnavailable as e:
                self.no_graph(str(e))
        return self.tape.replay(iteration, device)

    def no_graph(self, why: str) -> None:
        """Replay the tape instead of a CUDA graph from now on, saying why (once)."""
        self.graph_reason, self.graph = why, None
        warnings.warn(f"replay graph: replaying the tape instead: {why}", RuntimeWarning,
                      stacklevel=5)

    def start(self, iteration: int, pool) -> Tape | None:
        """A tape to record this iteration on, or None (given up: run eagerly)."""
        if self.reason is not None:
            return None
        tape = Tape(iteration)
        tape.start_state = pool_state(pool)
        tape.counters = traffic(pool)
        return tape

    def finish(self, tape: Tape, pool) -> None:
        """The recorded iteration succeeded: trust its tape if it repeats the last one."""
        self.recorded += 1
        before = tape.counters
        tape.counters = {k: v - before[k] for k, v in traffic(pool).items()}
        if tape.diverged is not None:
            self.give_up(tape.diverged)
            return
        if pool_state(pool) != tape.start_state:
            # not a fixed point (yet: the first iterations allocate host buffers, evaluate()
            # moves parameters); records from here on compare afresh
            self._last = None
            self._unsettled += 1
            if self._unsettled >= 2 * self.ATTEMPTS:
                self.give_up(f"{self._unsettled} iterations in a row ended with tensors "
                             "elsewhere than they started")
            return
        self._unsettled = 0
        last, self._last = self._last, tape
        if last is None or last.start_state != tape.start_state:
            return
        why = difference(last, tape)
        if why is None:
            self.tape, self._last, self.graph = tape, None, None
            return
        self._attempts += 1
        if self._attempts >= self.ATTEMPTS:
            self.give_up(why)

    def give_up(self, why: str, warn: bool = True) -> None:
        """Run eagerly from now on, saying why (once)."""
        self.reason = why
        self.tape = self._last = self.graph = None
        if warn:
            warnings.warn(f"replay {self.mode}: running every iteration eagerly: {why}",
                          RuntimeWarning, stacklevel=4)

    def losses(self, tape: Tape, results) -> dict:
        ctx = _LossContext()
        for index, name, chunk in tape.losses:
            ctx.chunk = chunk
            record_loss(name, results[index], ctx)
        return ctx.losses

    def repeat_traffic(self, tape: Tape, pool) -> None:
        for a, d in tape.counters.items():
            setattr(pool, a, getattr(pool, a) + d)

    def info(self) -> dict:
        return {"mode": self.mode, "ran": self.last_ran, "replayed_iterations": self.replayed,
                "recorded_iterations": self.recorded,
                "operations": len(self.tape.ops) if self.tape is not None else None,
                "eager_because": self.reason, "tape_because": self.graph_reason,
                "graph_captures": self.graph.captures if self.graph is not None else 0,
                "host_ms": round(statistics.median(self.host_seconds) * 1e3, 4)
                if self.host_seconds else None}
