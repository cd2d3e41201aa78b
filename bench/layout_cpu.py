"""CPU training speed of the quick-start model at --layout nchw and nhwc, in one process.

    python bench/layout_cpu.py [--threads 1] [--rounds 9] [--iters 4] [--replay tape]

The README's quick start (``resnet_cifar --depth 20`` on the 8x8 digits, batch 64, SGD lr 0.1,
momentum 0.9, weight decay 5e-4), one Executor per layout, rounds alternating between them so
that load on a shared machine falls on both; the median over rounds is reported, with the CPU
seconds per step (close to the step time on an idle machine, whatever the load). Writes
bench/results/<name>.json and .md. nhwc is for cuDNN's tensor cores: on the CPU the NumPy
kernels gather channels-last maps through strided copies, so this measures what it costs."""
from __future__ import annotations

import argparse
import os
import platform
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench._common import provenance, write  # noqa: E402
from bench.cpu_speed import digits_batches, run, set_threads, summary  # noqa: E402

LAYOUTS = ("nchw", "nhwc")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1, help="BLAS threads (default 1)")
    p.add_argument("--replay", default="tape", help="the Executor's replay mode (default tape)")
    p.add_argument("--depth", type=int, default=20)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per layout")
    p.add_argument("--rounds", type=int, default=9, help="timed rounds (median taken)")
    p.add_argument("--iters", type=int, default=4, help="steps per layout per round")
    p.add_argument("--name", default="layout_cpu", help="results file name (without suffix)")
    return p.parse_args(argv)


def stepper(args, shape, classes, layout):
    from neuron.executor import Executor
    from neuron.models import build_model
    from neuron.optim import SGD
    graph = build_model("resnet_cifar", depth=args.depth, in_shape=shape, num_classes=classes)
    ex = Executor(graph, args.batch, device="cpu", policy="liveness", seed=0, layout=layout,
                  replay=args.replay, optimizer=SGD(lr=0.1, momentum=0.9, weight_decay=5e-4))
    return ex


def main(argv=None) -> int:
    args = parse_args(argv)
    prov = provenance(device=f"CPU ({platform.processor() or platform.machine()}, "
                             f"{os.cpu_count()} cores, shared), training on the CPU")
    limits = set_threads(args.threads)         # holds the BLAS limit while it lives
    threads = {k: v for k, v in limits.items() if not k.startswith("_")}
    batches, shape, classes = digits_batches(args.batch)
    exs = {layout: stepper(args, shape, classes, layout) for layout in LAYOUTS}
    for ex in exs.values():
        run(lambda x, y, ex=ex: ex.train_step(x, y), batches, args.warmup, 0)
    seconds = {layout: [] for layout in LAYOUTS}
    cpu = {layout: [] for layout in LAYOUTS}
    losses = {}
    for r in range(args.rounds):
        order = LAYOUTS if r % 2 == 0 else LAYOUTS[::-1]
        for layout in order:
            ex = exs[layout]
            s, c, loss = run(lambda x, y, ex=ex: ex.train_step(x, y), batches, args.iters,
                             args.warmup + r * args.iters)
            seconds[layout].append(s)
            cpu[layout].append(c)
            losses[layout] = loss
    res = {layout: dict(summary(seconds[layout], cpu[layout], args.iters, args.batch),
                        replay_ran=exs[layout].replay["ran"], last_loss=losses[layout])
           for layout in LAYOUTS}
    ratio = res["nhwc"]["img_per_s"] / res["nchw"]["img_per_s"]
    out = {"model": f"resnet_cifar depth {args.depth}", "dataset": "digits 1x8x8",
           "batch": args.batch, "replay": args.replay, "threads": threads,
           "rounds": args.rounds, "iters": args.iters, "layouts": res,
           "nhwc_over_nchw": round(ratio, 3), "provenance": prov}
    table = "\n".join(
        f"| {layout} | {r['img_per_s']} | {r['step_ms']} | {r['cpu_ms_per_step']} | "
        f"{r['replay_ran']} |" for layout, r in res.items())
    md = (f"# CPU speed by layout ({out['model']}, {out['dataset']}, batch {args.batch})\n\n"
          f"{prov['date']}, commit {prov['commit']}, {prov['device']}; "
          f"{threads['requested']} BLAS thread(s); median of {args.rounds} alternating rounds "
          f"of {args.iters} steps; load average {prov['load_average_at_start']} at start.\n\n"
          "| layout | img/s | ms/step | CPU ms/step | replay |\n|---|---:|---:|---:|---|\n"
          f"{table}\n\nnhwc / nchw = {ratio:.2f}\n\nThe layouts compute the same function up to "
          "float32 summation order (tests/memory/test_memory_layout.py: 3 steps agree to 1e-6); "
          "over many steps at lr 0.1 the two trajectories drift apart as any change of "
          "summation order makes them (``last_loss`` in the JSON).\n")
    write(args.name, out, md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
