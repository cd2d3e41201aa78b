"""The kit's mixed-precision throughput stage (bench/gpu/throughput.py --stage throughput_mixed)
on the CPU: neuron at bf16 and fp16 against PyTorch under autocast in both layouts, the ratio
against the faster layout, and the importer's configs ``model:batch:bf16`` / ``:fp16`` merged
into throughput.json beside the fp32 ones already there."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench.gpu import throughput as T

from test_gpu_contact import ROOT, _run_stage, _stage_json

pytest.importorskip("ml_dtypes")


def test_the_faster_layout_is_the_reference():
    r = T.faster_layout({"nchw": {"img_per_s": 100.0}, "channels_last": {"img_per_s": 130.0}})
    assert r["layout"] == "channels_last" and r["img_per_s"] == 130.0
    assert set(r["layouts"]) == {"nchw", "channels_last"}
    r = T.faster_layout({"nchw": {"img_per_s": 90.0}, "channels_last": {"error": "boom"}})
    assert r["layout"] == "nchw" and r["layouts"]["channels_last"]["error"] == "boom"
    r = T.faster_layout({"nchw": {"error": "a"}, "channels_last": {"error": "b"}})
    assert "img_per_s" not in r and "nchw: a" in r["error"]


def test_the_bf16_ratio_is_judged_against_its_target():
    row = T.ratios({"precision": "bf16", "neuron": {"graph": {"img_per_s": 120.0}},
                    "pytorch": {"img_per_s": 100.0, "layout": "channels_last"}})
    assert row["neuron_over_pytorch"] == pytest.approx(1.2) and row["target"] == 1.1
    assert row["target_met"] is True
    row = T.ratios({"precision": "fp16", "neuron": {"off": {"img_per_s": 50.0}},
                    "pytorch": {"img_per_s": 100.0}})
    assert row["neuron_over_pytorch"] == pytest.approx(0.5) and row["target_met"] is None


def test_throughput_mixed_stage_contract_and_import(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "out"
    _run_stage("throughput", out, "--stage", "throughput_mixed", "--precision", "mixed",
               "--runs", "2", "--iters", "1", "--warmup", "1", "--modes", "off", timeout=600)
    d = _stage_json(out, "throughput_mixed")
    assert d["ran"], d["verdict"]
    rows = {r["precision"]: r for r in d["rows"]}
    assert set(rows) == {"bf16", "fp16"}
    for prec, row in rows.items():
        layouts = row["pytorch"]["layouts"]
        assert set(layouts) == {"nchw", "channels_last"}
        best = max(layouts, key=lambda k: layouts[k]["img_per_s"])
        assert row["pytorch"]["layout"] == best
        assert row["pytorch"]["img_per_s"] == layouts[best]["img_per_s"]
        assert layouts[best]["autocast"] == {"bf16": "torch.bfloat16",
                                             "fp16": "torch.float16"}[prec]
        assert row["neuron_over_pytorch"] == pytest.approx(
            row["neuron"]["off"]["img_per_s"] / layouts[best]["img_per_s"])
    assert "by layout" in d["verdict"]
    res = tmp_path / "results"
    res.mkdir()
    old = {"device": "H200", "configs": {"resnet50:128:fp32": {"neuron_over_pytorch": 1.3}}}
    (res / "throughput.json").write_text(json.dumps(old))
    r = subprocess.run([sys.executable, "-m", "bench.gpu.import_results", str(out), "--results",
                        str(res), "--no-readme-tables", "--allow-smoke"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    t = json.loads((res / "throughput.json").read_text())
    assert set(t["configs"]) == {"resnet50:128:fp32", "resnet_cifar:4:bf16",
                                 "resnet_cifar:4:fp16"}
    c = t["configs"]["resnet_cifar:4:bf16"]
    assert c["neuron_over_pytorch"] > 0 and c["pytorch_layout"] in ("nchw", "channels_last")
    assert set(c["pytorch_img_per_s_by_layout"]) == {"nchw", "channels_last"}
    assert c["target"] == 1.1 and c["date"] == d["date"]
    assert t["configs"]["resnet50:128:fp32"] == old["configs"]["resnet50:128:fp32"]
    assert os.path.exists(res / "gpu_raw" / "throughput_mixed.json")
