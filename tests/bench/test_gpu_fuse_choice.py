"""bench/gpu/fuse_choice.py: the deepest stage runs fused only where this command's replay
tests all passed and fused graph replay beat unfused on every ResNet-50 row measured."""
import json
import subprocess
import sys

from bench.gpu.fuse_choice import fuse_choice


def _write(tmp_path, tests_met, rows):
    (tmp_path / "replay_tests.json").write_text(json.dumps({"target_met": tests_met}))
    (tmp_path / "throughput.json").write_text(json.dumps({"rows": rows}))


def _row(batch, plain, fused, model="resnet50"):
    return {"model": model, "batch": batch, "precision": "fp32",
            "neuron": {"graph": {"img_per_s": plain}, "graph+fuse": {"img_per_s": fused}}}


def test_fused_only_where_every_resnet50_row_gained_and_the_tests_passed(tmp_path):
    _write(tmp_path, True, [_row(64, 900, 950), _row(128, 970, 1000), _row(64, 800, 700, "vgg16")])
    assert fuse_choice(str(tmp_path))[0] is True
    _write(tmp_path, True, [_row(64, 900, 950), _row(128, 970, 960)])
    fuse, why = fuse_choice(str(tmp_path))
    assert fuse is False and "0.990x" in why
    _write(tmp_path, None, [_row(64, 900, 950)])            # the GPU tests were skipped
    assert fuse_choice(str(tmp_path))[0] is False
    _write(tmp_path, True, [{"model": "resnet50", "batch": 64, "neuron": {"graph": {}}}])
    assert fuse_choice(str(tmp_path)) == (
        False, "unfused: no ResNet-50 row measured graph and graph+fuse")


def test_the_command_prints_the_flag_or_nothing(tmp_path):
    _write(tmp_path, True, [_row(64, 900, 950)])
    run = lambda: subprocess.run([sys.executable, "-m", "bench.gpu.fuse_choice", str(tmp_path)],
                                 capture_output=True, text=True)
    r = run()
    assert r.returncode == 0 and r.stdout.strip() == "--fuse" and "fused:" in r.stderr
    (tmp_path / "replay_tests.json").unlink()
    r = run()
    assert r.returncode == 0 and r.stdout == "" and "unfused" in r.stderr


def test_throughput_is_fused_too_only_after_the_replay_tests_passed(tmp_path):
    run = lambda: subprocess.run([sys.executable, "-m", "bench.gpu.fuse_choice", "--tests",
                                  str(tmp_path)], capture_output=True, text=True)
    _write(tmp_path, True, [])
    assert run().stdout.strip() == "both"
    _write(tmp_path, False, [])
    assert run().stdout.strip() == "off"
    (tmp_path / "replay_tests.json").unlink()
    assert run().stdout.strip() == "off"
