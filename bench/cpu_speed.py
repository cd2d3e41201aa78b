"""The quick-start model's CPU training speed, neuron against PyTorch, in one process.

    python bench/cpu_speed.py [--threads N] [--replay off,tape] [--rounds 15] [--iters 4]

The network is the README's quick start: ``resnet_cifar --depth 20`` on scikit-learn's 8x8
digits (1x8x8 inputs, 10 classes), batch 64, SGD lr 0.1, momentum 0.9, weight decay 5e-4
(``neuron train``'s defaults). PyTorch trains the same ResNet-20 (bench/gpu/torch_models.py, one
input channel; the parameter counts are checked equal) on the same batches with the same
optimizer settings. Both sides use the same number of threads: ``torch.set_num_threads`` and
NumPy's BLAS pool (threadpoolctl) are set to ``--threads`` (default: PyTorch's own default)
and both counts are recorded as the libraries report them.

Protocol: ``--warmup`` untimed steps per side, then ``--rounds`` rounds; in each round every
neuron replay mode and PyTorch run ``--iters`` steps each, the order alternating from round to
round so that both sides see the same machine load; img/s is the median over rounds, and
beside the ratio of the medians the median of the per-round ratios (the two sides back to back)
is reported, the figure least moved by the machine's load drifting between rounds.

``--replay``: the neuron modes to time. They are passed to the Executor as ``replay=`` only
when its signature has that parameter; otherwise only eager execution ("off") is measured and
the result says so. ``--fuse both``: each mode also timed with BatchNorm+ReLU and Add+ReLU
fused (``MODE+fuse``), in the same rounds. Writes bench/results/cpu_speed.json and cpu_speed.md
(``--name``: another file name).
"""
from __future__ import annotations

import inspect
import os
import platform
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench._common import arg_parser, provenance, write  # noqa: E402

TARGET = 0.8        # issue 36: neuron img/s >= 0.8x PyTorch CPU on the quick-start model


def parse_args(argv=None):
    p = arg_parser(__doc__)
    p.add_argument("--threads", type=int, default=None,
                   help="threads for both sides (default: torch.get_num_threads())")
    p.add_argument("--replay", default="off,tape",
                   help="comma-separated neuron replay modes to time (default off,tape)")
    p.add_argument("--depth", type=int, default=20)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per side")
    p.add_argument("--rounds", type=int, default=15, help="timed rounds (median taken)")
    p.add_argument("--iters", type=int, default=4, help="steps per side per round")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--fuse", choices=["off", "on", "both"], default="off",
                   help="neuron's BatchNorm+ReLU and Add+ReLU fusion (Executor(fuse=True)): "
                   "off, on, or both "
                   "(each replay mode timed unfused and fused, as MODE and MODE+fuse, in the "
                   "same rounds) (default off)")
    p.add_argument("--name", default="cpu_speed", help="results file name (without suffix)")
    p.add_argument("--note", default=None, help="a remark kept in the JSON and the table")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.iters < 1 or args.warmup < 0:
        p.error("--rounds and --iters must be >= 1, --warmup >= 0")
    return args


def set_threads(n: int | None) -> dict:
    """Both libraries on n threads (PyTorch's default when None); what each reports."""
    import torch
    from threadpoolctl import threadpool_info, threadpool_limits
    n = n or torch.get_num_threads()
    limiter = threadpool_limits(limits=n, user_api="blas")      # NumPy's OpenBLAS (and MKL)
    torch.set_num_threads(n)
    blas = [{"library": i.get("internal_api"), "filepath": os.path.basename(i["filepath"]),
             "num_threads": i["num_threads"]} for i in threadpool_info()
            if i.get("user_api") == "blas"]
    return {"requested": n, "torch": torch.get_num_threads(),
            "numpy_blas": [b for b in blas if "torch" not in b["filepath"]] or blas,
            "_limiter": limiter}


def replay_modes(executor_cls, wanted: list[str]) -> tuple[list[str], bool, str | None]:
    """(modes to time, whether the Executor takes ``replay=``, a note when it does not)."""
    if "replay" in inspect.signature(executor_cls).parameters:
        return list(wanted), True, None
    return ["off"], False, ("the Executor has no 'replay' parameter at this commit: eager "
                            f"execution ('off') measured only (asked for {','.join(wanted)})")


def digits_batches(batch: int, count: int = 8):
    """``count`` batches of the digits training split, as ``neuron train`` orders them."""
    from neuron.data import load_dataset
    split = load_dataset("digits", seed=0)
    tr = split.train
    out = []
    for k in range(count):
        idx = [(k * batch + i) % len(tr.y) for i in range(batch)]
        out.append((tr.x[idx].copy(), tr.y[idx].copy()))
    return out, tr.sample_shape, tr.num_classes


def neuron_stepper(args, shape, classes, mode, replay_supported):
    from neuron.executor import Executor
    from neuron.models import build_model
    from neuron.optim import SGD
    graph = build_model("resnet_cifar", depth=args.depth, in_shape=shape, num_classes=classes)
    mode, _, fused = mode.partition("+")        # "tape+fuse": replay tape, fused
    kw = {"replay": mode} if replay_supported else {}
    if fused:
        kw["fuse"] = True
    ex = Executor(graph, args.batch, device="cpu", policy="liveness", seed=0,
                  optimizer=SGD(lr=args.lr, momentum=args.momentum,
                                weight_decay=args.weight_decay), **kw)
    step = lambda x, y: ex.train_step(x, y)      # noqa: E731
    step.executor = ex
    return graph.num_params(), step


def torch_stepper(args, shape, classes):
    import torch
    import torch.nn.functional as F
    from bench.gpu.torch_models import cifar_resnet
    torch.manual_seed(0)
    model = cifar_resnet(args.depth, num_classes=classes, in_channels=shape[0]).train()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                          weight_decay=args.weight_decay)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        opt.step()
        return loss.item()
    return sum(p.numel() for p in model.parameters()), step


def run(step, batches, iters, k0) -> tuple[float, float, float]:
    """(seconds for ``iters`` steps, the process's CPU seconds in them, last loss); batches
    cycle from index k0."""
    t, c = time.perf_counter(), time.process_time()
    loss = float("nan")
    for i in range(iters):
        x, y = batches[(k0 + i) % len(batches)]
        loss = step(x, y)
    return time.perf_counter() - t, time.process_time() - c, float(loss)


def summary(seconds: list[float], cpu: list[float], iters: int, batch: int) -> dict:
    """img/s and ms/step (medians over rounds), and the CPU ms per step: with one thread per
    side it is close to the step time on an idle machine, whatever the load."""
    rates = [batch * iters / s for s in seconds]
    med = statistics.median(rates)
    return {"img_per_s": round(med, 1), "step_ms": round(1000 * batch / med, 2),
            "cpu_ms_per_step": round(1000 * statistics.median(cpu) / iters, 2),
            "runs_img_per_s": [round(r, 1) for r in rates]}


def main(argv=None) -> int:
    args = parse_args(argv)
    prov = provenance(device=f"CPU ({platform.processor() or platform.machine()}, "
                             f"{os.cpu_count()} cores), training on the CPU")
    import numpy as np
    import torch
    threads = set_threads(args.threads)
    threads.pop("_limiter")
    from neuron.executor import Executor
    wanted = [m.strip() for m in args.replay.split(",") if m.strip()] or ["off"]
    modes, replay_supported, note = replay_modes(Executor, wanted)
    if args.fuse != "off":
        modes = ([] if args.fuse == "on" else modes) + [f"{m}+fuse" for m in modes]
    batches, shape, classes = digits_batches(args.batch)
    sides = {}
    counts = {}
    for mode in modes:
        counts[f"neuron_{mode}"], sides[f"neuron_{mode}"] = neuron_stepper(
            args, shape, classes, mode, replay_supported)
    counts["pytorch"], sides["pytorch"] = torch_stepper(args, shape, classes)
    if len(set(counts.values())) != 1:
        sys.exit(f"cpu_speed: the networks differ: parameter counts {counts}")
    first_loss = {}
    for name, step in sides.items():              # warm-up (not timed)
        first_loss[name] = run(step, batches, max(args.warmup, 1), 0)[2]
    secs = {name: [] for name in sides}
    cpus = {name: [] for name in sides}
    last_loss = {}
    order = list(sides)
    for r in range(args.rounds):
        for name in (order if r % 2 == 0 else order[::-1]):
            s, c, last_loss[name] = run(sides[name], batches, args.iters, r * args.iters)
            secs[name].append(s)
            cpus[name].append(c)
    res = {name: summary(v, cpus[name], args.iters, args.batch) for name, v in secs.items()}
    torch_rate = res["pytorch"]["img_per_s"]
    # per round, the two sides ran back to back: the median of those ratios is the least
    # sensitive to the machine's load drifting between rounds
    neuron = {m: dict(res[f"neuron_{m}"], over_pytorch=round(
        res[f"neuron_{m}"]["img_per_s"] / torch_rate, 3), over_pytorch_paired_median=round(
        statistics.median(t / n for n, t in zip(secs[f"neuron_{m}"], secs["pytorch"])), 3))
        for m in modes}
    for m in modes:                 # what the timed steps ran (a tape that was not trusted: off)
        r = getattr(sides[f"neuron_{m}"].executor, "replay", None)
        neuron[m]["ran"] = r["ran"] if isinstance(r, dict) else "off"
        neuron[m]["replayed_iterations"] = r["replayed_iterations"] if isinstance(r, dict) \
            else 0
    best = max(modes, key=lambda m: neuron[m]["img_per_s"])
    ratio = neuron[best]["over_pytorch"]
    payload = {
        "provenance": prov,
        "model": "resnet_cifar", "depth": args.depth, "dataset": "digits",
        "input_shape": list(shape), "classes": classes, "batch": args.batch,
        "parameters": counts["pytorch"],
        "optimizer": {"lr": args.lr, "momentum": args.momentum,
                      "weight_decay": args.weight_decay},
        "threads": threads,
        "versions": {"numpy": np.__version__, "torch": torch.__version__},
        "protocol": {"warmup_steps": args.warmup, "rounds": args.rounds,
                     "iters_per_round": args.iters, "statistic": "median over rounds",
                     "order": "alternating per round"},
        "replay": {"supported": replay_supported, "requested": wanted, "measured": modes,
                   "note": note},
        "fuse": args.fuse,
        "note": args.note,
        "neuron": neuron, "pytorch": res["pytorch"],
        "neuron_mode": best, "neuron_img_per_s": neuron[best]["img_per_s"],
        "pytorch_img_per_s": torch_rate, "neuron_over_pytorch": ratio,
        "target": TARGET, "target_met": ratio >= TARGET,
        "loss": {"after_warmup": {k: round(v, 4) for k, v in first_loss.items()},
                 "last": {k: round(v, 4) for k, v in last_loss.items()}},
    }
    rows = "\n".join(f"| neuron, replay {m} (ran: {neuron[m]['ran']}) | "
                     f"{neuron[m]['img_per_s']:,.0f} | "
                     f"{neuron[m]['step_ms']:.1f} | {neuron[m]['cpu_ms_per_step']:.1f} | "
                     f"{neuron[m]['over_pytorch']:.2f} |" for m in modes)
    blas = ", ".join(f"{b['library']} {b['num_threads']}" for b in threads["numpy_blas"])
    md = (f"# CPU training speed, quick-start model ({prov['date']}, commit {prov['commit']})\n\n"
          f"resnet_cifar depth {args.depth} on 8x8 digits, batch {args.batch}, SGD lr {args.lr} "
          f"momentum {args.momentum} wd {args.weight_decay}; {prov['device']}; threads: "
          f"torch {threads['torch']}, NumPy BLAS {blas or 'none found'}; median of "
          f"{args.rounds} rounds of {args.iters} steps, the sides alternating; load average "
          f"{prov['load_average_at_start']} at start.\n\n"
          "| side | img/s | ms/step | CPU ms/step | / PyTorch |\n|---|---:|---:|---:|---:|\n"
          + rows + f"\n| PyTorch {torch.__version__} eager | {torch_rate:,.0f} | "
          f"{res['pytorch']['step_ms']:.1f} | {res['pytorch']['cpu_ms_per_step']:.1f} | "
          "1.00 |\n\n"
          f"neuron / PyTorch = {ratio:.2f} (replay {best}; the median of the per-round "
          f"ratios: {neuron[best]['over_pytorch_paired_median']:.2f}); target >= {TARGET}: "
          f"{'met' if ratio >= TARGET else 'not met'}.\n" + (f"\nNote: {note}.\n" if note else "")
          + (f"\n{args.note}\n" if args.note else ""))
    write(args.name, payload, md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
