"""The fused BatchNorm+ReLU kernels against the unfused pair, kernel by kernel (GPU; not a stage).

    python -m bench.gpu.bnrelu_kernels --out $OUT [--model resnet50] [--batch 64] [--reps 20]

For every BatchNorm+ReLU pair ``--fuse`` would fuse in MODEL (neuron.fuse.fusable_pairs), at
its input shape: the unfused pair as neuron runs it (cuDNN BatchNorm forward training + cuDNN
ReLU forward; ReLU backward + BatchNorm backward) and the fused kernels (bnrelu_forward_train,
bnrelu_backward with their planned workspace), each timed with CUDA events (the median of
``--reps`` timed calls after warm-up), and the largest differences of y and dx between the two.
The totals weigh each shape by how many pairs have it: the time one training step spends in
these layers either way. Verdict: target met when the fused total is the smaller.

Writes <out>/bnrelu_kernels.json. ``--device cpu --smoke`` runs the same code with the NumPy
kernels (timed by the host clock) on tiny shapes, so CI checks the script.
"""
from __future__ import annotations

import os
import sys
import time
from collections import Counter

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def parse_args(argv=None):
    from bench.gpu.kit import stage_parser
    p = stage_parser(__doc__)
    p.add_argument("--model", default="resnet50", help="network whose pairs are timed")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--reps", type=int, default=20, help="timed calls per kernel (median)")
    args = p.parse_args(argv)
    if args.smoke:
        args.model, args.batch, args.reps = "resnet_cifar", 4, 3
    return args


def pair_shapes(model: str, batch: int, smoke: bool) -> Counter:
    """{input shape with the batch: how many fusable pairs have it}."""
    from neuron.fuse import fusable_pairs
    from neuron.layers import BatchNorm
    from neuron.models import build_model
    g = build_model(model, depth=8 if smoke else None)
    return Counter((batch, *bn.inputs[0].shape) for bn, _ in fusable_pairs(g, (BatchNorm,)))


def _timer(device):
    """time_ms(fn): one call's time in ms (CUDA events on the GPU, the host clock on the CPU)."""
    if device == "cuda":
        import cupy as cp

        def time_ms(fn):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record()
            fn()
            b.record()
            b.synchronize()
            return cp.cuda.get_elapsed_time(a, b)
        return time_ms

    def time_ms(fn):
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    return time_ms


def one_shape(K, xp, shape, reps, time_ms) -> dict:
    import numpy as np
    from neuron.kernels.cuda_raw import bnrelu_workspace_bytes
    from bench.gpu.kit import median
    rng = np.random.default_rng(0)
    c = shape[1]
    x = xp.asarray(rng.standard_normal(shape).astype(np.float32))
    dy = xp.asarray(rng.standard_normal(shape).astype(np.float32))
    g = xp.asarray((1 + 0.2 * rng.standard_normal(c)).astype(np.float32))
    b = xp.asarray((0.1 * rng.standard_normal(c)).astype(np.float32))

    def vec(v):
        return xp.full((c,), v, dtype=np.float32)
    z, y, dz, dx, fy, fdx = (xp.empty(shape, np.float32) for _ in range(6))
    rm, rv, sm, si, dg, db = vec(0), vec(1), vec(0), vec(0), vec(0), vec(0)
    frm, frv, fsm, fsi, fdg, fdb = vec(0), vec(1), vec(0), vec(0), vec(0), vec(0)
    m = x.size // c
    ws = xp.empty((bnrelu_workspace_bytes(m, c, 4),), np.uint8)

    def unfused_fwd():
        K.batchnorm_forward_train(x, g, b, z, rm, rv, sm, si, 0.1, 1e-5, True)
        K.relu_forward(z, y)

    def unfused_bwd():
        K.relu_backward(y, dy, dz)
        K.batchnorm_backward(x, dz, g, sm, si, dx, dg, db, eps=1e-5)

    def fused_fwd():
        K.bnrelu_forward_train(x, g, b, fy, frm, frv, fsm, fsi, 0.1, 1e-5, True, workspace=ws)

    def fused_bwd():
        K.bnrelu_backward(x, dy, g, b, fsm, fsi, fdx, fdg, fdb, 1e-5, workspace=ws)
    out = {"shape": list(shape)}
    for name, fn in (("unfused_fwd_ms", unfused_fwd), ("unfused_bwd_ms", unfused_bwd),
                     ("fused_fwd_ms", fused_fwd), ("fused_bwd_ms", fused_bwd)):
        for _ in range(2):
            fn()
        out[name] = median([time_ms(fn) for _ in range(reps)])

    def host(a):
        return np.asarray(a.get() if hasattr(a, "get") else a, dtype=np.float64)

    def rel(got, want):
        got, want = host(got), host(want)
        return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
    out["y_max_rel_diff"], out["dx_max_rel_diff"] = rel(fy, y), rel(fdx, dx)
    out["dgamma_max_rel_diff"] = rel(fdg, dg)
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    from bench.gpu.kit import device_name, write_stage
    if args.device == "cuda":
        import cupy as xp
        from neuron.kernels import cuda as K
        K.deterministic, K.allow_tf32 = False, False
    else:
        import numpy as xp
        from neuron.kernels import numpy_ref as K
    time_ms = _timer(args.device)
    rows = []
    for shape, count in sorted(pair_shapes(args.model, args.batch, args.smoke).items()):
        r = one_shape(K, xp, shape, args.reps, time_ms)
        r["pairs"] = count
        rows.append(r)
        print(f"{tuple(shape)} x{count}: unfused {r['unfused_fwd_ms']:.3f}+"
              f"{r['unfused_bwd_ms']:.3f} ms, fused {r['fused_fwd_ms']:.3f}+"
              f"{r['fused_bwd_ms']:.3f} ms, y diff {r['y_max_rel_diff']:.1e}, dx diff "
              f"{r['dx_max_rel_diff']:.1e}", flush=True)
    tot = {k: sum(r[k] * r["pairs"] for r in rows)
           for k in ("unfused_fwd_ms", "unfused_bwd_ms", "fused_fwd_ms", "fused_bwd_ms")}
    unfused = tot["unfused_fwd_ms"] + tot["unfused_bwd_ms"]
    fused = tot["fused_fwd_ms"] + tot["fused_bwd_ms"]
    detail = (f"{args.model} batch {args.batch}, {sum(r['pairs'] for r in rows)} pairs: "
              f"{unfused:.2f} ms per step unfused, {fused:.2f} ms fused "
              f"({unfused / fused:.2f}x)" if rows and fused > 0 else "no pairs to time")
    write_stage(args.out, "bnrelu_kernels", ran=bool(rows),
                target_met=(fused < unfused) if rows else None, detail=detail,
                device=device_name(args.device), smoke=args.smoke, model=args.model,
                batch=args.batch, reps=args.reps, rows=rows, totals_ms=tot,
                unfused_ms_per_step=unfused, fused_ms_per_step=fused)
    return 0


if __name__ == "__main__":
    sys.exit(main())
