"""GPU measurement helpers the table scripts share (deepest, widest, recompute_table,
tensor_cache, memory_trace, throughput, gpu_confirm, gpu_pressure): CUDA checks, memory caps,
one timed PyTorch or neuron run, the largest-that-fits search, library versions. The PyTorch
networks they run are in torch_models.py; ``build`` is re-exported for the scripts that take
this module as ``TM``.
"""
from __future__ import annotations

import gc
import os
import sys
import time

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.gpu.torch_models import build, segments_for

__all__ = ["build", "segments_for", "require_cuda", "host_memory_bytes", "gpu_total_bytes",
           "cap_torch", "free_gpu", "torch_run", "torch_search", "neuron_run", "versions",
           "BENCH_LR"]


def require_cuda(script: str) -> str:
    """Exit with a clear message unless both PyTorch and CuPy see a CUDA device. Returns the
    device name."""
    why = []
    if not torch.cuda.is_available():
        why.append("torch.cuda.is_available() is False")
    try:
        import cupy as cp
        if not cp.cuda.is_available():
            why.append("cupy.cuda.is_available() is False")
    except Exception as e:             # ImportError, or a CUDA driver error at import
        why.append(f"CuPy is not usable ({type(e).__name__}: {e})")
    if why:
        sys.exit(f"{script}: the GPU path needs a CUDA GPU with PyTorch and CuPy "
                 f"({'; '.join(why)}). Run it with --plan-only to get the planning columns "
                 "without a GPU.")
    return torch.cuda.get_device_name(0)


def host_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def gpu_total_bytes() -> int:
    return torch.cuda.get_device_properties(0).total_memory


def cap_torch(budget: int) -> float:
    """Cap PyTorch's caching allocator at ``budget`` bytes of this GPU (the same cap as
    neuron's arena). Returns the fraction set."""
    frac = budget / gpu_total_bytes()
    if frac > 1:
        raise ValueError(f"budget {budget} is larger than the GPU ({gpu_total_bytes()} bytes)")
    torch.cuda.set_per_process_memory_fraction(frac, 0)
    return frac


def free_gpu() -> None:
    """Give cached blocks back (PyTorch's and CuPy's) so the next run starts clean."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    try:
        import cupy as cp
        cp.get_default_memory_pool().free_all_blocks()
        cp.get_default_pinned_memory_pool().free_all_blocks()
    except Exception:
        pass


#: failures that mean "does not fit": the allocator's OOM, cuDNN/cuBLAS failing to allocate, and
#: cuDNN refusing a tensor too large for its 32-bit indexing (very large batches)
_OOM_MARKERS = ("out of memory", "CUDNN_STATUS_ALLOC_FAILED", "CUBLAS_STATUS_ALLOC_FAILED",
                "CUDNN_STATUS_NOT_SUPPORTED")


def _is_oom(e: BaseException) -> bool:
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(e, RuntimeError) and any(m in str(e) for m in _OOM_MARKERS)


#: learning rate of the timed runs (both sides): tiny, so that networks of thousands of layers
#: stay finite over a few iterations (a 137-layer Table-4 ResNet at batch 1 reaches loss 0 / a
#: gradient norm of ~8e3 after one step at lr 0.01, in PyTorch and neuron alike); speed and
#: memory do not depend on it, and neuron refuses a non-finite loss
BENCH_LR = 1e-6


def torch_run(name: str, batch: int, *, depth: int | None = None, mode: str = "eager",
              iters: int = 0, warmup: int = 2, seed: int = 0, device: str = "cuda",
              allow_tf32: bool = False) -> dict:
    """Train ``name`` for ``warmup`` + ``iters`` iterations under the cap already set.

    mode "eager": plain autograd; "checkpoint": torch.utils.checkpoint.checkpoint_sequential
    with sqrt(n) segments (use_reentrant=False). SGD with momentum 0.9 (neuron's default
    optimizer state) at BENCH_LR, float32, TF32 off (``allow_tf32``: on), cudnn.benchmark on. The batch is copied
    from pinned host memory every iteration, as neuron's train_step copies its NumPy batch
    into the arena.
    Two warm-up iterations at least: the second is the first with momentum buffers, i.e. the
    steady state. Returns {"fits", "seconds_per_iter", "img_per_s", "peak_allocated_bytes", ...}
    or {"fits": False, "oom": bool, "error": str}. device="cpu" runs the same code on the CPU
    (to test the scripts' logic without a GPU; no memory statistics there).
    """
    from torch.utils.checkpoint import checkpoint_sequential
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    torch.manual_seed(seed)
    out: dict = {"mode": mode, "batch": batch, "depth": depth}
    err = None
    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    try:
        model, shape, classes = build(name, depth)
        model = model.to(device).train()
        segments = segments_for(model)
        opt = torch.optim.SGD(model.parameters(), lr=BENCH_LR, momentum=0.9)
        x_host = torch.randn(batch, *shape)
        y_host = torch.randint(0, classes, (batch,))
        if cuda:
            x_host, y_host = x_host.pin_memory(), y_host.pin_memory()

        def step():
            x = x_host.to(device, non_blocking=True)
            y = y_host.to(device, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            if mode == "checkpoint":
                logits = checkpoint_sequential(model, segments, x, use_reentrant=False)
            else:
                logits = model(x)
            loss = F.cross_entropy(logits, y)
            loss.backward()
            opt.step()
            return loss.item()              # one host sync per step, as neuron's train_step

        loss = None

        for _ in range(max(2, warmup)):
            loss = step()
        sync()
        if iters:
            t0 = time.perf_counter()
            for _ in range(iters):
                loss = step()
            sync()
            dt = (time.perf_counter() - t0) / iters
            out.update(seconds_per_iter=dt, img_per_s=batch / dt)
        out.update(fits=True, segments=segments if mode == "checkpoint" else None,
                   final_loss=loss,
                   peak_allocated_bytes=int(torch.cuda.max_memory_allocated()) if cuda else None,
                   peak_reserved_bytes=int(torch.cuda.max_memory_reserved()) if cuda else None,
                   params=sum(p.numel() for p in model.parameters()))
    except Exception as e:                   # noqa: BLE001 (classified below)
        err = e
        out.update(fits=False, oom=_is_oom(e), error=f"{type(e).__name__}: {str(e)[:300]}")
    finally:
        model = opt = x_host = y_host = step = None    # noqa: F841 (drop references)
        err_type = type(err) if err is not None else None
        err = None
        free_gpu()
    if err_type is not None and not out["oom"]:
        out["note"] = "not an out-of-memory error"
    return out


def torch_search(name: str, *, mode: str, limit: int, batch: int | None = None,
                 depth: int | None = None, depth_of=None, log=print,
                 device: str = "cuda") -> dict:
    """With ``depth_of`` (k -> depth): the largest depth index k that trains at ``batch``;
    without: the largest batch k at ``depth``. Real iterations under the cap already set,
    exponential growth then bisection (neuron.plan.search_max), the cache emptied between
    probes. A probe failing with anything but out-of-memory stops the search and is reported."""
    from neuron.plan import search_max
    failures = []

    def ok(k):
        d = depth_of(k) if depth_of else depth
        b = batch if depth_of else k
        r = torch_run(name, b, depth=d, mode=mode, device=device)
        log(f"  torch {mode} {name} depth {d} batch {b}: "
            f"{'fits' if r['fits'] else 'fails: ' + r['error'][:120]}")
        if not r["fits"]:
            failures.append(r)
            if not r["oom"]:
                raise RuntimeError(f"PyTorch {mode} {name}: {r['error']}")
        return r["fits"]

    t0 = time.perf_counter()
    try:
        k, probes = search_max(ok, 1, limit=limit)
        error = None
    except RuntimeError as e:
        k, probes, error = None, [], str(e)
    return {"k": k, "capped": k is not None and k >= limit, "error": error,
            "probes": [{"k": p.value, "fits": p.fits, "seconds": round(p.seconds, 2)}
                       for p in probes],
            "last_failure": failures[-1]["error"] if failures else None,
            "search_seconds": round(time.perf_counter() - t0, 1)}


def first_divergence(planned, ran) -> dict | None:
    """Where an iteration's run left its plan: the first step whose tensors in use (after the
    step's frees, so without its workspace) or live count differ, both rows, and how many steps
    differ in all. None when every step agrees."""
    def key(r):
        return r.bytes_in_use, r.live_tensors
    diff = [i for i, (p, r) in enumerate(zip(planned, ran)) if key(p) != key(r)]
    if len(planned) != len(ran):
        diff.append(min(len(planned), len(ran)))
    if not diff:
        return None
    i = diff[0]
    row = (lambda rows: rows[i].as_dict() if i < len(rows) else None)
    return {"position": i, "planned": row(planned), "ran": row(ran), "steps_differing": len(diff),
            "steps": len(planned)}


def neuron_run(graph, batch: int, *, budget: int | None, policy: str,
               offload_params: bool = False, host_budget: int | None = None,
               recompute_strategy: str = "cost", tensor_cache: bool = True,
               iters: int = 3, warmup: int = 1, trace: bool = False, seed: int = 0,
               device: str = "cuda", chunks: int = 1, planner: str | None = None,
               replay: str | None = None, allow_tf32: bool = False,
               prefetch_ahead: int | str | None = None,
               resident_params: int | None = None, fuse: bool = False) -> dict:
    """Real training iterations of a neuron graph on the GPU (device="cuda") in an arena of
    ``budget`` bytes (None: the planned peak). SGD momentum 0.9 at BENCH_LR. TF32 off,
    convolution algorithms by measurement
    (as bench/gpu/throughput.py). Returns times, the pool's measured peak next to the planned one,
    bytes moved against the plan's, the replay mode that ran (``replay``: passed to the Executor
    only where it takes the argument, bench.gpu.kit.executor_kwargs), and optionally the per-step
    trace; {"fits": False, "error"} on failure. ``seconds_per_iter`` is the median of the timed
    iterations, each ended by a device synchronization. ``fuse``: BatchNorm+ReLU and Add+ReLU
    as one layer each (Executor(fuse=True)).
    device="cpu" runs the same code on the CPU (to test this script's logic without a GPU)."""
    import numpy as np

    import neuron as nn_
    from neuron.executor import Executor
    if device == "cuda":
        from neuron.kernels import cuda as K
        K.allow_tf32 = allow_tf32
        K.deterministic = False
        K.conv_algo_search = "find"
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, *graph.inputs[0].shape)).astype(np.float32)
    y = rng.integers(0, graph.outputs[0].shape[0], batch).astype(np.int64)
    from bench.gpu.kit import executor_kwargs, median, replay_of
    out: dict = {"batch": batch, "policy": policy, "offload_params": offload_params,
                 "budget_bytes": budget, "planner": planner, "replay_requested": replay}
    ex = None
    try:
        t0 = time.perf_counter()
        ex = Executor(graph, batch, device=device, policy=policy, budget=budget,
                      offload_params=offload_params, host_budget=host_budget,
                      recompute_strategy=recompute_strategy, tensor_cache=tensor_cache,
                      optimizer=nn_.SGD(lr=BENCH_LR, momentum=0.9), seed=seed, chunks=chunks,
                      planner=planner, **executor_kwargs(replay),
                      **({} if prefetch_ahead is None else {"prefetch_ahead": prefetch_ahead}),
                      **({} if not resident_params else {"resident_params": resident_params}),
                      **({"fuse": True} if fuse else {}))
        out["setup_seconds"] = round(time.perf_counter() - t0, 2)
        print(f"  [neuron_run] setup (planning, arena) {out['setup_seconds']} s", flush=True)
        out["warmup_seconds"] = []
        for i in range(max(1, warmup)):
            t0 = time.perf_counter()
            ex.train_step(x, y)
            _sync(ex.device)
            out["warmup_seconds"].append(round(time.perf_counter() - t0, 3))
            print(f"  [neuron_run] warmup {i + 1}/{max(1, warmup)}: "
                  f"{out['warmup_seconds'][-1]} s, replay {replay_of(ex)}", flush=True)
        before = ex.pool.counters()
        timeline = getattr(ex.pool, "overlap", None)     # CUDA-event copy/compute times
        if timeline is not None:
            timeline.clear()
        from neuron.memory.traffic import TrafficCheck
        traffic = TrafficCheck(ex) if ex.planned else None   # moves against the plan's
        step = traffic.wrap(ex.train_step) if traffic else ex.train_step
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            loss = step(x, y)
            _sync(ex.device)
            times.append(time.perf_counter() - t0)
        dt = median(times) if times else None
        after = ex.pool.counters()
        moved = {k: (after[k] - before[k]) / max(iters, 1)
                 for k in ("offload_bytes", "prefetch_bytes") if k in after}
        # the run's pool traffic per iteration beside the plan's (its virtual simulation):
        # where they differ (evictions the plan did not make), the GPU ran another schedule
        per_iter = {k: (after[k] - before[k]) / max(iters, 1) for k in after
                    if k != "host_peak_bytes"}
        plan_counts = {k: (ex.planned or {}).get(k) for k in per_iter}
        divergence = None
        if ex.planned and any(per_iter[k] != plan_counts[k] for k in per_iter):
            planned_rows = ex.simulate(ex.device.arena_bytes, trace=True)["trace"]
            divergence = first_divergence(planned_rows, ex.last_trace)
        planned_moved = (sum((ex.planned or {}).get(k) or 0 for k in ("offload_bytes",
                                                                      "prefetch_bytes"))
                         if ex.planned else None)
        out.update(fits=True, seconds_per_iter=dt if iters else None,
                   iteration_seconds=times, replay=replay_of(ex),
                   moved_bytes=sum(moved.values()), planned_moved_bytes=planned_moved,
                   img_per_s=batch / dt if iters else None, final_loss=float(loss) if iters
                   else None, peak_bytes=ex.pool.high_water,
                   planned_peak_bytes=(ex.planned or {}).get("peak_bytes"),
                   # without workspaces: on the GPU a conv's workspace is chosen under what is
                   # free at that moment (SuperNeurons §3.5), so only the tensors follow the plan
                   tensor_peak_bytes=ex.pool.tensor_high_water,
                   planned_tensor_peak_bytes=(ex.planned or {}).get("tensor_peak_bytes"),
                   moved_per_iter=moved, pool_per_iter=per_iter,
                   planned_pool_per_iter=plan_counts if ex.planned else None,
                   divergence=divergence,
                   overlap=timeline.report() if timeline is not None else None,
                   traffic=traffic.report() if traffic is not None else None,
                   device_memory=(ex.device.memory_info()
                                  if hasattr(ex.device, "memory_info") else None))
        if trace:
            out["trace"] = [r.as_dict() for r in ex.last_trace]
    except Exception as e:                   # noqa: BLE001 (a row's failure is its result)
        out.update(fits=False, error=f"{type(e).__name__}: {str(e)[:400]}")
    finally:
        if ex is not None and hasattr(ex, "device") and hasattr(ex.device, "close"):
            try:
                ex.device.close()
            except Exception:                # noqa: BLE001
                pass
        ex = None
        free_gpu()
    return out


def _sync(dev) -> None:
    if hasattr(dev, "synchronize"):
        dev.synchronize()


def versions() -> dict:
    import importlib.metadata as md
    v = {"torch": torch.__version__, "cuda": torch.version.cuda,
         "cudnn": torch.backends.cudnn.version()}
    for pkg in ("cupy-cuda13x", "nvidia-cudnn-cu13", "numpy"):
        try:
            v[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return v
