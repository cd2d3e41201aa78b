"""Dynamic loss scaling for fp16 training (torch.cuda.amp.GradScaler's rule).

float16 flushes gradients below 2^-24 to zero; multiplying the loss (so every gradient) by a
large scale keeps them representable. The parameter gradients are divided by the scale before
the update. A step whose gradients overflow (inf or NaN) is skipped, undone whole, and the
scale shrinks; after ``growth_interval`` good steps in a row it grows again. The scale and
the run of good steps are part of the training state (saved in checkpoints).
"""
from __future__ import annotations

import numpy as np

#: state_dict keys (the ':' keeps them out of Executor.parameters())
SCALE_KEY, GOOD_STEPS_KEY = "loss_scale:scale", "loss_scale:good_steps"


class GradientOverflow(ArithmeticError):
    """A scaled gradient is inf or NaN: the executor undoes the step and shrinks the scale."""


class LossScaler:
    def __init__(self, scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000):
        if not scale > 0 or not growth_factor > 1 or not 0 < backoff_factor < 1 \
                or growth_interval < 1:
            raise ValueError(f"LossScaler: need scale > 0, growth_factor > 1, 0 < "
                             f"backoff_factor < 1, growth_interval >= 1; got {scale}, "
                             f"{growth_factor}, {backoff_factor}, {growth_interval}")
        self.scale = float(scale)
        self.growth_factor, self.backoff_factor = float(growth_factor), float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.good_steps = 0
        self.skipped = 0            # steps skipped for overflow, this process

    def unscale(self, grad: np.ndarray) -> None:
        """Divide a parameter gradient by the scale, in place; GradientOverflow when it holds
        inf or NaN."""
        if not np.isfinite(grad).all():
            raise GradientOverflow(f"a gradient overflowed at loss scale {self.scale:g}")
        grad *= 1.0 / self.scale

    def overflowed(self) -> None:
        """The step was skipped: shrink the scale and start counting good steps again."""
        self.scale *= self.backoff_factor
        self.good_steps = 0
        self.skipped += 1

    def stepped(self) -> None:
        """The step was applied: grow the scale after a run of good steps."""
        self.good_steps += 1
        if self.good_steps >= self.growth_interval:
            self.scale *= self.growth_factor
            self.good_steps = 0

    def state(self) -> dict[str, np.ndarray]:
        return {SCALE_KEY: np.array(self.scale, np.float64),
                GOOD_STEPS_KEY: np.array(self.good_steps, np.int64)}

    def load(self, arrays: dict) -> None:
        """Take the scale and run of good steps from a checkpoint's arrays (where present)."""
        if SCALE_KEY in arrays:
            scale = float(np.asarray(arrays[SCALE_KEY]))
            if not np.isfinite(scale) or scale <= 0:
                raise ValueError(f"{SCALE_KEY}: must be a finite number > 0, got {scale}")
            self.scale = scale
        if GOOD_STEPS_KEY in arrays:
            self.good_steps = int(np.asarray(arrays[GOOD_STEPS_KEY]))
