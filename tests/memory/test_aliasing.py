"""Gradient aliasing (memory/aliasing.py): an Add input's gradient is its output gradient's
tensor where the rule allows it. Every run must train bit-identically to the unaliased
schedule (each Add input a copy), never hold more bytes at any step, and issue fewer copies."""
import numpy as np
import pytest

import neuron as nn
from neuron.executor import Executor
from neuron.memory.aliasing import has_gradient, shared_gradients
from neuron.memory.chunking import build_chunked_schedule
from neuron.optim import SGD
from neuron.models import build_model, densenet_cifar, resnet_bottleneck

from executor_graphs import batch_for, data_joins, self_join, small_resnet, states_equal


# ---------------------------------------------------------------- graphs
def clash():
    """Add(a, b) then Add(z, q) with q = conv_q(a): conv_q's backward reads the shared output
    gradient (as q's) and adds into a's, so a's gradient must stay a tensor of its own."""
    x = nn.Input((2, 4, 4), name="data")
    h = nn.Conv2d(2, 3, padding=1, name="c0")(x)
    a = nn.Tanh(name="ta")(h)
    q = nn.Conv2d(2, 3, padding=1, name="cq")(a)
    b = nn.Tanh(name="tb")(h)
    z = nn.Add(name="add")(a, b)
    w = nn.Add(name="add2")(z, q)
    y = nn.Linear(3, name="fc")(nn.GlobalAvgPool(name="gap")(w))
    return nn.Graph(x, y, name="clash")


def random_dag(seed: int, n: int = 9, relu_after_add: bool = False):
    """Tanh, 1x1/3x3 convs and Adds of 2-3 earlier tensors (repeats allowed) in random order:
    fan-outs, chains of Adds and Adds whose inputs other layers read too. ``relu_after_add``:
    about half the Adds read by a ReLU alone (AddReLU layers when fused)."""
    rng = np.random.default_rng(seed)
    x = nn.Input((2, 3, 3), name="data")
    ts = [nn.Conv2d(2, 1, name="stem")(x)]
    for i in range(n):
        r = rng.random()
        if r < 0.45 and len(ts) >= 2:
            picks = rng.choice(len(ts), size=int(rng.integers(2, 4)), replace=True)
            ts.append(nn.Add(name=f"add{i}")(*[ts[j] for j in picks]))
            if relu_after_add and rng.random() < 0.5:
                ts[-1] = nn.ReLU(name=f"relu{i}")(ts[-1])
        elif r < 0.7:
            ts.append(nn.Tanh(name=f"t{i}")(ts[int(rng.integers(len(ts)))]))
        else:
            k = int(rng.choice([1, 3]))
            ts.append(nn.Conv2d(2, k, padding=k // 2, name=f"c{i}")(ts[int(rng.integers(len(ts)))]))
    loose = [t for t in ts if not t.consumers]
    h = loose[0] if len(loose) == 1 else nn.Add(name="join_loose")(*loose)
    y = nn.Linear(3, name="fc")(nn.GlobalAvgPool(name="gap")(h))
    return nn.Graph(x, y, name=f"dag{seed}")


def resnet50_like():
    """Bottleneck blocks as ResNet-50's (projection shortcut at each stage's start, identity
    after it), two blocks in the first stage, at 16x16."""
    return resnet_bottleneck([2, 1, 1, 1], num_classes=5, in_shape=(3, 16, 16), name="r50like")


def bottleneck_net():
    """ResNet-50's bottleneck blocks (1x1-3x3-1x1 with BN and ReLU, a projection shortcut
    where the shape changes, strided, and identity ones after it) at widths the CPU trains
    under a budget (the real one's parameter gradients dwarf its activations at 16x16)."""
    x = nn.Input((3, 8, 8), name="data")
    h = nn.ReLU(name="stem.relu")(nn.BatchNorm(name="stem.bn")(
        nn.Conv2d(4, 3, padding=1, bias=False, name="stem.conv")(x)))
    for i, (mid, out, stride) in enumerate([(2, 8, 1), (2, 8, 1), (4, 16, 2), (4, 16, 1)]):
        p = f"b{i}"
        r = h
        for j, (c, k, st) in enumerate([(mid, 1, 1), (mid, 3, stride), (out, 1, 1)]):
            r = nn.BatchNorm(name=f"{p}.bn{j}")(nn.Conv2d(c, k, stride=st, padding=k // 2,
                                                        bias=False, name=f"{p}.conv{j}")(r))
            if j < 2:
                r = nn.ReLU(name=f"{p}.relu{j}")(r)
        sc = h if h.shape[0] == out and stride == 1 else nn.BatchNorm(name=f"{p}.down.bn")(
            nn.Conv2d(out, 1, stride=stride, bias=False, name=f"{p}.down.conv")(h))
        h = nn.ReLU(name=f"{p}.relu")(nn.Add(name=f"{p}.add")(r, sc))
    y = nn.Linear(5, name="fc")(nn.GlobalAvgPool(name="gap")(h))
    return nn.Graph(x, y, name="bottleneck_net")


def resnet8():
    return build_model("resnet_cifar", depth=8, in_shape=(3, 8, 8), num_classes=5)


def densenet():
    return densenet_cifar(depth=10, num_classes=5, in_shape=(3, 8, 8), growth_rate=4)


GRAPHS = {"small_resnet": small_resnet, "resnet8": resnet8, "bottleneck": bottleneck_net,
          "densenet": densenet}


# ---------------------------------------------------------------- helpers
def _train(make, alias, batch=4, steps=3, **kw):
    graph = make()
    ex = Executor(graph, batch, optimizer=SGD(lr=0.05, momentum=0.9, weight_decay=1e-4),
                  seed=1, _alias_gradients=alias, **kw)
    for s in range(steps):
        ex.train_step(*batch_for(graph, batch, graph.outputs[0].shape[0], seed=s))
    return ex


def _aliased(ex):
    return {s.layer.name: s.aliased for s in ex.steps if s.aliased}


def _live_bytes(steps):
    """Bytes of the non-persistent tensors live at each step (first to last use)."""
    first, last, size = {}, {}, {}
    for i, s in enumerate(steps):
        for t in s.reads + s.writes:
            if not t.persistent:
                first.setdefault(t.id, i)
                last[t.id], size[t.id] = i, t.nbytes
    delta = np.zeros(len(steps) + 1, np.int64)
    for tid, a in first.items():
        delta[a] += size[tid]
        delta[last[tid] + 1] -= size[tid]
    return np.cumsum(delta[:-1])


def _moved_aliased(ex, budget):
    """Offloads and fetches of aliased gradient tensors in the plan of this budget."""
    sched = ex.schedule
    keys = [(k, c) for k in sched.aliases for c in range(sched.chunks)] \
        if sched.chunks > 1 else list(sched.aliases)
    shared = {sched.grad[k].id for k in keys}
    events = ex.simulate(budget, trace=False, events=True)["events"]
    return sum(e[0] in ("offload", "offload_async", "fetch", "prefetch") and e[1] in shared
               for e in events)


def _copies(ex):
    """The kernel copies of one recorded iteration (the tape's operations named copy)."""
    return sum(getattr(fn, "__name__", "") == "copy" for fn, *_ in ex._replay.tape.ops)


# ---------------------------------------------------------------- the rule
def test_residual_block_aliases_both_inputs_and_a_clash_keeps_its_copy():
    ex = _train(small_resnet, True, steps=1)
    assert _aliased(ex) == {"b0.add": (0, 1), "b1.add": (0, 1)}
    # one tensor: the Add's input gradients are its output gradient
    g = ex.schedule.grad
    add = ex.train_graph.layers["b1.add"]
    assert all(g[id(t)] is g[id(add.outputs[0])] for t in add.inputs)
    # add2 aliases z and q; a would be added into by cq while q (the same tensor) is read
    ex = _train(clash, True, steps=1)
    assert _aliased(ex) == {"add2": (0, 1), "add": (1,)}
    off = _train(clash, False)
    assert not _aliased(off)
    assert states_equal(_train(clash, True).state_dict(), off.state_dict())


def test_an_add_of_one_tensor_twice_or_of_the_data_aliases_nothing_of_it():
    assert not _aliased(_train(self_join, True, steps=1))          # Add(h, h)
    assert _aliased(_train(data_joins, True, steps=1)) == {"add_x": (0,)}    # not the data


def test_random_graphs_train_bit_identically_and_never_hold_more():
    """The rule against graphs no one wrote by hand; some candidates must be turned down by
    its second condition, or this test would not exercise it."""
    rejected = aliased = 0
    for seed in range(24):
        make = lambda: random_dag(seed)                     # noqa: E731
        on, off = _train(make, True, batch=3, steps=2), _train(make, False, batch=3, steps=2)
        assert states_equal(on.state_dict(), off.state_dict()), seed
        assert (_live_bytes(on.steps) <= _live_bytes(off.steps)).all(), seed
        g = on.train_graph
        alias = shared_gradients(g)
        aliased += len(alias)
        order = [l for l in reversed(g.route) if l.inputs]
        for p, layer in enumerate(order):
            if not layer.passes_gradient:
                continue
            for x in layer.inputs:      # passes the first condition: A begins x's gradient
                if has_gradient(x) and layer.inputs.count(x) == 1 and next(
                        l for l in order if x in l.inputs) is layer and id(x) not in alias:
                    rejected += 1
    assert aliased > 20 and rejected > 0, (aliased, rejected)


def test_random_graphs_with_add_relu_train_bit_identically(monkeypatch):
    """Fused AddReLU layers mask their output gradient in place: aliased where the rule lets
    them (counting that write), they give the bits of the unfused, unaliased network; some
    aliases must be turned down for the write alone (Add would have taken them)."""
    from neuron.fuse import fuse_graph
    from neuron.layers import AddReLU
    fused_layers = refused = 0
    for seed in range(16):
        make = lambda: random_dag(seed, relu_after_add=True)     # noqa: E731
        fused = _train(make, True, batch=3, steps=2, fuse=True)
        plain = _train(make, False, batch=3, steps=2)
        assert states_equal(fused.state_dict(), plain.state_dict()), seed
        g = fuse_graph(make())
        fused_layers += sum(type(l) is AddReLU for l in g.route)
        with_write = shared_gradients(g)
        with monkeypatch.context() as m:    # the same graph as if the write were not there
            m.setattr(AddReLU, "rewrites_gradient", False)
            without = shared_gradients(g)
        refused += len(set(without) - set(with_write))     # (greedy: not always a subset)
    assert fused_layers > 10 and refused > 0, (fused_layers, refused)


def test_the_baseline_policy_never_aliases():
    ex = Executor(small_resnet(), 4, device="virtual", policy="baseline")
    assert not _aliased(ex) and not ex.schedule.aliases


def test_chunks_alias_chunk_by_chunk():
    sched = build_chunked_schedule(small_resnet(), 4, 2)
    adds = [s for s in sched.steps if s.phase == "B" and s.layer.name == "b1.add"]
    assert [s.aliased for s in adds] == [(0, 1), (0, 1)]
    assert all(not s.grad_targets and not s.writes for s in adds)
    assert adds[0].douts[0] is not adds[1].douts[0]


# ---------------------------------------------------------------- same bits, fewer bytes
def _tight_budget(make, batch, policy, chunks):
    """The smallest of a few budgets (the resident state plus a fraction of the rest of the
    liveness peak) that the policy's plan fits in."""
    ex = Executor(make(), batch, device="virtual", policy="liveness", chunks=chunks)
    live = ex.simulate(None, trace=False)["peak_bytes"]
    resident = sum(t.nbytes for t in ex.persistent)
    plan = Executor(make(), batch, device="virtual", policy=policy, chunks=chunks)
    for fraction in (0.2, 0.3, 0.4, 0.5, 0.6):
        budget = int(resident + fraction * (live - resident))
        if plan.simulate(budget, trace=False)["fits"]:
            return budget
    raise AssertionError(f"{make.__name__}: no budget below 0.6 of the liveness peak fits")


SETTINGS = {
    "liveness": dict(policy="liveness", replay="off"),
    "tape": dict(policy="liveness", replay="tape"),
    "chunks2": dict(policy="liveness", chunks=2, replay="off"),
    "superneurons_budget": dict(policy="superneurons", replay="off", tight=True),
    "chunks2_budget": dict(policy="superneurons", chunks=2, replay="tape", tight=True),
    "offload_params": dict(policy="superneurons", offload_params=True, replay="off"),
    "bf16": dict(policy="liveness", precision="bf16", replay="off"),
}


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("name", GRAPHS)
def test_same_bits_with_and_without_aliasing(name, setting):
    kw = dict(SETTINGS[setting])
    make, batch = GRAPHS[name], 4
    tight = kw.pop("tight", False)
    if tight:
        kw["budget"] = _tight_budget(make, batch, kw["policy"], kw.get("chunks", 1))
    steps = 4 if kw.get("replay") == "tape" else 3     # a budget's tape is trusted at 3
    on, off = _train(make, True, batch, steps, **kw), _train(make, False, batch, steps, **kw)
    assert states_equal(on.state_dict(), off.state_dict())
    if name == "densenet":          # no Add: the very same schedule
        assert not _aliased(on) and len(on.schedule.registry) == len(off.schedule.registry)
    else:
        assert _aliased(on) and not _aliased(off)
        assert len(on.schedule.registry) < len(off.schedule.registry)
    if tight:                       # the budget really moved memory, in both runs
        for ex in (on, off):
            assert ex.planned["fits"] and ex.planned["offload_bytes"] > 0 and \
                (ex.recompute_report is not None or ex.chunks > 1)
            assert ex.planned["peak_bytes"] <= kw["budget"]
        if name in ("small_resnet", "bottleneck"):  # an aliased gradient went to the host
            assert _moved_aliased(on, kw["budget"]) > 0
    if kw.get("replay") == "tape":
        assert on.replay["replayed_iterations"] >= 1 and off.replay["replayed_iterations"] >= 1


def test_data_parallel_overlap_same_bits():
    from neuron.distributed import DataParallel, LocalComm
    runs = []
    for alias in (True, False):
        g = small_resnet()
        ex = Executor(g, 4, seed=1, optimizer=SGD(lr=0.05, momentum=0.9), grad_buckets=600,
                      _alias_gradients=alias)
        dp = DataParallel(ex, LocalComm(), check_every=0)
        assert dp.overlap
        for s in range(3):
            dp.train_step(*batch_for(g, 4, 10, seed=s))
        runs.append(ex.state_dict())
    assert states_equal(*runs)


@pytest.mark.parametrize("make", [resnet8, resnet50_like])     # ResNet-50's blocks, 16x16
def test_planned_peak_never_higher_and_copies_fewer(make):
    batch = 4
    res = {}
    for alias in (True, False):
        ex = Executor(make(), batch, device="virtual", _alias_gradients=alias)
        res[alias] = ex.simulate(None, trace=False), _live_bytes(ex.steps)
    assert res[True][0]["peak_bytes"] <= res[False][0]["peak_bytes"]
    assert res[True][0]["tensor_peak_bytes"] <= res[False][0]["tensor_peak_bytes"]
    assert (res[True][1] <= res[False][1]).all()
    # a recorded iteration on the CPU: one copy fewer per aliased input, the same bits
    on, off = _train(make, True, batch, replay="tape"), _train(make, False, batch, replay="tape")
    assert states_equal(on.state_dict(), off.state_dict())
    n = sum(len(v) for v in _aliased(on).values())
    assert n > 0 and _copies(on) == _copies(off) - n
    assert len(on._replay.tape.ops) == len(off._replay.tape.ops) - n


def test_a_wholly_aliased_add_backward_costs_no_kernel_time():
    from neuron.memory.costmodel import CostModel
    cost = CostModel.analytic("h100")
    times = {}
    for alias in (True, False):
        ex = Executor(small_resnet(), 4, device="virtual", _alias_gradients=alias)
        step = next(s for s in ex.steps if s.phase == "B" and s.layer.name == "b1.add")
        times[alias] = cost.step_time(step, 4)
    assert times[True] == 0.0 < times[False]
