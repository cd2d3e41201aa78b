"""Optimizers. State tensors live in the arena like everything else; the update is applied per
layer, right after that layer's backward step, so each parameter gradient dies at once."""
from __future__ import annotations

import math
import numbers

from .recording import per_iteration


class SGD:
    """torch.optim.SGD semantics: momentum (dampening 0), Nesterov, L2 weight decay.

    The momentum buffer starts at zero; the first step then gives buf = grad, which is exactly
    torch's first step (it clones the gradient)."""

    def __init__(self, lr: float = 0.1, momentum: float = 0.9, weight_decay: float = 0.0,
                 nesterov: bool = False):
        for name, v in (("lr", lr), ("momentum", momentum), ("weight_decay", weight_decay)):
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
                raise ValueError(f"SGD: {name} must be a finite number, got {v!r}")
        if lr <= 0:
            raise ValueError(f"SGD: lr must be > 0, got {lr}")
        if momentum < 0 or weight_decay < 0:
            raise ValueError(f"SGD: momentum ({momentum}) and weight_decay ({weight_decay}) "
                             "must be >= 0")
        if nesterov and momentum == 0:
            raise ValueError("SGD: nesterov needs momentum > 0")
        self.lr, self.momentum = float(lr), float(momentum)
        self.weight_decay, self.nesterov = float(weight_decay), bool(nesterov)

    @property
    def state_names(self) -> tuple[str, ...]:
        return ("momentum",) if self.momentum else ()

    #: update() takes the step guard's flag and sets it on a non-finite result itself
    checks_finite = True

    def update(self, k, param, grad, state, flag=None) -> None:
        lr = per_iteration(k, self._lr, None)     # a schedule changes it between iterations
        k.sgd_update(param, grad, state[0] if state else None, lr, self.momentum,
                     self.weight_decay, self.nesterov, flag=flag)

    def update_many(self, k, items, flag=None) -> None:
        """``update`` of each (param, grad, state) in ``items`` (a layer's, or a bucket's, due
        updates), as one kernel call where they share a dtype: on the GPU one launch for all
        of them (kernels/cuda.py sgd_update_many); one tensor or mixed dtypes go one by one."""
        if len(items) < 2 or len({p.dtype for p, _, _ in items}) > 1 or \
                type(self).update is not SGD.update:        # a subclass's own update
            for p, g, state in items:
                self.update(k, p, g, state, flag=flag)
            return
        lr = per_iteration(k, self._lr, None)
        k.sgd_update_many([p for p, _, _ in items], [g for _, g, _ in items],
                          [s[0] if s else None for _, _, s in items], lr, self.momentum,
                          self.weight_decay, self.nesterov, flag=flag)

    def _lr(self, iteration) -> float:
        return self.lr

    def config(self) -> dict:
        return {"type": "SGD", "lr": self.lr, "momentum": self.momentum,
                "weight_decay": self.weight_decay, "nesterov": self.nesterov}
