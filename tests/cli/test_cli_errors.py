"""Every failure of the `neuron` command is one line, no traceback, exit 2 for usage and 1 for
runtime errors, naming what is wrong (the probes of issue 10)."""
import argparse
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from neuron.cli.main import build_parser
from neuron.cli.errors import run_command
from test_cli import ROOT, SMALL, run  # one runner for both files

TRAIN = ["train", *SMALL, "--batch", "4", "--device", "cpu", "--no-progress"]


def one_line_error(rc, err, code, *fragments):
    assert rc == code, (rc, err)
    assert "Traceback" not in err
    lines = [l for l in err.strip().splitlines() if not l.startswith(("usage:", " "))]
    assert len(lines) == 1, err
    for f in fragments:
        assert f in err, (f, err)


@pytest.mark.parametrize("argv,fragment", [
    (["--lr", "nan"], "argument --lr: must be finite"),
    (["--lr", "inf"], "argument --lr: must be finite"),
    (["--lr", "0"], "argument --lr: must be > 0"),
    (["--momentum", "nan"], "argument --momentum: must be finite"),
    (["--weight-decay=-inf"], "argument --weight-decay: must be finite"),
    (["--epochs", "0"], "argument --epochs: must be > 0"),
    (["--warmup", "-5"], "argument --warmup: must be >= 0"),
    (["--checkpoint-every", "0"], "argument --checkpoint-every: must be positive"),
    (["--batch", "2.5"], "argument --batch: must be an integer"),
])
def test_train_numbers_that_would_be_silently_wrong_are_usage_errors(capsys, argv, fragment):
    rc, _, err = run(capsys, *TRAIN, "--iters", "1", *argv)
    one_line_error(rc, err, 2, fragment)


@pytest.mark.parametrize("batch", ["0", "-3"])
def test_summary_and_plan_refuse_a_non_positive_batch(capsys, batch):
    for cmd in ("summary", "plan"):
        rc, _, err = run(capsys, cmd, *SMALL, "--batch", batch)
        one_line_error(rc, err, 2, "argument --batch: must be positive")


def test_classes_that_do_not_match_the_dataset(capsys):
    pytest.importorskip("sklearn")
    rc, _, err = run(capsys, *TRAIN, "--iters", "1", "--dataset", "digits", "--classes", "5")
    one_line_error(rc, err, 2, "--classes 5", "digits", "10 classes")


def test_a_partial_cifar_folder_says_what_was_loaded(capsys, tmp_path):
    from neuron.data import write_cifar10_bin
    rng = np.random.default_rng(0)
    write_cifar10_bin(tmp_path / "data_batch_1.bin",
                      rng.integers(0, 256, (8, 3, 32, 32), dtype=np.uint8), np.arange(8) % 10)
    rc, out, err = run(capsys, *TRAIN, "--iters", "1", "--dataset", f"cifar10:{tmp_path}")
    assert rc == 0, err
    assert "8 training images from data_batch_1.bin" in err
    assert "data_batch_2.bin" in err and "not found" in err


def test_mnist_header_whose_dimensions_overflow_names_the_file(capsys, tmp_path):
    (tmp_path / "train-images-idx3-ubyte").write_bytes(
        struct.pack(">iIII", 2051, 2 ** 31, 2 ** 31, 2 ** 31) + b"\0" * 16)
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(struct.pack(">iI", 2049, 1) + b"\0")
    rc, _, err = run(capsys, *TRAIN, "--iters", "1", "--dataset", f"mnist:{tmp_path}")
    one_line_error(rc, err, 1, "train-images-idx3-ubyte", "expected")


def test_checkpoint_targets_are_checked_before_any_work(capsys, tmp_path):
    for target, fragment in [(str(tmp_path), "is a directory"),
                             (str(tmp_path / "no" / "c.npz"), "does not exist"),
                             ("/dev/full", "not a regular file")]:
        rc, out, err = run(capsys, *TRAIN, "--iters", "1", "--checkpoint", target)
        one_line_error(rc, err, 2, fragment)
        assert out == ""                                # nothing trained


def test_resume_problems(capsys, tmp_path):
    from neuron.checkpoint import save_checkpoint
    ckpt = str(tmp_path / "c.npz")
    rc, _, err = run(capsys, *TRAIN, "--iters", "2", "--checkpoint", ckpt)
    assert rc == 0, err
    rc, _, err = run(capsys, *TRAIN, "--iters", "2", "--resume", ckpt)
    one_line_error(rc, err, 2, "nothing is left to train")
    rc, _, err = run(capsys, *TRAIN[:-5], "--batch", "8", "--device", "cpu", "--no-progress",
                     "--iters", "3", "--resume", ckpt)
    one_line_error(rc, err, 2, "trained with batch 4", "--batch 4")
    from neuron.checkpoint import load_checkpoint
    arrays, meta = load_checkpoint(ckpt)
    for bad_meta, fragment in [({k: v for k, v in meta.items() if k != "iteration"},
                                "no 'iteration'"),
                               ({**meta, "iteration": "x"}, "non-negative integer")]:
        save_checkpoint(ckpt, arrays, bad_meta)
        rc, _, err = run(capsys, *TRAIN, "--iters", "3", "--resume", ckpt)
        one_line_error(rc, err, 2, fragment, ckpt)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_non_finite_run_stops_with_exit_1_and_the_last_good_state_kept(capsys, tmp_path):
    from neuron.checkpoint import load_checkpoint
    ckpt = str(tmp_path / "c.npz")
    rc, _, err = run(capsys, *TRAIN, "--iters", "2", "--checkpoint", ckpt)
    assert rc == 0, err
    rc, _, err = run(capsys, *TRAIN, "--iters", "20", "--lr", "1e38", "--schedule", "constant",
                     "--resume", ckpt)
    one_line_error(rc, err, 1, "the step was undone", "was not saved",
                   f"{ckpt} still holds iteration 2 (continue with --resume {ckpt}")
    assert load_checkpoint(ckpt)[1]["iteration"] == 2


def test_device_cuda_without_a_gpu(capsys):
    from neuron.devices import cuda_available
    if cuda_available():
        pytest.skip("a GPU is usable here")
    rc, _, err = run(capsys, *TRAIN[:-3], "--device", "cuda", "--no-progress", "--iters", "1")
    one_line_error(rc, err, 1, "device cuda is not usable", "--device cpu")


def test_missing_optional_packages(capsys, monkeypatch):
    for name in ("sklearn", "sklearn.datasets"):              # imports fail as if not installed
        monkeypatch.setitem(sys.modules, name, None)
    rc, _, err = run(capsys, *TRAIN, "--iters", "1", "--dataset", "digits")
    one_line_error(rc, err, 1, "scikit-learn")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    rc, out, err = run(capsys, "plan", *SMALL, "--batch", "2", "--plot", "x.png")
    one_line_error(rc, err, 1, "matplotlib", "neuron-arena[plot]")
    assert out == ""                                        # refused before planning


def test_keyboard_interrupt_and_unexpected_errors_are_one_line(capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    def bug(args):
        raise ZeroDivisionError("division by zero")
    assert run_command("plan", interrupted, None) == 130
    assert run_command("plan", bug, None) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 2
    assert "interrupted" in err and "NEURON_TRACEBACK=1" in err


def test_broken_pipe_is_quiet():
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.Popen([sys.executable, "-m", "neuron", "summary", *SMALL, "--all"], cwd=ROOT,
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()                                        # `| head` that already exited
    err = p.stderr.read().decode()
    p.wait(timeout=120)
    assert p.returncode == 1 and "Traceback" not in err
    assert "broken pipe" in err and len(err.strip().splitlines()) == 1


def test_every_option_of_every_command_has_help_and_shows_its_default():
    ap = build_parser()
    sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
    for name, p in sub.choices.items():
        fmt = p._get_formatter()
        for action in p._actions:
            if not action.option_strings or isinstance(action, argparse._HelpAction):
                continue
            assert action.help, (name, action.option_strings)
            text = fmt._get_help_string(action)
            assert "default" in text, (name, action.option_strings, text)
    train = sub.choices["train"].format_help()
    assert "superneurons" in train and "(default: liveness; superneurons, planned," in train


def test_train_summary_shows_bytes_moved(capsys):
    rc, out, err = run(capsys, *TRAIN, "--iters", "1", "--policy", "offload", "--budget", "4MiB")
    assert rc == 0, err
    assert "moved " in out and " to host and " in out


def test_output_to_a_full_disk():
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with open("/dev/full", "w") as full:
        p = subprocess.run([sys.executable, "-m", "neuron", "summary", *SMALL, "--all"], cwd=ROOT,
                           env=env, stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines() == ["neuron summary: error: cannot write the output "
                                             "(No space left on device)"]


def _default_sigint():
    """In the child: SIGINT at its default, so that Python turns it into KeyboardInterrupt even
    when this test run was started with SIGINT ignored (`nohup pytest &`), which children
    inherit."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_in_a_parallel_search_is_one_line():
    """Ctrl-C signals the whole process group: the forked planning workers too."""
    import signal
    import threading
    import time
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.Popen([sys.executable, "-m", "neuron", "deepest", "resnet_cifar", "--budget",
                          "64GiB", "--batch", "16"], cwd=ROOT, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                         preexec_fn=_default_sigint)
    chunks = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: p.stderr.read(1), "")))
    reader.start()
    try:
        end = time.monotonic() + 120
        while "fits" not in "".join(chunks) and time.monotonic() < end and p.poll() is None:
            time.sleep(0.05)        # the search is under way (its first probe is out)
        os.killpg(p.pid, signal.SIGINT)
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        reader.join(10)
    err = "".join(chunks)
    assert p.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "ForkPoolWorker" not in err
    assert err.rstrip().splitlines()[-1] == "neuron deepest: interrupted"


def test_a_precision_the_device_cannot_run_is_one_line(capsys):
    rc, _, err = run(capsys, *TRAIN, "--iters", "1", "--precision", "tf32")
    one_line_error(rc, err, 2, "precision tf32 on device cpu:", "no TF32 arithmetic")


def test_bf16_without_ml_dtypes_names_the_package(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)     # import fails as if not installed
    rc, _, err = run(capsys, "plan", *SMALL, "--precision", "bf16", "--no-min-budget")
    assert rc != 0 and "ml_dtypes" in err and "pip install ml_dtypes" in err, err
    assert "Traceback" not in err
