"""The loss layers ending a training graph: softmax cross-entropy (classification, the default)
and mean squared error (regression)."""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from .base import AuxSpec, Layer


def record_loss(name: str, loss, ctx) -> None:
    """The batch's mean loss into ``ctx.losses``; under chunking, summed chunk by chunk in
    order, each weighted by its share of the batch. A loss still on the device (a kernel's
    DeviceLoss) is kept as a LossSum, read when the step ends."""
    ch = ctx.chunk
    if ctx.tape is not None:            # a replay reads it from the kernel's result
        ctx.tape.mark_loss(name, ch)
    if not isinstance(loss, (float, int, np.floating)):
        term = (loss, None, None) if ch is None else (loss, ch.size, ch.total)
        if ch is None or ch.first:
            ctx.losses[name] = LossSum([term])
        else:
            ctx.losses[name].terms.append(term)
        return
    if ch is None:
        ctx.losses[name] = float(loss)
    else:
        part = float(loss) * ch.size / ch.total
        ctx.losses[name] = part if ch.first else ctx.losses[name] + part


class LossSum:
    """A loss whose chunks' values are still on the device: float() reads them and sums them
    exactly as record_loss sums floats (same operations, same order, so the same bits)."""
    __slots__ = ("terms",)

    def __init__(self, terms: list):
        self.terms = terms              # (DeviceLoss, chunk rows or None, batch rows)

    def device_rows(self) -> list:
        """The device arrays holding the per-row losses (for a finiteness check there)."""
        return [loss.rows for loss, _, _ in self.terms]

    def __float__(self) -> float:
        acc = None
        for loss, size, total in self.terms:
            part = float(loss) if size is None else float(loss) * size / total
            acc = part if acc is None else acc + part
        return acc


def loss_value(loss) -> float:
    """A recorded loss as a float (reading it from the device if it is still there); NaN for
    None."""
    return float("nan") if loss is None else float(loss)


class SoftmaxCrossEntropy(Layer):
    kind = "loss"
    syncs_host = True               # the loss value, as a float
    num_inputs = 2                  # logits, labels
    type_name = "SoftmaxLoss"

    def infer_shapes(self, in_shapes):
        logits, labels = in_shapes
        if len(logits) != 1:
            raise ShapeError(f"{self.name}: logits must be (K,) per sample, got {logits}")
        if labels != ():
            raise ShapeError(f"{self.name}: labels must be one integer per sample, got {labels}")
        self.num_classes = logits[0]
        return [()]

    def aux_specs(self, batch):
        return {"probs": AuxSpec((batch, self.num_classes))}

    def forward(self, k, ins, outs, params, aux, ws, ctx):
        sink = ctx.loss_sink(self.name, outs[0]) if ctx.loss_sink is not None else None
        if sink is None:
            loss = k.softmax_xent_forward(ins[0], ins[1], aux["probs"], rows=outs[0])
            outs[0][...] = loss
        else:                       # the loss stays on the device until the step ends
            loss = k.softmax_xent_forward(ins[0], ins[1], aux["probs"], rows=outs[0], sink=sink)
        record_loss(self.name, loss, ctx)

    def backward(self, k, ins, outs, douts, dins, params, dparams, aux, ws, ctx):
        if dins[0] is not None:
            if ctx.chunk is None:
                k.softmax_xent_backward(aux["probs"], ins[1], dins[0], **ctx.grad_kw(0))
            else:
                k.softmax_xent_backward(aux["probs"], ins[1], dins[0], **ctx.grad_kw(0),
                                        total=ctx.chunk.total)


# Backward reads the labels (input 1) but not the logits.
SoftmaxCrossEntropy.retain_inputs = (1,)


class MSELoss(Layer):
    """Squared error for regression (the DQN planner's Q-network, planners/dqn_agent.py):
    loss = mean over the batch of 0.5 * sum_k (pred_k - target_k)^2, so the gradient is
    (pred - target) / batch. Targets are float, shape (K,) per sample like the prediction."""
    kind = "loss"
    syncs_host = True               # the loss value, as a float
    num_inputs = 2                  # prediction, target
    type_name = "MSELoss"

    def infer_shapes(self, in_shapes):
        pred, target = in_shapes
        if len(pred) != 1:
            raise ShapeError(f"{self.name}: predictions must be (K,) per sample, got {pred}")
        if tuple(target) != tuple(pred):
            raise ShapeError(f"{self.name}: targets must match predictions {pred}, got {target}")
        self.width = pred[0]
        return [()]

    def forward(self, k, ins, outs, params, aux, ws, ctx):
        loss = k.mse_forward(ins[0], ins[1])
        outs[0][...] = loss
        record_loss(self.name, loss, ctx)

    def backward(self, k, ins, outs, douts, dins, params, dparams, aux, ws, ctx):
        if dins[0] is not None:
            total = None if ctx.chunk is None else ctx.chunk.total
            k.mse_backward(ins[0], ins[1], dins[0], **ctx.grad_kw(0), total=total)


# Backward reads both the predictions and the targets.
MSELoss.retain_inputs = (0, 1)
