"""Images per second of the folder:DIR loader alone (no training): a generated ImageFolder of
JPEGs, decoded, resized, centre-cropped and standardized by 1, 2, ... background threads.

    python bench/image_loader.py [--images 1200] [--size 224] [--workers 1,2,4]
"""
from __future__ import annotations

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import arg_parser, provenance, write  # noqa: E402


def make_folder(root: str, images: int, classes: int, side: int) -> None:
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(0)
    for i in range(images):
        d = os.path.join(root, f"class{i % classes}")
        os.makedirs(d, exist_ok=True)
        # smooth content (JPEG of pure noise is unrepresentatively large)
        base = rng.random((side // 8, side // 8, 3)) * 255
        a = np.kron(base, np.ones((8, 8, 1))).astype(np.uint8)
        Image.fromarray(a).save(os.path.join(d, f"{i:05d}.jpg"), quality=90)


def main():
    ap = arg_parser(__doc__)
    ap.add_argument("--images", type=int, default=1200)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--source-side", type=int, default=320, help="generated JPEGs' side")
    ap.add_argument("--size", type=int, default=224, help="crop side fed to the model")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--workers", default="1,2,4")
    args = ap.parse_args()
    from neuron.data import iterate, load_dataset
    prov = provenance(device=f"CPU ({os.cpu_count()} cores), loader only, no training")
    rows = []
    with tempfile.TemporaryDirectory() as root:
        make_folder(root, args.images, args.classes, args.source_side)
        for w in (int(x) for x in args.workers.split(",")):
            ds = load_dataset(f"folder:{root}", sample_shape=(3, args.size, args.size),
                              loader_workers=w).train
            steps = len(ds) // args.batch
            it = iterate(ds, args.batch, seed=0)
            t = time.perf_counter()
            for _ in range(steps):
                next(it)
            dt = time.perf_counter() - t
            rows.append({"workers": w, "images": steps * args.batch, "seconds": round(dt, 2),
                         "images_per_sec": round(steps * args.batch / dt, 1)})
            print(rows[-1])
    md = [f"# folder:DIR loader alone ({prov['date']}, {prov['device']}, commit {prov['commit']})",
          "", f"{args.images} generated {args.source_side}x{args.source_side} JPEGs -> "
          f"{args.size}x{args.size} crops, batch {args.batch}; load average "
          f"{prov['load_average_at_start']} at start.", "",
          "| threads | images | seconds | images/s |", "|---:|---:|---:|---:|"]
    md += [f"| {r['workers']} | {r['images']} | {r['seconds']} | {r['images_per_sec']} |"
           for r in rows]
    write("image_loader", {"provenance": prov, "settings": vars(args), "rows": rows},
          "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
