"""Time model of the gradient all-reduce (for `neuron plan --data-parallel K`).

Ring all-reduce (reduce-scatter then all-gather): in 2(K-1) steps each rank sends and receives
n/K bytes per step, i.e. 2(K-1)/K * n bytes over its link, plus a per-step latency. With one
collective per layer (how the gradient hook calls it) the latency is paid per layer.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: default per-step latency of a collective (NCCL/MPI on one node are a few microseconds)
DEFAULT_LATENCY_S = 5e-6


def ring_allreduce_seconds(nbytes: int, world_size: int, link_gbps: float,
                           latency_s: float = DEFAULT_LATENCY_S, calls: int = 1) -> float:
    """Seconds to all-reduce ``nbytes`` (split into ``calls`` collectives) over ``world_size``
    ranks on a ring whose links carry ``link_gbps`` gigabits (10^9 bits) per second each way."""
    if world_size < 1:
        raise ValueError(f"world size must be >= 1, got {world_size}")
    if nbytes < 0 or calls < 0:
        raise ValueError(f"all-reduce of {nbytes} bytes in {calls} calls: both must be >= 0")
    if link_gbps <= 0:
        raise ValueError(f"link bandwidth must be positive, got {link_gbps} Gbit/s")
    if world_size == 1 or nbytes == 0:
        return 0.0
    k = world_size
    bandwidth = link_gbps * 1e9 / 8                   # bytes per second
    return 2 * (k - 1) / k * nbytes / bandwidth + calls * 2 * (k - 1) * latency_s


def bucket_groups(sizes, bucket_bytes: int) -> list[list[int]]:
    """Consecutive gradients (in the order they are ready) grouped into collectives of at least
    ``bucket_bytes`` each (the last one may be smaller); 0: one collective per entry. Returns
    the entries' positions per collective: the one rule of the clock (memory/clock.py), the
    cost model and the runtime's buckets (distributed/overlap.py)."""
    out, cur, acc = [], [], 0
    for i, n in enumerate(sizes):
        cur.append(i)
        acc += int(n)
        if acc >= bucket_bytes:
            out.append(cur)
            cur, acc = [], 0
    if cur:
        out.append(cur)
    return out


def buckets(sizes, bucket_bytes: int) -> list[int]:
    """The bytes of each collective of ``bucket_groups``."""
    sizes = [int(n) for n in sizes]
    return [sum(sizes[i] for i in g) for g in bucket_groups(sizes, bucket_bytes)]


@dataclass(frozen=True)
class RingModel:
    """The collective model the simulated clock (memory/clock.py) replays on its comm stream."""
    world_size: int
    link_gbps: float
    latency_s: float = DEFAULT_LATENCY_S
    bucket_bytes: int = 0           # 0: one collective per layer, as the gradient hook does

    def seconds(self, nbytes: int) -> float:
        return ring_allreduce_seconds(nbytes, self.world_size, self.link_gbps, self.latency_s)


def allreduce_plan(graph, dtype, world_size: int, link_gbps: float,
                   latency_s: float = DEFAULT_LATENCY_S, bucket_bytes: int = 0) -> dict:
    """Per-iteration communication of data-parallel training of ``graph``: every trainable
    parameter's gradient, one collective per layer that has any (``bucket_bytes``: consecutive
    layers, in backward order, grouped into collectives of at least that size)."""
    itemsize = np.dtype(dtype).itemsize
    per_layer: dict[str, int] = {}          # route order
    for _, layer, _, spec in graph.params():
        if spec.trainable:
            per_layer[layer.name] = (per_layer.get(layer.name, 0)
                                     + int(np.prod(spec.shape)) * itemsize)
    calls = buckets(reversed(list(per_layer.values())), bucket_bytes)   # backward: last first
    nbytes = sum(calls)
    return {"world_size": int(world_size), "link_gbps": float(link_gbps),
            "latency_s": latency_s, "bucket_bytes": int(bucket_bytes),
            "allreduce_bytes": nbytes, "allreduce_calls": len(calls),
            "allreduce_time_s": ring_allreduce_seconds(nbytes, world_size, link_gbps,
                                                       latency_s, calls=len(calls))}
