"""Atomic .npz checkpoints.

A checkpoint is a single uncompressed ``.npz`` holding named arrays plus a JSON
metadata dict stored as a 0-d unicode array under the reserved key
``"__meta__"``.  No pickling is used on either side (``allow_pickle=False``).

Writes are atomic: the data goes to a temp file in the destination directory
(``tempfile.mkstemp``), is flushed and fsynced, then ``os.replace``-d onto the
target.  On any failure the temp file is removed and an existing checkpoint at
the target path is left untouched.
"""
from __future__ import annotations

import json
import os
import tempfile
import zipfile
from typing import Any, Mapping

import numpy as np

__all__ = ["save_checkpoint", "load_checkpoint", "check_checkpoint_target",
           "remove_stale_temps", "META_KEY"]

META_KEY = "__meta__"
# names that np.savez itself takes as keyword arguments cannot be array keys
_SAVEZ_RESERVED = frozenset({"file", "allow_pickle", "args", "kwds"})


def _json_default(o: Any):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"object of type {type(o).__name__} is not JSON serializable")


def save_checkpoint(path, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None:
    """Atomically write ``arrays`` and ``meta`` to ``path`` (written exactly at
    ``path``; no ".npz" is appended).  ``meta`` must be JSON-serializable
    (numpy scalars/arrays are converted; tuples come back as lists).  The
    parent directory is created if needed."""
    path = os.fspath(path)
    if not isinstance(meta, Mapping):
        raise TypeError(f"checkpoint {path}: meta must be a dict, got {type(meta).__name__}")
    try:
        meta_json = json.dumps(dict(meta), default=_json_default, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise TypeError(f"checkpoint {path}: meta is not JSON-serializable: {e}") from e

    payload: dict[str, np.ndarray] = {}
    for name, value in arrays.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"checkpoint {path}: array names must be non-empty strings, got {name!r}")
        if name == META_KEY or name in _SAVEZ_RESERVED:
            raise ValueError(f"checkpoint {path}: array name {name!r} is reserved")
        arr = np.asarray(value)
        if arr.dtype.hasobject:
            raise TypeError(f"checkpoint {path}: array {name!r} has object dtype, which cannot be saved without pickle")
        payload[name] = arr
    payload[META_KEY] = np.array(meta_json)

    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    try:
        mode = os.stat(path).st_mode & 0o777
    except FileNotFoundError:
        mode = 0o644
    fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=".tmp", dir=directory)
    fd_owned = False
    try:
        f = os.fdopen(fd, "wb")
        fd_owned = True
        with f:
            np.savez(f, **payload)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if not fd_owned:  # os.fdopen itself failed; the fd is still ours
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    # make the rename durable (best effort; not supported everywhere)
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def _temp_prefix(path: str) -> str:
    return "." + os.path.basename(path) + "."


def remove_stale_temps(path) -> list[str]:
    """Delete the temp files that killed writes to ``path`` left behind (``.NAME.*.tmp`` in its
    directory; a write in progress to the same target from another process would lose its temp,
    so one target has one writer). Returns the removed paths."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    prefix, removed = _temp_prefix(path), []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        if name.startswith(prefix) and name.endswith(".tmp"):
            full = os.path.join(directory, name)
            try:
                if os.path.isfile(full) and not os.path.islink(full):
                    os.unlink(full)
                    removed.append(full)
            except OSError:
                pass
    return removed


def check_checkpoint_target(path) -> str:
    """Raise ValueError (naming the path and what would work) unless ``path`` can receive a
    checkpoint: a regular file or a new name, in an existing writable directory, not a symlink
    or device. Called before training starts, so a bad target costs no training."""
    path = os.fspath(path)
    if not path:
        raise ValueError("checkpoint path is empty")
    if os.path.islink(path):
        raise ValueError(f"checkpoint {path} is a symbolic link; give the real file's path "
                         f"({os.path.realpath(path)})")
    if os.path.isdir(path):
        raise ValueError(f"checkpoint {path} is a directory; give a file name such as "
                         f"{os.path.join(path, 'checkpoint.npz')}")
    if os.path.exists(path) and not os.path.isfile(path):
        raise ValueError(f"checkpoint {path} exists and is not a regular file (a device or "
                         "pipe); give a file name in a writable directory")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.exists(directory):
        raise ValueError(f"checkpoint {path}: directory {directory} does not exist (create it "
                         "first)")
    if not os.path.isdir(directory):
        raise ValueError(f"checkpoint {path}: {directory} is not a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ValueError(f"checkpoint {path}: no permission to write in {directory}")
    # the proof: create and remove a temp file where the real write will go (read-only mounts)
    try:
        fd, probe = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=".tmp", dir=directory)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ValueError(f"checkpoint {path}: cannot create files in {directory} ({e.strerror})"
                         ) from None
    return path


def load_checkpoint(path) -> tuple[dict[str, np.ndarray], dict]:
    """Read a checkpoint written by :func:`save_checkpoint`.

    Returns ``(arrays, meta)``.  Raises FileNotFoundError for a missing file and
    ValueError (naming the path) for a file that is not a valid checkpoint."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if not os.path.isfile(path):
        raise ValueError(f"checkpoint {path} is not a regular file")
    if not zipfile.is_zipfile(path):
        raise ValueError(f"checkpoint {path} is not an .npz archive (not a zip file, or truncated)")
    arrays: dict[str, np.ndarray] = {}
    try:
        with np.load(path, allow_pickle=False) as npz:
            if not hasattr(npz, "files"):
                raise ValueError("not an .npz archive")
            names = list(npz.files)
            for name in names:
                value = npz[name]
                if not isinstance(value, np.ndarray):  # member is not a valid .npy
                    raise ValueError(f"member {name!r} is not a .npy array")
                arrays[name] = value
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, KeyError) as e:
        raise ValueError(f"checkpoint {path} could not be read as .npz: {e}") from e
    if META_KEY not in arrays:
        raise ValueError(f"checkpoint {path} has no {META_KEY!r} entry (not written by save_checkpoint?)")
    raw = arrays.pop(META_KEY)
    if raw.ndim != 0 or raw.dtype.kind != "U":
        raise ValueError(f"checkpoint {path}: {META_KEY!r} must be a JSON string, found {raw.dtype} array of shape {raw.shape}")
    try:
        meta = json.loads(str(raw[()]))
    except json.JSONDecodeError as e:
        raise ValueError(f"checkpoint {path}: {META_KEY!r} is not valid JSON: {e}") from e
    if not isinstance(meta, dict):
        raise ValueError(f"checkpoint {path}: {META_KEY!r} must decode to a dict, found {type(meta).__name__}")
    return arrays, meta
