"""FreeLunch compression's effect on accuracy (issue 13): resnet_cifar 20 trained on the digits
data set (and a CIFAR-format folder when given) with and without compression, same seed and
epochs. Every feature map goes through the codec: the vdnn planner offloads all of them, so
``--compress`` acts on each one (without compression vdnn trains bit-identically to
liveness). Target: final test accuracy within 1 point of the uncompressed run.

    nice python bench/compress_accuracy.py [--epochs 3] [--cifar DIR]
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import arg_parser, provenance, write  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def train(dataset, epochs, batch, seed, compress):
    cmd = [sys.executable, "-m", "neuron", "train", "resnet_cifar", "--depth", "20",
           "--dataset", dataset, "--epochs", str(epochs), "--batch", str(batch),
           "--seed", str(seed), "--planner", "vdnn", "--device", "cpu", "--no-progress",
           "--json"]
    if compress:
        cmd += ["--compress", str(compress)]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": ROOT})
    res = json.loads(out.stdout.strip().splitlines()[-1])
    return {"dataset": dataset, "compress": compress, "epochs": epochs, "batch": batch,
            "seed": seed, "test_accuracy": res.get("test_accuracy"),
            "final_loss": res["final_loss"], "offload_bytes": res["offload_bytes"],
            "host_peak_bytes": res["host_peak_bytes"], "command": " ".join(cmd[1:])}


def main(argv=None):
    ap = arg_parser(__doc__)
    ap.add_argument("--epochs", type=float, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cifar", default=None, metavar="DIR")
    ap.add_argument("--rates", default="2,4", help="compression rates to run (default 2,4)")
    args = ap.parse_args(argv)
    prov = provenance("CPU (2 shared cores), training on the CPU device")
    sets = ["digits"] + ([f"cifar10:{args.cifar}"] if args.cifar else [])
    rows, md = [], ["# FreeLunch compression: accuracy (resnet_cifar 20, vdnn offloads every "
                    "feature map)", "", f"{prov}", "",
                    "| data | compress | epochs | test accuracy | vs uncompressed | "
                    "offloaded bytes | host peak |", "|---|---|---|---|---|---|---|"]
    for ds in sets:
        base = None
        for c in [None] + [int(r) for r in args.rates.split(",") if r]:
            r = train(ds, args.epochs, args.batch, args.seed, c)
            base = r if c is None else base
            d = 100 * (r["test_accuracy"] - base["test_accuracy"])
            r["delta_points"] = d
            rows.append(r)
            md.append(f"| {ds} | {c or 'none'} | {args.epochs:g} | "
                      f"{100 * r['test_accuracy']:.2f}% | {d:+.2f} points | "
                      f"{r['offload_bytes']:,} | {r['host_peak_bytes']:,} |")
            print(md[-1], flush=True)
    ok = all(abs(r["delta_points"]) <= 1.0 for r in rows)
    md += ["", f"Target within 1 point: {'met' if ok else 'NOT met'}", ""]
    name = "compress_accuracy" + ("" if args.seed == 0 else f"_seed{args.seed}")
    write(name, {"provenance": prov, "rows": rows}, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
