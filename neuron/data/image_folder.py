"""`--dataset folder:DIR`: the ImageFolder layout (one subfolder per class, JPEG/PNG files),
decoded with Pillow in background threads that feed a bounded queue of batches.

Layout: DIR/train/<class>/* with DIR/val/<class>/* (or DIR/test/...) as the test split, or
DIR/<class>/* alone (no test split). Classes are the sorted subfolder names of the training
split. Each image is converted to RGB (or L for one channel), its shorter side resized to
8/7 of the target (256 for 224, torchvision's habit), centre-cropped to the target and
standardized per channel with statistics of up to 512 training images.

Order: epoch e visits the training files in the same permutation as the array datasets
(batch_order.epoch_permutation(n, seed, e)), so step k is a pure function of (seed, k)
whatever the number of workers; batches are decoded concurrently and delivered in order.

Unreadable files: a scan at load opens every file's header (cheap; Pillow's verify()). With
on_corrupt="skip" they are left out and counted; with "refuse" the first one is an error
naming it. A file that passes the scan but fails to decode later is, under "skip", replaced
by the next file in the epoch's order that decodes (and counted), under "refuse" an error.
"""
from __future__ import annotations

import os
import queue
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from .batch_order import epoch_batches

EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".ppm", ".tif", ".tiff")
STATS_SAMPLE = 512
CORRUPT_CHOICES = ("skip", "refuse")


def _pil():
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError as e:
        raise ImportError("--dataset folder:DIR decodes images with Pillow: "
                          "pip install 'neuron-arena[images]'") from e
    return Image, UnidentifiedImageError


def _unreadable():
    """What opening or decoding a bad image raises: a broken file, or a decompression bomb
    (more pixels than Image.MAX_IMAGE_PIXELS: Pillow warns, and above twice that refuses)."""
    Image, Unidentified = _pil()
    return (OSError, Unidentified, SyntaxError, ValueError, Image.DecompressionBombError,
            Image.DecompressionBombWarning)


def _why(e: BaseException) -> str:
    from PIL import Image
    if isinstance(e, (Image.DecompressionBombError, Image.DecompressionBombWarning)):
        return f"decompression bomb: {e}"
    return str(e) or type(e).__name__


class ImageFolderError(ValueError):
    """The folder is not an ImageFolder layout, or an image is unreadable under 'refuse'."""


def _list_split(root: Path, classes: list[str] | None):
    if classes is None:
        classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not
                         d.name.startswith("."))
        if not classes:
            raise ImageFolderError(f"folder:{root}: no class subfolders (expected "
                                   f"{root}/<class>/<image>.jpg|png)")
    files, labels = [], []
    for ci, c in enumerate(classes):
        d = root / c
        if not d.is_dir():
            continue
        for f in sorted(d.iterdir()):
            if f.suffix.lower() in EXTENSIONS and f.is_file():
                files.append(f)
                labels.append(ci)
    return classes, files, np.asarray(labels, dtype=np.int64)


def _scan(files, labels, on_corrupt, where):
    """Drop (or refuse) files whose header Pillow cannot read, and decompression bombs (the
    header gives the size: such a file never reaches a decoding thread). Returns the kept files
    and labels and the skipped ones as "path (why)"."""
    Image, _ = _pil()
    unreadable = _unreadable()
    keep, bad = [], []
    with warnings.catch_warnings():     # the scan runs alone, before the loader's threads
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        for i, f in enumerate(files):
            try:
                with Image.open(f) as im:
                    im.verify()
                keep.append(i)
            except unreadable as e:
                if on_corrupt == "refuse":
                    raise ImageFolderError(f"folder:{where}: unreadable image {f} ({_why(e)}); "
                                           "use --on-corrupt skip to leave such files out"
                                           ) from None
                bad.append(f"{f} ({_why(e)})")
    return [files[i] for i in keep], labels[keep], bad


class ImageFolderDataset:
    """A lazily decoded image dataset; `iterate` and `batches` in data.py dispatch to it."""

    def __init__(self, name, files, labels, classes, sample_shape, mean=None, std=None,
                 workers: int = 4, prefetch: int = 8, on_corrupt: str = "skip",
                 skipped: list | None = None):
        if on_corrupt not in CORRUPT_CHOICES:
            raise ValueError(f"on_corrupt must be one of {', '.join(CORRUPT_CHOICES)}, got "
                             f"{on_corrupt!r}")
        c, h, w = (int(d) for d in sample_shape)
        if c not in (1, 3):
            raise ImageFolderError(f"{name}: images decode to 1 or 3 channels; the model wants "
                                   f"{c} (input shape {tuple(sample_shape)})")
        self.name, self.files, self.y = name, list(files), labels
        self.classes, self.num_classes = classes, len(classes)
        self.origin = (f"{len(files)} images in {len(classes)} classes from {name[7:]}"
                       + (f", {len(skipped)} unreadable skipped: " + "; ".join(skipped[:3]) +
                          ("; ..." if len(skipped) > 3 else "") if skipped else ""))
        self.sample_shape = (c, h, w)
        self.workers, self.prefetch, self.on_corrupt = max(1, workers), max(1, prefetch), on_corrupt
        self.skipped = list(skipped or [])          # left out at the scan
        self.replaced: list[str] = []               # failed to decode later, replaced
        self.decoded = 0
        self.decode_seconds = 0.0                   # summed over worker threads
        self._lock = threading.Lock()
        self.mean, self.std = mean, std
        if mean is None:
            self.mean, self.std = self._stats()

    def __len__(self) -> int:
        return len(self.files)

    # ---- decoding ---------------------------------------------------------------------
    def _decode_raw(self, i: int) -> np.ndarray:
        """(C, H, W) float32 in [0, 1]: resize the shorter side, centre-crop."""
        Image, _ = _pil()
        c, h, w = self.sample_shape
        with Image.open(self.files[i]) as im:
            im = im.convert("RGB" if c == 3 else "L")
            short = max(h, w) * 8 / 7
            scale = short / min(im.size)
            size = (max(w, round(im.size[0] * scale)), max(h, round(im.size[1] * scale)))
            im = im.resize(size, Image.BILINEAR)
            left, top = (size[0] - w) // 2, (size[1] - h) // 2
            a = np.asarray(im.crop((left, top, left + w, top + h)), dtype=np.float32)
        a = a.reshape(h, w, c).transpose(2, 0, 1) / np.float32(255)
        return a

    def _stats(self):
        unreadable = _unreadable()
        n = min(len(self), STATS_SAMPLE)
        xs = []
        for i in (np.linspace(0, len(self) - 1, n).astype(int) if n else []):
            try:
                xs.append(self._decode_raw(int(i)))
            except unreadable as e:
                if self.on_corrupt == "refuse":
                    raise ImageFolderError(f"{self.name}: cannot decode {self.files[i]} "
                                           f"({_why(e)}); "
                                           "use --on-corrupt skip to leave such files out"
                                           ) from None
        if not xs:
            raise ImageFolderError(f"{self.name}: no image decodes")
        x = np.stack(xs)
        mean = x.mean(axis=(0, 2, 3)).astype(np.float32)
        std = x.std(axis=(0, 2, 3)).astype(np.float32)
        std[std < 1e-6] = 1.0
        return mean, std

    def _sample(self, order: np.ndarray, pos: int) -> tuple[np.ndarray, int]:
        """The image at position pos of the order, or under 'skip' the next that decodes."""
        unreadable = _unreadable()
        for k in range(len(order)):
            i = int(order[(pos + k) % len(order)])
            try:
                x = self._decode_raw(i)
            except unreadable as e:
                if self.on_corrupt == "refuse":
                    raise ImageFolderError(f"{self.name}: cannot decode {self.files[i]} "
                                           f"({_why(e)})") from None
                with self._lock:
                    self.replaced.append(str(self.files[i]))
                continue
            x -= self.mean[:, None, None]
            x /= self.std[:, None, None]
            return x, int(self.y[i])
        raise ImageFolderError(f"{self.name}: no image decodes")

    def _batch(self, order, start, b):
        t = time.perf_counter()
        xs, ys = zip(*(self._sample(order, start + j) for j in range(b)))
        with self._lock:
            self.decoded += b
            self.decode_seconds += time.perf_counter() - t
        return np.stack(xs), np.asarray(ys, dtype=np.int64)

    def _pipeline(self, jobs):
        """Batches of ``jobs`` (an iterator of (order, start, b)) decoded by worker threads,
        at most ``prefetch`` ahead, yielded in order."""
        pool = ThreadPoolExecutor(self.workers, thread_name_prefix="neuron-loader")
        q: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()

        def feed():
            for job in jobs:
                if stop.is_set():
                    return
                try:
                    fut = pool.submit(self._batch, *job)
                except RuntimeError:        # the consumer closed the pool meanwhile
                    return
                while not stop.is_set():
                    try:
                        q.put(fut, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(None)

        feeder = threading.Thread(target=feed, daemon=True, name="neuron-loader-feed")
        feeder.start()
        try:
            while True:
                fut = q.get()
                if fut is None:
                    return
                yield fut.result()
        finally:
            stop.set()
            pool.shutdown(wait=False, cancel_futures=True)

    # ---- the two ways data.py asks for batches ----------------------------------------
    def stream(self, batch: int, seed: int, start_step: int = 0):
        """Infinite shuffled stream, step k a pure function of (seed, k) (as data.iterate)."""
        return self._pipeline((order, i, batch) for order, i in
                              epoch_batches(len(self), batch, seed, start_step))

    def in_order(self, batch: int):
        """One pass in file order, the last batch partial (for evaluation)."""
        order = np.arange(len(self))
        return self._pipeline((order, i, min(batch, len(self) - i))
                              for i in range(0, len(self), batch))

    def loader_stats(self) -> dict:
        return {"images_decoded": self.decoded, "decode_seconds": round(self.decode_seconds, 3),
                "workers": self.workers,
                "skipped_unreadable": len(self.skipped), "replaced_undecodable": len(self.replaced)}


def load_image_folder(root, sample_shape, *, workers: int | None = None, prefetch: int = 8,
                      on_corrupt: str = "skip"):
    """(train, test or None) ImageFolderDatasets for DIR (see the module docstring)."""
    root = Path(os.path.expanduser(str(root)))
    if not root.is_dir():
        raise FileNotFoundError(f"folder:{root}: no such directory")
    if on_corrupt not in CORRUPT_CHOICES:
        raise ValueError(f"on_corrupt must be one of {', '.join(CORRUPT_CHOICES)}, got "
                         f"{on_corrupt!r}")
    workers = workers or min(8, os.cpu_count() or 1)
    train_root = root / "train" if (root / "train").is_dir() else root
    test_root = next((root / d for d in ("val", "test") if (root / d).is_dir()), None) \
        if train_root != root else None
    classes, files, labels = _list_split(train_root, None)
    files, labels, bad = _scan(files, labels, on_corrupt, train_root)
    if not files:
        raise ImageFolderError(f"folder:{train_root}: no readable images with extensions "
                               f"{', '.join(EXTENSIONS)} under {len(classes)} class folders")
    train = ImageFolderDataset(f"folder:{train_root}", files, labels, classes, sample_shape,
                               workers=workers, prefetch=prefetch, on_corrupt=on_corrupt,
                               skipped=bad)
    test = None
    if test_root is not None:
        _, tf, tl = _list_split(test_root, classes)
        tf, tl, tbad = _scan(tf, tl, on_corrupt, test_root)
        if tf:
            test = ImageFolderDataset(f"folder:{test_root}", tf, tl, classes, sample_shape,
                                      train.mean, train.std, workers=workers, prefetch=prefetch,
                                      on_corrupt=on_corrupt, skipped=tbad)
    return train, test
