"""neuron/precision: which tensor is stored in which type, as planned (VirtualDevice) and reported."""
import numpy as np
import pytest

from neuron.devices import CpuDevice, Device, VirtualDevice
from neuron.executor import Executor
from neuron.memory.tensors import Kind
from neuron.models import build_model
from neuron.plan import make_plan, widest
from neuron.precision import PRECISIONS, bfloat16, get_precision

BF16 = bfloat16()


@pytest.fixture(scope="module")
def net():
    return build_model("resnet_cifar", depth=8)


def _virtual(net, precision, **kw):
    return Executor(net, 4, device="virtual", precision=precision, **kw)


def test_unknown_precision_is_an_error_naming_the_argument():
    with pytest.raises(ValueError, match=r"Executor: precision must be one of fp32, tf32, "
                                         r"bf16, fp16, got 'bf8'"):
        get_precision("bf8")
    assert [get_precision(p).name for p in PRECISIONS] == list(PRECISIONS)
    assert get_precision(None).name == "fp32"


def test_bf16_stores_feature_maps_and_weight_copies_in_two_bytes(net):
    s = _virtual(net, "bf16").schedule
    by_kind = {}
    for t in s.registry.tensors:
        if not t.members:
            by_kind.setdefault(t.kind, set()).add(t.dtype)
    assert by_kind[Kind.GRADIENT] == {BF16}
    assert by_kind[Kind.PARAM_GRAD] == {np.dtype(np.float32)}      # what the optimizer sees
    assert by_kind[Kind.OPT_STATE] == {np.dtype(np.float32)}
    assert by_kind[Kind.AUX] == {np.dtype(np.float32)}             # BN statistics, softmax
    assert by_kind[Kind.PARAM] == {np.dtype(np.float32)}            # the master weights
    assert by_kind[Kind.PARAM_COPY] == {BF16}
    for layer in net.route:
        for t in layer.outputs:
            want = BF16 if layer.kind != "loss" else np.dtype(np.float32)
            assert s.act[id(t)].dtype == want, layer.name
    # every step of a conv/linear layer casts a fresh bf16 copy of each of its parameters
    # (one of its writes, so freed after it) from the float32 master (one of its reads);
    # BatchNorm reads its float32 parameters; the copies are never state
    for st in s.steps:
        casts = st.layer.kind in ("conv", "fc")
        assert sorted(m.name for m, _ in st.casts) == (sorted(
            f"{st.layer.name}.{p}" for p in st.layer.param_specs) if casts else [])
        for n, t in st.params.items():
            assert t.dtype == (BF16 if casts else np.dtype(np.float32)), st.name
        for m, c in st.casts:
            assert c in st.writes and m.storage in st.reads and st.params[m.name.rsplit(".")[-1]] is c
    copies = [c for st in s.steps for _, c in st.casts]
    assert len({c.id for c in copies}) == len(copies)
    assert not any(t.kind is Kind.PARAM_COPY for t in s.state_tensors())


def test_a_recomputed_conv_casts_its_own_copy(net):
    from neuron.memory.recompute import rerun_step
    s = _virtual(net, "bf16").schedule
    fwd = next(st for st in s.steps if st.layer.kind == "conv")
    again = rerun_step(fwd, fwd.ins, fwd.outs[0])
    assert [m for m, _ in again.casts] == [m for m, _ in fwd.casts]
    assert not {c.id for _, c in again.casts} & {c.id for _, c in fwd.casts}


def test_fp32_and_tf32_plan_the_same_bytes(net):
    a, b = (make_plan(net, 16, precision=p, trace=False).report for p in ("fp32", "tf32"))
    for k in ("unbounded_peak_bytes", "min_budget_bytes", "lower_bound_bytes"):
        assert a[k] == b[k], k
    assert b["precision"] == "tf32" and set(b["bytes_by_dtype"]) == {"float32"}


def test_bf16_halves_feature_map_bytes_and_reports_bytes_by_type(net):
    f32, b16 = (make_plan(net, 32, precision=p, trace=False, policy="liveness").report
                for p in ("fp32", "bf16"))
    t32, t16 = f32["tensor_bytes_by_dtype"], b16["tensor_bytes_by_dtype"]
    loss_rows = t16["float32"]["activation"]          # the loss's per-sample values stay fp32
    assert t16["bfloat16"]["activation"] * 2 == t32["float32"]["activation"] - loss_rows
    assert t16["bfloat16"]["gradient"] * 2 == t32["float32"]["gradient"]
    assert t16["bfloat16"]["data"] * 2 == t32["float32"]["data"]      # labels: int64 in both
    for kind in ("param_grad", "opt_state"):
        assert t16["float32"][kind] == t32["float32"][kind]
    # the peak's bytes by type add up to its tensor bytes, both types present
    assert set(b16["bytes_by_dtype"]) == {"bfloat16", "float32"}
    assert sum(b16["bytes_by_dtype"].values()) + b16["bytes_by_kind"]["workspace"] == \
        b16["unbounded_peak_bytes"]
    assert sum(f32["bytes_by_dtype"].values()) + f32["bytes_by_kind"]["workspace"] == \
        f32["unbounded_peak_bytes"]
    assert b16["unbounded_peak_bytes"] < 0.6 * f32["unbounded_peak_bytes"]


def test_widest_batch_at_bf16_nearly_doubles(net):
    kw = dict(policy="superneurons")
    a = widest("resnet_cifar", 64 << 20, depth=8, precision="fp32", **kw)["widest"]
    b = widest("resnet_cifar", 64 << 20, depth=8, precision="bf16", **kw)["widest"]
    assert b >= 1.9 * a, (a, b)


def test_a_device_names_the_precision_it_cannot_run(net):
    class Float32Only(Device):
        name = "f32only"
    assert Float32Only(1024).precision_missing("bf16").startswith(
        "Float32Only's kernels compute in float32 only (no bf16 path")
    assert CpuDevice(1024).precision_missing("bf16") is None
    assert "TF32 is a GPU tensor-core math mode" in CpuDevice(1024).precision_missing("tf32")
    assert all(VirtualDevice(1024).precision_missing(p) is None for p in PRECISIONS)
    with pytest.raises(ValueError, match=r"precision tf32 on device cpu: TF32 is a GPU"):
        Executor(net, 2, device="cpu", precision="tf32")
