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

STAGE_KEYS = {"stage", "ok", "verdict", "device", "date", "commit", "smoke", "command"}


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
    assert got["env"]["ok"] and got["install"]["ok"] and not got["nonsense"]["ok"]
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
    assert d["ok"] and d["deterministic"]["ok"]
    for name, m in d["models"].items():
        assert m["loss_rel_err"] == 0.0 and m["param_max_rel_err"] == 0.0, name


def test_models_comparison_catches_a_wrong_kernel(monkeypatch):
    """The tolerance is not vacuous: a ReLU backward 2% off fails it."""
    from bench.gpu import models as gpu_models
    from neuron.kernels import numpy_ref

    good = gpu_models.reference_device

    def wrong_device(arena):
        dev = good(arena)
        k = gpu_models.hash_dropout_kernels()

        def relu_backward(y, dy, dx):
            numpy_ref.relu_backward(y, dy, dx)
            dx *= np.float32(1.02)

        k.relu_backward = relu_backward
        type(dev)._k = k
        return dev

    monkeypatch.setattr(gpu_models, "_device_under_test", lambda kind, g, b: wrong_device(1 << 26))
    r = gpu_models.compare_one("resnet_cifar", 8, 2, (3, 16, 16), "cpu")
    monkeypatch.setattr(gpu_models, "reference_device", good)
    assert not r["ok"] and r["update_max_rel_err"] > gpu_models.UPDATE_TOL
    assert r["loss_rel_err"] == 0.0         # forward untouched


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
               "--warmup", "1")
    d = _stage_json(tmp_path, "throughput")
    assert d["ok"]
    (row,) = d["rows"]
    assert row["precision"] == "fp32" and row["neuron_over_pytorch"] > 0
    assert len(row["neuron"]["runs_img_per_s"]) == 2 == len(row["pytorch"]["runs_img_per_s"])


def test_throughput_refuses_a_protocol_below_the_issue(tmp_path):
    r = subprocess.run([sys.executable, "-m", "bench.gpu.throughput", "--out",
                        str(tmp_path), "--runs", "3"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode != 0 and "at least 5 runs" in r.stderr


def test_pool_stage_trains_with_malloc_pool(tmp_path):
    _run_stage("pool_vs_malloc", tmp_path)
    d = _stage_json(tmp_path, "pool")
    assert d["ok"], d["verdict"]
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


def test_pressure_stage_contract(tmp_path):
    pytest.importorskip("torch")
    _run_stage("pressure", tmp_path)
    d = _stage_json(tmp_path, "pressure")
    assert d["ok"], d["verdict"]
    assert d["batch"] == 2 * d["torch_eager"]["k"]
    nb = d["neuron_budget"]
    assert nb["fits"] and nb["budget_bytes"] == d["budget_bytes"]
    moved = nb["moved_per_iter"]
    assert moved["offload_bytes"] + moved["prefetch_bytes"] >= 0
    # the run's pool traffic next to its plan's: on the CPU the run follows the plan exactly
    # (on a GPU a difference shows the schedule it really ran, e.g. unplanned evictions)
    assert nb["pool_per_iter"] == nb["planned_pool_per_iter"]
    assert {"evictions", "evicted_bytes", "compactions"} <= set(nb["pool_per_iter"])
    # the planners run beside the policy by default, each following its own plan; at the
    # policy's own minimum budget the superneurons planner fits (the policy's plan is one of its
    # candidates), another planner may not (a row that says why)
    assert set(d["planners"]) == {"superneurons", "capuchin"}
    assert d["planners"]["superneurons"]["fits"]
    for r in d["planners"].values():
        if r["fits"]:
            assert r["pool_per_iter"] == r["planned_pool_per_iter"], r
        else:
            assert r["error"].startswith("MemoryBudgetError: step "), r


def test_hidden_fraction():
    from bench.gpu import pressure as G
    bw = {"h2d": 1e9, "d2h": 1e9}
    assert G.hidden_fraction(1.0, 1.0, 1e9, 0, bw) == 1.0          # nothing lost: all hidden
    assert G.hidden_fraction(2.0, 1.0, 1e9, 0, bw) == 0.0          # lost the whole copy time
    assert G.hidden_fraction(1.25, 1.0, 5e8, 5e8, bw) == pytest.approx(0.75)
    assert G.hidden_fraction(1.0, 1.0, 0, 0, bw) is None


@pytest.mark.slow
def test_confirm_stage_contract(tmp_path):
    pytest.importorskip("torch")
    _run_stage("confirm", tmp_path, timeout=400)
    d = _stage_json(tmp_path, "confirm")
    assert d["ok"], d["verdict"]
    for part in ("widest", "deepest"):
        p = d["parts"][part]
        assert p["run"]["fits"] and p["peak"]["equal"], p
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
    write_stage(str(raw), "tests", True, "OK", tests={"passed": 90, "failed": 1, "skipped": 2,
                                                      "errors": 0}, failures=[], **common)
    write_stage(str(raw), "models", False, "FAIL", models={
        "resnet50": {"loss_rel_err": 1e-6, "param_max_rel_err": 2e-7,
                     "update_max_rel_err": 1e-4, "ok": True},
        "vgg16": {"ok": False, "error": "CudnnError: x", "loss_rel_err": None,
                  "param_max_rel_err": None}}, **common)
    write_stage(str(raw), "throughput", True, "OK", rows=[
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


def test_import_refuses_smoke_runs(tmp_path):
    from bench.gpu.kit import write_stage
    write_stage(str(tmp_path), "tests", True, "OK", device="cpu", smoke=True,
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
    assert d["ok"], d["verdict"]
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
    assert not ok and v.startswith("FAIL") and "OutOfMemoryError" in v


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
    assert d["ok"], d["verdict"]
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
    assert d["ok"], d["verdict"]
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
