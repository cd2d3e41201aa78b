"""bench/analytic_clock_vs_gpu.py: measured strict-fp32 cells without a budget beside the
analytic clock of the same card."""
import json

import pytest

import bench.analytic_clock_vs_gpu as A
import bench._common as C


def test_each_measured_cell_gets_the_same_cards_analytic_time(tmp_path, monkeypatch):
    (tmp_path / "throughput.json").write_text(json.dumps({"configs": {
        "alexnet:8:fp32": {"device": "NVIDIA H200", "date": "2026-11-27", "commit": "abc",
                                "neuron_img_per_s_by_mode": {"off": 100.0, "graph": 200.0}},
        "alexnet:8:tf32": {"device": "NVIDIA H200",            # not strict fp32
                                "neuron_img_per_s_by_mode": {"graph": 400.0}},
        "alexnet:4:fp32": {"device": "Some GPU",               # no analytic model
                                "neuron_img_per_s_by_mode": {"graph": 400.0}}}}))
    monkeypatch.setattr(A, "RESULTS", str(tmp_path))
    monkeypatch.setattr(C, "RESULTS", str(tmp_path))
    assert A.main([]) == 0
    (row,) = json.loads((tmp_path / "analytic_clock_vs_gpu.json").read_text())["rows"]
    assert row["config"] == "alexnet:8" and row["measured_s"] == pytest.approx(8 / 200.0)
    assert row["simulated_s"] == pytest.approx(A.simulated_s("alexnet", 8, "h200"))
    assert row["rel_error"] == pytest.approx(row["simulated_s"] / row["measured_s"] - 1)


def test_nothing_measured_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(A, "RESULTS", str(tmp_path))
    assert A.main([]) == 1
