"""`neuron plan --html`: the self-contained canvas timeline (neuron/views/timeline_html.py), checked
as data and in a real headless Chromium (Debian's package, driven by Playwright)."""
import json
import re
import shutil

import pytest

from neuron.cli.main import main
from neuron.memory.recorder import record_iteration
from neuron.models import build_model
from neuron.plan import plan
from neuron.views.timeline_html import timeline_data, write_timeline

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def recording():
    g = build_model("resnet_cifar", depth=8, in_shape=(3, 16, 16))
    budget = plan(g, 8, policy="superneurons", trace=False)["min_budget_bytes"]
    rec, _ = record_iteration(g, 8, budget, policy="superneurons")
    return rec, budget


def test_data_is_columnar_and_complete():
    rec, budget = recording()
    d = timeline_data(rec, "t", budget)
    n = len(rec.intervals())
    assert all(len(d[k]) == n for k in ("name", "kind", "offset", "bytes", "start", "end"))
    assert max(d["name"]) < len(d["names"]) and max(d["kind"]) < len(d["kinds"])
    assert all(o + b <= budget for o, b in zip(d["offset"], d["bytes"]))
    assert len(d["step_phase"]) == len(rec.steps) and set(d["step_phase"]) <= {"F", "R", "B"}


def test_file_is_self_contained(tmp_path):
    rec, budget = recording()
    path = tmp_path / "t.html"
    write_timeline(rec, str(path), "x</script><b>", budget)
    html = path.read_text()
    assert not re.search(r"(src|href)\s*=|https?://|@import", html)   # nothing fetched
    assert "x</script><b>" not in html                                  # the title is escaped
    data = json.loads(re.search(r"const D = (\{.*?\});\n", html, re.S).group(1))
    assert data["names"] and data["budget"] == budget


def test_cli_writes_plot_and_html(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png, html = tmp_path / "m.png", tmp_path / "m.html"
    assert main(["plan", "resnet_cifar", "--depth", "8", "--batch", "4", "--budget", "8MiB",
                 "--policy", "superneurons", "--plot", str(png), "--html", str(html)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert "const D = {" in html.read_text()


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.skip("Chromium not installed (Debian: apt-get install chromium; .ci/run does)")
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="playwright not installed (the [test] extra has it)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def test_renders_in_chromium_and_hover_names_the_tensor(browser, tmp_path):
    rec, budget = recording()
    path = tmp_path / "t.html"
    write_timeline(rec, str(path), "resnet8", budget)
    d = timeline_data(rec, "resnet8", budget)
    page = browser.new_page(viewport={"width": 1000, "height": 600})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.as_uri())
    page.wait_for_function("document.body.dataset.drawn !== undefined")
    assert not errors
    assert int(page.evaluate("document.body.dataset.drawn")) == len(d["offset"])
    shot = tmp_path / "shot.png"
    page.screenshot(path=str(shot))
    assert shot.stat().st_size > 5_000
    # hover the centre of the stay with the largest area: its name is in the tooltip
    steps = len(d["step_phase"])
    i = max(range(len(d["offset"])),
            key=lambda i: (d["end"][i] + 1 - d["start"][i]) * d["bytes"][i])
    box = page.locator("canvas").bounding_box()
    w, h = page.evaluate("[document.getElementById('c').width, document.getElementById('c').height]")
    x = (d["start"][i] + d["end"][i] + 1) / 2 * w / steps
    y = h - (d["offset"][i] + d["bytes"][i] / 2) * h / d["arena"]
    assert not page.locator("#tip").is_visible()
    page.mouse.move(box["x"] + 1 + x, box["y"] + 1 + y)
    tip = page.locator("#tip")
    assert tip.is_visible()
    assert tip.inner_text().splitlines()[0] == d["names"][d["name"][i]]
    # zooming in redraws fewer stays; a double-click resets the view
    for _ in range(8):
        page.mouse.wheel(0, -100)
    page.wait_for_timeout(200)
    assert int(page.evaluate("document.body.dataset.drawn")) < len(d["offset"])
    page.mouse.dblclick(box["x"] + 1 + x, box["y"] + 1 + y)
    page.wait_for_timeout(100)
    assert int(page.evaluate("document.body.dataset.drawn")) == len(d["offset"])
    page.close()


def test_plot_marks_what_the_recording_holds(tmp_path):
    pytest.importorskip("matplotlib")
    from neuron.views.report import plot_recording
    rec, budget = recording()
    marks = plot_recording(rec, str(tmp_path / "p.png"), "t", budget=budget)
    phases = [s.phase for s in rec.steps]
    assert marks["backward_starts"] == phases.index("B") > 0
    assert marks["recompute_steps"] == phases.count("R") > 0
    assert len(marks["compaction_steps"]) == len(set(rec.compactions))
    assert marks["offload_bytes"] == sum(e.nbytes for e in rec.events if e.op == "offload") > 0
    assert marks["fetch_bytes"] == sum(e.nbytes for e in rec.events
                                       if e.op in ("prefetch", "fetch")) > 0
