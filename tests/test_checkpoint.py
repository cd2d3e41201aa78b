import os
import zipfile

import numpy as np
import pytest

from neuron.checkpoint import load_checkpoint, save_checkpoint


def _arrays():
    rng = np.random.default_rng(0)
    return {
        "layer1.0.conv1.weight": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
        "opt.layer1.0.conv1.weight.momentum": rng.standard_normal((4, 3, 3, 3)),  # float64
        "fc.bias": np.arange(5, dtype=np.float32),
        "step_counts": np.array([1, 2, 2**40], dtype=np.int64),
        "scalar": np.float64(3.25),
        "empty": np.zeros((0, 7), np.float32),
        "mask": np.array([True, False]),
    }


def _tmp_leftovers(d):
    return [p for p in os.listdir(d) if p.endswith(".tmp")]


def test_round_trip_dtypes_and_dotted_names(tmp_path):
    p = tmp_path / "ckpt.npz"
    arrays = _arrays()
    meta = {"step": 120, "lr": 0.1, "model": "resnet", "nested": {"a": [1, 2]}, "np": np.int64(7),
            "loss": np.float32(0.5)}
    save_checkpoint(p, arrays, meta)
    got, got_meta = load_checkpoint(p)
    assert set(got) == set(arrays)
    for k, v in arrays.items():
        v = np.asarray(v)
        assert got[k].dtype == v.dtype, k
        assert got[k].shape == v.shape, k
        np.testing.assert_array_equal(got[k], v)
    assert got["layer1.0.conv1.weight"].dtype == np.float32
    assert got["opt.layer1.0.conv1.weight.momentum"].dtype == np.float64
    assert got["step_counts"].dtype == np.int64 and got["step_counts"][2] == 2**40
    assert got_meta == {"step": 120, "lr": 0.1, "model": "resnet", "nested": {"a": [1, 2]}, "np": 7,
                        "loss": 0.5}
    # a standard .npz readable by plain numpy, meta under the reserved key
    with np.load(p, allow_pickle=False) as z:
        assert "__meta__" in z.files and "layer1.0.conv1.weight" in z.files
    assert _tmp_leftovers(tmp_path) == []


def test_path_written_exactly_and_str_path(tmp_path):
    p = str(tmp_path / "sub" / "dir" / "model.ckpt")  # parent created, no .npz appended
    save_checkpoint(p, {"w": np.ones(3)}, {})
    assert os.path.isfile(p)
    arrays, meta = load_checkpoint(p)
    assert meta == {} and arrays["w"].tolist() == [1, 1, 1]


def test_overwrite_replaces(tmp_path):
    p = tmp_path / "c.npz"
    save_checkpoint(p, {"w": np.zeros(2)}, {"step": 1})
    save_checkpoint(p, {"v": np.ones(3, np.int64)}, {"step": 2})
    arrays, meta = load_checkpoint(p)
    assert set(arrays) == {"v"} and meta["step"] == 2


def test_atomic_on_failure_mid_write(tmp_path, monkeypatch):
    p = tmp_path / "c.npz"
    save_checkpoint(p, {"w": np.arange(4.0)}, {"step": 1})
    before = p.read_bytes()

    def boom(file, *args, **kwargs):
        file.write(b"PK\x03\x04 partial garbage")  # simulate a partially written archive
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", boom)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(p, {"w": np.arange(100.0)}, {"step": 2})
    assert p.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["c.npz"]  # no temp files left behind
    monkeypatch.undo()
    arrays, meta = load_checkpoint(p)
    assert meta == {"step": 1}
    np.testing.assert_array_equal(arrays["w"], np.arange(4.0))


def test_failure_without_existing_file_leaves_nothing(tmp_path, monkeypatch):
    p = tmp_path / "new.npz"

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(np, "savez", boom)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(p, {"w": np.zeros(1)}, {})
    assert os.listdir(tmp_path) == []


def test_failure_in_replace_cleans_temp(tmp_path, monkeypatch):
    p = tmp_path / "c.npz"
    save_checkpoint(p, {"w": np.zeros(1)}, {"step": 1})
    before = p.read_bytes()

    def bad_replace(src, dst):
        raise PermissionError("nope")

    monkeypatch.setattr(os, "replace", bad_replace)
    with pytest.raises(PermissionError):
        save_checkpoint(p, {"w": np.ones(1)}, {"step": 2})
    monkeypatch.undo()
    assert p.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["c.npz"]


def test_bad_inputs_rejected_before_writing(tmp_path):
    p = tmp_path / "c.npz"
    with pytest.raises(TypeError, match="JSON"):
        save_checkpoint(p, {"w": np.zeros(1)}, {"f": object()})
    with pytest.raises(ValueError, match="reserved"):
        save_checkpoint(p, {"__meta__": np.zeros(1)}, {})
    with pytest.raises(ValueError, match="reserved"):
        save_checkpoint(p, {"file": np.zeros(1)}, {})
    with pytest.raises(TypeError, match="object dtype"):
        save_checkpoint(p, {"o": np.array([object()])}, {})
    assert os.listdir(tmp_path) == []


def test_load_missing_file(tmp_path):
    p = tmp_path / "missing.npz"
    with pytest.raises(FileNotFoundError) as ei:
        load_checkpoint(p)
    assert str(p) in str(ei.value)


def test_load_not_npz(tmp_path):
    p = tmp_path / "junk.npz"
    p.write_bytes(b"this is not a zip archive at all")
    with pytest.raises(ValueError) as ei:
        load_checkpoint(p)
    assert str(p) in str(ei.value)
    # a .npy file is not a checkpoint either
    q = tmp_path / "arr.npy"
    np.save(q, np.zeros(3))
    with pytest.raises(ValueError) as ei:
        load_checkpoint(q)
    assert str(q) in str(ei.value)
    # a directory
    with pytest.raises(ValueError) as ei:
        load_checkpoint(tmp_path)
    assert str(tmp_path) in str(ei.value)


def test_load_truncated(tmp_path):
    p = tmp_path / "c.npz"
    save_checkpoint(p, _arrays(), {"step": 3})
    blob = p.read_bytes()
    p.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(ValueError) as ei:
        load_checkpoint(p)
    assert str(p) in str(ei.value)


def test_load_zip_with_bad_member(tmp_path):
    p = tmp_path / "c.npz"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("w.npy", b"not an npy payload")
        z.writestr("__meta__.npy", b"nor this")
    with pytest.raises(ValueError) as ei:
        load_checkpoint(p)
    assert str(p) in str(ei.value)


def test_load_missing_meta(tmp_path):
    p = tmp_path / "plain.npz"
    np.savez(p, w=np.zeros(3))
    with pytest.raises(ValueError) as ei:
        load_checkpoint(p)
    assert str(p) in str(ei.value) and "__meta__" in str(ei.value)


def test_load_bad_meta(tmp_path):
    p = tmp_path / "badmeta.npz"
    np.savez(p, w=np.zeros(3), __meta__=np.array("{not json"))
    with pytest.raises(ValueError, match="JSON"):
        load_checkpoint(p)
    np.savez(p, w=np.zeros(3), __meta__=np.array("[1, 2]"))
    with pytest.raises(ValueError, match="dict"):
        load_checkpoint(p)
    np.savez(p, w=np.zeros(3), __meta__=np.zeros(2))
    with pytest.raises(ValueError, match="JSON string"):
        load_checkpoint(p)


# ---------------------------------------------------------------- the target, before training
def test_target_checks_name_what_is_wrong(tmp_path):
    from neuron.checkpoint import check_checkpoint_target
    ok = tmp_path / "ok.npz"
    assert check_checkpoint_target(str(ok)) == str(ok)
    assert not list(tmp_path.iterdir())                 # the probe left nothing
    (tmp_path / "file").write_text("x")
    os.symlink(tmp_path / "ok.npz", tmp_path / "link.npz")
    cases = [(str(tmp_path), "is a directory"),
             (str(tmp_path / "missing" / "c.npz"), "does not exist"),
             (str(tmp_path / "file" / "c.npz"), "is not a directory"),
             (str(tmp_path / "link.npz"), "symbolic link"),
             ("/dev/full", "not a regular file"),
             ("", "empty")]
    for path, fragment in cases:
        with pytest.raises(ValueError, match=fragment):
            check_checkpoint_target(path)


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root may write anywhere")
def test_target_without_write_permission(tmp_path):
    from neuron.checkpoint import check_checkpoint_target
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    try:
        with pytest.raises(ValueError, match="permission"):
            check_checkpoint_target(str(d / "c.npz"))
    finally:
        d.chmod(0o700)


def test_stale_temp_files_of_killed_writes_are_removed(tmp_path):
    from neuron.checkpoint import remove_stale_temps
    target = tmp_path / "c.npz"
    stale = [tmp_path / ".c.npz.abc123.tmp", tmp_path / ".c.npz.x.tmp"]
    keep = [tmp_path / ".other.npz.abc.tmp", tmp_path / "c.npz.tmp", tmp_path / "c.npz"]
    for p in stale + keep:
        p.write_bytes(b"partial")
    removed = remove_stale_temps(str(target))
    assert sorted(removed) == sorted(str(p) for p in stale)
    assert all(p.exists() for p in keep) and not any(p.exists() for p in stale)
