"""Reads CUDA's ordering off the stand-in's stream log (runtime.py) and checks it both ways.

Every logged operation touches address ranges: a kernel (``launch(name, writes, reads)``) writes
and reads device ranges (a range not known to be only read counts as written), a device-to-
device move touches device ranges (counted as written), a copy to the host reads a device range
and writes a host range, a copy from the host the other way round. Two operations
on different streams *conflict* where one writes a range the other touches.

- Safe: of two conflicting operations, the one issued first happens before the other (stream
  order plus the wait_event edges, as CUDA defines them, plus what the host issued after it
  saw an operation complete).
- Tight, copies: a copy waits directly (the waits issued on its stream just before it) for
  compute only up to the first step event recorded after the last kernel that touches its
  device range (read or written);
  waiting for the whole queue shows up as a wait past that step event.
- Tight, compute: a wait of compute for a copy is followed, before the next step event, by a
  kernel that touches the copy's device range (it reads the tensor or reuses the block).

Step events are the ones the pool's fences record after each step (``step_events``: their
ids); the compute stream's other records are the "now" events of the running step.
"""
from __future__ import annotations

from dataclasses import dataclass, field

COPIES = ("d2h", "h2d")


def _touch(op) -> tuple[list, list, list, list]:
    """(device reads, device writes, host reads, host writes) of a logged operation."""
    kind = op[0]
    if kind == "kernel":
        return list(op[3]) if len(op) > 3 else [], list(op[2]), [], []
    if kind == "d2d":
        _, dst, src, n = op
        return [], [(src, src + n), (dst, dst + n)], [], []
    if kind == "d2h":
        _, dst, src, n = op
        return [(src, src + n)], [], [], [(dst, dst + n)]
    if kind == "h2d":
        _, dst, src, n = op
        return [], [(dst, dst + n)], [(src, src + n)], []
    return [], [], [], []


def _overlap(a, b) -> bool:
    return any(lo < h and l2 < hi for lo, hi in a for l2, h in b)


def _conflict(x, y) -> bool:
    dr, dw, hr, hw = x
    dr2, dw2, hr2, hw2 = y
    return (_overlap(dw, dr2 + dw2) or _overlap(dr, dw2) or
            _overlap(hw, hr2 + hw2) or _overlap(hr, hw2))


@dataclass
class Report:
    races: list = field(default_factory=list)          # (first, second) unordered conflicts
    copy_waits: list = field(default_factory=list)     # (copy, compute index waited, allowed)
    compute_waits: list = field(default_factory=list)  # (wait, the copy it waits for)
    copies: int = 0
    kernels: int = 0
    waits_for_copies: int = 0

    @property
    def ok(self) -> bool:
        return not (self.races or self.copy_waits or self.compute_waits)


def check(issued, compute, step_events) -> Report:
    """``issued``: the stand-in's ``_Stream.issued``; ``compute``: the compute stream;
    ``step_events``: ids of the events recorded at step ends."""
    rep = Report()
    # vector clocks: for each op, per stream, the last index that happens before or is it
    vc, last, host = {}, {}, {}
    ops_issued = []
    for s, i in issued:
        if s == "host":                         # what the host saw complete orders the rest
            if i not in vc:                     # issued before this log began (an earlier
                continue                        # device's stream): orders nothing in it
            for k, v in vc[i].items():
                if v > host.get(k, -1):
                    host[k] = v
            continue
        ops_issued.append((s, i))
        clock = dict(last.get(s, {}))
        op = s.ops[i]
        waited = [vc[op[2]]] if op[0] == "wait" and op[2] is not None else []
        for other in waited + [host]:
            for k, v in other.items():
                if v > clock.get(k, -1):
                    clock[k] = v
        clock[s] = i
        vc[(s, i)] = clock
        last[s] = clock

    def before(a, b) -> bool:
        return a != b and vc[b].get(a[0], -1) >= a[1]

    touching = [(a, _touch(a[0].ops[a[1]])) for a in ops_issued
                if a[0].ops[a[1]][0] in ("kernel", "d2d", "d2h", "h2d")]
    rep.kernels = sum(1 for a, _ in touching if a[0] is compute)
    rep.copies = sum(1 for a, _ in touching if a[0] is not compute)
    # safety: conflicting pairs on different streams, in issue order
    for n, (a, ta) in enumerate(touching):
        for b, tb in touching[n + 1:]:
            if a[0] is not b[0] and _conflict(ta, tb) and not before(a, b):
                rep.races.append((a, b))

    ops = compute.ops
    step_at = [i for i, op in enumerate(ops) if op[0] == "record" and id(op[1]) in step_events]

    def next_step_event(i):
        return next((j for j in step_at if j > i), len(ops))

    # tight copies
    pos = {a: k for k, (a, _) in enumerate(touching)}
    for a, ta in touching:
        s, i = a
        if s is compute:
            continue
        waited = -1
        for j in range(i - 1, -1, -1):          # its direct waits
            op = s.ops[j]
            if op[0] != "wait":
                if op[0] == "record":
                    continue
                break
            if op[2] is not None and op[2][0] is compute:
                waited = max(waited, op[2][1])
        if waited < 0:
            continue
        # the rule (issue 37): a copy waits for the last kernel that wrote or read its block
        dev_a = ta[0] + ta[1]
        dep = max((b[1] for b, tb in touching[:pos[a]]
                   if b[0] is compute and _overlap(dev_a, tb[0] + tb[1])), default=-1)
        allowed = next_step_event(dep)
        if waited > allowed:
            rep.copy_waits.append((a, waited, allowed))
    # tight compute waits
    for w, op in enumerate(ops):
        if op[0] != "wait" or op[2] is None or op[2][0] is compute:
            continue
        s, r = op[2]
        copy = next(((s, j) for j in range(r - 1, -1, -1) if s.ops[j][0] in COPIES), None)
        if copy is None:
            continue
        rep.waits_for_copies += 1
        end = next_step_event(w)
        tc = _touch(s.ops[copy[1]])
        dev = tc[0] + tc[1]
        if not any(op2[0] in ("kernel", "d2d") and _overlap(dev, sum(_touch(op2)[:2], []))
                   for op2 in ops[w + 1:end]):
            rep.compute_waits.append(((compute, w), copy))
    return rep
