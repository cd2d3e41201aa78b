"""Every numeric option of every command goes through neuron/cli/args.py and refuses NaN,
infinities, fractions where an integer is meant, and values out of its range: one line naming
the option, exit 2, before any work."""
import argparse

import pytest

from neuron.cli import args as cli_args
from neuron.cli.main import build_parser, main

# what each command needs besides the option under test
REQUIRED = {"profile": ["resnet_cifar", "-o", "p.json"], "deepest": ["resnet_cifar", "--budget",
                                                                      "1GiB"],
            "widest": ["resnet_cifar", "--budget", "1GiB"], "models": []}


def _commands():
    ap = build_parser()
    sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices


def _options():
    for cmd, p in _commands().items():
        for a in p._actions:
            if a.option_strings:
                yield cmd, a


def test_every_numeric_option_is_checked_in_one_place():
    numeric = []
    for cmd, a in _options():
        is_number = isinstance(a.default, (int, float)) and not isinstance(a.default, bool)
        if a.type is not None or is_number:
            assert getattr(a.type, "__module__", None) == cli_args.__name__, \
                f"{cmd} {a.option_strings[0]}: type {a.type!r} is not from neuron.cli.args"
        if hasattr(a.type, "kind"):
            numeric.append(a.option_strings[-1])
    for name in ("--link-gbps", "--search-seconds", "--lr", "--batch", "--seed", "--chunks",
                 "--dp-timeout", "--bucket-mb", "--top", "--repeat"):
        assert name in numeric, name


def _bad_values(conv):
    bad = ["x", ""]
    if conv.kind is float:
        bad += ["nan", "inf", "-inf"]
    else:
        bad += ["1.5", "nan"]
    if conv.low is not None:
        bad.append(repr(conv.low) if conv.low_open else repr(conv.low - 1))
    if conv.high is not None:
        bad.append(repr(conv.high) if conv.high_open else repr(conv.high + 1))
    return bad


def _cases():
    for cmd, a in _options():
        if hasattr(a.type, "kind"):
            for v in _bad_values(a.type):
                yield pytest.param(cmd, a.option_strings[-1], v,
                                   id=f"{cmd}{a.option_strings[-1]}={v}")


@pytest.mark.parametrize("cmd,option,value", list(_cases()))
def test_a_bad_number_is_one_usage_line_naming_the_option(capsys, cmd, option, value):
    argv = [cmd, *REQUIRED.get(cmd, ["resnet_cifar"]), f"{option}={value}"]
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    lines = [l for l in err.strip().splitlines() if not l.startswith(("usage:", " "))]
    assert len(lines) == 1, err
    assert f"argument {option}" in lines[0] and repr(value) in lines[0], err


def test_good_numbers_pass_through_as_numbers():
    a = build_parser().parse_args(["plan", "resnet_cifar", "--link-gbps", "25", "--search-seconds",
                                   "0.5", "--chunks", "auto", "--budget", "1GiB", "--seed", "3"])
    assert a.link_gbps == 25.0 and a.search_seconds == 0.5 and a.chunks == "auto"
    assert a.budget == "1GiB" and a.seed == 3


@pytest.mark.parametrize("argv,fragment", [
    (["--budget", "12XB"], "argument --budget: cannot parse size '12XB'"),
    (["--budget", "0"], "argument --budget: size must be at least 1 byte"),
    (["--host-budget", "nan"], "argument --host-budget: cannot parse size 'nan'"),
])
def test_byte_sizes_are_checked_when_parsed(capsys, argv, fragment):
    with pytest.raises(SystemExit) as e:
        main(["plan", "resnet_cifar", "--depth", "8", *argv])
    assert e.value.code == 2
    assert fragment in capsys.readouterr().err


def test_an_empty_checkpoint_or_resume_path_is_a_usage_error(capsys):
    for opt in ("--checkpoint", "--resume"):
        with pytest.raises(SystemExit) as e:
            main(["train", "resnet_cifar", "--depth", "8", "--iters", "1", opt, ""])
        assert e.value.code == 2
        assert f"argument {opt}: needs a file name" in capsys.readouterr().err


PRECISION_COMMANDS = ("train", "plan", "memory", "deepest", "widest", "profile")


@pytest.mark.parametrize("opt, default, words, bad, choices, good, want", [
    ("--precision", "fp32", ("bf16", "docs/precision.md"), "half", "fp32, tf32, bf16, fp16",
     "bf16", "bf16"),
    ("--layout", "nchw", ("nhwc", "channels last"), "nwhc", "nchw, nhwc", "NHWC", "nhwc"),
])
def test_every_planning_and_training_command_takes_a_checked_choice(capsys, opt, default, words,
                                                                     bad, choices, good, want):
    cmds = _commands()
    for cmd in PRECISION_COMMANDS:
        a = next(a for a in cmds[cmd]._actions if opt in a.option_strings)
        assert a.type.__module__ == cli_args.__name__ and a.default == default
        assert all(w in a.help for w in words), (cmd, a.help)
        argv = [cmd, *REQUIRED.get(cmd, ["resnet_cifar"]), opt, bad]
        with pytest.raises(SystemExit) as e:
            build_parser().parse_args(argv)
        assert e.value.code == 2
        assert f"argument {opt}: must be one of {choices}, got '{bad}'" in \
            capsys.readouterr().err
    assert getattr(build_parser().parse_args(["plan", "resnet_cifar", opt, good]),
                   opt[2:]) == want


def test_plan_reports_bytes_by_type(capsys):
    import json
    assert main(["plan", "resnet_cifar", "--depth", "8", "--precision", "bf16",
                 "--no-min-budget", "--json"]) == 0
    out = capsys.readouterr().out
    assert "at the peak by type (bf16): bfloat16" in out and "all tensors by type" in out
    r = json.loads(out.strip().splitlines()[-1])
    assert r["precision"] == "bf16" and set(r["bytes_by_dtype"]) == {"bfloat16", "float32"}


def test_plan_at_nhwc_reports_the_layout_and_the_same_bytes(capsys):
    import json
    reports = {}
    for layout in ("nchw", "nhwc"):
        assert main(["plan", "resnet_cifar", "--depth", "8", "--layout", layout,
                     "--no-min-budget", "--json"]) == 0
        out = capsys.readouterr().out
        assert ("layout nhwc" in out) == (layout == "nhwc")
        reports[layout] = json.loads(out.strip().splitlines()[-1])
    assert reports["nhwc"]["layout"] == "nhwc"
    assert reports["nhwc"]["peak_bytes"] == reports["nchw"]["peak_bytes"]
