"""`neuron memory` (neuron/views/memory_summary.py): the report's numbers come from the plan."""
import json

import pytest

from neuron.cli.main import main
from neuron.views.memory_summary import format_summary, memory_summary
from neuron.models import build_model
from neuron.plan import plan


def resnet8():
    return build_model("resnet_cifar", depth=8, in_shape=(3, 16, 16))


def test_summary_matches_the_plan_at_the_minimum_budget():
    g = resnet8()
    p = plan(g, 8, policy="superneurons", trace=False)
    budget = p["min_budget_bytes"]
    planned = plan(g, 8, policy="superneurons", budget=budget, trace=False)
    r = memory_summary(g, 8, policy="superneurons", top=3)
    assert r["arena_bytes"] == budget and r["arena_is_minimum"]
    assert r["peak_bytes"] == planned["peak_bytes"]
    assert r["bytes_by_kind_at_peak"] == {k: v for k, v in planned["bytes_by_kind"].items() if v}
    assert sum(r["bytes_by_kind_at_peak"].values()) == r["peak_bytes"]
    assert r["offload_bytes"] == planned["offload_bytes"]
    assert r["prefetch_bytes"] == planned["prefetch_bytes"]
    assert r["compactions"] == planned["compactions"]
    assert len(r["largest_tensors_at_peak"]) == 3
    # the fullest step is the peak's step, and holds the peak
    assert r["fullest_steps"][0]["most_bytes"] == r["peak_bytes"]
    assert r["fullest_steps"][0]["step"] == r["peak_step"]["step"]
    sizes = [t["bytes"] for t in r["largest_tensors_at_peak"]]
    assert sizes == sorted(sizes, reverse=True)
    f = r["fragmentation"]
    for d in (f["at_peak_step"], f["worst"]):
        assert 0 <= d["largest_free_block"] <= d["free_bytes"] <= budget
        assert 0.0 <= d["fragmentation"] <= f["worst"]["fragmentation"] <= 1.0


def test_report_text_names_the_peak_and_the_moves():
    r = memory_summary(resnet8(), 8, policy="offload", top=2)
    text = format_summary(r)
    for needle in ("bytes by kind at the peak", "largest tensors at the peak", "fragmentation",
                   "device -> host", "host -> device", "compactions",
                   r["largest_tensors_at_peak"][0]["name"]):
        assert needle in text


def test_cli_memory_json_and_a_budget_that_does_not_fit(capsys):
    assert main(["memory", "resnet_cifar", "--depth", "8", "--batch", "4", "--policy",
                 "liveness", "--json"]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # the arena is the minimum budget; workspaces may shrink there, so the peak can be lower
    # than in an unbounded arena, never higher than the arena
    assert r["arena_bytes"] == r["min_budget_bytes"] and r["arena_is_minimum"]
    assert r["peak_bytes"] <= r["arena_bytes"] and r["peak_bytes"] <= r["unbounded_peak_bytes"]
    assert main(["memory", "resnet_cifar", "--depth", "8", "--batch", "4", "--budget",
                 "64KiB"]) == 1
    out = capsys.readouterr().out
    assert "does NOT fit" in out and "the minimum budget is" in out


def _cli_json(capsys, args):
    rc = main(args)
    return rc, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.parametrize("model", ["resnet50", "densenet121", "vgg16"])
def test_plan_and_memory_report_the_same_numbers(model, capsys):
    """`plan --json` and `memory --json` for the same arguments: the same offloaded bytes,
    host peak and step count, at three budgets between the minimum budget and the unbounded
    peak, for the policy alone and for a planner that plans for the budget (capuchin); the
    figures of the plan for no budget (unbounded peak, minimum budget) do not move with
    --budget."""
    ref = plan(build_model(model), 2, policy="superneurons", trace=False)
    peak, least = ref["unbounded_peak_bytes"], ref["min_budget_bytes"]
    for planner in ("none", "capuchin"):
        unbounded, minimum, moved = set(), set(), 0
        for f in (0.2, 0.5, 0.8):
            budget = (least + int((peak - least) * f)) // 1024 * 1024
            args = [model, "--batch", "2", "--budget", str(budget), "--planner", planner,
                    "--json"]
            rc_p, p = _cli_json(capsys, ["plan", *args, "--no-min-budget"])
            rc_m, m = _cli_json(capsys, ["memory", *args])
            where = f"{model} --planner {planner} --budget {budget}"
            assert rc_p == rc_m == 0 and p["fits"] and m["fits"], where
            for key in ("offload_bytes", "prefetch_bytes", "host_peak_bytes", "num_steps",
                        "peak_bytes", "unbounded_peak_bytes", "extra_forward_steps"):
                assert p[key] == m[key], f"{where}: {key} plan {p[key]} memory {m[key]}"
            assert m["peak_step"]["of"] == p["num_steps"], where
            unbounded.add(p["unbounded_peak_bytes"])
            minimum.add(m["min_budget_bytes"])
            moved += p["offload_bytes"]
        assert len(unbounded) == 1 and len(minimum) == 1, (model, planner, unbounded, minimum)
        assert moved > 0, f"{model} {planner}: nothing offloaded at any budget (a vacuous check)"
        if planner == "none":       # the policy alone: its plan for no budget is the reference
            assert unbounded == {peak} and minimum == {least}, (model, unbounded, minimum)
