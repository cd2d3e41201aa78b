"""COMPRESS as a fourth decision (FreeLunch, seed 002), over any planner's decisions.

``--compress 2|4`` (planner option ``compress=2``): every float32 feature map (activation,
recomputed ones included; never a gradient, parameter or the data batch) goes to the host
compressed whenever it goes there at all, by the planner's own offload or the pool's LRU
fallback (memory/compressed_swap.py), at a fixed rate, so its
compressed size is known at plan time: bf16 (2x) or 8-bit block floating point (3.88x). The
tensors the planner swaps are reported as COMPRESS. Lossy, so never on by default.

The wrapped planner plans with the compressed copies: the plan context carries the codec
(``PlanContext.codec``), so every candidate it simulates (``ctx.simulate``/``ctx.evaluate``)
has the same compression as the decisions returned (``ctx.compress_map``; the executor then
reuses the planner's simulation of them), and the per-tensor costs it weighs
(planners/costs.py: ``ctx.copy_cost``; superneurons' bounds: ``ctx.copy_fraction``) count the
compressed bytes plus an encode and a decode, each a pass over the tensor and its compressed
bytes that compute waits for. So superneurons keeps the candidate that is fastest with
compression, and capuchin and the MILP swap where a compressed copy beats a recompute; as the
truer per-tensor price alone sometimes chose worse (it sees neither the tensor cache nor the
copy stream), those two also search the choice made from full-size costs and keep the faster
(capuchin.py, checkmate.py). A prefetch keeps the full-size copy's lead (swap.py). Before, the
planner planned with full-size copies and only the final plan was compressed; on ResNet-50
and DenseNet-121 at batch 32 (0.5x, 0.3x the liveness peak and the minimum budget) planning
with the compressed copies is up to 16% faster in simulated time and nowhere slower.

A compressed copy moves fewer bytes but passes through a staging
block of its compressed size in the arena (memory/compressed_swap.py), and while it waits it
holds less than a plain copy does: the tensor's own block is free once encoded,
so a planned compressed offload holds 1/rate of the bytes a plain one holds while its copy
runs, and a prefetched one holds only its staging block until its first reader decodes it
(a plain one holds its whole block). Only the encode and the decode need more, their
staging block beside the tensor's: an eviction with less free space encodes in
slices, and only where free space holds less than a quarter of it (or a planned offload finds
no room) does the tensor go to the host as it is; a reader whose block cannot be had beside a
staged copy drops the copy and misses. Neither fails for want of a staging block.
"""
from __future__ import annotations

from ..codecs import get_codec
from .base import COMPRESS, SWAP, Decisions, Planner


class Compressed(Planner):
    def __init__(self, inner: Planner, rate: int):
        self.inner, self.rate = inner, get_codec(rate).rate
        self.name = f"{inner.name}+compress{self.rate}"
        self.description = f"{inner.description}; feature maps to the host at {self.rate}x"

    def plan(self, ctx) -> Decisions:
        ctx.codec = get_codec(self.rate)
        d = self.inner.plan(ctx)
        # the compression every simulation of d had (ctx.simulate): the executor reuses the
        # planner's simulation of it
        d.compress = ctx.compress_map(d.steps)
        d.info = dict(d.info)
        names = {t.name for s in d.steps for t in s.reads + s.writes if t.id in d.compress}
        d.tensors = {k: COMPRESS if v == SWAP and k in names else v for k, v in d.tensors.items()}
        d.info["compress_rate"] = self.rate
        d.info["codec"] = get_codec(self.rate).name
        return d
