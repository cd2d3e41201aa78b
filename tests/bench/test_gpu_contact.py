"""The GPU contact kit's logic and JSON contracts, on the CPU (its --smoke mode), so the first
GPU run does not spend scarce minutes on a crash in the kit itself."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile

import numpy as np
import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
KIT = os.path.join(ROOT, "bench", "gpu")
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

STAGE_KEYS = {"stage", "ran", "target_met", "verdict", "device", "date", "commit", "smoke",
              "command"}


def _run_stage(module, out, *extra, timeout=240):
    r = subprocess.run([sys.executable, "-m", f"bench.gpu.{module}", "--out", str(out),
                        "--device", "cpu", "--smoke", *extra], cwd=ROOT, capture_output=True,
                       text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r


def _stage_json(out, stage):
    with open(os.path.join(out, f"{stage}.json")) as f:
        d = json.load(f)
    assert STAGE_KEYS <= set(d), set(STAGE_KEYS) - set(d)
    assert d["stage"] == stage and d["smoke"] is True
    return d


def test_driver_runs_every_stage_packs_and_survives_a_crash(tmp_path):
    env = dict(os.environ, NEURON_CONTACT_DEVICE="cpu", NEURON_CONTACT_SMOKE="1",
               PYTHON=sys.executable)
    out = tmp_path / "out"
    r = subprocess.run(["bash", os.path.join(KIT, "contact.sh"), str(out), "env",
                        "nonsense", "install"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    # a verdict line per stage, the crashing one included, and the stage after it still ran
    assert "[env]" in r.stdout and "[install]" in r.stdout
    assert "[nonsense]" in r.stdout and "CRASH" in r.stdout
    # two files only: the device machine returns at most 8
    assert sorted(os.listdir(out)) == ["contact-env-nonsense-install.tar.gz",
                                       "summary-env-nonsense-install.json"]
    summary = json.loads((out / "summary-env-nonsense-install.json").read_text())
    got = {s["stage"]: s for s in summary["stages"]}
    assert got["env"]["ran"] and got["install"]["ran"] and not got["nonsense"]["ran"]
    assert got["env"]["target_met"] is None         # on the CPU: no GPU to find, nothing judged
    assert got["nonsense"]["verdict"].startswith("DID NOT RUN")
    with tarfile.open(out / "contact-env-nonsense-install.tar.gz") as t:
        names = {os.path.basename(n) for n in t.getnames()}
    assert {"env.json", "env.log", "install.json", "nonsense.log", "stages.jsonl"} <= names


def test_a_stage_over_its_time_limit_is_reported_as_such(tmp_path):
    env = dict(os.environ, NEURON_CONTACT_DEVICE="cpu", NEURON_CONTACT_SMOKE="1",
               PYTHON=sys.executable, TIMEOUT_ENV="0.05")
    r = subprocess.run(["bash", os.path.join(KIT, "contact.sh"), str(tmp_path), "env"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert "[env]" in r.stdout and "TIMEOUT" in r.stdout, r.stdout


def test_models_stage_contract(tmp_path):
    _run_stage("models", tmp_path)
    d = _stage_json(tmp_path, "models")
    assert d["ran"] and d["target_met"] and d["deterministic"]["ok"], d["verdict"]
    assert d["dtype"] == "float64" and d["verdict"].startswith("RAN, TARGET MET: 2/2 models")
    for name, m in d["models"].items():
        # CPU against CPU, both float64: the same function in the same order
        assert m["loss_rel_err"] == 0.0 and m["update_max_rel_err"] == 0.0, name
        assert m["dtype"] == "float64" and m["ok"], name


def _wrong_kernel_run(monkeypatch, name, wrong):
    """compare_one on the CPU with one kernel of the device under test replaced by ``wrong``."""
    from bench.gpu import models as gpu_models

    def wrong_device(kind, graph, batch):
        dev = gpu_models._executor(graph, batch, "virtual", dtype=np.float64).simulate()
        k = gpu_models.hash_dropout_kernels()
        setattr(k, name, wrong)

        class Wrong(type(gpu_models.reference_device(1))):
            _k = k
        return Wrong(dev["arena_bytes"])

    monkeypatch.setattr(gpu_models, "_device_under_test", wrong_device)
    return gpu_models.compare_one("resnet_cifar", 8, 2, (3, 16, 16), "cpu")


def test_models_gate_fails_a_relu_gradient_1e5_off(monkeypatch):
    """The float64 tolerance is tight: a ReLU backward 0.001% off fails it."""
    from bench.gpu import models as gpu_models
    from neuron.kernels import numpy_ref

    def relu_backward(y, dy, dx, accumulate=False):
        numpy_ref.relu_backward(y, dy, dx, accumulate)
        dx *= 1 + 1e-5

    r = _wrong_kernel_run(monkeypatch, "relu_backward", relu_backward)
    assert not r["ok"] and r["update_max_rel_err"] > gpu_models.UPDATE_TOL
    assert r["loss_rel_err"] == 0.0         # forward untouched
    assert not gpu_models.within_tolerance(r["loss_rel_err"], r["update_max_rel_err"])


def test_models_gate_fails_a_bn_gradient_68_percent_off(monkeypatch):
    """The case that passed the float32 gate on the H100: a BN bias gradient 68% off."""
    from neuron.kernels import numpy_ref

    def batchnorm_backward(x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta, *a, **kw):
        numpy_ref.batchnorm_backward(x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta,
                                     *a, **kw)
        dbeta *= 1.68

    r = _wrong_kernel_run(monkeypatch, "batchnorm_backward", batchnorm_backward)
    assert not r["ok"] and r["update_max_rel_err"] > 0.1, r
    assert "bn" in r["worst_update"].lower() or "beta" in r["worst_update"], r["worst_update"]


def test_models_verdict_says_ran_and_target_apart(tmp_path, monkeypatch):
    from bench.gpu import models as gpu_models
    monkeypatch.setattr(gpu_models, "compare_one", lambda *a: {
        "ok": False, "loss_rel_err": 0.0, "update_max_rel_err": 0.5, "worst_update": "bn.beta",
        "param_max_rel_err": 0.1})
    monkeypatch.setattr(gpu_models, "deterministic_across_policies",
                        lambda *a: {"ok": True})
    gpu_models.main(["--out", str(tmp_path), "--device", "cpu", "--smoke"])
    d = json.loads((tmp_path / "models.json").read_text())
    assert d["ran"] is True and d["target_met"] is False
    assert d["verdict"].startswith("RAN, TARGET NOT MET: 0/2 models within tolerance")
    assert "update_max_rel_err 5.00e-01" in d["verdict"]


def test_hash_dropout_reference_matches_the_gpu_mask():
    from bench.gpu import models as gpu_models
    from neuron.kernels.dropout_mask import dropout_mask_reference
    k = gpu_models.hash_dropout_kernels()
    x = np.ones((4, 50), np.float32)
    y, mask = np.empty_like(x), np.empty(x.shape, np.uint8)
    k.dropout_forward(x, y, mask, 0.3, 1234)
    assert np.array_equal(mask, dropout_mask_reference(x.shape, 0.3, 1234))
    assert np.allclose(y, mask / np.float32(0.7))


def test_throughput_stage_contract(tmp_path):
    pytest.importorskip("torch")
    _run_stage("throughput", tmp_path, "--precision", "fp32", "--runs", "2", "--iters", "1",
               "--warmup", "1", "--modes", "off")
    d = _stage_json(tmp_path, "throughput")
    assert d["ran"], d["verdict"]
    (row,) = d["rows"]
    assert row["precision"] == "fp32" and row["neuron_over_pytorch"] > 0
    assert row["target"] == 1.1 and row["target_met"] == (row["neuron_over_pytorch"] >= 1.1)
    assert d["target_met"] == row["target_met"]
    assert len(row["neuron"]["off"]["runs_img_per_s"]) == 2 == \
        len(row["pytorch"]["runs_img_per_s"])
    assert row["neuron"]["off"]["replay"] == "off" and row["neuron_mode"] == "off"


def test_throughput_fuse_both_runs_each_mode_fused_beside_unfused(tmp_path):
    pytest.importorskip("torch")
    _run_stage("throughput", tmp_path, "--precision", "fp32", "--runs", "2", "--iters", "1",
               "--warmup", "1", "--modes", "off", "--fuse", "both")
    (row,) = _stage_json(tmp_path, "throughput")["rows"]
    assert row["fuse"] == "both" and set(row["neuron"]) == {"off", "off+fuse"}
    assert row["neuron"]["off+fuse"]["fuse"] and row["neuron"]["off+fuse"]["fused_layers"] > 0
    assert not row["neuron"]["off"]["fuse"]
    assert set(row["neuron_over_pytorch_by_mode"]) == {"off", "off+fuse"}


def test_throughput_refuses_a_protocol_below_the_issue(tmp_path):
    r = subprocess.run([sys.executable, "-m", "bench.gpu.throughput", "--out",
                        str(tmp_path), "--runs", "3"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode != 0 and "at least 5 runs" in r.stderr


def test_pool_stage_trains_with_malloc_pool(tmp_path):
    _run_stage("pool_vs_malloc", tmp_path)
    d = _stage_json(tmp_path, "pool")
    assert d["ran"] and d["target_met"] is None, d["verdict"]    # the 10x target is the GPU's
    assert d["train"]["arena"] > 0 and d["train"]["malloc"] > 0
    assert d["train"]["malloc_allocations"] > 0
    (row,) = d["rows"]
    assert row["heap_peak_bytes"] > 0 and row["allocs"] > 0


def test_malloc_pool_keeps_the_arena_figure_when_malloc_fails(monkeypatch):
    from bench.gpu import pool_vs_malloc as P
    from neuron.models import build_model

    def broken(self, nbytes):
        raise MemoryError("no memory for you")

    monkeypatch.setattr(P.DeviceMemory, "malloc", broken)
    out = P.train_images_per_second("resnet_cifar", 2, 1, device="cpu",
                                    graph=build_model("resnet_cifar", depth=8,
                                                      in_shape=(3, 8, 8)))
    assert out["arena"] > 0 and "MemoryError" in out["malloc_error"]


def test_hidden_fraction():
    from bench.gpu import pressure as G
    bw = {"h2d": 1e9, "d2h": 1e9}
    assert G.hidden_fraction(1.0, 1.0, 1e9, 0, bw) == 1.0          # nothing lost: all hidden
    assert G.hidden_fraction(2.0, 1.0, 1e9, 0, bw) == 0.0          # lost the whole copy time
    assert G.hidden_fraction(1.25, 1.0, 5e8, 5e8, bw) == pytest.approx(0.75)
    assert G.hidden_fraction(1.0, 1.0, 0, 0, bw) is None
    # not clamped: a run that lost twice its copies' time says so
    assert G.hidden_fraction(3.0, 1.0, 1e9, 0, bw) == pytest.approx(-1.0)


def test_pressure_targets():
    from bench.gpu import pressure as G
    assert G.run_spec("policy=superneurons") == {"policy": "superneurons", "planner": None}
    assert G.run_spec("policy=superneurons:ahead=auto") == {
        "policy": "superneurons", "planner": None, "prefetch_ahead": "auto"}
    assert G.run_spec("planner=superneurons:compress=4:ahead=8") == {
        "policy": "superneurons", "planner": "superneurons:compress=4", "prefetch_ahead": "8"}
    assert G.run_spec("planner=superneurons:compress=4") == {
        "policy": "superneurons", "planner": "superneurons:compress=4"}
    with pytest.raises(SystemExit, match="neither policy=NAME"):
        G.run_spec("capuchin")
    good = {"seconds_per_iter": 1.05, "overhead": 0.05, "img_per_s": 300.0, "moved_bytes": 7,
            "planned_moved_bytes": 7, "hidden_copy_fraction": 0.9}
    t = G.targets({"planner=superneurons": good}, ckpt_img_per_s=200.0)
    assert all(t.values()) and len(t) == 4
    slow = dict(good, overhead=0.3, moved_bytes=8)
    t = G.targets({"planner=superneurons": good, "policy=superneurons": slow}, 200.0)
    assert not t["policy=superneurons overhead <= 25%"]
    assert not t["policy=superneurons moved = planned"]
    assert not G.targets({"planner=superneurons": good}, 250.0)[
        "planner=superneurons >= 1.3x PyTorch+checkpoint"]
    assert G.targets({"x": {"seconds_per_iter": None, "error": "e"}}, None) == {"x ran": False}


@pytest.mark.slow
def test_confirm_stage_contract(tmp_path):
    pytest.importorskip("torch")
    _run_stage("confirm", tmp_path, timeout=400)
    d = _stage_json(tmp_path, "confirm")
    assert d["ran"] and d["target_met"], d["verdict"]
    for part in ("widest", "deepest"):
        p = d["parts"][part]
        assert p["run"]["fits"] and p["peak"]["tensor_equal"], p
        assert p["peak"]["arena_peak_bytes"] >= p["peak"]["tensor_peak_bytes"]
    assert "tensor peak" in d["verdict"] and "arena peak" in d["verdict"]
    assert d["parts"]["torch_eager"]["depth"] and d["parts"]["torch_checkpoint"]["depth"]


def test_junit_counts(tmp_path):
    from bench.gpu.kit import junit_counts
    xml = tmp_path / "j.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.gpu.test_a" name="t1"/>'
        '<testcase classname="tests.gpu.test_a" name="t2"><failure message="boom"/></testcase>'
        '<testcase classname="tests.gpu.test_a" name="t3"><skipped message="no GPU"/></testcase>'
        '<testcase classname="tests.gpu.test_a" name="t4"><error message="setup"/></testcase>'
        '</testsuite></testsuites>')
    c = junit_counts(str(xml))
    assert {k: c[k] for k in ("passed", "failed", "skipped", "errors")} == \
        {"passed": 1, "failed": 1, "skipped": 1, "errors": 1}
    assert c["failures"][0]["test"].endswith("t2") and c["skips"][0]["reason"] == "no GPU"


def _fake_run(tmp_path):
    """A kit output folder as a GPU run would leave it: tarball + summary."""
    from bench.gpu.kit import write_stage
    raw = tmp_path / "raw"
    common = dict(device="NVIDIA H100 80GB HBM3", smoke=False)
    write_stage(str(raw), "tests", ran=True, target_met=False, detail="90 passed, 1 failed",
                tests={"passed": 90, "failed": 1, "skipped": 2, "errors": 0}, failures=[],
                **common)
    write_stage(str(raw), "models", ran=False, target_met=True, detail="6/7", models={
        "resnet50": {"loss_rel_err": 1e-6, "param_max_rel_err": 2e-7,
                     "update_max_rel_err": 1e-4, "ok": True},
        "vgg16": {"ok": False, "error": "CudnnError: x", "loss_rel_err": None,
                  "param_max_rel_err": None}}, **common)
    write_stage(str(raw), "throughput", ran=True, target_met=False, detail="0/1", rows=[
        {"model": "resnet50", "batch": 64, "precision": "fp32", "neuron_over_pytorch": 0.9,
         "neuron": {"img_per_s": 900.0}, "pytorch": {"img_per_s": 1000.0}}], **common)
    (raw / "tests.log").write_text("log")
    out = tmp_path / "fetched"
    out.mkdir()
    with tarfile.open(out / "contact-tests-models.tar.gz", "w:gz") as t:
        for f in raw.iterdir():
            t.add(f, arcname="./" + f.name)
    return out


def test_import_writes_the_contracts(tmp_path):
    src = _fake_run(tmp_path)
    res = tmp_path / "results"
    r = subprocess.run([sys.executable, "-m", "bench.gpu.import_results", str(src),
                        "--results", str(res), "--no-readme-tables"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    c = json.loads((res / "gpu_contact.json").read_text())
    assert {"device", "date", "commit", "tests", "models"} <= set(c)
    assert c["device"] == "NVIDIA H100 80GB HBM3"
    assert c["tests"] == {"passed": 90, "failed": 1, "skipped": 2, "errors": 0}
    assert c["models"]["resnet50"]["loss_rel_err"] == 1e-6
    assert c["models"]["resnet50"]["param_max_rel_err"] == 2e-7
    assert c["models"]["vgg16"]["loss_rel_err"] is None and "error" in c["models"]["vgg16"]
    t = json.loads((res / "throughput.json").read_text())
    assert t["configs"]["resnet50:64:fp32"]["neuron_over_pytorch"] == 0.9
    assert (res / "gpu_raw" / "tests.log").exists() and (res / "gpu_contact.md").exists()
    st = c["stages"]
    # ran and target met apart; ok (older readers) only where both hold
    assert (st["tests"]["ran"], st["tests"]["target_met"], st["tests"]["ok"]) == \
        (True, False, False)
    assert (st["models"]["ran"], st["models"]["target_met"], st["models"]["ok"]) == \
        (False, True, False)
    assert "| tests | yes | NO |" in (res / "gpu_contact.md").read_text()


def test_verdict_line_says_ran_and_target_apart():
    from bench.gpu.kit import all_met, verdict_line
    assert verdict_line(True, False, "0/6") == "RAN, TARGET NOT MET: 0/6"
    assert verdict_line(True, True, "x") == "RAN, TARGET MET: x"
    assert verdict_line(False, None, "x") == "DID NOT RUN, NO TARGET JUDGED: x"
    assert all_met([True, None, True]) is True and all_met([True, False]) is False
    assert all_met([None, None]) is None and all_met([]) is None


def test_replay_argument_is_passed_only_where_the_executor_takes_it(monkeypatch):
    from bench.gpu import kit
    real = kit.executor_has_replay()
    assert kit.executor_kwargs(None) == {}
    assert kit.executor_kwargs("graph") == ({"replay": "graph"} if real else {})
    monkeypatch.setattr(kit, "executor_has_replay", lambda: True)
    assert kit.executor_kwargs("tape") == {"replay": "tape"}
    ran = {"ran": "tape", "eager_because": None, "tape_because": "no capture"}
    assert kit.replay_of(type("E", (), {"replay": ran})()) == "tape (no capture)"
    ran.update(ran="graph", tape_because=None)
    assert kit.replay_of(type("E", (), {"replay": ran})()) == "graph"
    monkeypatch.setattr(kit, "executor_has_replay", lambda: False)
    assert kit.executor_kwargs("graph") == {} and kit.replay_of(object()) == "off"


def test_table4_depths():
    from bench.gpu.deepest_run import table4_depth
    assert table4_depth(4292) == 4292 and table4_depth(10000) == 10001
    assert table4_depth(4293) == 4295


def test_profile_counts_device_activities_once_per_stream():
    """The trace's CPU operators carry no device time here; every kernel is kept, per stream,
    and overlapping streams are not double counted in the busy time."""
    from bench.gpu.profile_step import device_time_table
    ev = [{"ph": "X", "cat": "cpu_op", "name": "aten::conv2d", "ts": 0, "dur": 500},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 0, "dur": 5}]
    for i in range(30):         # 30 distinct kernels on stream 7, 10 us each, back to back
        ev.append({"ph": "X", "cat": "kernel", "name": f"k{i}", "ts": 100 + 10 * i, "dur": 10,
                   "args": {"stream": 7}})
    ev.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH", "ts": 100, "dur": 100,
               "args": {"stream": 13}})          # under stream 7's kernels: overlapping
    t = device_time_table(ev, steps=2)
    assert len(t["kernels"]) == 31
    assert t["per_stream"]["7"]["ms_per_step"] == pytest.approx(0.15)
    assert t["per_stream"]["13"]["ms_per_step"] == pytest.approx(0.05)
    assert t["device_ms_per_step"] == pytest.approx(0.2)
    assert t["busy_ms_per_step"] == pytest.approx(0.15)     # 100..400 us over 2 steps
    assert t["kernels"][0]["name"] == "Memcpy DtoH"


def test_a_command_deadline_stops_starting_stages(tmp_path):
    env = dict(os.environ, NEURON_CONTACT_DEVICE="cpu", NEURON_CONTACT_SMOKE="1",
               PYTHON=sys.executable, NEURON_KIT_DEADLINE_S="19")
    r = subprocess.run(["bash", os.path.join(KIT, "contact.sh"), str(tmp_path), "install"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert "[install] 0s: DID NOT RUN, NO TARGET JUDGED: " in r.stdout, r.stdout
    summary = json.loads((tmp_path / "summary-install.json").read_text())
    assert summary["stages"][0]["ran"] is False


def test_both_device_commands_run_in_smoke_mode_and_import(tmp_path):
    """Every stage of `first`, `second` and `third` on the CPU through the driver, then the
    importer's contracts from what they wrote: throughput.json, deepest_gpu.json,
    pressure.json."""
    pytest.importorskip("torch")
    env = dict(os.environ, NEURON_CONTACT_DEVICE="cpu", NEURON_CONTACT_SMOKE="1",
               PYTHON=sys.executable, NEURON_KIT_DEADLINE_S="900")
    out = tmp_path / "out"
    r = subprocess.run(["bash", os.path.join(KIT, "contact.sh"), str(out), "first", "second",
                        "third"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    summary = json.loads((out / "summary-first-second-third.json").read_text())
    got = {s["stage"]: s for s in summary["stages"]}
    assert list(got) == ["replay_tests", "throughput", "deepest", "mixed_tests",
                         "throughput_mixed", "pressure", "profile_step", "codec_tests",
                         "deepest_offload", "nccl", "simulator"]
    for name, st in got.items():
        assert st["ran"], (name, st["verdict"])
        assert st["verdict"].startswith("RAN, "), st["verdict"]
    assert got["codec_tests"]["target_met"] is None         # every GPU test skipped here
    assert got["mixed_tests"]["target_met"] is None
    assert got["profile_step"]["target_met"] is None        # a diagnosis
    res = tmp_path / "results"
    r = subprocess.run([sys.executable, "-m", "bench.gpu.import_results", str(out), "--results",
                        str(res), "--no-readme-tables", "--allow-smoke"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    t = json.loads((res / "throughput.json").read_text())
    assert set(t["configs"]) == {"resnet_cifar:4:fp32", "resnet_cifar:4:tf32",
                                 "resnet_cifar:4:bf16", "resnet_cifar:4:fp16"}
    for key, c in t["configs"].items():
        assert c["neuron_over_pytorch"] > 0 and c["neuron_mode"] in ("off", "off+fuse")
        # the kit runs graph replay, fp32 and TF32 fused and not (eager on the CPU, which
        # captures no graph)
        assert set(c["neuron_img_per_s_by_mode"]) == (
            {"off"} if key.endswith(("bf16", "fp16")) else {"off", "off+fuse"}), key
    d = json.loads((res / "deepest_gpu.json").read_text())
    assert len(d["runs"]) == 2 and len(d["pytorch"]) == 2
    for row in d["runs"]:
        assert {"device", "date", "commit", "depth", "batch", "budget_bytes", "offload_params",
                "compress", "replay", "seconds_per_iter", "tensor_peak_bytes",
                "planned_tensor_peak_bytes"} <= set(row)
        assert row["seconds_per_iter"] > 0 and row["replay"] in ("off", "tape", "graph")
        assert row["tensor_peak_bytes"] == row["planned_tensor_peak_bytes"]
    assert {(r["offload_params"], r["compress"], r["planner"]) for r in d["runs"]} == \
        {(True, None, "sublinear-sqrt"), (True, 4, "superneurons:compress=4")}
    assert {p["mode"] for p in d["pytorch"]} == {"eager", "checkpoint"}
    assert all(p["seconds_per_iter"] > 0 for p in d["pytorch"])
    p = json.loads((res / "pressure.json").read_text())
    assert {"device", "date", "commit", "configs"} <= set(p)
    (key, cfg), = p["configs"].items()
    assert key == "resnet_cifar:4" and cfg["unbudgeted_s"] > 0
    assert cfg["pytorch_checkpoint"]["batch"] == 2 and cfg["pytorch_checkpoint"]["img_per_s"] > 0
    assert set(cfg["runs"]) == {"planner=superneurons", "policy=superneurons",
                                "policy=superneurons:ahead=auto", "planner=capuchin",
                                "planner=superneurons:compress=4"}
    for name, run in cfg["runs"].items():
        assert {"seconds_per_iter", "overhead", "img_per_s", "hidden_copy_fraction",
                "moved_bytes", "planned_moved_bytes"} <= set(run), name
        # on the CPU every run follows its plan exactly, bytes moved included
        assert run["moved_bytes"] == run["planned_moved_bytes"], name
    assert cfg["runs"]["policy=superneurons"]["moved_bytes"] > 0
    c = json.loads((res / "gpu_contact.json").read_text())
    assert set(c["stages"]) == set(got)


def test_import_refuses_smoke_runs(tmp_path):
    from bench.gpu.kit import write_stage
    write_stage(str(tmp_path), "tests", ran=True, target_met=True, detail="1 passed",
                device="cpu", smoke=True,
                tests={"passed": 1, "failed": 0, "skipped": 0, "errors": 0})
    r = subprocess.run([sys.executable, "-m", "bench.gpu.import_results",
                        str(tmp_path), "--results", str(tmp_path / "res"),
                        "--no-readme-tables"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode != 0 and "smoke" in r.stderr


SIM_ROW_KEYS = {"model", "policy", "budget_bytes", "simulated_s", "measured_s", "rel_error",
                "simulated_serial_s", "serial_rel_error", "cost_model", "profile"}


def test_simulator_stage_contract(tmp_path):
    _run_stage("simulator", tmp_path)
    d = _stage_json(tmp_path, "simulator")
    assert d["ran"], d["verdict"]
    assert [r["policy"] for r in d["rows"]] == ["liveness", "superneurons"]
    for r in d["rows"]:
        assert SIM_ROW_KEYS <= set(r), SIM_ROW_KEYS - set(r)
        assert r["simulated_s"] > 0 and r["measured_s"] > 0
        assert r["cost_model"] == "serial" and r["serial_rel_error"] is None    # CPU: serial
        assert (tmp_path / r["profile"]).exists()
    assert d["profiles"] == ["profile_resnet_cifar_b2_16_cpu.json"]
    prof = json.loads((tmp_path / d["profiles"][0]).read_text())
    assert prof["format"] == "neuron-profile-2" and prof["batch"] == 2
    assert "max |error|" in d["verdict"] and "target 10%" in d["verdict"]
    assert d["provenance"]["device"].startswith("CPU") and d["errors"] == []


def test_simulator_verdict():
    from bench.gpu import simulator as G
    rows = [{"rel_error": 0.071, "serial_rel_error": -0.182, "cost_model": "pipelined"},
            {"rel_error": -0.02, "serial_rel_error": 0.05, "cost_model": "pipelined"}]
    ok, v, s = G.verdict_of(rows, [], 0.05)
    assert ok and v.startswith("pipelined model: max |error| 7.1% (serial 18.2%); target 5%: "
                               "NOT met") and not s["target_met"]
    ok, v, s = G.verdict_of(rows[1:], [{"model": "densenet121", "error": "x"}], 0.05)
    assert not ok and "target 5%: met" in v and "densenet121" in v and s["target_met"]
    ok, v, _ = G.verdict_of([], [{"model": "resnet50", "error": "OutOfMemoryError: y"}], 0.05)
    assert not ok and v.startswith("no model measured") and "OutOfMemoryError" in v


def test_driver_runs_the_simulator_stage(tmp_path):
    env = dict(os.environ, NEURON_CONTACT_DEVICE="cpu", NEURON_CONTACT_SMOKE="1",
               PYTHON=sys.executable)
    r = subprocess.run(["bash", os.path.join(KIT, "contact.sh"), str(tmp_path),
                        "simulator"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0 and "[simulator]" in r.stdout, r.stdout + r.stderr
    with tarfile.open(tmp_path / "contact-simulator.tar.gz") as t:
        names = {os.path.basename(n) for n in t.getnames()}
    assert {"simulator.json", "simulator.log", "profile_resnet_cifar_b2_16_cpu.json"} <= names


def test_import_simulator_stage_keeps_the_cpu_list(tmp_path):
    TESTS = {"passed": 90, "failed": 0, "skipped": 2, "errors": 0}
    raw = tmp_path / "raw"
    _run_stage("simulator", raw)
    stage = json.loads((raw / "simulator.json").read_text())
    src = tmp_path / "fetched"
    src.mkdir()
    with tarfile.open(src / "contact-simulator.tar.gz", "w:gz") as t:
        for f in raw.iterdir():
            t.add(f, arcname="./" + f.name)
    res = tmp_path / "results"
    res.mkdir()
    cpu_rows = [{"model": "resnet50 b8 112x112", "policy": "liveness", "budget_bytes": None,
                 "simulated_s": 1.68, "measured_s": 1.73, "rel_error": -0.03,
                 "cost_model": "serial", "simulated_serial_s": None, "serial_rel_error": None}]
    (res / "simulator_error.json").write_text(json.dumps(
        {"cpu": cpu_rows, "gpu": [], "cpu_provenance": {"commit": "abc", "device": "CPU x"}}))
    (res / "gpu_contact.json").write_text(json.dumps(
        {"device": "H100", "date": "2026-11-23", "commit": "abc", "tests": TESTS,
         "models": {}, "stages": {"tests": {
            "ok": True, "verdict": "OK"}}}))
    cmd = [sys.executable, "-m", "bench.gpu.import_results", str(src),
           "--results", str(res), "--no-readme-tables"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert r.returncode != 0 and "smoke" in r.stderr           # a CPU smoke run is no GPU result
    r = subprocess.run(cmd + ["--allow-smoke", "--commit", "0123456789abcdef"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    se = json.loads((res / "simulator_error.json").read_text())
    assert se["cpu"] == cpu_rows and se["cpu_provenance"]["commit"] == "abc"
    assert se["gpu"] == stage["rows"] and len(se["gpu"]) == 2
    assert se["gpu_provenance"]["commit"] == "0123456789ab"
    assert se["gpu_provenance"]["kit"]["stage"] == "simulator"
    md = (res / "simulator_error.md").read_text()
    assert "(cpu)" in md and "(gpu)" in md
    assert (res / "profile_resnet_cifar_b2_16_cpu.json").exists()
    assert (res / "gpu_raw" / "simulator.json").exists()
    # the stage alone (a command of its own) keeps the earlier commands' contact results
    c = json.loads((res / "gpu_contact.json").read_text())
    assert c["tests"] == TESTS and set(c["stages"]) == {"tests", "simulator"}


def test_the_models_and_simulator_stages_take_their_gpu_branches_on_the_standins(
        tmp_path, gpu_kernels):
    """`--device cuda` through the kit's own code (make_device("cuda"), CUDA-event profiles,
    the pipelined clock, the GPU's cost-model entry), on the CPU: a crash there would cost a
    lent GPU's minutes. The numbers are the stand-ins' (NumPy), so only the contracts count."""
    from bench.gpu import models as gpu_models
    from bench.gpu import simulator as gpu_simulator
    assert gpu_models.main(["--out", str(tmp_path), "--device", "cuda", "--smoke"]) == 0
    d = _stage_json(tmp_path, "models")
    assert d["ran"] and d["target_met"], d["verdict"]
    assert gpu_simulator.main(["--out", str(tmp_path), "--device", "cuda", "--smoke"]) == 0
    d = _stage_json(tmp_path, "simulator")
    assert d["errors"] == [] and [r["policy"] for r in d["rows"]] == ["liveness", "superneurons"]
    for r in d["rows"]:
        assert r["cost_model"] == "pipelined" and r["serial_rel_error"] is not None
    assert d["profiles"] == ["profile_resnet_cifar_b2_16_h100.json"]
    assert "target 5%" in d["verdict"]


def test_nccl_stage_contract(tmp_path):
    # on the CPU the same path runs on MPI: plain, data-parallel at world size 1, blocking
    _run_stage("nccl", tmp_path)
    d = _stage_json(tmp_path, "nccl")
    assert d["ran"] and d["target_met"] is None, d["verdict"]
    assert "world size 1" in d["verdict"] and "blocking" in d["verdict"]
    assert d["probe"]["mpi4py"].startswith("MPICH") and d["probe"]["mpiexec"]
    r = d["result"]
    assert r["dp_1"]["world_size"] == 1 and r["plain"]["world_size"] == 1
    assert r["dp_1"]["overlap"] and not r["dp_1_no_overlap"]["overlap"]
    assert r["dp_1"]["allreduce_calls_per_iter"] > 0       # the path runs its collectives
    r_dp1 = r["dp_1"]
    assert "--ranks" in d["argv"] and "| plain |" in d["markdown"]
    # the importer turns it into data_parallel_gpu.{json,md} and keeps the other stages
    res = tmp_path / "results"
    res.mkdir()
    (res / "gpu_contact.json").write_text(json.dumps(
        {"device": "H100", "date": "2026-11-23", "commit": "abc", "models": {},
         "tests": {"passed": 1, "failed": 0, "skipped": 0, "errors": 0},
         "stages": {"tests": {"ok": True, "verdict": "OK"}}}))
    r = subprocess.run([sys.executable, "-m", "bench.gpu.import_results",
                        str(tmp_path), "--results", str(res), "--no-readme-tables",
                        "--allow-smoke"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    imported = json.loads((res / "data_parallel_gpu.json").read_text())
    assert imported["dp_1"] == r_dp1 and imported["kit"]["verdict"] == d["verdict"]
    assert "| plain |" in (res / "data_parallel_gpu.md").read_text()
    assert set(json.loads((res / "gpu_contact.json").read_text())["stages"]) == {"tests", "nccl"}


def test_data_parallel_direct_launch_is_one_rank(capsys):
    # no launcher: the one rank starts as a plain process (MPI as a singleton here; NCCL on a
    # GPU bootstraps without MPI); more ranks than one need mpiexec
    from bench import data_parallel as DP
    args = DP.parse_args(["--model", "resnet_cifar", "--depth", "8", "--batch", "2",
                          "--iters", "1", "--warmup", "1", "--launcher", "direct"])
    r = DP.launch(args, "dp", 1)
    assert r["world_size"] == 1 and r["allreduce_calls_per_iter"] > 0
    with pytest.raises(SystemExit, match="a direct launch runs one rank, not 2"):
        DP.launcher("direct", 2)
    assert DP.launcher("auto", 1)[0] in ("mpiexec", "direct")


def test_local_bootstrap_is_a_world_of_one():
    from neuron.distributed.comm import LocalComm, make_comm
    c = make_comm("local")
    assert isinstance(c, LocalComm) and (c.rank, c.world_size) == (0, 1)
    assert c.bcast_object({"uid": 7}) == {"uid": 7}
    with pytest.raises(ValueError, match="unknown NCCL bootstrap 'tcp'"):
        make_comm("nccl", device="cuda", bootstrap="tcp")


def test_first_divergence_names_the_step_where_a_run_left_its_plan():
    pytest.importorskip("torch")
    from bench.gpu.runs import first_divergence
    from neuron.executor import TraceRow
    plan = [TraceRow(i, f"l{i}", "F", 100 * i, i) for i in range(5)]
    assert first_divergence(plan, list(plan)) is None
    ran = list(plan)
    ran[3] = TraceRow(3, "l3", "F", 250, 3, workspace_bytes=7)       # an unplanned eviction
    ran[4] = TraceRow(4, "l4", "F", 350, 4)
    d = first_divergence(plan, ran)
    assert d["position"] == 3 and d["steps_differing"] == 2 and d["steps"] == 5
    assert d["planned"]["bytes_in_use"] == 300 and d["ran"]["bytes_in_use"] == 250
    # a workspace of another size (chosen under free memory on the GPU) is no divergence
    ws = [TraceRow(i, f"l{i}", "F", 100 * i, i, workspace_bytes=64) for i in range(5)]
    assert first_divergence(plan, ws) is None
    assert first_divergence(plan, plan[:4])["position"] == 4         # a run cut short
