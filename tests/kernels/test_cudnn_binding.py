"""CPU tests of the CUDA path: everything that does not need a GPU.

cuDNN library discovery, the hand-copied ABI (struct layouts, enum values, prototypes), descriptor
cache keys, the dropout hash, and the device's pointer and host-buffer bookkeeping (the
convolution-algorithm choice is in test_conv_algos.py). Tests that need the real libcudnn.so.9 or
its headers (but no GPU) are skipped where they are not installed; nothing here needs CuPy.
"""
from __future__ import annotations

import ctypes
import inspect
import os
import shutil
import struct
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from neuron.devices.cuda import ArenaAllocator, ArenaLayout
from neuron.errors import MemoryBudgetError
from neuron.kernels import cuda as K
from neuron.kernels import cudnn as dnn
from neuron.kernels import numpy_ref
from neuron.memory.heap import Heap

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))

needs_lib = pytest.mark.skipif(not dnn.available(), reason="libcudnn.so.9 not installed")


# ----------------------------------------------------------------------------------------------
# import hygiene
# ----------------------------------------------------------------------------------------------

def test_import_needs_neither_cupy_nor_cudnn():
    code = ("import sys, neuron, neuron.kernels.cuda, neuron.kernels.cudnn, neuron.devices.cuda\n"
            "assert 'cupy' not in sys.modules, 'cupy imported eagerly'\n"
            "assert neuron.kernels.cudnn._lib is None, 'cuDNN loaded eagerly'\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_cuda_kernels_mirror_numpy_reference_signatures():
    for name in numpy_ref.__all__:
        assert hasattr(K, name), f"neuron.kernels.cuda lacks {name}"
        ref = inspect.signature(getattr(numpy_ref, name))
        got = inspect.signature(getattr(K, name))
        assert list(ref.parameters) == list(got.parameters), name
        for p in ref.parameters.values():
            assert got.parameters[p.name].default == p.default, (name, p.name)


def test_conv_workspace_bytes_match_the_planner():
    args = ((8, 16, 32, 32), (32, 8, 3, 3), 1, 1, 1, 2, 4)
    assert K.conv2d_workspace_bytes(*args) == numpy_ref.conv2d_workspace_bytes(*args)


# ----------------------------------------------------------------------------------------------
# library discovery
# ----------------------------------------------------------------------------------------------

def _fake_lib(root, *parts):
    path = os.path.join(root, *parts)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "wb").close()
    return path


class _Loader:
    """Stands in for ctypes.CDLL: records the attempts, loads only the allowed paths."""

    def __init__(self, ok=lambda p: True):
        self.tried, self.ok = [], ok

    def __call__(self, path):
        self.tried.append(path)
        if not self.ok(path):
            raise OSError(f"cannot open {path}")
        return SimpleNamespace(path=path)


def _no_pathfinder():
    raise RuntimeError("pathfinder says no")


def test_finds_the_wheel_in_any_site_dir(tmp_path):
    empty = str(tmp_path / "empty-site")
    site = str(tmp_path / "site")
    lib = _fake_lib(site, "nvidia", "cudnn", "lib", "libcudnn.so.9")
    loader = _Loader()
    cdll, path = dnn.find_library(env={}, sites=[empty, site], loader=loader,
                                  pathfinder=_no_pathfinder)
    assert path == lib and cdll.path == lib
    assert loader.tried == [lib]        # the missing file in `empty` was never dlopen'ed


def test_pathfinder_comes_first(tmp_path):
    site = str(tmp_path / "site")
    _fake_lib(site, "nvidia", "cudnn", "lib", "libcudnn.so.9")
    loader = _Loader()
    _, path = dnn.find_library(env={}, sites=[site], loader=loader,
                               pathfinder=lambda: "/from/pathfinder/libcudnn.so.9")
    assert path == "/from/pathfinder/libcudnn.so.9"


def test_cudnn_path_directory_and_file(tmp_path):
    root = str(tmp_path / "cudnn")
    lib = _fake_lib(root, "lib64", "libcudnn.so.9")
    _, path = dnn.find_library(env={"CUDNN_PATH": root}, sites=[], loader=_Loader(),
                               pathfinder=None)
    assert path == lib
    _, path = dnn.find_library(env={"CUDNN_PATH": lib}, sites=[], loader=_Loader(),
                               pathfinder=None)
    assert path == lib


def test_a_broken_wheel_falls_through_to_cudnn_path(tmp_path):
    site = str(tmp_path / "site")
    wheel = _fake_lib(site, "nvidia", "cudnn", "lib", "libcudnn.so.9")
    root = str(tmp_path / "cudnn")
    lib = _fake_lib(root, "lib", "libcudnn.so.9")
    loader = _Loader(ok=lambda p: p != wheel)
    _, path = dnn.find_library(env={"CUDNN_PATH": root}, sites=[site], loader=loader,
                               pathfinder=None)
    assert path == lib and loader.tried[0] == wheel


def test_order_is_wheel_then_cudnn_path_then_system(tmp_path):
    cands = dnn.candidate_paths(env={"CUDNN_PATH": str(tmp_path)}, sites=["/s1", "/s2"])
    hows = [h for h, _ in cands]
    assert hows[:2] == ["nvidia-cudnn wheel"] * 2
    assert hows[2:5] == ["CUDNN_PATH"] * 3
    assert hows[-1] == "system loader" and cands[-1][1] == "libcudnn.so.9"


def test_nothing_found_lists_every_place_searched(tmp_path):
    sites = [str(tmp_path / "a"), str(tmp_path / "b")]
    root = str(tmp_path / "nowhere")
    os.makedirs(root)
    with pytest.raises(dnn.CudnnNotFoundError) as ei:
        dnn.find_library(env={"CUDNN_PATH": root}, sites=sites,
                         loader=_Loader(ok=lambda p: False), pathfinder=_no_pathfinder)
    msg = str(ei.value)
    assert isinstance(ei.value, ImportError)
    assert "cuda.pathfinder" in msg and "pathfinder says no" in msg
    for s in sites:
        assert os.path.join(s, "nvidia", "cudnn", "lib", "libcudnn.so.9") in msg
    assert os.path.join(root, "lib64", "libcudnn.so.9") in msg
    assert "system loader libcudnn.so.9: failed to load" in msg
    assert "CUDNN_PATH" in msg and "pip install nvidia-cudnn-cu13" in msg
    # one entry per place: pathfinder + 2 wheels + 3 CUDNN_PATH spellings + system (1 or 2)
    assert len(ei.value.searched) >= 7


def test_site_dirs_are_strings_without_duplicates():
    dirs = dnn.site_dirs()
    assert dirs and all(isinstance(d, str) for d in dirs)
    assert len(dirs) == len(set(dirs))


# ----------------------------------------------------------------------------------------------
# ABI: structs, enums, prototypes
# ----------------------------------------------------------------------------------------------

# An independent copy of the values documented in shared/reference/cuda-stack.md (cuDNN 9.28).
DOCUMENTED = {
    "CUDNN_DATA_FLOAT": 0, "CUDNN_DATA_DOUBLE": 1, "CUDNN_DATA_HALF": 2, "CUDNN_DATA_INT8": 3,
    "CUDNN_DATA_INT32": 4, "CUDNN_DATA_BFLOAT16": 9, "CUDNN_TENSOR_NCHW": 0,
    "CUDNN_TENSOR_NHWC": 1, "CUDNN_CONVOLUTION": 0, "CUDNN_CROSS_CORRELATION": 1,
    "CUDNN_DEFAULT_MATH": 0, "CUDNN_TENSOR_OP_MATH": 1, "CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION": 2,
    "CUDNN_FMA_MATH": 3, "CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM": 0,
    "CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED": 7, "CUDNN_CONVOLUTION_FWD_ALGO_COUNT": 8,
    "CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT": 7, "CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT": 6,
    "CUDNN_BATCHNORM_PER_ACTIVATION": 0, "CUDNN_BATCHNORM_SPATIAL": 1,
    "CUDNN_BATCHNORM_SPATIAL_PERSISTENT": 2, "CUDNN_POOLING_MAX": 0,
    "CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING": 1,
    "CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING": 2, "CUDNN_POOLING_MAX_DETERMINISTIC": 3,
    "CUDNN_ACTIVATION_SIGMOID": 0, "CUDNN_ACTIVATION_RELU": 1, "CUDNN_ACTIVATION_TANH": 2,
    "CUDNN_ACTIVATION_CLIPPED_RELU": 3, "CUDNN_ACTIVATION_ELU": 4, "CUDNN_ACTIVATION_IDENTITY": 5,
    "CUDNN_ACTIVATION_SWISH": 6, "CUDNN_NOT_PROPAGATE_NAN": 0, "CUDNN_PROPAGATE_NAN": 1,
    "CUDNN_SOFTMAX_FAST": 0, "CUDNN_SOFTMAX_ACCURATE": 1, "CUDNN_SOFTMAX_LOG": 2,
    "CUDNN_SOFTMAX_MODE_INSTANCE": 0, "CUDNN_SOFTMAX_MODE_CHANNEL": 1,
    "CUDNN_LRN_CROSS_CHANNEL_DIM1": 0, "CUDNN_STATUS_SUCCESS": 0,
    "CUDNN_STATUS_NOT_INITIALIZED": 1001, "CUDNN_STATUS_NOT_SUPPORTED": 3000,
}


def test_enum_values_match_the_documented_headers():
    for name, value in DOCUMENTED.items():
        assert dnn.ENUMS[name] == value, name
        assert getattr(dnn, name) == value
    assert dnn.CUDNN_DIM_MAX == 8 and dnn.CUDNN_BN_MIN_EPSILON == 0.0


@pytest.mark.parametrize("cname", sorted(dnn.STRUCT_LAYOUTS))
def test_algo_perf_struct_layout(cname):
    cls, size, fields = dnn.STRUCT_LAYOUTS[cname]
    assert ctypes.sizeof(cls) == size == 48
    for f, off in fields.items():
        assert getattr(cls, f).offset == off, f
    assert ctypes.sizeof(ctypes.c_int) == 4          # enums are C ints


def test_algo_perf_reads_a_c_laid_out_buffer():
    # the bytes a C compiler lays down for {algo=5, status=0, time=1.5f, memory=2**40+3,
    # determinism=1, mathType=3}: 4 bytes of padding after `time`, size_t at 16, and
    # the struct rounded up to a multiple of 8
    raw = struct.pack("<iif4xQii16x", 5, 0, 1.5, 2**40 + 3, 1, 3)
    assert len(raw) == 48
    p = dnn.AlgoPerf.from_struct(dnn.FwdAlgoPerf.from_buffer_copy(raw))
    assert p == dnn.AlgoPerf(5, 0, 1.5, 2**40 + 3, 1, 3)


def test_signature_table_is_well_formed():
    for name, sig in dnn.SIGNATURES.items():
        assert name.startswith("cudnn") and set(sig) <= set("piuzld"), name
    # the calls whose argument lists are long enough to get wrong by hand
    assert dnn.SIGNATURES["cudnnConvolutionForward"] == "pppppppipzppp"
    assert dnn.SIGNATURES["cudnnFindConvolutionForwardAlgorithmEx"] == "ppppppppipppz"
    assert dnn.SIGNATURES["cudnnBatchNormalizationForwardTraining"] == "pipppppppppdppdpp"
    assert dnn.SIGNATURES["cudnnSetLRNDescriptor"] == "puddd"
    # the backend API's element counts are int64_t: "l", never a C int
    assert dnn.SIGNATURES["cudnnBackendSetAttribute"] == "piilp"
    assert dnn.SIGNATURES["cudnnBackendGetAttribute"] == "piilpp"


def test_declare_sets_argtypes_from_the_table():
    fake = SimpleNamespace(**{n: SimpleNamespace() for n in
                              list(dnn.SIGNATURES) + list(dnn._OTHER_RESTYPES)})
    saved = dict(dnn._funcs)
    try:
        dnn._declare(fake)
        f = fake.cudnnSetActivationDescriptor
        assert f.argtypes == [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_double]
        assert f.restype is ctypes.c_int
        assert fake.cudnnGetVersion.restype is ctypes.c_size_t
    finally:
        dnn._funcs.clear()
        dnn._funcs.update(saved)


def test_parse_prototypes():
    text = """
    /* comment (with parens); */
    CUDNN_DEPRECATED cudnnStatus_t CUDNNWINAPI
    cudnnSetThing(cudnnTensorDescriptor_t d, cudnnDataType_t t, int n, const int dimA[],
                  double eps, size_t bytes, unsigned lrnN, void *ptr, cudaStream_t s);
    size_t CUDNNWINAPI cudnnGetVersion(void);
    cudnnStatus_t CUDNNWINAPI cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor,
        cudnnBackendAttributeName_t attributeName, cudnnBackendAttributeType_t attributeType,
        int64_t elementCount, const void *arrayOfElements);
    """
    protos = dnn.parse_prototypes(text)
    assert protos["cudnnSetThing"] == "piipdzupp"
    assert protos["cudnnBackendSetAttribute"] == "piilp"
    assert protos["cudnnGetVersion"] == ""


def test_probe_source_prints_every_checked_value():
    src = dnn.probe_source()
    exp = dnn.expected_probe_values()
    for key in exp:
        name = key.split("(")[-1].rstrip(")") if key.startswith(("sizeof", "offsetof")) else key
        assert name.split(",")[0] in src, key
    assert exp["sizeof(cudnnConvolutionFwdAlgoPerf_t)"] == 48


def _headers_and_cc():
    inc = dnn.find_include_dir()
    cc = shutil.which("gcc") or shutil.which("cc") or shutil.which("g++")
    return inc, cc


@pytest.mark.skipif(None in _headers_and_cc(), reason="cuDNN headers or a C compiler missing")
def test_constants_match_the_installed_headers():
    assert dnn.check_headers() == []


@pytest.mark.skipif(None in _headers_and_cc(), reason="cuDNN headers or a C compiler missing")
def test_header_check_runs_with_stub_cuda_headers_and_catches_a_wrong_value(monkeypatch):
    # without a CUDA toolkit the stubs must be enough...
    from neuron.kernels import cudnn_headers
    monkeypatch.setattr(cudnn_headers, "_cuda_include_dirs", lambda *a, **k: [])
    assert dnn.check_headers() == []
    # ...and a wrong constant or signature must be reported
    monkeypatch.setitem(dnn.ENUMS, "CUDNN_POOLING_MAX_DETERMINISTIC", 4)
    monkeypatch.setitem(dnn.SIGNATURES, "cudnnAddTensor", "pppppp")
    problems = dnn.check_headers()
    assert any("CUDNN_POOLING_MAX_DETERMINISTIC" in p for p in problems)
    assert any("cudnnAddTensor" in p for p in problems)


# ----------------------------------------------------------------------------------------------
# descriptors
# ----------------------------------------------------------------------------------------------

def test_tensor_keys_pad_to_4d_with_element_strides():
    key = dnn.tensor_key((32, 10), None, np.float32)
    assert key == ("tensor", (32, 10, 1, 1), (10, 1, 1, 1), "<f4")
    a = np.empty((4, 6, 5, 5), np.float64)[:, ::2]          # a channel-strided view
    dims, strides = dnn.as_4d(a.shape, a.strides, 8)
    assert dims == (4, 3, 5, 5) and strides == (150, 50, 5, 1)
    # same geometry, same key; another dtype, another key
    assert dnn.tensor_key((2, 3, 4, 5), None, np.float32) == \
        dnn.tensor_key((2, 3, 4, 5), (240, 80, 20, 4), np.float32)
    assert dnn.tensor_key((2, 3, 4, 5), None, np.float32) != \
        dnn.tensor_key((2, 3, 4, 5), None, np.float64)
    with pytest.raises(ValueError):
        dnn.as_4d((2, 3), (6, 3), 4)                         # stride not a multiple of 4
    with pytest.raises(ValueError):
        dnn.as_4d((1, 2, 3, 4, 5), None, 4)


def test_other_descriptor_keys():
    assert dnn.conv_key(1, 1, 1, 1, np.float32) != dnn.conv_key(1, 1, 1, 2, np.float32)
    assert dnn.conv_key((1, 1), (2, 2), (1, 1), 1, "float32") == \
        dnn.conv_key([1, 1], [2, 2], [1, 1], 1, np.float32)
    assert dnn.pooling_key(0, (3, 3), (1, 1), (2, 2)) != dnn.pooling_key(1, (3, 3), (1, 1), (2, 2))
    assert dnn.lrn_key(5, 1e-4, 0.75, 1) == dnn.lrn_key(5, 1e-4, 0.75, 1.0)
    assert dnn.filter_key((8, 3, 3, 3), np.float32) == ("filter", (8, 3, 3, 3), "<f4")
    # --layout nhwc's K, R, S, C filters are a descriptor of their own
    assert dnn.filter_key((8, 3, 3, 3), np.float32, dnn.CUDNN_TENSOR_NCHW) == \
        dnn.filter_key((8, 3, 3, 3), np.float32)
    assert dnn.filter_key((8, 3, 3, 3), np.float32, dnn.CUDNN_TENSOR_NHWC) != \
        dnn.filter_key((8, 3, 3, 3), np.float32)


def test_descriptor_cache_is_an_lru():
    c = dnn.DescriptorCache(capacity=2)
    built = []

    def build(k):
        return lambda: built.append(k) or object()

    a = c.get("a", build("a"))
    assert c.get("a", build("a")) is a and built == ["a"]
    c.get("b", build("b"))
    c.get("a", build("a"))           # a becomes most recent
    c.get("c", build("c"))           # evicts b
    assert "a" in c and "c" in c and "b" not in c and len(c) == 2
    assert (c.hits, c.misses) == (2, 3)


def test_dtype_helpers():
    assert dnn.data_type(np.float32) == dnn.CUDNN_DATA_FLOAT
    assert dnn.data_type("float64") == dnn.CUDNN_DATA_DOUBLE
    assert dnn.compute_type(np.float16) == dnn.CUDNN_DATA_FLOAT
    assert isinstance(dnn.scalar(1.0, np.float64), ctypes.c_double)
    assert isinstance(dnn.scalar(1.0, np.float32), ctypes.c_float)
    with pytest.raises(TypeError):
        dnn.data_type(np.bool_)


@needs_lib
def test_real_library_descriptors_and_errors():
    assert dnn.version() >= 90000
    x = dnn.tensor_descriptor((8, 3, 32, 32), np.float32)
    assert dnn.tensor_descriptor((8, 3, 32, 32), np.float32) is x       # cached
    w = dnn.filter_descriptor((16, 3, 3, 3), np.float32)
    conv = dnn.convolution_descriptor((1, 1), (2, 2), (1, 1), 1, np.float32)
    assert dnn.conv_output_dims(conv, x, w) == (8, 16, 16, 16)
    w_nhwc = dnn.filter_descriptor((16, 3, 3, 3), np.float32, dnn.CUDNN_TENSOR_NHWC)
    assert w_nhwc is not w and w_nhwc.fmt == dnn.CUDNN_TENSOR_NHWC
    x_nhwc = dnn.tensor_descriptor((8, 3, 32, 32), np.float32, (12288, 4, 384, 12))
    assert dnn.conv_output_dims(conv, x_nhwc, w_nhwc) == (8, 16, 16, 16)
    dnn.pooling_descriptor(dnn.CUDNN_POOLING_MAX, (3, 3), (1, 1), (2, 2))
    dnn.activation_descriptor(dnn.CUDNN_ACTIVATION_RELU)
    bn = dnn.TensorDescriptor((1, 1, 1, 1), (1, 1, 1, 1), np.float32)
    dnn.call("cudnnDeriveBNTensorDescriptor", bn.ptr, x.ptr, dnn.CUDNN_BATCHNORM_SPATIAL)
    with pytest.raises(dnn.CudnnError) as ei:
        dnn.LRNDescriptor(17, 1e-4, 0.75, 1.0)             # n > CUDNN_LRN_MAX_N
    e = ei.value
    assert e.status == dnn.CUDNN_STATUS_BAD_PARAM and e.function == "cudnnSetLRNDescriptor"
    assert "cudnnSetLRNDescriptor" in str(e) and "BAD_PARAM" in str(e)
    assert isinstance(e, RuntimeError)


# ----------------------------------------------------------------------------------------------
# dropout hash
# ----------------------------------------------------------------------------------------------

def _mask_by_hand(seed, i, p):
    m64 = (1 << 64) - 1

    def fin(z):
        z &= m64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m64
        return z ^ (z >> 31)

    z = fin((fin(seed) + (i + 1) * 0x9E3779B97F4A7C15) & m64)
    return int(np.float32((z >> 40) / float(1 << 24)) < np.float32(1 - p))


def test_dropout_mask_reference():
    m = K.dropout_mask_reference((64, 100), 0.3, seed=1234)
    assert m.dtype == np.uint8 and m.shape == (64, 100)
    assert np.array_equal(m, K.dropout_mask_reference((64, 100), 0.3, seed=1234))
    assert not np.array_equal(m, K.dropout_mask_reference((64, 100), 0.3, seed=1235))
    assert abs(m.mean() - 0.7) < 0.02
    flat = m.ravel()
    for i in (0, 1, 17, 6399):
        assert flat[i] == _mask_by_hand(1234, i, 0.3)
    assert K.dropout_mask_reference((3,), 0.0, 1).tolist() == [1, 1, 1]
    assert K.dropout_mask_reference((3,), 1.0, 1).tolist() == [0, 0, 0]
    big = K.dropout_mask_reference((5,), 0.5, seed=2**63 - 1)      # the largest layer seed
    assert big.shape == (5,)


# ----------------------------------------------------------------------------------------------
# device bookkeeping
# ----------------------------------------------------------------------------------------------

BASE = 0x7F00_0000_0000


def test_arena_layout_pointer_math():
    lay = ArenaLayout(BASE, 1 << 20)
    assert lay.pointer(0) == BASE and lay.end == BASE + (1 << 20)
    assert lay.pointer(4096, 1024, align=4) == BASE + 4096
    assert lay.pointer((1 << 20) - 8, 8) == BASE + (1 << 20) - 8     # last bytes are fine
    assert lay.offset(BASE + 12345) == 12345
    assert lay.contains(BASE + 10, 10) and not lay.contains(BASE - 1)
    for off, n in ((-1, 0), ((1 << 20) - 8, 9), (1 << 20, 1)):
        with pytest.raises(ValueError, match="outside the arena"):
            lay.pointer(off, n)
    with pytest.raises(ValueError, match="not aligned"):
        lay.pointer(2, 4, align=4)
    with pytest.raises(ValueError, match="outside the arena"):
        lay.offset(BASE + (1 << 20), 1)
    head, tail = lay.split(1000)
    assert (head.base, head.size, tail.base, tail.size) == (BASE, 1000, BASE + 1000,
                                                            (1 << 20) - 1000)


def test_arena_allocator_scratch_then_pool(tmp_path):
    pool_lay, scratch_lay = ArenaLayout(BASE, 1 << 20).split(768 << 10)
    scratch = Heap(scratch_lay.size, block=256)
    pool = Heap(pool_lay.size, block=256)
    a = ArenaAllocator()
    a.add_region(scratch, scratch_lay, "scratch")
    p1 = a.malloc(1000, 0)
    assert scratch_lay.contains(p1, 1000) and a.live_bytes == 1000
    a.add_region(pool, pool_lay, "pool", first=True)          # what CudaDevice.attach_heap does
    p2 = a.malloc(5000, 0)
    assert pool_lay.contains(p2, 5000) and pool.used_bytes >= 5000
    p3 = a.malloc(700 << 10, 0)                                # too big for what the pool has left
    assert p3 != 0
    p4 = a.malloc(200 << 10, 0)                                # pool full: falls back to scratch
    assert scratch_lay.contains(p4, 200 << 10)
    with pytest.raises(MemoryBudgetError, match="does not fit") as ei:
        a.malloc(512 << 10, 0)
    assert ei.value.requested == 512 << 10
    for p in (p1, p2, p3, p4):
        a.free(p, 0)
    assert pool.used_bytes == 0 and scratch.used_bytes == 0 and a.live_bytes == 0
    assert a.malloc(0, 0) == 0
    a.free(0, 0)
    a.remove_region("pool")
    assert scratch_lay.contains(a.malloc(10, 0))


def test_make_device_cuda_without_a_gpu_is_a_clear_error():
    from neuron.devices import cuda_available, make_device
    if cuda_available():
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match="CuPy|CUDA device"):
        make_device("cuda", 1 << 20)
