"""The training loop: data stream, learning-rate schedule, evaluation, checkpoints, progress."""
from __future__ import annotations

import math
import time

import numpy as np

from .checkpoint import load_checkpoint, save_checkpoint
from .data import Dataset, iterate, steps_per_epoch
from .executor import Executor


def lr_at(step: int, total: int, base: float, schedule: str, warmup: int = 0) -> float:
    if warmup and step < warmup:
        return base * (step + 1) / warmup
    if schedule == "constant":
        return base
    if schedule == "cosine":
        return 0.5 * base * (1 + math.cos(math.pi * min(step, total) / max(total, 1)))
    raise ValueError(f"unknown schedule {schedule!r}; expected constant or cosine")


def evaluate(ex: Executor, ds: Dataset) -> tuple[float, float]:
    """Mean loss and accuracy over a whole split; the last partial batch is padded, not dropped."""
    n, b = len(ds), ex.batch
    total_loss, correct = 0.0, 0
    for start in range(0, n, b):
        xb, yb = ds.x[start:start + b], ds.y[start:start + b]
        m = len(yb)
        if m < b:      # pad with copies; inference is per sample, so padding changes nothing
            idx = np.arange(b) % m
            xb, yb = xb[idx], yb[idx]
        loss, _ = ex.evaluate(xb, yb)
        pred = ex.last_logits.argmax(axis=1)[:m]
        correct += int((pred == yb[:m]).sum())
        total_loss += loss * m if m == b else _partial_loss(ex.last_logits[:m], yb[:m]) * m
    return total_loss / n, correct / n


def _partial_loss(logits, y) -> float:
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float(-logp[np.arange(len(y)), y].mean())


def fit(ex: Executor, train: Dataset, test: Dataset | None = None, *, iters: int | None = None,
        epochs: float | None = None, lr: float = 0.1, schedule: str = "cosine", warmup: int = 0,
        seed: int = 0, checkpoint: str | None = None, resume: str | None = None,
        meta: dict | None = None, progress: bool = True, stop_at: int | None = None,
        dp=None) -> dict:
    """Train ``ex`` on ``train``; returns a summary dict (losses, accuracy, speed, memory).

    ``stop_at`` ends the run early at that step (as if interrupted) while the learning-rate
    schedule still spans the full ``iters``: resuming from its checkpoint continues the exact
    trajectory.

    ``dp`` (a distributed.DataParallel): ``ex.batch`` is per rank; every rank walks the same
    stream of global batches (``ex.batch`` x world size) and trains on its shard; rank 0 alone
    shows progress and writes the checkpoint.
    """
    world = dp.world_size if dp is not None else 1
    gbatch = ex.batch * world
    step_fn = ex.train_step if dp is None else lambda x, y: dp.train_step(*dp.shard(x, y))
    progress = progress and (dp is None or dp.rank == 0)
    per_epoch = steps_per_epoch(train, gbatch)
    total = iters if iters is not None else int(math.ceil((epochs or 1) * per_epoch))
    if total <= 0:
        raise ValueError(f"number of iterations must be positive, got {total}")
    start = 0
    if resume:
        arrays, m = load_checkpoint(resume)
        ex.load_state_dict(arrays)
        start = ex.iteration = int(m["iteration"])
        if dp is not None:
            dp.check_parameters(when=f"after resuming from {resume}")
    end = min(total, stop_at) if stop_at is not None else total
    stream = iterate(train, gbatch, seed=seed, start_step=start)
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=total, initial=start, unit="it", dynamic_ncols=True, leave=True)
    losses: list[float] = []
    t0 = time.perf_counter()
    for step in range(start, end):
        ex.optimizer.lr = lr_at(step, total, lr, schedule, warmup)
        xb, yb = next(stream)
        losses.append(step_fn(xb, yb))
        if bar is not None:
            el = time.perf_counter() - t0
            bar.set_postfix(loss=f"{losses[-1]:.4f}", img_s=f"{len(losses) * gbatch / el:.0f}")
            bar.update(1)
    elapsed = time.perf_counter() - t0
    if bar is not None:
        bar.close()
    if checkpoint and (dp is None or dp.rank == 0):
        save_checkpoint(checkpoint, ex.state_dict(),
                        {**(meta or {}), "iteration": ex.iteration, "seed": seed,
                         "optimizer": ex.optimizer.config(), "batch": ex.batch,
                         "world_size": world})
    if checkpoint and dp is not None:
        dp.comm.barrier(f"checkpoint {checkpoint} written by rank 0")
    result = {"iterations": end - start, "final_loss": losses[-1] if losses else None,
              "images_per_sec": (len(losses) * gbatch / elapsed) if elapsed > 0 else None,
              "seconds": elapsed, "peak_bytes": ex.pool.high_water,
              "planned_peak_bytes": ex.planned["peak_bytes"] if ex.planned else None,
              "arena_bytes": ex.device.arena_bytes}
    if test is not None and (dp is None or dp.rank == 0):     # replicas are identical
        tl, acc = evaluate(ex, test)
        result.update(test_loss=tl, test_accuracy=acc)
    return result
