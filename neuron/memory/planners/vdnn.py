"""vDNN (Rhu et al. 2016), the baseline of SuperNeurons' Table 3 and later papers.

vDNN-all offloads every activation that backward needs right after its last forward use;
vDNN-conv only the inputs of convolutions. Nothing is recomputed and there is no tensor
cache: every offloaded tensor comes back by a prefetch started one layer ahead of its
backward use (it overlaps the layer before). The LRU eviction of the pool stays as the
fallback, so a budget the static schedule misses still runs where the bytes exist.
"""
from __future__ import annotations

from .base import KEEP, SWAP, Decisions, Planner
from .rewrite import droppable, producers
from .swap import swap_schedule


class VdnnAll(Planner):
    name = "vdnn"
    description = "offload every activation backward needs, prefetch one layer ahead"
    conv_only = False

    def chosen(self, ctx, cands) -> list:
        if not self.conv_only:
            return cands
        conv_inputs = {t.id for layer in ctx.schedule.graph.route if layer.kind == "conv"
                       for sym in layer.inputs for t in ctx.schedule.values(sym)}
        return [t for t in cands if t.id in conv_inputs]

    def plan(self, ctx) -> Decisions:
        steps = ctx.schedule.steps
        cands = droppable(ctx.schedule)
        # the data batch is a conv input too (vDNN offloads it): add it back
        prod = producers(ctx.schedule)
        data = [t for sym in ctx.schedule.graph.inputs for t in ctx.schedule.values(sym)]
        cands = [t for t in data if t.id in prod] + cands
        swap = self.chosen(ctx, cands)
        offload_after, prefetch_after = swap_schedule(steps, swap, ctx, ahead=1)
        ids = {t.id for t in swap}
        return Decisions(list(steps), offload_after=offload_after, prefetch_after=prefetch_after,
                         tensors={t.name: SWAP if t.id in ids else KEEP for t in cands})


class VdnnConv(VdnnAll):
    name = "vdnn-conv"
    description = "offload only convolution inputs, prefetch one layer ahead"
    conv_only = True
