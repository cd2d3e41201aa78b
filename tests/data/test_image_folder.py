"""`--dataset folder:DIR` (neuron/data/image_folder.py) on folders of generated images."""
import json
import time

import numpy as np
import pytest

Image = pytest.importorskip("PIL.Image")

from neuron.cli.main import main  # noqa: E402
from neuron.data import iterate, load_dataset  # noqa: E402
from neuron.data.image_folder import ImageFolderError  # noqa: E402

SHAPE = (3, 16, 16)


def make_folder(root, per_class=(12, 9, 10), val=4, seed=0):
    """root/train/<class>/ and root/val/<class>/, JPEG and PNG of assorted sizes whose
    brightness tells the class."""
    rng = np.random.default_rng(seed)
    for split, counts in (("train", per_class), ("val", [val] * len(per_class))):
        for c, n in enumerate(counts):
            d = root / split / f"c{c}"
            d.mkdir(parents=True)
            for i in range(n):
                h, w = 18 + (i * 5) % 23, 20 + (i * 7) % 31
                a = (rng.random((h, w, 3)) * 60 + 90 * c).astype(np.uint8)
                Image.fromarray(a).save(d / f"{i:03d}.{'png' if i % 2 else 'jpg'}")
    return root


def test_layout_classes_and_splits(tmp_path):
    split = load_dataset(f"folder:{make_folder(tmp_path)}", sample_shape=SHAPE)
    tr, te = split.train, split.test
    assert tr.classes == ["c0", "c1", "c2"] and tr.num_classes == 3
    assert len(tr) == 31 and len(te) == 12
    assert np.bincount(tr.y).tolist() == [12, 9, 10]
    assert te.mean is tr.mean            # the test split uses the training statistics


def test_batches_are_resized_cropped_standardized(tmp_path):
    tr = load_dataset(f"folder:{make_folder(tmp_path)}", sample_shape=SHAPE).train
    xs, ys = zip(*(b for b, _ in zip(tr.in_order(8), range(10))))
    x = np.concatenate(xs)
    assert x.shape == (31, *SHAPE) and x.dtype == np.float32
    assert np.all(np.abs(x.mean(axis=(0, 2, 3))) < 0.1)
    assert np.allclose(x.std(axis=(0, 2, 3)), 1, atol=0.1)
    # brightness encodes the class, and survives the normalization
    y = np.concatenate(ys)
    means = [x[y == c].mean() for c in range(3)]
    assert means == sorted(means)


def _take(ds, k, seed, start=0):
    it = iterate(ds, 5, seed=seed, start_step=start)
    return [next(it) for _ in range(k)]


def test_order_is_a_function_of_the_seed_not_of_the_workers(tmp_path):
    root = make_folder(tmp_path)
    one = load_dataset(f"folder:{root}", sample_shape=SHAPE, loader_workers=1).train
    four = load_dataset(f"folder:{root}", sample_shape=SHAPE, loader_workers=4).train
    a, b = _take(one, 9, seed=3), _take(four, 9, seed=3)     # crosses an epoch (6 steps)
    assert all(np.array_equal(x1, x2) and np.array_equal(y1, y2) for (x1, y1), (x2, y2)
               in zip(a, b))
    c = _take(four, 9, seed=4)
    assert not all(np.array_equal(y1, y2) for (_, y1), (_, y2) in zip(a, c))
    tail = _take(four, 4, seed=3, start=5)                   # resume at step 5
    assert all(np.array_equal(x1, x2) for (x1, _), (x2, _) in zip(a[5:], tail))


def test_the_queue_is_bounded(tmp_path):
    tr = load_dataset(f"folder:{make_folder(tmp_path)}", sample_shape=SHAPE,
                      loader_workers=2).train
    tr.prefetch = 2
    it = iterate(tr, 3, seed=0)
    next(it)
    time.sleep(0.5)                      # let the workers run ahead as far as they may
    # consumed 1 batch; at most `prefetch` queued plus one being handed over per worker
    assert tr.decoded <= 3 * (1 + tr.prefetch + tr.workers)


def test_unreadable_files_skipped_with_a_count_or_refused(tmp_path):
    root = make_folder(tmp_path)
    (root / "train" / "c1" / "zz_bad.png").write_bytes(b"\x89PNG not really")
    (root / "train" / "c2" / "notes.txt").write_text("ignored: not an image extension")
    tr = load_dataset(f"folder:{root}", sample_shape=SHAPE).train
    assert len(tr) == 31 and tr.loader_stats()["skipped_unreadable"] == 1
    with pytest.raises(ImageFolderError, match="zz_bad.png"):
        load_dataset(f"folder:{root}", sample_shape=SHAPE, on_corrupt="refuse")


def test_a_file_that_fails_only_when_decoded(tmp_path):
    """A truncated JPEG passes the header scan; decoding it fails later."""
    root = make_folder(tmp_path, per_class=(6, 6, 6))
    bad = root / "train" / "c0" / "000.jpg"
    a = (np.random.default_rng(1).random((64, 64, 3)) * 255).astype(np.uint8)
    Image.fromarray(a).save(bad)
    bad.write_bytes(bad.read_bytes()[:bad.stat().st_size * 8 // 10])
    with Image.open(bad) as im:
        im.verify()                     # the header scan cannot tell
    tr = load_dataset(f"folder:{root}", sample_shape=SHAPE, loader_workers=1).train
    assert len(tr) == 18
    xs = [x for x, _ in tr.in_order(6)]
    assert sum(len(x) for x in xs) == 18 and tr.loader_stats()["replaced_undecodable"] == 1
    # under refuse, the statistics pass (which decodes the images) already stops at it
    with pytest.raises(ImageFolderError, match="000.jpg"):
        load_dataset(f"folder:{root}", sample_shape=SHAPE, on_corrupt="refuse")


def test_bad_folders_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        load_dataset(f"folder:{tmp_path / 'nope'}", sample_shape=SHAPE)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ImageFolderError, match="no class subfolders"):
        load_dataset(f"folder:{tmp_path / 'empty'}", sample_shape=SHAPE)
    with pytest.raises(ValueError, match="needs a directory"):
        load_dataset("folder", sample_shape=SHAPE)


def test_train_from_a_folder(tmp_path, capsys):
    root = make_folder(tmp_path)
    rc = main(["train", "resnet_cifar", "--depth", "8", "--dataset", f"folder:{root}",
               "--iters", "4", "--batch", "8", "--no-progress", "--json"])
    assert rc == 0
    out = capsys.readouterr().out
    res = json.loads(out.strip().splitlines()[-1])
    assert res["loader"]["images_decoded"] >= 4 * 8 and res["loader"]["workers"] >= 1
    assert 0 <= res["test_accuracy"] <= 1 and "loader:" in out


def test_a_decompression_bomb_is_skipped_and_named_or_refused(tmp_path, monkeypatch, capsys):
    """More pixels than Pillow's limit (lowered here, so the 'bombs' stay small): between the
    limit and twice it Pillow only warns and would decode; above twice it raises an error that
    names no file. Both are left out at the scan and named, or refused under refuse."""
    root = make_folder(tmp_path, per_class=(6, 6, 6))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 60 * 60)     # the others: <= 40x50
    Image.fromarray(np.zeros((70, 70, 3), np.uint8)).save(root / "train" / "c0" / "warns.png")
    Image.fromarray(np.zeros((100, 100, 3), np.uint8)).save(root / "train" / "c1" / "bomb.png")
    tr = load_dataset(f"folder:{root}", sample_shape=SHAPE).train
    assert len(tr) == 18 and tr.loader_stats()["skipped_unreadable"] == 2
    assert "bomb.png (decompression bomb" in tr.origin and "warns.png (decompression bomb" \
        in tr.origin
    with pytest.raises(ImageFolderError, match=r"unreadable image .*warns.png \(decompression "
                       r"bomb.*--on-corrupt skip"):
        load_dataset(f"folder:{root}", sample_shape=SHAPE, on_corrupt="refuse")
    (root / "train" / "c0" / "warns.png").unlink()
    with pytest.raises(ImageFolderError, match=r"unreadable image .*bomb.png \(decompression "
                       r"bomb.*--on-corrupt skip"):
        load_dataset(f"folder:{root}", sample_shape=SHAPE, on_corrupt="refuse")
    rc = main(["train", "resnet_cifar", "--depth", "8", "--dataset", f"folder:{root}",
               "--iters", "1", "--batch", "4", "--no-progress", "--on-corrupt", "refuse"])
    err = capsys.readouterr().err
    assert rc == 1 and "bomb.png" in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
