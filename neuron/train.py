"""The training loop: data stream, learning-rate schedule, evaluation, checkpoints, progress."""
from __future__ import annotations

import math
import signal
import time

import numpy as np

from .checkpoint import (check_checkpoint_target, load_checkpoint, remove_stale_temps,
                         save_checkpoint)
from .data import Dataset, iterate, steps_per_epoch
from .errors import NeuronError, NonFiniteLossError, TrainingStopped, UsageError
from .executor import Executor
from .interrupt import StopRequest
from .memory.traffic import TrafficCheck
from .sizes import number_arg

SCHEDULES = ("cosine", "constant")


def lr_at(step: int, total: int, base: float, schedule: str, warmup: int = 0) -> float:
    if warmup < 0:
        raise UsageError(f"warmup must be >= 0 iterations, got {warmup}")
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
    chunks = ds.in_order(b) if hasattr(ds, "in_order") else \
        ((ds.x[i:i + b], ds.y[i:i + b]) for i in range(0, n, b))
    for xb, yb in chunks:
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


def _resume_point(path, meta: dict, batch: int) -> int:
    """The checkpoint's iteration, checked (it decides where the data stream resumes)."""
    it = meta.get("iteration")
    if it is None:
        raise ValueError(f"checkpoint {path}: its metadata has no 'iteration'; it was not "
                         "written by neuron train")
    if isinstance(it, bool) or not isinstance(it, int) or it < 0:
        raise ValueError(f"checkpoint {path}: 'iteration' must be a non-negative integer, "
                         f"found {it!r}")
    saved_batch = meta.get("batch")
    if saved_batch is not None and saved_batch != batch:
        raise UsageError(f"checkpoint {path} was trained with batch {saved_batch}; resuming "
                         f"with batch {batch} would change the data order and the schedule: "
                         f"resume with --batch {saved_batch}")
    return it


def _count(name, value, *, positive=True, allow_none=True):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise UsageError(f"{name} must be an integer, got {value!r}")
    if value < (1 if positive else 0):
        raise UsageError(f"{name} must be {'positive' if positive else '>= 0'}, got {value}")
    return int(value)


def _diverged_state(iteration, checkpoint, saved, resume, start) -> str:
    """Where the good state is after a non-finite step: the state the step started from may
    itself have diverged (a huge but finite update), so it is not written over the last good
    checkpoint."""
    head = (f"the state of iteration {iteration} was not saved (the step after it went "
            "non-finite: it may have diverged already)")
    if saved is not None:
        return (f"{head}; {checkpoint} keeps the last good checkpoint, iteration {saved} "
                f"(continue with --resume {checkpoint}, e.g. with a lower --lr)")
    if resume:
        return (f"{head}; {resume} still holds iteration {start} (continue with --resume "
                f"{resume}, e.g. with a lower --lr)")
    return f"{head}; no checkpoint was written before it"


def fit(ex: Executor, train: Dataset, test: Dataset | None = None, *, iters: int | None = None,
        epochs: float | None = None, lr: float = 0.1, schedule: str = "cosine", warmup: int = 0,
        seed: int = 0, checkpoint: str | None = None, resume: str | None = None,
        meta: dict | None = None, progress: bool = True, stop_at: int | None = None,
        checkpoint_every: int | None = None, dp=None) -> dict:
    """Train ``ex`` on ``train``; returns a summary dict (losses, accuracy, speed, memory).

    With ``checkpoint``, the state is written atomically every ``checkpoint_every`` iterations
    (default: once per epoch) and at the end. SIGINT/SIGTERM/SIGHUP stop the run after the
    current step (a second signal undoes it and stops at once); a step refused as non-finite,
    or any other failure, also stops it. Then the checkpoint of the last whole step is written and
    :class:`TrainingStopped` says where the state is; after a non-finite step the state it
    started from is suspect (a huge finite update overflows only at the next step), so it is
    not written, and a periodic checkpoint is only written once the step after it ran finite:
    the checkpoint file keeps the last good state.

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
    traffic = TrafficCheck(ex) if ex.planned and dp is None else None   # moves == the plan's
    if traffic is not None:
        step_fn = traffic.wrap(step_fn)
    progress = progress and (dp is None or dp.rank == 0)
    writer = dp is None or dp.rank == 0
    per_epoch = steps_per_epoch(train, gbatch)
    iters = _count("iters", iters)
    if epochs is not None and not (isinstance(epochs, (int, float)) and math.isfinite(epochs)
                                   and epochs > 0):
        raise UsageError(f"epochs must be a positive number, got {epochs!r}")
    total = iters if iters is not None else int(math.ceil((epochs or 1) * per_epoch))
    warmup = _count("warmup", warmup, positive=False, allow_none=False)
    stop_at = _count("stop_at", stop_at, positive=False)
    lr = number_arg(lr, "lr", "fit", low=0, low_open=True, error=UsageError)
    if schedule not in SCHEDULES:
        raise UsageError(f"fit: schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    every = _count("checkpoint_every", checkpoint_every) or per_epoch
    if checkpoint is not None:          # "" is an error, not "no checkpoint"
        check_checkpoint_target(checkpoint)
        remove_stale_temps(checkpoint)
    start = 0
    if resume:
        arrays, m = load_checkpoint(resume)
        start = _resume_point(resume, m, ex.batch)
        if start >= total:
            raise UsageError(f"checkpoint {resume} is at iteration {start} and this run ends at "
                             f"iteration {total}: nothing is left to train (ask for more, e.g. "
                             f"--iters {start + max(per_epoch, 1)})")
        ex.load_state_dict(arrays)
        ex.iteration = start
        if dp is not None:
            dp.check_parameters(when=f"after resuming from {resume}")
    end = min(total, stop_at) if stop_at is not None else total
    # a replaying executor's batch buffers: the loader gathers each batch there, not the step
    into = (lambda: _images_and_labels(ex.batch_buffers())) if dp is None else None
    stream = iterate(train, gbatch, seed=seed, start_step=start, into=into)
    losses: list[float] = []
    saved_at = [None]

    def snapshot():
        """The state to checkpoint now (rank 0's copy; the other ranks hold only the turn)."""
        if not writer:
            return None, ex.iteration
        return (ex.state_dict(), {**(meta or {}), "iteration": ex.iteration, "seed": seed,
                                  "optimizer": ex.optimizer.config(), "batch": ex.batch,
                                  "world_size": world}), ex.iteration

    def write(snap):
        state, iteration = snap
        try:                        # outside a step: a signal is only recorded, never cuts this
            if writer:
                save_checkpoint(checkpoint, *state)
        except OSError as e:
            where = (f"the checkpoint of iteration {saved_at[0]} there is intact"
                     if saved_at[0] is not None else "nothing was saved")
            raise TrainingStopped(f"cannot write checkpoint {checkpoint} at iteration "
                                  f"{iteration} ({e.strerror or e}); {where}",
                                  iteration=iteration, checkpoint=None) from None
        saved_at[0] = iteration
        if dp is not None:
            dp.comm.barrier(f"checkpoint {checkpoint} written by rank 0")

    # A due checkpoint is held (host copy) until the next step proves its state finite: an
    # update that explodes to huge finite values passes its own step's check and only the next
    # step overflows, so writing at once would put a diverged state over the last good one.
    pending = None

    failure: BaseException | None = None
    bar = None
    t0 = time.perf_counter()
    data_wait = 0.0
    with StopRequest(announce=progress) as stop:
        if progress:
            from tqdm import tqdm
            bar = tqdm(total=total, initial=start, unit="it", dynamic_ncols=True, leave=True)
        try:
            for step in range(start, end):
                if stop.requested:
                    break
                ex.optimizer.lr = lr_at(step, total, lr, schedule, warmup)
                tw = time.perf_counter()
                xb, yb = next(stream)
                data_wait += time.perf_counter() - tw     # the step waited on the data loader
                try:
                    with stop.step():
                        losses.append(step_fn(xb, yb))
                except BaseException as e:      # undone by the executor; save what we have
                    failure = e
                    break
                if bar is not None:
                    el = time.perf_counter() - t0
                    bar.set_postfix(loss=f"{losses[-1]:.4f}",
                                    img_s=f"{len(losses) * gbatch / el:.0f}")
                    bar.update(1)
                if pending is not None:         # this step ran finite from that state
                    write(pending)
                    pending = None
                if checkpoint and ex.iteration % every == 0 and ex.iteration < end:
                    pending = snapshot()
        finally:
            if bar is not None:
                bar.close()
        elapsed = time.perf_counter() - t0
        diverged = isinstance(failure, NonFiniteLossError)
        if checkpoint and ex.iteration > start and not diverged:
            write(snapshot())           # the end, a signal, or a failure that is not the numbers
        if isinstance(failure, KeyboardInterrupt) and stop.signum is None:
            stop.signum = signal.SIGINT
    result = {"iterations": ex.iteration - start,
              "final_loss": losses[-1] if losses else None,
              "images_per_sec": (len(losses) * gbatch / elapsed) if elapsed > 0 else None,
              "seconds": elapsed, "peak_bytes": ex.pool.high_water,
              "planned_peak_bytes": ex.planned["peak_bytes"] if ex.planned else None,
              "arena_bytes": ex.device.arena_bytes, "data_wait_seconds": round(data_wait, 3)}
    if hasattr(train, "loader_stats"):
        result["loader"] = train.loader_stats()
    if traffic is not None:
        result["traffic"] = traffic.report()
    if getattr(ex.pool, "overlap", None) is not None:     # CUDA-event copy/compute times
        result["overlap"] = ex.pool.overlap.report()
    if stop.requested or failure is not None:
        if not checkpoint:
            state = f"state of iteration {ex.iteration} not saved (no --checkpoint given)"
        elif diverged:
            state = _diverged_state(ex.iteration, checkpoint, saved_at[0], resume, start)
        elif saved_at[0] == ex.iteration:
            state = (f"state of iteration {ex.iteration} saved to {checkpoint} (continue with "
                     f"--resume {checkpoint})")
        elif saved_at[0] is None:
            state = ("no step finished, nothing saved" +
                     (f"; {resume} still holds iteration {start}" if resume else ""))
        else:
            state = f"state of iteration {saved_at[0]} in {checkpoint}"
        if stop.requested:
            raise TrainingStopped(f"stopped by {stop.name} after iteration {ex.iteration} of "
                                  f"{total}; {state}", iteration=ex.iteration,
                                  checkpoint=checkpoint, signum=stop.signum, result=result)
        if isinstance(failure, NeuronError):
            raise TrainingStopped(f"{failure}; {state}", iteration=ex.iteration,
                                  checkpoint=checkpoint, result=result) from failure
        failure.add_note(state)
        raise failure
    if test is not None and (dp is None or dp.rank == 0):     # replicas are identical
        tl, acc = evaluate(ex, test)
        result.update(test_loss=tl, test_accuracy=acc)
    return result


def _images_and_labels(buffers):
    """Executor.batch_buffers() as (images, labels), or None."""
    return None if buffers is None else tuple(buffers.values())[:2]
