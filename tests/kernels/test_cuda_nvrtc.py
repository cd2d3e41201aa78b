"""Every CUDA kernel of the GPU path compiled by NVRTC, as CuPy compiles it on the GPU machine,
without a GPU: the ElementwiseKernels of kernels/cuda_raw.py and kernels/cuda.py and the
codecs' (kernels/cuda_codecs.py), in the source CuPy generates around them, and the codecs'
and the per-layer SGD step's RawModules as they are. The stand-ins (test_cuda_raw_source.py, test_cuda_codecs_source.py) check
what the kernels compute, through g++; this checks that CUDA's own compiler takes them (CUDA
built-ins, CuPy's types, const inputs): a GPU run once lost its whole time to a kernel that
did not compile there. Skipped where NVRTC or CuPy's headers are missing (the skip names how
to get them); nothing here needs a GPU or a driver."""
from __future__ import annotations

import pytest

from neuron.kernels import cuda, cuda_codecs, cuda_low, cuda_raw

import nvrtc_compiler as nv
from cuda_standins import KERNEL_CACHES

pytestmark = pytest.mark.skipif(nv.unavailable() is not None,
                                reason=str(nv.unavailable()))

FACTORIES = [f for f in KERNEL_CACHES if f not in cuda_low.KERNEL_CACHES] + \
    [cuda_codecs._bf16, cuda_codecs._bfp8]

#: the type bindings compiled: float32 everywhere (the GPU path's dtype), float32 with a
#: float64 loss (U), float64 everywhere
BINDINGS = ({"T": "float32", "U": "float32"}, {"T": "float32", "U": "float64"},
            {"T": "float64", "U": "float64"})


@pytest.fixture(scope="module")
def compiler():
    return nv.Nvrtc()


@pytest.fixture(scope="module")
def kernels():
    """What each factory makes, recorded instead of compiled (the factories' caches are
    cleared before and after, so no recorded kernel outlives this module)."""
    rec = nv.Recorder()
    modules = (cuda_raw, cuda, cuda_codecs, cuda_low)
    saved = [m._cp for m in modules]
    for f in FACTORIES + list(cuda_low.KERNEL_CACHES):
        f.cache_clear()
    try:
        for m in modules:
            m._cp = lambda: rec
        for f in FACTORIES:
            f()
        for f, args in cuda_low.factories():    # the low types' kernels, each type's own
            f(*args)
        cuda_raw._k_sgd(True)       # the step guard's fused check
        cuda_raw._k_sgd(True, True)     # and a CUDA graph's learning rate on the device
        cuda_raw._k_sgd(False, True)
        cuda_raw._k_dropout(True)       # a CUDA graph's dropout key on the device
        cuda_raw._k_bnrelu("bf16")      # the fused BatchNorm + ReLU on 2-byte data
        cuda_raw._k_bnrelu("fp16")
        for args in (("float32", True), ("float32", True, True), ("float64", False, True),
                     ("float64", True)):
            cuda_raw._k_sgd_many(*args)     # one launch per layer, each variant
        for dt in ("float32", "float64"):
            cuda_raw._k_nonfinite_many(dt)  # the step guard's statistics, one launch
        cuda_raw._k_avgpool_bwd_low("fp16")     # the average-pool backward on fp16 bits
        cuda_raw._k_add_relu("bf16")    # the fused Add + ReLU on 2-byte data
        cuda_raw._k_add_relu("fp16")
    finally:
        for m, cp in zip(modules, saved):
            m._cp = cp
        for f in FACTORIES + list(cuda_low.KERNEL_CACHES):
            f.cache_clear()
    return rec


def _bindings(k) -> list:
    used = {ty for _, ty, _ in nv.params(k["in_params"]) + nv.params(k["out_params"])
            if ty in ("T", "U")}
    out = []
    for b in BINDINGS:
        tv = {t: d for t, d in b.items() if t in used}
        if tv not in out:
            out.append(tv)
    return out


def test_every_factory_is_recorded(kernels):
    names = [k["name"] for k in kernels.elementwise]
    assert len(names) == len(set(names)), names
    for expected in ("neuron_sgd_momentum_checked", "neuron_sgd_momentum_checked_lrbuf",
                     "neuron_sgd_lrbuf", "neuron_flag_nonfinite", "neuron_dropout_mask_keybuf",
                     "neuron_bf16_encode", "neuron_bf16_decode", "neuron_to_low_bf16",
                     "neuron_to_f32_fp16", "neuron_xent_grad_bf16", "neuron_unscale_f32",
                     "neuron_bnrelu_stats", "neuron_bnrelu_finish", "neuron_bnrelu_apply",
                     "neuron_bnrelu_sums", "neuron_bnrelu_sums_finish", "neuron_bnrelu_dx",
                     "neuron_bnrelu_dx_acc", "neuron_bnrelu_mask", "neuron_bnrelu_stats_bf16",
                     "neuron_bnrelu_dx_acc_fp16", "neuron_bnrelu_apply_bf16",
                     "neuron_add_relu_fwd", "neuron_add_relu_acc", "neuron_add_relu_mask",
                     "neuron_add_relu_fwd_bf16", "neuron_add_relu_mask_fp16"):
        assert expected in names
    codes = [m["code"] for m in kernels.modules]
    assert sum("neuron_bfp8_encode" in c for c in codes) == 1
    for name in ("neuron_sgd_many_float32", "neuron_sgd_many_float32_checked_lrbuf",
                 "neuron_sgd_many_float64_lrbuf", "neuron_sgd_many_float64_checked"):
        assert sum(f" {name}(" in c for c in codes) == 1, name
    assert all(m["options"] == ("--fmad=false",) for m in kernels.modules
               if "neuron_sgd_many" in m["code"])


def test_elementwise_kernels_compile(kernels, compiler):
    done = 0
    for k in kernels.elementwise:
        for tv in _bindings(k):
            for i32 in (True, False):
                src = nv.elementwise_source(k["in_params"], k["out_params"], k["operation"],
                                            k["name"], tv, k["preamble"], k["loop_prep"],
                                            k["after_loop"], index_32_bits=i32)
                compiler.compile(src, k["name"], k["options"])
                done += 1
    assert done >= 2 * len(kernels.elementwise)


def test_raw_modules_compile(kernels, compiler):
    for m in kernels.modules:
        compiler.compile(m["code"], "raw_module", m["options"])


# ---- the check can fail: what CuPy's compile refuses, this refuses ---------------------------

def _one(operation, in_params="T x", out_params="T y"):
    return nv.elementwise_source(in_params, out_params, operation, "probe", {"T": "float32"})


def test_writing_an_input_does_not_compile(compiler):
    """CuPy makes inputs const (the defect of the fused step check on the first GPU run)."""
    compiler.compile(_one("y = x * T(2)"), "probe")
    with pytest.raises(nv.CompileError, match="probe"):
        compiler.compile(_one("x = y"), "probe")
    with pytest.raises(nv.CompileError):
        compiler.compile(_one("flag[0] = true", "T x, raw bool flag"), "probe")


def test_an_unknown_function_does_not_compile(compiler):
    with pytest.raises(nv.CompileError, match="no_such_function"):
        compiler.compile(_one("y = no_such_function(x)"), "probe")


def test_cuda_builtins_and_cupy_types_are_there(compiler):
    compiler.compile(_one("y = isfinite((double)x) ? fmaxf(x, 0.f) : T(0); "
                          "atomicAdd(&y, T(0))"), "probe")
