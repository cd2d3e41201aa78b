"""README.md and docs/*.md as a reader meets them: every python block runs as printed, the README
stays a short page, and every local link resolves."""
import glob
import os
import re

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
DOCS = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
BLOCK = re.compile(r"```python\n(.*?)```", re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _blocks():
    for path in [README, *DOCS]:
        for i, m in enumerate(BLOCK.finditer(open(path).read())):
            yield pytest.param(path, m.group(1), id=f"{os.path.relpath(path, ROOT)}[{i}]")


def _run(path, code, tmp_path, monkeypatch) -> dict:
    if re.search(r"^import torch|^from torch", code, re.M):
        pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)         # examples write their .npz files where they run
    scope: dict = {"__name__": "__doc_example__"}
    exec(compile(code, os.path.relpath(path, ROOT), "exec"), scope)
    return scope


@pytest.mark.parametrize("path,code", list(_blocks()))
def test_every_python_block_runs(path, code, tmp_path, monkeypatch):
    _run(path, code, tmp_path, monkeypatch)


def test_readme_example_trains_evaluates_saves_and_loads(tmp_path, monkeypatch):
    blocks = BLOCK.findall(open(README).read())
    assert len(blocks) == 1, "the README holds one Python example"
    scope = _run(README, blocks[0], tmp_path, monkeypatch)
    assert np.isfinite(scope["loss"])
    assert scope["acc"] >= 0.9, scope["acc"]            # it learned
    ex, restored = scope["ex"], scope["restored"]
    assert ex.pool.high_water == ex.planned["peak_bytes"] <= 4 << 20
    assert (tmp_path / "quarters.npz").is_file()
    for name, value in ex.state_dict().items():         # loaded exactly what was saved
        np.testing.assert_array_equal(restored.state_dict()[name], value, err_msg=name)


def test_readme_is_a_short_page_with_the_two_commands():
    text = open(README).read()
    assert len(text.splitlines()) <= 250
    commands = re.findall(r"^pip install -e '\.\[\w+\]' && .+$", text, re.M)
    assert commands == [
        "pip install -e '.[examples]' && neuron train resnet_cifar --depth 20 --dataset digits "
        "--epochs 15 --batch 64 --lr 0.1",
        "pip install -e '.[test]' && python -m pytest -q"]


def test_the_measured_quick_start_is_the_readme_command():
    """bench/quickstart.py times the README's first command, exactly."""
    import sys
    sys.path.insert(0, ROOT)
    from bench.quickstart import COMMAND
    assert f"&& neuron {' '.join(COMMAND)}\n" in open(README).read()


def test_every_docs_page_is_linked_from_the_readme():
    links = set(LINK.findall(open(README).read()))
    missing = [p for p in DOCS if f"docs/{os.path.basename(p)}" not in links]
    assert DOCS and not missing, missing


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: os.path.relpath(p, ROOT))
def test_local_links_resolve(path):
    text = open(path).read()
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):        # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
        assert os.path.exists(full), f"{os.path.relpath(path, ROOT)}: broken link {target}"
        if anchor and full.endswith(".md"):
            headings = re.findall(r"^#+ (.+)$", open(full).read(), re.M)
            slugs = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-")
                     for h in headings}
            assert anchor in slugs, f"{os.path.relpath(path, ROOT)}: no heading for {target}"
