"""README.md's results agree with bench/results/*.json (bench/readme_tables.py)."""
import json
import os
import shutil
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from bench import readme_tables as RT  # noqa: E402


def test_readme_agrees_with_results():
    text = open(RT.README).read()
    assert RT.REGION.search(text), "README.md has no generated regions"
    assert RT.stale_regions(text) == [], "run python bench/readme_tables.py"


def test_every_result_names_command_commit_device_date():
    for name in sorted(os.listdir(RT.RESULTS)):
        if name.endswith(".json"):
            data = json.load(open(os.path.join(RT.RESULTS, name)))
            if "format" in data:        # an input file in a declared format (a layer profile)
                continue
            prov = RT.provenance_of(data)
            assert all(prov.get(k) for k in RT.PROVENANCE_FIELDS), (name, prov)
    # and every JSON a README table reads is a result
    for json_name, _ in RT.GENERATORS.values():
        data = RT.load(json_name)
        assert data is None or "format" not in data, json_name


def test_every_region_has_a_generator_and_every_generator_a_region():
    names = [m["name"] for m in RT.REGION.finditer(open(RT.README).read())]
    assert sorted(set(names)) == sorted(RT.GENERATORS)


@pytest.fixture
def results_copy(tmp_path):
    shutil.copytree(RT.RESULTS, tmp_path / "results")
    return str(tmp_path / "results")


def test_a_changed_number_makes_the_readme_stale(results_copy):
    path = os.path.join(results_copy, "plan_min_budget.json")
    data = json.load(open(path))
    row = next(r for r in data["rows"] if r["model"] == "resnet50" and r["policy"] == "liveness")
    row["min_budget_bytes"] += 7 << 20
    json.dump(data, open(path, "w"))
    assert RT.stale_regions(open(RT.README).read(), results_copy) == ["min_budget"]


def test_a_missing_result_reads_not_yet_measured(results_copy):
    os.remove(os.path.join(results_copy, "widest.json"))
    text = RT.regenerate("a\n<!-- gen:widest -->old<!-- /gen:widest -->\nb", results_copy)
    assert "not yet measured (`bench/results/widest.json` is missing)" in text
    assert text.startswith("a\n") and text.endswith("\nb")


def test_a_result_of_another_shape_is_named(results_copy):
    json.dump({"provenance": {}, "rows": [{"model": "x"}]},
              open(os.path.join(results_copy, "plan_speed.json"), "w"))
    with pytest.raises(RT.SchemaError, match="gen:plan_speed.*plan_speed.json"):
        RT.regenerate("<!-- gen:plan_speed --><!-- /gen:plan_speed -->", results_copy)
