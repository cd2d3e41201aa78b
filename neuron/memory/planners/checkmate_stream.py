"""The copy stream inside the MILP (checkmate.py): one queue shared by every swap, as
time-indexed flow.

Priced alone, each swap's copies hide in the compute around them as if the stream were idle,
and swaps that each hide can together overrun it. Here the stream is a resource:
- during step k it copies at most the step's compute seconds plus z_k, the seconds compute
  waits at the end of step k (continuous, z_k >= 0, each in the objective);
- a swap's copy out runs between its offload (after its last forward use f) and the end of
  the step its block is released after (alone on the stream: TensorCost.held_after);
- its copy back runs between its prefetch (after step p) and its reader j; with no step
  between, compute waits for all of it.
Each copy is split over the steps of its window as flow variables (in microseconds, so that
HiGHS's absolute tolerances stay small against them). That is preemptive scheduling with
release times and deadlines on one machine, which the flow describes exactly; the real stream
is first-in first-out and does not preempt, so the model is optimistic, and its plan, like
every plan, is then simulated: checkmate keeps whichever of its programs simulates fastest.
Compute waits for a compressed swap's encode and decode in any case (two codec passes).

Tried and left out: a choice of release step per swap (the first step ending 0-3 copy times
after the offload, one binary each). HiGHS then ended every resnet_cifar 20 solve at the
20 s limit with gaps of 0.66-0.86 (before checkmate's objective was in microseconds), and
the plans were slower than with the one release.
"""
from __future__ import annotations

US = 1e6                    # flow and wait columns in microseconds


class CopyStream:
    """The copy stream's columns (placed after the MILP's r and s columns) and rows."""

    def __init__(self, ctx, costs):
        steps = ctx.schedule.steps
        n = len(costs)
        self.step_s = [ctx.step_time(s) for s in steps]
        self.n, self._obj = n, []
        self._flows = []            # (the swap's s column, copy seconds, its flow columns)
        self.stall_s = []           # seconds each swap costs outside the flow
        by_step: dict[int, list] = {}
        for i, c in enumerate(costs):
            one = c.swap_s / 2
            self._flows.append((n + i, one, self._window(range(c.last_fwd + 1,
                                                               c.held_after + 1), by_step)))
            back = range(c.prefetch_after + 1, c.first_bwd)
            if len(back):
                self._flows.append((n + i, one, self._window(back, by_step)))
            self.stall_s.append(2 * c.codec_s + (0.0 if len(back) else one))
        self._capacity = [(k, cols, self._column(1.0 / US)) for k, cols in
                          sorted(by_step.items())]

    def _column(self, objective: float) -> int:
        self._obj.append(objective)
        return 2 * self.n + len(self._obj) - 1

    def _window(self, ks, by_step) -> list:
        cols = [self._column(0.0) for _ in ks]
        for k, col in zip(ks, cols):
            by_step.setdefault(k, []).append(col)
        return cols

    def objective(self) -> list:
        """Objective coefficients of the stream's columns (seconds per unit)."""
        return self._obj

    def constraints(self, row) -> None:
        """``row(entries, low, high)`` for each of the stream's rows."""
        for s, one, cols in self._flows:        # each copy runs within its window
            row([(c, 1) for c in cols] + [(s, -one * US)], 0, 0)
        for k, cols, wait in self._capacity:    # the stream copies during step k, or waits
            row([(c, 1) for c in cols] + [(wait, -1)], -float("inf"), self.step_s[k] * US)
