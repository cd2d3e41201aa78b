"""The cost model a planner gets when given none: the GPU the run is on, else the H100's."""
from __future__ import annotations

from neuron.devices import CpuDevice, VirtualDevice
from neuron.executor import Executor
from neuron.memory.costmodel import CostModel, planning_cost
from neuron.models import build_model


def test_planning_cost_is_the_h100s_without_a_known_gpu(monkeypatch):
    # the CPU's measured peaks would make a plan (and what --compress compresses) vary from
    # run to run; a virtual plan has no device at all
    for device in ("cpu", CpuDevice(1 << 20), "virtual", VirtualDevice(1 << 20)):
        assert planning_cost(device).spec.name == "h100"
    from neuron.memory import costmodel
    monkeypatch.setattr(costmodel, "gpu_kind", lambda: "h200")
    assert planning_cost("cuda").spec.name == "h200"


def test_an_executor_plans_with_the_default_costs_unless_given_one():
    graph = build_model("resnet_cifar", depth=8, in_shape=(3, 8, 8))
    ex = Executor(graph, 2, device="cpu", planner="capuchin", budget=8 << 20)
    assert ex.cost.spec.name == "h100"
    given = CostModel.analytic("h200")
    assert Executor(graph, 2, device="cpu", planner="capuchin", budget=8 << 20,
                    cost=given).cost is given
    assert Executor(graph, 2, device="virtual", planner="capuchin").cost.spec.name == "h100"
    assert Executor(graph, 2, device="cpu").cost is None        # no planner: no cost model


def test_a_binary_or_non_object_profile_names_the_file(tmp_path, capsys):
    import pytest
    from neuron.cli.main import main
    from neuron.memory.costmodel import CostModel, ProfileError
    binary = tmp_path / "weights.npz"
    binary.write_bytes(b"PK\x03\x04\x89\xff\x00binary")
    listing = tmp_path / "list.json"
    listing.write_text("[1, 2]")
    with pytest.raises(ProfileError, match=f"cannot read profile {binary}: not a text file"):
        CostModel.from_profile(str(binary))
    with pytest.raises(ProfileError, match=f"{listing} is not a neuron profile"):
        CostModel.from_profile(str(listing))
    rc = main(["plan", "resnet_cifar", "--depth", "8", "--no-min-budget", "--time",
               "--profile", str(binary)])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and str(binary) in err, err
