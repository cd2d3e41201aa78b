"""SIGINT/SIGTERM during `neuron train`: the run stops cleanly, writes its checkpoint, exits
non-zero with one line saying where the state is, and resumes. Subprocesses, bounded in time."""
import os
import signal
import subprocess
import sys
import time

import pytest

from neuron.checkpoint import load_checkpoint

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))
BASE = [sys.executable, "-m", "neuron", "train", "resnet_cifar", "--depth", "8", "--batch", "4",
        "--device", "cpu", "--no-progress"]
TRAIN = [*BASE, "--iters", "100000", "--checkpoint-every", "2"]


def _env():
    return {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _default_signals():
    """In the child: the dispositions a terminal gives, whatever this test run inherited
    (`nohup pytest &` ignores SIGHUP and SIGINT, and an ignored SIGHUP is kept by design)."""
    for s in (signal.SIGINT, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)


def _start(ckpt, extra=()):
    return subprocess.Popen([*TRAIN, "--checkpoint", str(ckpt), *extra], cwd=ROOT, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_signals)


def _wait_for(path, proc, timeout=120):
    end = time.monotonic() + timeout
    while not os.path.exists(path):
        if proc.poll() is not None:
            raise AssertionError(f"training ended early: {proc.communicate()}")
        if time.monotonic() > end:
            proc.kill()
            raise AssertionError("no checkpoint appeared")
        time.sleep(0.05)


@pytest.mark.parametrize("sig,times", [(signal.SIGINT, 1), (signal.SIGTERM, 1),
                                       (signal.SIGINT, 2), (signal.SIGHUP, 1)])
def test_signal_stops_training_saves_and_says_where(tmp_path, sig, times):
    ckpt = tmp_path / "run.npz"
    p = _start(ckpt)
    try:
        _wait_for(ckpt, p)              # training is under way (the first checkpoint is out)
        for _ in range(times):
            p.send_signal(sig)
            time.sleep(0.05)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 128 + sig, (p.returncode, err)
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    name = signal.Signals(sig).name
    assert last.startswith(f"neuron train: stopped by {name} after iteration "), err
    assert f"saved to {ckpt} (continue with --resume {ckpt})" in last
    it = int(last.split("after iteration ")[1].split()[0])
    _, meta = load_checkpoint(str(ckpt))
    assert meta["iteration"] == it >= 2
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
    # the run continues from where it stopped
    r = subprocess.run([*BASE, "--iters", str(it + 1), "--resume", str(ckpt), "--json"], cwd=ROOT, env=_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert '"iterations": 1' in r.stdout.strip().splitlines()[-1]


def test_sigkill_leftovers_are_cleaned_by_the_next_run(tmp_path):
    ckpt = tmp_path / "run.npz"
    leftover = tmp_path / ".run.npz.k1ll3d.tmp"     # what a write killed by SIGKILL leaves
    leftover.write_bytes(b"\0" * 4096)
    r = subprocess.run([*BASE, "--iters", "1", "--checkpoint", str(ckpt)], cwd=ROOT, env=_env(), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert not leftover.exists() and ckpt.exists()
    assert f"state saved to {ckpt}" in r.stdout


@pytest.fixture
def default_sigint():
    """SIGINT as Python installs it by default, whatever this test run inherited (a run started
    with SIGINT ignored, e.g. `nohup pytest &`, has SIG_IGN here); put back afterwards."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def test_signals_are_deferred_while_state_is_put_back(default_sigint):
    from neuron.interrupt import signals_deferred
    reached_end = False
    with pytest.raises(KeyboardInterrupt):
        with signals_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            reached_end = True          # the interrupt waited for the block to end
    assert reached_end


def test_stop_request_interrupts_only_inside_a_step(default_sigint):
    from neuron.interrupt import StopRequest
    with StopRequest(announce=False) as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)                # outside a step: recorded, nothing raised
        assert stop.requested and stop.signum == signal.SIGTERM and stop.count == 2
        with pytest.raises(KeyboardInterrupt):
            with stop.step():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_hang_up_stops_like_sigterm_unless_started_under_nohup():
    from neuron.interrupt import StopRequest
    old = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        with StopRequest(announce=False) as stop:
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.05)
            assert stop.requested and stop.name == "SIGHUP"
        signal.signal(signal.SIGHUP, signal.SIG_IGN)      # as nohup starts a command
        with StopRequest(announce=False) as stop:
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.05)
            assert not stop.requested
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, old)
