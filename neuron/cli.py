"""The `neuron` command (also `python -m neuron`)."""
from __future__ import annotations

import argparse
import json
import sys

from .units import fmt_bytes, parse_bytes


def _model_args(p, batch_default: int):
    p.add_argument("model", help="model name (see `neuron models`)")
    p.add_argument("--depth", type=int, default=None,
                   help="depth for resnet (Table 4 family), resnet_cifar (6n+2)")
    p.add_argument("--batch", type=int, default=batch_default, help="batch size")
    p.add_argument("--classes", type=int, default=None, help="number of classes")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")


def _positive(name):
    def conv(s):
        v = int(s)
        if v <= 0:
            raise argparse.ArgumentTypeError(f"{name} must be positive, got {v}")
        return v
    return conv


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="neuron", description="neuron: train very deep and wide "
                                 "networks on a memory budget; plan them without a GPU.")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    t = sub.add_parser("train", help="train a model", description="Train MODEL on a dataset "
                       "and report loss, accuracy, speed and memory.")
    _model_args(t, 64)
    g = t.add_mutually_exclusive_group()
    g.add_argument("--iters", type=_positive("--iters"), help="number of iterations")
    g.add_argument("--epochs", type=float, help="number of epochs (default 1)")
    t.add_argument("--dataset", default="synthetic",
                   help="synthetic | digits | cifar10:DIR | mnist:DIR (default synthetic)")
    t.add_argument("--lr", type=float, default=0.1, help="base learning rate (default 0.1)")
    t.add_argument("--momentum", type=float, default=0.9)
    t.add_argument("--weight-decay", type=float, default=5e-4)
    t.add_argument("--nesterov", action="store_true")
    t.add_argument("--schedule", choices=["cosine", "constant"], default="cosine")
    t.add_argument("--warmup", type=int, default=0, help="linear warm-up iterations")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--device", choices=["cpu", "cuda", "auto"], default="auto",
                   help="auto: cuda when a GPU is usable, else cpu")
    t.add_argument("--policy", default="liveness", help="memory policy")
    t.add_argument("--budget", default=None, help="arena size, e.g. 12GiB, 512MiB, 3GB")
    t.add_argument("--offload-params", action="store_true",
                   help="keep parameters and optimizer state on the host between uses")
    t.add_argument("--checkpoint", default=None, help="save parameters + optimizer to this .npz")
    t.add_argument("--resume", default=None, help="resume from a checkpoint .npz")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")

    s = sub.add_parser("summary", help="layers, shapes, parameters and per-step bytes",
                       description="List MODEL's layers, output shapes, parameter counts and the "
                       "bytes each forward and backward step needs resident.")
    _model_args(s, 32)
    s.add_argument("--all", action="store_true", help="print every layer (default: first and "
                   "last 20 for deep models)")

    m = sub.add_parser("models", help="list the model names")
    m.add_argument("--json", action="store_true")
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    from .errors import NeuronError
    try:
        return {"train": cmd_train, "summary": cmd_summary, "models": cmd_models}[args.command](args)
    except (NeuronError, ValueError, KeyError, FileNotFoundError, MemoryError) as e:
        # user errors: one clear line, no traceback
        print(f"neuron {args.command}: error: {e}", file=sys.stderr)
        return 2


def _build(args, in_shape=None, num_classes=None):
    from .models import build_model
    return build_model(args.model, depth=args.depth, in_shape=in_shape,
                       num_classes=num_classes or args.classes)


def cmd_models(args) -> int:
    from .models import model_names
    names = model_names()
    if args.json:
        print(json.dumps({"models": names}))
    else:
        print("\n".join(names))
    return 0


def cmd_summary(args) -> int:
    from .summary import summarize
    info = summarize(_build(args), args.batch)
    if not args.json or args.all:
        rows = info["layers"]
        show = rows if args.all or len(rows) <= 60 else rows[:20] + [None] + rows[-20:]
        print(f"{'layer':32} {'type':28} {'output':22} {'params':>11} {'fwd':>11} {'bwd':>11}")
        for r in show:
            if r is None:
                print(f"... {len(rows) - 40} more layers ...")
                continue
            print(f"{r['name'][:32]:32} {r['describe'][:28]:28} {str(tuple(r['output_shape']))[:22]:22}"
                  f" {r['params']:>11,} {fmt_bytes(r['fwd_bytes']):>11} {fmt_bytes(r['bwd_bytes']):>11}")
        print(f"{info['model']}: {info['num_layers']} layers, {info['params']:,} parameters "
              f"({fmt_bytes(info['param_bytes'])}), largest step {fmt_bytes(info['max_step_bytes'])}"
              f" at batch {args.batch}")
    if args.json:
        print(json.dumps(info))
    return 0


def cmd_train(args) -> int:
    import numpy as np
    from .data import load_dataset
    from .executor import Executor
    from .optim import SGD
    from .train import fit
    budget = parse_bytes(args.budget) if args.budget else None
    split = load_dataset(args.dataset, seed=args.seed,
                         num_classes=args.classes or 10,
                         sample_shape=_build(args).inputs[0].shape)
    graph = _build(args, in_shape=split.train.sample_shape, num_classes=split.train.num_classes)
    opt = SGD(lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay,
              nesterov=args.nesterov)
    ex = Executor(graph, args.batch, device=args.device, optimizer=opt, policy=args.policy,
                  seed=args.seed, budget=budget)
    meta = {"model": args.model, "depth": args.depth, "dataset": args.dataset}
    res = fit(ex, split.train, split.test, iters=args.iters, epochs=args.epochs, lr=args.lr,
              schedule=args.schedule, warmup=args.warmup, seed=args.seed,
              checkpoint=args.checkpoint, resume=args.resume, meta=meta,
              progress=not args.no_progress)
    res.update(model=args.model, depth=args.depth, batch=args.batch, device=ex.device.name,
               policy=ex.policy.name, dataset=args.dataset)
    line = (f"{args.model}: {res['iterations']} iterations, final loss {res['final_loss']:.4f}, "
            f"{res['images_per_sec']:.1f} img/s on {ex.device.name}, pool peak "
            f"{fmt_bytes(res['peak_bytes'])} (planned {fmt_bytes(res['planned_peak_bytes'] or 0)})")
    if "test_accuracy" in res:
        line += f", test accuracy {100 * res['test_accuracy']:.2f}%"
    print(line)
    if args.json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
