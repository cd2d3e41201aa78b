"""The `neuron` command, run in-process through neuron.cli.main.main (and once as
python -m neuron)."""
import json
import os
import subprocess
import sys


from neuron.cli.main import main

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
SMALL = ["resnet_cifar", "--depth", "8"]


def run(capsys, *argv):
    """(exit code, stdout, stderr); argparse's own errors exit through SystemExit."""
    try:
        rc = main(list(argv))
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def last_json(out):
    lines = [l for l in out.strip().splitlines() if l.strip()]
    assert lines, "no output"
    return json.loads(lines[-1])


# ---------------------------------------------------------------- models / summary
def test_models(capsys):
    rc, out, err = run(capsys, "models")
    assert rc == 0
    names = out.split()
    assert "resnet_cifar" in names and "alexnet" in names
    assert names == sorted(names)
    rc, out, _ = run(capsys, "models", "--json")
    assert rc == 0
    assert last_json(out)["models"] == names


def test_summary_json(capsys):
    from neuron.models import build_model
    rc, out, err = run(capsys, "summary", *SMALL, "--batch", "2", "--json")
    assert rc == 0, err
    info = last_json(out)
    assert {"layers", "params", "steps"} <= info.keys()
    assert info["params"] == build_model("resnet_cifar", depth=8).num_params()
    names = [l["name"] for l in info["layers"]]
    assert names[0] == "data" and "fc" in names and names[-1] == "loss"
    for l in info["layers"]:
        assert l["output_shape"][0] == 2 if l["output_shape"] else True
    phases = [s["phase"] for s in info["steps"]]
    nf = phases.count("F")
    assert phases == ["F"] * nf + ["B"] * (len(phases) - nf)
    assert all(s["bytes"] > 0 for s in info["steps"] if s["layer"] not in ("labels",))
    assert info["max_step_resident_bytes"] == max(s["bytes"] for s in info["steps"])


def test_summary_text(capsys):
    rc, out, err = run(capsys, "summary", *SMALL, "--batch", "2")
    assert rc == 0, err
    assert "parameters" in out.splitlines()[-1]
    assert "layer1.0.conv1" in out


# ---------------------------------------------------------------- train
def test_train_synthetic_json(capsys):
    rc, out, err = run(capsys, "train", *SMALL, "--dataset", "synthetic", "--iters", "2",
                       "--batch", "4", "--no-progress", "--json", "--device", "cpu")
    assert rc == 0, err
    r = last_json(out)
    assert {"final_loss", "images_per_sec", "peak_bytes"} <= r.keys()
    assert r["iterations"] == 2
    assert 0 < r["final_loss"] < 10
    assert r["images_per_sec"] > 0
    assert r["peak_bytes"] == r["planned_peak_bytes"] > 0
    assert "test_accuracy" not in r           # synthetic data has no test split
    assert "final loss" in out.splitlines()[0]
    assert r["wall_seconds"] >= r["seconds"] > 0      # the whole command against the loop
    assert f"{r['wall_seconds']:.1f} s wall clock" in out.splitlines()[0]


def test_resume_without_checkpoint_goes_on_saving_to_the_resumed_file(capsys, tmp_path):
    from neuron.checkpoint import load_checkpoint
    ckpt = str(tmp_path / "c.npz")
    base = ["train", *SMALL, "--batch", "4", "--no-progress", "--device", "cpu"]
    rc, out, err = run(capsys, *base, "--iters", "2", "--checkpoint", ckpt)
    assert rc == 0, err
    assert load_checkpoint(ckpt)[1]["iteration"] == 2
    rc, out, err = run(capsys, *base, "--iters", "4", "--resume", ckpt)
    assert rc == 0, err
    assert load_checkpoint(ckpt)[1]["iteration"] == 4
    assert f"state saved to {ckpt}" in out


def test_train_digits_reports_test_accuracy(capsys, tmp_path):
    ckpt = tmp_path / "c.npz"
    rc, out, err = run(capsys, "train", *SMALL, "--dataset", "digits", "--iters", "2",
                       "--batch", "16", "--no-progress", "--json", "--device", "cpu",
                       "--checkpoint", str(ckpt))
    assert rc == 0, err
    r = last_json(out)
    assert 0.0 <= r["test_accuracy"] <= 1.0
    assert "test_loss" in r and r["dataset"] == "digits"
    assert ckpt.exists()
    # resume to 3 iterations from the checkpoint: one more step
    rc, out, err = run(capsys, "train", *SMALL, "--dataset", "digits", "--iters", "3",
                       "--batch", "16", "--no-progress", "--json", "--device", "cpu",
                       "--resume", str(ckpt))
    assert rc == 0, err
    assert last_json(out)["iterations"] == 1


# ---------------------------------------------------------------- user errors
def _assert_user_error(rc, err, *fragments):
    assert rc == 2
    assert "Traceback" not in err
    for f in fragments:
        assert f in err, (f, err)


def test_unknown_model(capsys):
    rc, out, err = run(capsys, "summary", "nosuchnet")
    _assert_user_error(rc, err, "unknown model", "nosuchnet", "resnet_cifar")
    rc, out, err = run(capsys, "train", "nosuchnet", "--iters", "1", "--no-progress")
    _assert_user_error(rc, err, "nosuchnet")


def test_bad_budget(capsys):
    rc, out, err = run(capsys, "train", *SMALL, "--budget", "12XB", "--iters", "1",
                       "--no-progress")
    _assert_user_error(rc, err, "12XB")


def test_budget_too_small(capsys):
    rc, out, err = run(capsys, "train", *SMALL, "--batch", "2", "--budget", "64KiB",
                       "--iters", "1", "--no-progress", "--device", "cpu")
    _assert_user_error(rc, err, "bytes", "budget")


def test_nonexistent_dataset_dir(capsys, tmp_path):
    missing = tmp_path / "no_such_dir"
    for spec in (f"cifar10:{missing}", f"mnist:{missing}"):
        rc, out, err = run(capsys, "train", *SMALL, "--dataset", spec, "--iters", "1",
                           "--no-progress")
        _assert_user_error(rc, err, str(missing))


def test_unknown_dataset(capsys):
    rc, out, err = run(capsys, "train", *SMALL, "--dataset", "imagenet", "--iters", "1",
                       "--no-progress")
    _assert_user_error(rc, err, "imagenet")


def test_missing_depth(capsys):
    rc, out, err = run(capsys, "summary", "resnet_cifar")
    _assert_user_error(rc, err, "depth")
    rc, out, err = run(capsys, "summary", "resnet_cifar", "--depth", "9")
    _assert_user_error(rc, err, "8", "14")      # names the nearest valid depths


def test_argparse_errors(capsys):
    rc, out, err = run(capsys, "train", *SMALL, "--iters", "0")
    _assert_user_error(rc, err, "--iters")
    rc, out, err = run(capsys)
    assert rc == 2 and "usage" in err
    rc, out, err = run(capsys, "frobnicate")
    assert rc == 2 and "frobnicate" in err
    rc, out, err = run(capsys, "train", *SMALL, "--iters", "1", "--epochs", "1")
    assert rc == 2 and "not allowed" in err


def test_unknown_policy(capsys):
    rc, out, err = run(capsys, "train", *SMALL, "--policy", "magic", "--iters", "1",
                       "--no-progress")
    _assert_user_error(rc, err, "magic")


# ---------------------------------------------------------------- python -m neuron
def test_python_m_neuron_help():
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run([sys.executable, "-m", "neuron", "--help"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    for cmd in ("train", "summary", "models"):
        assert cmd in p.stdout
    p = subprocess.run([sys.executable, "-m", "neuron", "models"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "resnet_cifar" in p.stdout


def test_train_at_fp16_reports_its_precision_and_loss_scale(capsys):
    rc, out, _ = run(capsys, "train", *SMALL, "--batch", "4", "--iters", "2", "--device", "cpu",
                     "--no-progress", "--precision", "fp16", "--json")
    assert rc == 0
    r = json.loads(out.strip().splitlines()[-1])
    assert r["precision"] == "fp16" and r["loss_scale"] == 2.0 ** 16
    assert r["overflow_skipped_steps"] == 0 and "precision fp16 (loss scale 65536" in out


def test_train_at_nhwc_reports_its_layout(capsys):
    rc, out, _ = run(capsys, "train", *SMALL, "--batch", "4", "--iters", "2", "--device", "cpu",
                     "--no-progress", "--layout", "nhwc", "--json")
    assert rc == 0
    r = json.loads(out.strip().splitlines()[-1])
    assert r["layout"] == "nhwc" and ", layout nhwc" in out


def test_fuse_option_plans_and_trains_fused(capsys):
    """--fuse: plan names the fused pairs and the bytes saved; train runs them (default off)."""
    import pytest
    _json, _main = json, main
    assert _main(["plan", "resnet_cifar", "--depth", "8", "--batch", "4", "--no-min-budget",
                  "--fuse", "--json"]) == 0
    out = capsys.readouterr().out
    r = _json.loads(out.strip().splitlines()[-1])
    assert "4 BatchNorm+ReLU pairs as BNReLU and 3 Add+ReLU pairs as AddReLU layers" in out
    assert r["fuse"] and len(r["fused_layers"]) == 7 and r["fused_tensor_bytes"] > 0
    assert r["fused_counts"] == {"BNReLU": 4, "AddReLU": 3}
    assert r["peak_bytes"] <= r["unfused_unbounded_peak_bytes"]
    assert _main(["plan", "resnet_cifar", "--depth", "8", "--batch", "4", "--no-min-budget",
                  "--json"]) == 0
    assert "fuse" not in _json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert _main(["train", "resnet_cifar", "--depth", "8", "--batch", "4", "--iters", "2",
                  "--dataset", "synthetic", "--classes", "3", "--no-progress", "--fuse",
                  "--json"]) == 0
    res = _json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["fuse"] and res["fused_layers"] == 7
    for cmd in ("train", "plan", "memory", "deepest", "widest", "profile"):
        with pytest.raises(SystemExit):
            _main([cmd, "--help"])
        assert "--fuse" in capsys.readouterr().out, cmd
