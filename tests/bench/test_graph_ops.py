"""bench/graph_ops.py: the count it reports, on ResNet-50 over the CUDA stand-ins."""
from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def test_resnet50s_replayed_iteration_has_a_guard_of_a_few_operations(cuda_standins):
    """The step guard takes a handful of the graph's operations and cross-stream waits (it
    took two per parameter block, 107 blocks), and a float32 iteration takes no temporary."""
    if not cuda_standins.have_compiler():
        pytest.skip("g++ is not installed")
    cuda_standins.uninstall()           # count() installs its own, then removes them
    from bench.graph_ops import count
    r = count("resnet50", fuse=False)
    assert r["update_launches"] == 107
    assert r["guard_operations"] <= 20, r["by_kind"]
    assert r["graph_copies"]["d2h"] <= 10 and r["graph_cross_stream_waits"] <= 12, r
    assert r["temporaries_per_replay"] == 0, r["temporaries_by_kernel"]
    assert r["operations"] == sum(r["by_kind"].values())
