"""The training loop: real learning, exact checkpoint resume, evaluation, lr schedules."""
import math
import time

import numpy as np
import pytest

import neuron as nn
from neuron.checkpoint import load_checkpoint
from neuron.data import load_dataset
from neuron.train import evaluate, fit, lr_at


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", seed=0)


def small_cnn(dropout=0.0):
    x = nn.Input((1, 8, 8), name="data")
    h = nn.Conv2d(8, 3, padding=1, bias=False, name="c1")(x)
    h = nn.ReLU(name="r1")(nn.BatchNorm(name="bn1")(h))
    h = nn.MaxPool2d(2, name="p1")(h)
    h = nn.ReLU(name="r2")(nn.BatchNorm(name="bn2")(nn.Conv2d(16, 3, padding=1, name="c2")(h)))
    h = nn.GlobalAvgPool(name="gap")(h)
    if dropout:
        h = nn.Dropout(dropout, name="drop")(h)
    return nn.Graph(x, nn.Linear(10, name="fc")(h), name="small_cnn")


def _sgd():
    return nn.SGD(lr=0.1, momentum=0.9, weight_decay=5e-4)


# ---------------------------------------------------------------- (a) it learns
def _learning_graph():
    try:
        from neuron.models import build_model
    except ImportError:          # the model zoo is optional for this test
        return small_cnn()
    return build_model("resnet_cifar", depth=8, in_shape=(1, 8, 8), num_classes=10)


def test_learns_digits(digits):
    g = _learning_graph()
    ex = nn.Executor(g, 32, optimizer=_sgd(), seed=0)
    t0 = time.process_time()     # this process's CPU time: other jobs on the cores do not count
    res = fit(ex, digits.train, digits.test, iters=60, lr=0.1, schedule="cosine", seed=0,
              progress=False)
    elapsed = time.process_time() - t0
    assert res["test_accuracy"] >= 0.90, res
    assert elapsed < 60, f"{elapsed:.1f}s"
    assert res["iterations"] == 60
    assert res["final_loss"] < 0.5
    assert res["peak_bytes"] == res["planned_peak_bytes"] == ex.pool.high_water
    assert res["images_per_sec"] > 0 and res["seconds"] > 0
    assert 0 <= res["test_loss"] < 1.0
    assert res["arena_bytes"] >= res["peak_bytes"]


def test_fit_gathers_batches_into_the_replay_staging_with_the_same_bits(digits, monkeypatch):
    """A replaying executor's staging buffers are where fit's loader gathers each batch: the
    step copies no batch, and training gives the bits of feeding the same batches by hand."""
    from neuron.data import iterate
    kw = dict(optimizer=_sgd(), seed=0, replay="tape")
    by_hand = nn.Executor(small_cnn(), 16, **kw)
    stream = iterate(digits.train, 16, seed=0)
    for i in range(8):
        by_hand.optimizer.lr = lr_at(i, 8, 0.1, "cosine", 0)
        by_hand.train_step(*next(stream))
    ex = nn.Executor(small_cnn(), 16, **kw)
    copies = []
    real = np.copyto
    monkeypatch.setattr(np, "copyto", lambda dst, src, **k: (copies.append(dst),
                                                           real(dst, src, **k))[1])
    fit(ex, digits.train, iters=8, lr=0.1, schedule="cosine", seed=0, progress=False)
    monkeypatch.undo()
    assert ex.replay["replayed_iterations"] > 0
    # the first step makes the staging and copies its batch there; no later step copies one
    staging = list(ex.batch_buffers().values())
    assert sum(any(c is s for s in staging) for c in copies) == len(staging)
    a, b = by_hand.state_dict(), ex.state_dict()
    assert all(a[k].tobytes() == b[k].tobytes() for k in a)


# ---------------------------------------------------------------- (b) resume
def test_checkpoint_resume_is_bit_identical(digits, tmp_path):
    """Stop at k with a checkpoint, resume in a new executor to N: identical to N straight.
    Dropout, BN running statistics, momentum, weight decay and the cosine schedule all must
    continue exactly."""
    n, k = 14, 6
    g = small_cnn(dropout=0.3)
    kw = dict(iters=n, lr=0.1, schedule="cosine", warmup=3, seed=4, progress=False)

    straight = nn.Executor(g, 16, optimizer=_sgd(), seed=9)
    r_full = fit(straight, digits.train, **kw)

    ckpt = tmp_path / "run.npz"
    first = nn.Executor(g, 16, optimizer=_sgd(), seed=9)
    r1 = fit(first, digits.train, **kw, stop_at=k, checkpoint=str(ckpt), meta={"note": "x"})
    assert r1["iterations"] == k
    arrays, meta = load_checkpoint(ckpt)
    assert meta["iteration"] == k and meta["note"] == "x" and meta["seed"] == 4
    assert meta["optimizer"]["momentum"] == 0.9 and meta["batch"] == 16
    assert arrays.keys() == straight.state_dict().keys()

    second = nn.Executor(g, 16, optimizer=_sgd(), seed=9)
    r2 = fit(second, digits.train, **kw, resume=str(ckpt))
    assert r2["iterations"] == n - k
    assert second.iteration == straight.iteration == n
    assert r2["final_loss"] == r_full["final_loss"]
    a, b = second.state_dict(), straight.state_dict()
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].tobytes() == b[key].tobytes(), key
    # the optimizer's lr ended on the same schedule value
    assert second.optimizer.lr == straight.optimizer.lr == lr_at(n - 1, n, 0.1, "cosine", 3)


def test_resume_checkpoint_of_the_end_of_a_run(digits, tmp_path):
    g = small_cnn()
    ckpt = tmp_path / "end.npz"
    ex = nn.Executor(g, 16, optimizer=_sgd(), seed=0)
    fit(ex, digits.train, iters=3, seed=0, progress=False, checkpoint=str(ckpt))
    ex2 = nn.Executor(g, 16, optimizer=_sgd(), seed=1)
    for iters in (3, 2):        # at or below the checkpoint's iteration: nothing to train
        with pytest.raises(ValueError, match="nothing is left to train"):
            fit(ex2, digits.train, iters=iters, seed=0, progress=False, resume=str(ckpt))
    r = fit(ex2, digits.train, iters=4, seed=0, progress=False, resume=str(ckpt))
    assert r["iterations"] == 1 and ex2.iteration == 4


def test_fit_rejects_bad_arguments(digits, tmp_path):
    ex = nn.Executor(small_cnn(), 16, optimizer=_sgd())
    with pytest.raises(ValueError, match="positive"):
        fit(ex, digits.train, iters=0, progress=False)
    with pytest.raises(FileNotFoundError):
        fit(ex, digits.train, iters=2, progress=False, resume=str(tmp_path / "missing.npz"))
    with pytest.raises(ValueError, match="schedule"):
        fit(ex, digits.train, iters=2, schedule="linear", progress=False)


def test_fit_epochs_counts_steps(digits):
    ex = nn.Executor(small_cnn(), 256, optimizer=_sgd())
    r = fit(ex, digits.train, epochs=0.5, progress=False)
    # 1437 training samples // 256 = 5 steps per epoch; half an epoch rounds up to 3
    assert r["iterations"] == math.ceil(0.5 * (len(digits.train) // 256)) == 3


# ---------------------------------------------------------------- evaluation
def test_evaluate_pads_the_last_batch(digits):
    """Accuracy and mean loss over the whole test split do not depend on the batch size
    (360 samples: a partial last batch for 32 and for 7), and equal one whole-split batch."""
    g = small_cnn()
    trained = nn.Executor(g, 32, optimizer=_sgd(), dtype=np.float64, seed=0)
    fit(trained, digits.train, iters=5, progress=False)
    state = trained.state_dict()
    test = digits.test
    results = {}
    for b in (32, 7, len(test)):
        ex = nn.Executor(g, b, optimizer=_sgd(), dtype=np.float64)
        ex.load_state_dict(state)
        results[b] = evaluate(ex, test)
    ex = nn.Executor(g, len(test), optimizer=_sgd(), dtype=np.float64)
    ex.load_state_dict(state)
    loss, correct = ex.evaluate(test.x, test.y)
    for b, (l, acc) in results.items():
        assert acc == correct / len(test), b
        assert l == pytest.approx(loss, rel=1e-12), b
    # evaluation changes no state
    for key, v in state.items():
        assert np.array_equal(v, trained.state_dict()[key])


# ---------------------------------------------------------------- (c) lr schedules
def test_lr_constant():
    assert all(lr_at(s, 100, 0.1, "constant") == 0.1 for s in range(0, 120, 7))


def test_lr_cosine():
    base, total = 0.4, 100
    assert lr_at(0, total, base, "cosine") == base
    assert lr_at(total // 2, total, base, "cosine") == pytest.approx(base / 2)
    assert lr_at(total, total, base, "cosine") == pytest.approx(0.0, abs=1e-15)
    assert lr_at(total + 50, total, base, "cosine") == pytest.approx(0.0, abs=1e-15)
    assert lr_at(25, total, base, "cosine") == pytest.approx(base * (1 + math.sqrt(0.5)) / 2)
    vals = [lr_at(s, total, base, "cosine") for s in range(total + 1)]
    assert all(a >= b for a, b in zip(vals, vals[1:]))
    assert all(0 <= v <= base for v in vals)


def test_lr_warmup():
    base = 0.2
    w = [lr_at(s, 100, base, "cosine", warmup=4) for s in range(4)]
    assert w == pytest.approx([0.05, 0.1, 0.15, 0.2])
    assert lr_at(4, 100, base, "cosine", warmup=4) == pytest.approx(
        0.5 * base * (1 + math.cos(math.pi * 4 / 100)))
    assert lr_at(2, 100, base, "constant", warmup=4) == pytest.approx(0.15)
    assert lr_at(10, 100, base, "constant", warmup=4) == base


def test_lr_unknown_schedule():
    with pytest.raises(ValueError, match="step"):
        lr_at(0, 10, 0.1, "step")


# ---------------------------------------------------------------- nothing lost
@pytest.fixture(scope="module")
def tiny():
    return load_dataset("synthetic", sample_shape=(1, 8, 8), num_classes=10,
                        synthetic_size=64, seed=0).train      # 4 steps per epoch at batch 16


def _record_saves(monkeypatch, fail_at=None):
    import neuron.train as T
    saved, real = [], T.save_checkpoint

    def save(path, arrays, meta):
        if fail_at is not None and len(saved) + 1 == fail_at:
            raise OSError(28, "No space left on device", path)
        real(path, arrays, meta)
        saved.append(meta["iteration"])
    monkeypatch.setattr(T, "save_checkpoint", save)
    return saved


def test_checkpoints_every_n_iterations_and_at_the_end(tiny, tmp_path, monkeypatch):
    ckpt = str(tmp_path / "c.npz")
    saved = _record_saves(monkeypatch)
    ex = nn.Executor(small_cnn(), 16, optimizer=_sgd())
    fit(ex, tiny, iters=5, checkpoint=ckpt, checkpoint_every=2, progress=False)
    assert saved == [2, 4, 5]
    saved.clear()
    ex = nn.Executor(small_cnn(), 16, optimizer=_sgd())
    fit(ex, tiny, iters=9, checkpoint=ckpt, progress=False)       # default: once per epoch
    assert saved == [4, 8, 9]
    assert load_checkpoint(ckpt)[1]["iteration"] == 9


def test_a_full_disk_stops_the_run_and_says_what_is_intact(tiny, tmp_path, monkeypatch):
    from neuron.errors import TrainingStopped
    ckpt = str(tmp_path / "c.npz")
    _record_saves(monkeypatch, fail_at=2)
    ex = nn.Executor(small_cnn(), 16, optimizer=_sgd())
    with pytest.raises(TrainingStopped, match="No space left on device.*iteration 2 there is "
                       "intact"):
        fit(ex, tiny, iters=6, checkpoint=ckpt, checkpoint_every=2, progress=False)
    assert load_checkpoint(ckpt)[1]["iteration"] == 2


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_non_finite_step_stops_the_run_without_saving_the_state_it_started_from(tiny, tmp_path):
    from neuron.errors import TrainingStopped
    ckpt = str(tmp_path / "c.npz")
    ex = nn.Executor(small_cnn(), 16, optimizer=nn.SGD(lr=1e38, momentum=0.9))
    with pytest.raises(TrainingStopped, match="NaN or infinite|loss is") as e:
        fit(ex, tiny, iters=20, lr=1e38, schedule="constant", checkpoint=ckpt, progress=False)
    assert e.value.iteration == ex.iteration and e.value.signum is None
    assert f"state of iteration {ex.iteration} was not saved" in str(e.value)
    assert "no checkpoint was written before it" in str(e.value)
    import os
    assert not os.path.exists(ckpt)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_an_update_that_explodes_to_huge_finite_values_keeps_the_last_good_checkpoint(
        tiny, tmp_path):
    """The 4th update passes its own finiteness check (huge, finite); the 5th step overflows.
    The checkpoint of iteration 3, the last whose next step ran finite, is the one kept."""
    from neuron.errors import TrainingStopped
    ckpt = str(tmp_path / "c.npz")
    ex = nn.Executor(small_cnn(), 16, optimizer=_sgd())
    real, calls = ex.train_step, [0]

    def step(x, y):
        loss = real(x, y)
        calls[0] += 1
        if calls[0] == 4:
            ex.load_state_dict({k: v * np.float32(1e30) for k, v in ex.state_dict().items()})
        return loss
    ex.train_step = step
    with pytest.raises(TrainingStopped) as e:
        fit(ex, tiny, iters=20, lr=0.1, checkpoint=ckpt, checkpoint_every=1, progress=False)
    msg = str(e.value)
    assert ex.iteration == 4 and calls[0] == 4
    assert "state of iteration 4 was not saved" in msg
    assert f"{ckpt} keeps the last good checkpoint, iteration 3 (continue with --resume " \
        f"{ckpt}" in msg
    arrays, meta = load_checkpoint(ckpt)
    assert meta["iteration"] == 3
    assert max(float(np.abs(a).max()) for a in arrays.values()) < 1e6


def test_keyboard_interrupt_mid_step_undoes_it_and_saves_the_last_whole_step(tiny, tmp_path):
    import signal
    from neuron.errors import TrainingStopped
    ckpt = str(tmp_path / "c.npz")
    ex = nn.Executor(small_cnn(), 16, optimizer=_sgd())
    real, calls = ex._compute, [0]

    def compute(step, ctx, ws):
        calls[0] += 1
        if calls[0] == 2 * len(ex.steps) + 5:       # inside the third step
            raise KeyboardInterrupt
        return real(step, ctx, ws)
    ex._compute = compute
    with pytest.raises(TrainingStopped, match=rf"after iteration 2 of 8; state of iteration 2 "
                       rf"saved to {ckpt}") as e:
        fit(ex, tiny, iters=8, checkpoint=ckpt, progress=False)
    assert e.value.signum == signal.SIGINT and ex.iteration == 2
    arrays, meta = load_checkpoint(ckpt)
    assert meta["iteration"] == 2
    assert all(np.array_equal(arrays[k], v) for k, v in ex.state_dict().items())


def test_resume_refuses_bad_metadata_and_another_batch(tiny, tmp_path):
    from neuron.checkpoint import save_checkpoint
    ex = nn.Executor(small_cnn(), 16, optimizer=_sgd())
    state = ex.state_dict()
    for meta, fragment in [({}, "no 'iteration'"), ({"iteration": 2.5}, "non-negative integer"),
                           ({"iteration": "3"}, "non-negative integer"),
                           ({"iteration": -1}, "non-negative integer"),
                           ({"iteration": 1, "batch": 32}, "resume with --batch 32")]:
        path = str(tmp_path / "bad.npz")
        save_checkpoint(path, state, meta)
        with pytest.raises(ValueError, match=fragment):
            fit(ex, tiny, iters=4, resume=path, progress=False)
    assert ex.iteration == 0


@pytest.mark.parametrize("bad", [np.complex64, np.int32])
def test_resume_refuses_complex_or_integer_arrays(tiny, tmp_path, bad):
    from neuron.checkpoint import save_checkpoint
    ex = nn.Executor(small_cnn(), 16, optimizer=_sgd())
    state = ex.state_dict()
    state["fc.weight"] = state["fc.weight"].astype(bad)
    path = str(tmp_path / "bad.npz")
    save_checkpoint(path, state, {"iteration": 1, "batch": 16})
    with pytest.raises(ValueError, match="fc.weight: dtype"):
        fit(ex, tiny, iters=4, resume=path, progress=False)


@pytest.mark.parametrize("kw,fragment", [(dict(epochs=0), "epochs must be a positive"),
                                         (dict(epochs=float("nan")), "epochs must be"),
                                         (dict(iters=2.5), "iters must be an integer"),
                                         (dict(iters=2, warmup=-5), "warmup must be >= 0"),
                                         (dict(iters=2, checkpoint_every=0), "positive"),
                                         (dict(iters=2, lr=float("nan")), "fit: lr must be a "
                                          "finite number > 0"),
                                         (dict(iters=2, lr=-0.1), "fit: lr must be"),
                                         (dict(iters=2, schedule="step"), "fit: schedule"),
                                         (dict(iters=2, stop_at=-1), "stop_at must be >= 0")])
def test_fit_refuses_counts_that_would_silently_do_something_else(tiny, kw, fragment):
    ex = nn.Executor(small_cnn(), 16, optimizer=_sgd())
    with pytest.raises(ValueError, match=fragment):
        fit(ex, tiny, progress=False, **kw)
    assert ex.iteration == 0


def test_an_empty_checkpoint_path_is_an_error_not_no_checkpoint(tiny):
    ex = nn.Executor(small_cnn(), 16, optimizer=_sgd())
    with pytest.raises(ValueError, match="checkpoint path is empty"):
        fit(ex, tiny, iters=1, checkpoint="", progress=False)
    assert ex.iteration == 0
