"""The GPU codecs' CUDA source (kernels/cuda_codecs.py) checked without a GPU: the very source
strings, compiled by g++ with the CUDA built-ins they use emulated (a warp is 32 threads
exchanging values through a barrier for __shfl_xor_sync), give the NumPy codecs' bytes.
The math functions they call (frexpf, ldexpf, rintf, fabsf, fminf, fmaxf) are exact in both
C and CUDA, so this checks the indexing, padding, casts and rounding. Skipped without g++."""
from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest

from neuron.kernels.cuda_codecs import BF16_DECODE, BF16_ENCODE, BFP8_SOURCE
from neuron.memory.codecs import BLOCK, Bf16, Bfp8

HARNESS = r"""
#include <math.h>
#include <barrier>
#include <thread>
#include <vector>
#include <algorithm>
using std::max; using std::min;
#define __global__
struct Dim { unsigned x; };
thread_local Dim threadIdx, blockIdx;
static Dim blockDim = {256};
static std::barrier<> *warp_barrier;
static float lanes[32];

float __shfl_xor_sync(unsigned, float v, int mask) {
    int lane = threadIdx.x & 31;
    lanes[lane] = v;
    warp_barrier->arrive_and_wait();
    float r = lanes[lane ^ mask];
    warp_barrier->arrive_and_wait();
    return r;
}

KERNELS

template <class F> static void each_thread(long long count, F kernel) {
    for (long long t = 0; t < count; ++t) {
        blockIdx.x = (unsigned)(t / blockDim.x); threadIdx.x = (unsigned)(t % blockDim.x);
        kernel();
    }
}

extern "C" void bfp8_encode(const float* x, unsigned char* out, long long n, long long blocks) {
    std::barrier<> bar(32);
    warp_barrier = &bar;
    for (long long w = 0; w < blocks; ++w) {        // one warp at a time, its lanes as threads
        std::vector<std::thread> lanes_;
        for (int lane = 0; lane < 32; ++lane)
            lanes_.emplace_back([=] {
                long long t = w * 32 + lane;
                blockIdx.x = (unsigned)(t / blockDim.x); threadIdx.x = (unsigned)(t % blockDim.x);
                neuron_bfp8_encode(x, out, n, blocks);
            });
        for (auto &th : lanes_) th.join();
    }
}

extern "C" void bfp8_decode(const unsigned char* data, float* out, long long n, long long blocks) {
    each_thread(n, [=] { neuron_bfp8_decode(data, out, n, blocks); });
}

extern "C" void bf16_encode(const unsigned int* in, unsigned short* out, long long n) {
    for (long long i = 0; i < n; ++i) { unsigned int u = in[i]; unsigned short h; BF16_ENCODE; out[i] = h; }
}

extern "C" void bf16_decode(const unsigned short* in, unsigned int* out, long long n) {
    for (long long i = 0; i < n; ++i) { unsigned short h = in[i]; unsigned int u; BF16_DECODE; out[i] = u; }
}
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("g++ is not installed")
    d = tmp_path_factory.mktemp("codecs")
    src = HARNESS.replace("KERNELS", BFP8_SOURCE.replace('extern "C" ', "")) \
        .replace("BF16_ENCODE", BF16_ENCODE).replace("BF16_DECODE", BF16_DECODE)
    (d / "codecs.cpp").write_text(src)
    so = d / "codecs.so"
    subprocess.run([cxx, "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-o", str(so),
                    str(d / "codecs.cpp")], check=True, capture_output=True, text=True)
    lib = ctypes.CDLL(str(so))
    p, i64 = ctypes.c_void_p, ctypes.c_longlong
    for name in ("bfp8_encode", "bfp8_decode"):
        getattr(lib, name).argtypes = [p, p, i64, i64]
    for name in ("bf16_encode", "bf16_decode"):
        getattr(lib, name).argtypes = [p, p, i64]
    return lib


@pytest.mark.parametrize("n", [1, 31, 33, 64, 1000])
def test_the_bfp8_kernels_give_the_numpy_bytes(lib, codec_samples, n):
    x, codec = codec_samples(n), Bfp8()
    blocks = -(-n // BLOCK)
    got = np.full(codec.nbytes(n), 0xAB, np.uint8)
    lib.bfp8_encode(x.ctypes.data, got.ctypes.data, n, blocks)
    want = codec.encode(x)
    np.testing.assert_array_equal(got, want)
    out, ref = np.empty(n, np.float32), np.empty(n, np.float32)
    lib.bfp8_decode(want.ctypes.data, out.ctypes.data, n, blocks)
    codec.decode(want, ref)
    np.testing.assert_array_equal(out, ref)


def test_the_bf16_kernels_give_the_numpy_bytes(lib, codec_samples):
    n, codec = 5000, Bf16()
    x = codec_samples(n)
    x[:4] = [np.inf, -np.inf, 3.3895314e38, 1.0000001]   # overflow to inf and a tie case
    got = np.empty(n, np.uint16)
    lib.bf16_encode(x.ctypes.data, got.ctypes.data, n)
    want = codec.encode(x)
    np.testing.assert_array_equal(got.view(np.uint8), want)
    out, ref = np.empty(n, np.float32), np.empty(n, np.float32)
    lib.bf16_decode(want.ctypes.data, out.ctypes.data, n)
    codec.decode(want, ref)
    np.testing.assert_array_equal(out, ref)
