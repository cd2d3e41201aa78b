"""README.md's and docs/*.md's results agree with bench/results/*.json (bench/readme_tables.py)."""
import json
import os
import re
import shutil
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from bench import readme_tables as RT  # noqa: E402


def _texts() -> dict[str, str]:
    return {os.path.relpath(p, ROOT): open(p).read() for p in RT.documents()}


def test_documents_are_the_readme_and_every_docs_page():
    names = list(_texts())
    assert names[0] == "README.md" and "docs/benchmarks.md" in names


@pytest.mark.parametrize("name", list(_texts()))
def test_document_agrees_with_results(name):
    assert RT.stale_regions(_texts()[name]) == [], f"{name}: run python bench/readme_tables.py"


def test_readme_and_docs_have_generated_regions():
    texts = _texts()
    assert RT.REGION.search(texts["README.md"]), "README.md has no generated regions"
    assert RT.REGION.search(texts["docs/benchmarks.md"]), "docs/benchmarks.md has none"


def test_every_result_names_command_commit_device_date():
    for name in sorted(os.listdir(RT.RESULTS)):
        if name.endswith(".json"):
            data = json.load(open(os.path.join(RT.RESULTS, name)))
            if "format" in data:        # an input file in a declared format (a layer profile)
                continue
            prov = RT.provenance_of(data)
            assert all(prov.get(k) for k in RT.PROVENANCE_FIELDS), (name, prov)
    # and every JSON a README table reads is a result
    for json_names, _ in RT.GENERATORS.values():
        for json_name in (json_names,) if isinstance(json_names, str) else json_names:
            data = RT.load(json_name)
            assert data is None or "format" not in data, json_name


def test_every_region_has_a_generator_and_every_generator_a_region():
    names = [m["name"] for t in _texts().values() for m in RT.REGION.finditer(t)]
    assert sorted(set(names)) == sorted(RT.GENERATORS)


def test_every_generated_table_keeps_its_source_line():
    for name in RT.GENERATORS:
        body = RT.render(name)
        if "|" in body:                       # a table: its source line names file and commit
            assert "bench/results/" in body and re.search(r"commits? `[0-9a-f]{7,}", body), name


def test_check_mode_names_a_stale_document(tmp_path, capsys):
    doc = tmp_path / "page.md"
    doc.write_text("<!-- gen:widest -->old<!-- /gen:widest -->\n")
    assert RT.main(["--check", str(doc)]) == 1
    assert "page.md is stale in: widest" in capsys.readouterr().err
    assert RT.main([str(doc)]) == 0 and RT.main(["--check", str(doc)]) == 0


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
    stale = {name: RT.stale_regions(text, results_copy) for name, text in _texts().items()}
    assert {k: v for k, v in stale.items() if v} == {"docs/benchmarks.md": ["min_budget"]}


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


def test_a_result_not_on_main_says_so_in_its_source_line(results_copy):
    path = os.path.join(results_copy, "plan_speed.json")
    data = json.load(open(path))
    data["provenance"].update(commit="0123456789ab", commit_on_main=False,
                              not_on_main_reason="a rebased branch")
    json.dump(data, open(path, "w"))
    text = RT.regenerate("<!-- gen:plan_speed --><!-- /gen:plan_speed -->", results_copy)
    assert ("not reproducible from this history (produced at commit `0123456789ab`, not on "
            "main): a rebased branch") in text
    del data["provenance"]["not_on_main_reason"]
    json.dump(data, open(path, "w"))
    with pytest.raises(RT.SchemaError, match="not_on_main_reason"):
        RT.regenerate("<!-- gen:plan_speed --><!-- /gen:plan_speed -->", results_copy)


def test_a_region_of_several_results_names_each_missing_one(results_copy):
    os.remove(os.path.join(results_copy, "throughput.json"))
    text = RT.regenerate("<!-- gen:headline --><!-- /gen:headline -->", results_copy)
    assert "not yet measured (`bench/results/throughput.json` is missing)" in text
