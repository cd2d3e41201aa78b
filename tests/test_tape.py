"""The tape (neuron/tape.py): a recorded iteration replayed gives the same bits as running the
executor every iteration, for every policy, planner and option, and stays a transaction."""
import numpy as np
import pytest

import neuron as nn
from executor_graphs import (batch_for, concat_fan_lrn, dropout_mix, residual_bn, self_join,
                             small_resnet, states_equal)
from neuron.errors import NonFiniteLossError, NonFiniteUpdateError

STEPS = 6       # two recorded iterations, then replays


def _classes(graph):
    return graph.outputs[0].shape[0]


def _executor(graph, replay, batch=6, **kw):
    return nn.Executor(graph, batch, optimizer=nn.SGD(lr=0.05, momentum=0.9, weight_decay=5e-4),
                       replay=replay, seed=3, **kw)


def _train(graph, replay, steps=STEPS, batch=6, schedule=True, **kw):
    ex = _executor(graph, replay, batch, **kw)
    losses = []
    for i in range(steps):
        x, y = batch_for(graph, batch, _classes(graph), seed=i)
        if schedule:                # a learning rate that changes every iteration
            ex.optimizer.lr = 0.05 * (1 - i / (2 * steps))
        losses.append(ex.train_step(x.astype(np.float32), y))
    return ex, losses


def _same_as_eager(graph, steps=STEPS, **kw):
    off, l_off = _train(graph, "off", steps, **kw)
    tape, l_tape = _train(graph, "tape", steps, **kw)
    assert l_tape == l_off
    assert states_equal(tape.state_dict(), off.state_dict())
    r = tape.replay
    assert r["eager_because"] is None, r
    assert r["replayed_iterations"] == steps - r["recorded_iterations"] >= steps - 3, r
    assert r["ran"] == "tape"
    return tape, off


@pytest.mark.parametrize("policy", ["baseline", "liveness", "offload", "recompute",
                                    "superneurons"])
def test_replay_is_bit_identical_for_every_policy(policy):
    _same_as_eager(small_resnet(), policy=policy)


@pytest.mark.parametrize("planner", ["superneurons", "capuchin", "vdnn", "sublinear",
                                     "superneurons:compress=2"])
def test_replay_is_bit_identical_for_planners_under_a_budget(planner):
    g = small_resnet()
    from neuron.plan import plan
    need = plan(g, 6, policy="liveness", trace=False)["peak_bytes"]
    tape, off = _same_as_eager(g, planner=planner, budget=int(need * 0.7))
    # the budget makes the pool move bytes, and a replay repeats its traffic
    assert tape.pool.counters() == off.pool.counters()


@pytest.mark.parametrize("option", [{"offload_params": True}, {"chunks": 2},
                                    {"offload_params": True, "chunks": 3}],
                         ids=["offload_params", "chunks", "both"])
def test_replay_is_bit_identical_with_offloaded_parameters_and_chunks(option):
    _same_as_eager(residual_bn(), **option)


@pytest.mark.parametrize("graph", [concat_fan_lrn, self_join])
def test_replay_engages_where_gradients_accumulate_into_a_concat(graph):
    """A concat's backward names the inputs it accumulates into (a set): equal sets are the
    same argument, or no DenseNet-like graph would ever be replayed."""
    _same_as_eager(graph())


def test_dropout_masks_follow_the_iteration_on_replay():
    """The seed is a Varying argument: a replay that reused the recorded seed would repeat
    the recorded iteration's masks and differ from eager execution."""
    g = dropout_mix()
    tape, off = _same_as_eager(g, steps=5)
    assert tape.replay["replayed_iterations"] >= 2


def test_the_replayed_loss_is_the_eager_loss_to_the_bit():
    _, l_off = _train(residual_bn(), "off", 5, schedule=False)
    _, l_tape = _train(residual_bn(), "tape", 5, schedule=False)
    assert [float(v).hex() for v in l_tape] == [float(v).hex() for v in l_off]


# ---------------------------------------------------------------- transactions
def _replaying(graph=None, **kw):
    graph = graph or residual_bn()
    ex, _ = _train(graph, "tape", 4, schedule=False, **kw)
    assert ex.replay["ran"] == "tape"
    return ex, graph


def test_a_nonfinite_update_in_a_replay_is_undone_exactly():
    ex, g = _replaying()
    before = ex.state_dict()
    ex.optimizer.lr = float("inf")  # finite loss, an infinite update
    x, y = batch_for(g, 6, _classes(g), seed=9)
    with pytest.raises(NonFiniteUpdateError, match="iteration 4"):
        ex.train_step(x.astype(np.float32), y)
    assert states_equal(ex.state_dict(), before)
    assert ex.iteration == 4
    ex.optimizer.lr = 0.05          # and training goes on, still replaying
    ex.train_step(x.astype(np.float32), y)
    assert ex.replay["ran"] == "tape" and ex.iteration == 5


def test_a_nonfinite_loss_in_a_replay_is_undone_with_the_eager_error():
    ex, g = _replaying()
    off, _ = _train(g, "off", 4, schedule=False)
    before = ex.state_dict()
    x, y = batch_for(g, 6, _classes(g), seed=9)
    x = x.astype(np.float32) * np.float32(1e30)     # finite input, a non-finite loss
    with pytest.raises(NonFiniteLossError) as e_tape:
        ex.train_step(x, y)
    with pytest.raises(NonFiniteLossError) as e_off:
        off.train_step(x, y)
    assert type(e_tape.value) is type(e_off.value) and str(e_tape.value) == str(e_off.value)
    assert states_equal(ex.state_dict(), before)


@pytest.mark.parametrize("bad", [np.nan, -np.inf])
def test_a_nonfinite_image_in_a_replay_is_named_and_undone(bad):
    """The images are checked on the device, into the step guard's flag (the tape holds that
    check on the input's view), not by a pass on the host before every step; the batch is
    named on the host only when the step failed."""
    from neuron.errors import DataError
    ex, g = _replaying()
    checks = [args for fn, args, _, _ in ex._replay.tape.ops
              if getattr(fn, "__name__", "") == "nonfinite_flag_update"]
    x, y = batch_for(g, 6, _classes(g), seed=9)
    assert any(a[1].shape == x.shape for a in checks)      # the batch's view in the arena
    before = ex.state_dict()
    x = x.astype(np.float32)
    x[2, 0, 1, 1] = bad
    with pytest.raises(DataError, match="input data: batch contains NaN or infinity"):
        ex.train_step(x, y)
    assert states_equal(ex.state_dict(), before) and ex.iteration == 4
    x[2, 0, 1, 1] = 0.0
    ex.train_step(x, y)
    assert ex.replay["ran"] == "tape" and ex.iteration == 5


@pytest.mark.parametrize("where", [0.3, 0.6, 0.95])
def test_an_interrupted_replay_leaves_the_state_of_the_iteration_before(where):
    """KeyboardInterrupt at an operation of the tape: every block the replay had started to
    update is written back, and nothing the replay had not snapshotted is touched."""
    ex, g = _replaying()
    before = ex.state_dict()
    tape = ex._replay.tape
    at = int(where * len(tape.ops))
    fn, args, kw, flags = tape.ops[at]

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    tape.ops[at] = (interrupted, args, kw, flags)
    x, y = batch_for(g, 6, _classes(g), seed=9)
    with pytest.raises(KeyboardInterrupt):
        ex.train_step(x.astype(np.float32), y)
    assert states_equal(ex.state_dict(), before)
    tape.ops[at] = (fn, args, kw, flags)
    # the run goes on from there exactly as an eager one does
    off, _ = _train(g, "off", 4, schedule=False)
    for ex_ in (ex, off):
        ex_.train_step(x.astype(np.float32), y)
    assert states_equal(ex.state_dict(), off.state_dict())


def test_evaluate_between_steps_does_not_break_the_replay():
    g = residual_bn()
    runs = {}
    for mode in ("off", "tape"):
        ex = _executor(g, mode, offload_params=True)
        for i in range(9):
            x, y = batch_for(g, 6, _classes(g), seed=i)
            ex.train_step(x.astype(np.float32), y)
            if i in (1, 5):
                ex.evaluate(x.astype(np.float32), y)
        runs[mode] = ex
    assert states_equal(runs["tape"].state_dict(), runs["off"].state_dict())
    assert runs["tape"].replay["replayed_iterations"] >= 1


def test_a_loaded_state_is_what_the_replay_trains():
    g = residual_bn()
    a, _ = _train(g, "tape", 4)
    b, _ = _train(g, "off", 2)
    a.load_state_dict(b.state_dict())
    x, y = batch_for(g, 6, _classes(g), seed=7)
    la = a.train_step(x.astype(np.float32), y)
    lb = b.train_step(x.astype(np.float32), y)
    assert la == lb and a.replay["ran"] == "tape"


# ---------------------------------------------------------------- modes and fallbacks
def test_replay_modes_and_bad_values():
    g = residual_bn()
    assert _executor(g, None).replay["mode"] == "tape"        # the CPU's fastest
    assert _executor(g, "off").replay["mode"] == "off"
    with pytest.raises(ValueError, match="replay must be one of off, tape, graph"):
        _executor(g, "fast")
    with pytest.raises(ValueError, match="needs a device that captures graphs; cpu does not"):
        _executor(g, "graph")


def test_a_record_that_cannot_be_followed_falls_back_to_eager_and_says_why():
    """Host work on the iteration's data outside the device's operations (here: a compressed
    tensor decoded on the host) makes the record unusable: the executor trains eagerly, warns
    once, and reports the reason; the bits are eager's."""
    from neuron.recording import unrecordable
    g = residual_bn()
    ex = _executor(g, "tape")
    real = ex._run

    def run(*a, **k):
        unrecordable(ex.device, "host work the tape cannot see")
        return real(*a, **k)
    ex._run = run
    off, _ = _train(g, "off", 4, schedule=False)
    with pytest.warns(RuntimeWarning, match="running every iteration eagerly: host work"):
        for i in range(4):
            x, y = batch_for(g, 6, _classes(g), seed=i)
            ex.train_step(x.astype(np.float32), y)
    assert ex.replay["ran"] == "off" and "host work" in ex.replay["eager_because"]
    assert states_equal(ex.state_dict(), off.state_dict())


def test_a_replay_that_meets_what_its_record_did_not_have_is_undone_and_run_eagerly():
    """A TapeDiverged in the middle of a replay (a device temporary of another size): the
    replay is undone, the step runs eagerly, and the run goes on eagerly, bit for bit."""
    from neuron.recording import TapeDiverged
    ex, g = _replaying()
    off, _ = _train(g, "off", 4, schedule=False)
    tape = ex._replay.tape
    at = len(tape.ops) // 2
    fn, args, kw, flags = tape.ops[at]

    def diverged(*a, **k):
        raise TapeDiverged("a kernel asked for what the record did not have")
    tape.ops[at] = (diverged, args, kw, flags)
    with pytest.warns(RuntimeWarning, match="did not have"):
        for i in range(4, 6):
            x, y = batch_for(g, 6, _classes(g), seed=i)
            assert ex.train_step(x.astype(np.float32), y) == off.train_step(
                x.astype(np.float32), y)
    assert ex.replay["ran"] == "off" and ex.iteration == 6
    assert states_equal(ex.state_dict(), off.state_dict())


def test_consecutive_records_must_match_before_one_is_trusted():
    from neuron.tape import Tape, difference
    a, b = Tape(0), Tape(1)
    x = np.zeros(4, np.float32)
    for t in (a, b):
        t.start_state = ((), ())
    a.call(np.copyto, (x, np.ones(4, np.float32)), {})
    b.call(np.copyto, (x[:2], np.ones(2, np.float32)), {})
    assert "differ at operation 0" in difference(a, b)
    assert difference(a, a) is None


def test_train_json_reports_the_replay(capsys):
    from neuron.cli.main import main
    rc = main(["train", "resnet_cifar", "--depth", "8", "--batch", "4", "--iters", "4",
               "--no-progress", "--json", "--dataset", "synthetic"])
    assert rc == 0
    out = capsys.readouterr().out.strip().splitlines()
    import json
    res = json.loads(out[-1])
    assert res["replay"] == "tape" and res["replay_detail"]["replayed_iterations"] == 2
    assert "final_loss" in res and "images_per_sec" in res
    assert "replayed 2 of 4 iterations from a tape" in out[-2]


def test_a_signature_keys_arrays_by_address_and_the_rest_by_value_or_identity():
    """arg_key (what two records must agree on): arrays, NumPy subclasses included, by address,
    shape, strides and type; a device array (``.data.ptr``) likewise; scalars by value and
    type; sequences element by element; sets in any order; other objects by identity."""
    from neuron.recording import Varying
    from neuron.tape import _Ref, arg_key

    class DeviceArray:                          # the shape of a CuPy array's attributes
        def __init__(self, ptr):
            self.data = type("Memory", (), {"ptr": ptr})()
            self.shape, self.strides, self.dtype = (4,), (4,), np.dtype(np.float32)

    class Sub(np.ndarray):
        pass

    buf = np.zeros(8, np.float32)
    assert arg_key(buf[:4]) == arg_key(buf[:4]) != arg_key(buf[4:])
    assert arg_key(buf[:4]) != arg_key(buf[:4].reshape(2, 2))
    assert arg_key(buf.view(Sub)) == arg_key(buf)
    assert arg_key(DeviceArray(64)) == arg_key(DeviceArray(64)) != arg_key(DeviceArray(128))
    assert arg_key(1) != arg_key(1.0) and arg_key(True) != arg_key(1)
    assert arg_key(np.float32(2)) == arg_key(np.float32(2)) != arg_key(np.float32(3))
    assert arg_key((1, [buf], {"k": None})) == arg_key((1, [buf], {"k": None}))
    assert arg_key((1, 2)) != arg_key([1, 2])
    assert arg_key({3, 1, 2}) == arg_key({2, 3, 1})
    assert arg_key(_Ref(3)) == arg_key(_Ref(3)) != arg_key(_Ref(4))
    f = lambda i: i                             # noqa: E731
    assert arg_key(Varying(f)) == arg_key(Varying(f))
    o = object()
    assert arg_key(o) == arg_key(o) != arg_key(object())
