"""Every commit a result names resolves in this history: each commit hash written in README.md,
docs/*.md and bench/results/**/*.md, and each "commit" field of bench/results/**/*.json, is an
ancestor of HEAD, so a reader can check out the code that produced it. A result produced where
this history cannot reach is marked: in JSON, ``"commit_on_main": false`` with a
``"not_on_main_reason"`` in the object that names the commit; in text, the hash inside
"not reproducible from this history (produced at commit X, not on main)"."""
import glob
import json
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXTS = [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))),
         *sorted(glob.glob(os.path.join(ROOT, "bench", "results", "**", "*.md"), recursive=True))]
RESULTS = sorted(glob.glob(os.path.join(ROOT, "bench", "results", "**", "*.json"), recursive=True))
# a hex word of 7-40 characters with a letter and a digit, not part of a number (1.905e-05),
# an address (0x7f...) or a longer digest; "-dirty" may follow
HASH = re.compile(r"(?<![\w.])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])([0-9a-f]{7,40})"
                  r"(?=-dirty\b|(?!\w|[-+]\d|\.\w))")
MARKED = re.compile(r"not reproducible from this history \(produced at commit `?([0-9a-f]{7,40})")


def _git(*args) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


@pytest.fixture(scope="module")
def history():
    """A function: does this commit resolve to an ancestor of HEAD?"""
    try:
        inside = _git("rev-parse", "--is-inside-work-tree")
    except OSError:
        pytest.skip("git is not installed")
    if inside.returncode != 0 or inside.stdout.strip() != "true":
        pytest.skip("not a git checkout: commits cannot be resolved")
    if _git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        pytest.skip("shallow clone: older commits are missing (fetch with --unshallow)")
    cache: dict[str, bool] = {}

    def on_main(sha: str) -> bool:
        if sha not in cache:
            cache[sha] = _git("merge-base", "--is-ancestor", sha, "HEAD").returncode == 0
        return cache[sha]
    return on_main


def text_commits(text: str) -> tuple[set[str], set[str]]:
    """(named commits, commits marked as not reproducible from this history) in a text."""
    return set(HASH.findall(text)), set(MARKED.findall(text))


def json_commits(node, marked=False):
    """(commit, marked) for every "commit"-named string field, marked when the object holding
    it (or one above) says commit_on_main: false with a reason."""
    if isinstance(node, dict):
        marked = marked or (node.get("commit_on_main") is False
                            and bool(node.get("not_on_main_reason")))
        for key, value in node.items():
            if "commit" in key and key != "commit_on_main" and isinstance(value, str):
                yield value.removesuffix("-dirty"), marked
            else:
                yield from json_commits(value, marked)
    elif isinstance(node, list):
        for value in node:
            yield from json_commits(value, marked)


def test_the_patterns_find_what_results_write():
    named, marked = text_commits(
        "at commit `7ed45fc6d695-dirty` on CPU; rerun at 7ed45fc (5584c39), loss 1.905933681354445e-05, "
        "2.5e-05, 123456e-05, commit b281f5418289. a file 1d6d883.png, "
        "address 0x7f3a2b1c9d00, not reproducible from this history (produced at commit "
        "`abcdef123456`, not on main)")
    assert named == {"7ed45fc6d695", "7ed45fc", "5584c39", "b281f5418289", "abcdef123456"}
    assert marked == {"abcdef123456"}
    data = {"provenance": {"commit": "aaaa1111bbbb-dirty"},
            "stages": {"x": {"commit": "cccc2222dddd", "commit_on_main": False,
                             "not_on_main_reason": "a device's copy"}}}
    assert sorted(json_commits(data)) == [("aaaa1111bbbb", False), ("cccc2222dddd", True)]


@pytest.mark.parametrize("path", TEXTS, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_commit_named_in_text_is_in_this_history(path, history):
    named, marked = text_commits(open(path).read())
    missing = sorted(c for c in named - marked if not history(c))
    assert not missing, (f"{os.path.relpath(path, ROOT)} names commits that are not ancestors of "
                         f"HEAD: {missing}; regenerate the result here, or mark it 'not "
                         "reproducible from this history (produced at commit X, not on main)'")


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_commit_of_a_result_is_in_this_history(path, history):
    missing = sorted(c for c, marked in json_commits(json.load(open(path)))
                     if not marked and not history(c))
    assert not missing, (f"{os.path.relpath(path, ROOT)}: commits not in this history: "
                         f"{missing}; regenerate the result, or set \"commit_on_main\": false "
                         "and a \"not_on_main_reason\" next to the commit")


def test_a_marked_commit_is_really_not_in_this_history(history):
    """The mark is for what cannot be resolved, not a way around the check."""
    wrongly = []
    for path in TEXTS:
        wrongly += [(path, c) for c in text_commits(open(path).read())[1] if history(c)]
    for path in RESULTS:
        wrongly += [(path, c) for c, marked in json_commits(json.load(open(path)))
                    if marked and history(c)]
    assert not wrongly, wrongly
