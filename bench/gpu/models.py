"""Stage `models` of the GPU contact kit: one training step of every model family on the device
under test and on the CPU reference, both in float64, from the same weights and data.

For each model: the CPU executor (NumPy kernels) and the device executor start from the same
float64 state (loaded, not re-drawn) and take one SGD step (momentum 0.9) on the same batch.
cuDNN computes convolution, BN, pooling and softmax in double for double tensors, and neuron's
own CUDA kernels are templated on the dtype, so both sides compute the same function in the same
precision and the tolerance can be tight. Compared, and gated, exactly as printed:

* ``loss_rel_err`` = |loss_dev - loss_cpu| / |loss_cpu|, at most LOSS_TOL;
* ``update_max_rel_err`` = max over parameter tensors of ||d_dev - d_cpu|| / ||d_cpu||, where
  d = p1 - p0 is the step's change (on the first step of momentum SGD, -lr x the gradient: the
  gradient's error, not diluted by the unchanged weights), at most UPDATE_TOL.

``param_max_rel_err`` (the same on the parameters after the step) is kept in the results (the
contract's figure); it is never larger than the update's error times ||d|| / ||p||, so the gate
on the update covers it.

Tolerances (float64): loss 1e-10, update 1e-7. Why: float64 rounds at 1.1e-16; cuDNN and NumPy
sum a convolution's products in different orders (up to C*kh*kw = 4608 terms), ~1e-15 relative
per layer, growing with depth (~100 layers) to ~1e-13 on the loss. Gradients are worse
conditioned: a BN layer's backward subtracts two nearly equal means, and in float32 the worst
parameter gradients seen (Inception-v4 and ResNet-50 BN biases at batch 2, H100 2026-11-23) lost
5-6 of float32's 7 digits, i.e. an amplification of ~3e6 of the rounding unit; in float64 that is
~4e-10, so 1e-7 leaves a 250x margin while any wrong kernel (a wrong stride, axis, scale or a
gradient a fraction of a percent off) gives errors of 1e-5 to 1.

Dropout: the device draws its masks from a counter hash (neuron.kernels.cuda's
``dropout_mask_reference``); the CPU reference here uses the same hash, so both drop the same
units.

Then, with ``deterministic=True``: two float32 steps of a small network under several memory
policies on the device; the parameters must be bit-identical across policies.
"""
from __future__ import annotations

import sys
import time
import types

import numpy as np

from bench.gpu.kit import all_met, device_name, rel_err, stage_parser, write_stage

LOSS_TOL = 1e-10
UPDATE_TOL = 1e-7
DTYPE = np.float64
LR = 0.01

#: (name, depth, batch, in_shape or None) per family; the full GPU run
FULL = [("alexnet", None, 4, None), ("vgg16", None, 2, None), ("resnet50", None, 2, None),
        ("densenet121", None, 2, None), ("inception_v4", None, 2, None),
        ("resnet_cifar", 20, 8, None), ("densenet_cifar", 40, 8, None)]
#: tiny versions for --smoke (CI on the CPU): the same code, seconds instead of minutes
SMOKE = [("resnet_cifar", 8, 2, (3, 16, 16)), ("alexnet", None, 2, (3, 67, 67))]
DETERMINISTIC_POLICIES = ("liveness", "recompute", "superneurons", "baseline")


def hash_dropout_kernels():
    """numpy_ref with the device's dropout mask (a counter hash), so CPU and GPU drop the same
    units."""
    from neuron.kernels import numpy_ref
    from neuron.kernels.dropout_mask import dropout_mask_reference
    k = types.ModuleType("numpy_ref_hash_dropout")
    k.__dict__.update({n: getattr(numpy_ref, n) for n in dir(numpy_ref) if not n.startswith("__")})

    def dropout_forward(x, y, mask, p, seed):
        mask[...] = dropout_mask_reference(x.shape, p, seed)
        numpy_ref.dropout_apply(x, y, mask, p)

    k.dropout_forward = dropout_forward
    return k


def reference_device(arena_bytes: int):
    from neuron.devices import CpuDevice

    class HashDropoutCpu(CpuDevice):
        name = "cpu-hash-dropout"
        _k = hash_dropout_kernels()

        @property
        def kernels(self):
            return self._k

    return HashDropoutCpu(arena_bytes)


def _executor(graph, batch, device, policy="liveness", budget=None, dtype=np.float32):
    import neuron as nn
    from neuron.executor import Executor
    return Executor(graph, batch, device=device, policy=policy, budget=budget, seed=0,
                    dtype=dtype, optimizer=nn.SGD(lr=LR, momentum=0.9))


def _device_under_test(kind, graph, batch):
    if kind == "cpu":       # the smoke run: the reference's own device type, same plan size
        ex = _executor(graph, batch, "virtual", dtype=DTYPE)
        return reference_device(ex.simulate()["arena_bytes"])
    return kind


def within_tolerance(loss_rel_err: float, update_max_rel_err: float) -> bool:
    """The gate, on exactly the two figures the stage prints."""
    return bool(np.isfinite(loss_rel_err) and np.isfinite(update_max_rel_err)
                and loss_rel_err <= LOSS_TOL and update_max_rel_err <= UPDATE_TOL)


def compare_one(name, depth, batch, in_shape, device) -> dict:
    from neuron.models import build_model
    graph = build_model(name, depth=depth, in_shape=in_shape)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, *graph.inputs[0].shape)).astype(DTYPE)
    y = rng.integers(0, graph.outputs[0].shape[0], batch).astype(np.int64)
    t0 = time.perf_counter()
    plan = _executor(graph, batch, "virtual", dtype=DTYPE).simulate()
    ref = _executor(graph, batch, reference_device(plan["arena_bytes"]), dtype=DTYPE)
    state0 = ref.state_dict()
    loss_ref = ref.train_step(x, y)
    p_ref = ref.parameters()
    t_ref = time.perf_counter() - t0
    dut = _executor(graph, batch, _device_under_test(device, graph, batch), dtype=DTYPE)
    try:
        dut.load_state_dict(state0)
        t0 = time.perf_counter()
        loss_dev = dut.train_step(x, y)
        p_dev = dut.parameters()
        t_dev = time.perf_counter() - t0
    finally:
        if hasattr(dut.device, "close"):
            dut.device.close()
    per_param = {}
    for k, p1 in p_ref.items():
        if p_dev[k].dtype != DTYPE:
            raise TypeError(f"{name}: parameter {k} came back as {p_dev[k].dtype}, not float64: "
                            "the device did not run the step in double")
        per_param[k] = (rel_err(p_dev[k], p1), rel_err(p_dev[k] - state0[k], p1 - state0[k]))
    worst_p = max(per_param, key=lambda k: per_param[k][0])
    worst_u = max(per_param, key=lambda k: per_param[k][1])
    loss_err = (abs(loss_dev - loss_ref) / max(abs(loss_ref), 1e-300)
                if np.isfinite(loss_dev) else float("inf"))
    upd = per_param[worst_u][1]
    return {"dtype": "float64", "depth": depth, "batch": batch,
            "in_shape": list(graph.inputs[0].shape),
            "loss_cpu": float(loss_ref), "loss_device": float(loss_dev),
            "loss_rel_err": float(loss_err), "param_max_rel_err": per_param[worst_p][0],
            "worst_param": worst_p, "update_max_rel_err": upd, "worst_update": worst_u,
            "params": len(per_param), "ok": within_tolerance(loss_err, upd),
            "seconds_cpu": round(t_ref, 2), "seconds_device": round(t_dev, 2)}


def deterministic_across_policies(device, smoke) -> dict:
    """Two steps under each policy with deterministic kernels: parameters bit-identical?"""
    from neuron.models import build_model
    depth, batch, shape = (8, 4, (3, 16, 16)) if smoke else (20, 16, None)
    graph = build_model("resnet_cifar", depth=depth, in_shape=shape)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((batch, *graph.inputs[0].shape)).astype(np.float32)
    y = rng.integers(0, 10, batch).astype(np.int64)
    K = None
    if device == "cuda":
        from neuron.kernels import cuda as K
        saved = K.deterministic
        K.deterministic = True
    results, first = {}, None
    try:
        for policy in DETERMINISTIC_POLICIES:
            budget = None
            if policy == "superneurons":    # its smallest budget: offload and recompute at work
                from neuron.plan import plan
                # + 1 MiB: room for CuPy's temporaries (now inside the budget), which the plan
                # does not model
                budget = plan(graph, batch, policy=policy, trace=False)["min_budget_bytes"] \
                    + (1 << 20 if device == "cuda" else 0)
            try:
                ex = _executor(graph, batch, device, policy=policy, budget=budget)
                for _ in range(2):
                    ex.train_step(x, y)
                params = ex.parameters()
                if hasattr(ex.device, "close"):
                    ex.device.close()
            except Exception as e:          # noqa: BLE001 (a policy's failure is its result)
                results[policy] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                continue
            if first is None:
                first = params
            same = all(np.array_equal(params[k], first[k]) for k in first)
            results[policy] = {"bit_identical_to_first": bool(same), "budget_bytes": budget}
    finally:
        if K is not None:
            K.deterministic = saved
    ok = all(r.get("bit_identical_to_first") for r in results.values())
    return {"dtype": "float32", "model": f"resnet_cifar-{depth}", "batch": batch,
            "policies": results, "ok": ok}


def main(argv=None) -> int:
    args = stage_parser(__doc__).parse_args(argv)
    cases = SMOKE if args.smoke else FULL
    models, crashed = {}, []
    for name, depth, batch, shape in cases:
        try:
            models[name] = compare_one(name, depth, batch, shape, args.device)
        except Exception as e:              # noqa: BLE001 (keep going: the next model may work)
            models[name] = {"ok": None, "error": f"{type(e).__name__}: {str(e)[:500]}",
                            "loss_rel_err": None, "param_max_rel_err": None,
                            "update_max_rel_err": None}
            crashed.append(name)
        r = models[name]
        print(f"  {name}: loss_rel_err {r.get('loss_rel_err')}, update_max_rel_err "
              f"{r.get('update_max_rel_err')} ({r.get('worst_update', r.get('error', ''))})",
              flush=True)
    try:
        det = deterministic_across_policies(args.device, args.smoke)
    except Exception as e:                  # noqa: BLE001
        det = {"ok": None, "error": f"{type(e).__name__}: {str(e)[:500]}"}
    measured = {k: m for k, m in models.items() if "error" not in m}
    ran = not crashed and "error" not in det
    target_met = all_met([m["ok"] for m in measured.values()] + [det.get("ok")])
    outside = [k for k, m in measured.items() if not m["ok"]]
    if measured:
        wl = max(measured, key=lambda k: measured[k]["loss_rel_err"])
        wu = max(measured, key=lambda k: measured[k]["update_max_rel_err"])
        detail = (f"{len(measured) - len(outside)}/{len(cases)} models within tolerance, "
                  f"float64 device vs float64 CPU: max loss_rel_err "
                  f"{measured[wl]['loss_rel_err']:.2e} ({wl}; tolerance {LOSS_TOL:g}), max "
                  f"update_max_rel_err {measured[wu]['update_max_rel_err']:.2e} ({wu} "
                  f"{measured[wu]['worst_update']}; tolerance {UPDATE_TOL:g})")
    else:
        detail = f"0/{len(cases)} models compared"
    if outside:
        detail += f"; outside: {', '.join(outside)}"
    if crashed:
        detail += f"; crashed: {', '.join(crashed)}"
    detail += ("; deterministic across policies: "
               + {True: "yes", False: "NO", None: "not run"}[det.get("ok")])
    write_stage(args.out, "models", ran=ran, target_met=target_met, detail=detail,
                device=device_name(args.device), smoke=args.smoke,
                tolerance={"loss_rel_err": LOSS_TOL, "update_max_rel_err": UPDATE_TOL},
                dtype="float64", models=models, deterministic=det)
    return 0


if __name__ == "__main__":
    sys.exit(main())
