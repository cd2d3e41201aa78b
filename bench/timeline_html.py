"""Is `neuron plan --html` responsive at 10^4 layers? Records a planned iteration of a deep
ResNet, writes the timeline, opens it in headless Chromium (Debian's package, via Playwright)
and times: page load to first picture, a full redraw, a redraw zoomed in, a hover.

    python bench/timeline_html.py [--depth 3002] [--batch 16] [--budget 12GiB]
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import arg_parser, provenance, write  # noqa: E402


def main():
    ap = arg_parser(__doc__)
    ap.add_argument("--model", default="resnet")
    ap.add_argument("--depth", type=int, default=3002)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--budget", default="12GiB")
    ap.add_argument("--policy", default="superneurons")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--keep-params", action="store_true",
                    help="keep parameters resident (default: --offload-params, so the picture "
                    "shows them moving instead of a solid block)")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    from neuron.executor import no_gc
    from neuron.memory.recorder import record_iteration
    from neuron.models import build_model
    from neuron.views.timeline_html import write_timeline
    from neuron.units import parse_bytes
    prov = provenance(device=f"CPU ({os.cpu_count()} cores), headless Chromium "
                      "(Debian package), planning only")
    budget = parse_bytes(args.budget)
    with no_gc():
        g = build_model(args.model, depth=args.depth)
    t = time.perf_counter()
    rec, run = record_iteration(g, args.batch, budget, policy=args.policy,
                                offload_params=not args.keep_params)
    record_s = time.perf_counter() - t
    if rec is None:
        sys.exit(f"timeline_html: does not fit: {run['error']}")
    d = tempfile.mkdtemp()
    try:
        path = os.path.join(d, "t.html")
        t = time.perf_counter()
        write_timeline(rec, path, f"{args.model}-{args.depth}", budget)
        write_s = time.perf_counter() - t
        size = os.path.getsize(path)
        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = b.new_page(viewport={"width": 1400, "height": 800})
            t = time.perf_counter()
            page.goto("file://" + path)
            page.wait_for_function("document.body.dataset.drawn !== undefined", timeout=120000)
            load_s = time.perf_counter() - t
            full = [float(page.evaluate("(draw(), document.body.dataset.drawMs)"))
                    for _ in range(args.repeats)]
            results = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
            page.screenshot(path=os.path.join(results, "timeline_html_full.png"))
            box = page.locator("canvas").bounding_box()
            # hover the middle of the stay with the largest area (always under the cursor)
            d = page.evaluate("({s: D.start, e: D.end, o: D.offset, b: D.bytes, S: S, "
                              "A: D.arena, W: W, H: H})")
            i = max(range(len(d["o"])), key=lambda i: (d["e"][i] + 1 - d["s"][i]) * d["b"][i])
            cx = box["x"] + 1 + (d["s"][i] + d["e"][i] + 1) / 2 * d["W"] / d["S"]
            cy = box["y"] + 1 + d["H"] - (d["o"][i] + d["b"][i] / 2) * d["H"] / d["A"]
            hover = []
            for k in range(args.repeats):
                t = time.perf_counter()
                page.mouse.move(cx + k, cy)
                page.wait_for_function("document.getElementById('tip').textContent !== ''")
                hover.append((time.perf_counter() - t) * 1000)
            tip = page.locator("#tip").inner_text().splitlines()[0]
            page.mouse.move(cx, cy)
            for _ in range(20):
                page.mouse.wheel(0, -100)
            page.wait_for_timeout(300)
            zoomed = [float(page.evaluate("(draw(), document.body.dataset.drawMs)"))
                      for _ in range(args.repeats)]
            in_view = int(page.evaluate("document.body.dataset.drawn"))
            page.screenshot(path=os.path.join(results, "timeline_html_zoomed.png"))
            b.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)
    med = lambda xs: sorted(xs)[len(xs) // 2]     # noqa: E731
    row = {"model": args.model, "depth": args.depth, "batch": args.batch, "budget": budget,
           "policy": args.policy, "offload_params": not args.keep_params, "layers": len(g.route), "steps": len(rec.steps),
           "stays": len(rec.intervals()), "events": len(rec.events),
           "html_bytes": size, "record_seconds": round(record_s, 1),
           "write_seconds": round(write_s, 1), "page_load_seconds": round(load_s, 2),
           "full_redraw_ms_median": med(full), "zoomed_redraw_ms_median": med(zoomed),
           "zoomed_stays_in_view": in_view, "hover_ms_median": round(med(hover), 1),
           "hovered": tip}
    print(row)
    md = (f"# --html timeline at {row['layers']:,} layers ({prov['date']}, {prov['device']}, "
          f"commit {prov['commit']})\n\n"
          f"`{args.model} --depth {args.depth} --batch {args.batch}`, {args.policy}"
          f"{'' if args.keep_params else ' + offload-params'} under "
          f"{args.budget}: {row['steps']:,} steps, {row['stays']:,} tensor stays, "
          f"{size / 2**20:.1f} MiB of HTML. Page load to first picture {load_s:.2f} s; full "
          f"redraw {row['full_redraw_ms_median']:.0f} ms, zoomed in "
          f"{row['zoomed_redraw_ms_median']:.0f} ms ({in_view:,} stays in view), hover "
          f"{row['hover_ms_median']:.0f} ms (median of {args.repeats}); load average "
          f"{prov['load_average_at_start']} at start. Screenshots: "
          "timeline_html_full.png, timeline_html_zoomed.png.\n")
    write("timeline_html", {"provenance": prov, "settings": vars(args), "rows": [row]}, md)


if __name__ == "__main__":
    main()
