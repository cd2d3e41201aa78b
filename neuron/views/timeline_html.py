"""`neuron plan --html F`: every tensor's stay in the arena (address against step), one
self-contained HTML file, drawn on a canvas.

In the spirit of PyTorch's memory visualizer, but it stays responsive at 10^4 layers (10^5-10^6
stays): each redraw rasterizes the stays into one pixel buffer. Stays never overlap in the
(step, address) plane, so that costs one pass over the stays plus one over the pixels, however
many there are; zoomed out, a pixel shows the last stay drawn into it (aggregation), zoomed in
every stay gets its own rectangle. The same buffer remembers which stay owns each pixel, so
hovering is a lookup. No network: the data and the script are inline.
"""
from __future__ import annotations

import json

KIND_COLORS = {"data": "#7f7f7f", "activation": "#1f77b4", "gradient": "#d62728",
               "param": "#2ca02c", "param_grad": "#98df8a", "opt_state": "#9467bd",
               "workspace": "#ff7f0e", "aux": "#8c564b"}


def timeline_data(rec, title: str = "", budget: int | None = None) -> dict:
    """The recording, columnar (compact JSON): stays as parallel arrays, names interned."""
    names: dict[str, int] = {}
    kinds = list(KIND_COLORS)
    cols = {"name": [], "kind": [], "offset": [], "bytes": [], "start": [], "end": []}
    for name, kind, off, nb, a, b in rec.intervals():
        cols["name"].append(names.setdefault(name, len(names)))
        if kind not in kinds:
            kinds.append(kind)
        cols["kind"].append(kinds.index(kind))
        cols["offset"].append(off)
        cols["bytes"].append(nb)
        cols["start"].append(a)
        cols["end"].append(b)
    steps = rec.steps
    return {"title": title, "names": list(names), "kinds": kinds,
            "colors": [KIND_COLORS.get(k, "#bcbd22") for k in kinds], **cols,
            "step_layer": [s.layer for s in steps], "step_phase": "".join(s.phase for s in steps),
            "arena": budget or max((o + n for o, n in zip(cols["offset"], cols["bytes"])),
                                   default=1),
            "budget": budget, "peak": rec.peak_bytes}


def write_timeline(rec, path: str, title: str = "", budget: int | None = None) -> None:
    data = json.dumps(timeline_data(rec, title, budget), separators=(",", ":"))
    with open(path, "w") as f:
        f.write(_PAGE.replace("/*DATA*/null", data.replace("</", "<\\/"))
                .replace("TITLE", _escape(title)))


def _escape(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


_PAGE = r"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>TITLE: memory timeline</title>
<style>
 body { font: 13px sans-serif; margin: 8px; }
 #wrap { position: relative; }
 canvas { border: 1px solid #999; cursor: crosshair; display: block; }
 #tip { position: absolute; pointer-events: none; background: #fffbe6; border: 1px solid #aaa;
        padding: 3px 6px; display: none; white-space: pre; font: 12px monospace; }
 #legend span { display: inline-block; margin-right: 10px; }
 #legend i { display: inline-block; width: 10px; height: 10px; margin-right: 3px; }
</style></head><body>
<div><b>TITLE</b>: each rectangle is one tensor's stay in the arena (x: step, y: address).
 Wheel: zoom (shift: zoom addresses), drag: pan, double-click: reset. <span id="stats"></span></div>
<div id="legend"></div>
<div id="wrap"><canvas id="c"></canvas><div id="tip"></div></div>
<script>
const D = /*DATA*/null;
const N = D.offset.length, S = D.step_phase.length;
const cv = document.getElementById('c'), ctx = cv.getContext('2d'), tip = document.getElementById('tip');
const rgb = D.colors.map(c => [parseInt(c.slice(1,3),16), parseInt(c.slice(3,5),16), parseInt(c.slice(5,7),16)]);
// pixels as little-endian RGBA words; EDGE: the darker outline of stays big enough to show one
const word = (r, g, b) => ((255 << 24) | (b << 16) | (g << 8) | r) >>> 0;
const FILL = rgb.map(c => word(c[0], c[1], c[2]));
const EDGE = rgb.map(c => word(c[0] * 0.6 | 0, c[1] * 0.6 | 0, c[2] * 0.6 | 0));
document.getElementById('legend').innerHTML = D.kinds.map((k,i) =>
  `<span><i style="background:${D.colors[i]}"></i>${k}</span>`).join('');
let W = 0, H = 0, owner = null, view = null;
function reset() { view = {s0: 0, s1: Math.max(S, 1), a0: 0, a1: D.arena}; }
function resize() {
  W = Math.max(300, Math.min(window.innerWidth - 30, 4000)); H = Math.max(200, window.innerHeight - 110);
  cv.width = W; cv.height = H; owner = new Int32Array(W * H); draw();
}
function draw() {
  const t0 = performance.now();
  const img = ctx.createImageData(W, H), u32 = new Uint32Array(img.data.buffer);
  u32.fill(0xffffffff); owner.fill(-1);          // white; whole rows at a time below
  const sx = W / (view.s1 - view.s0), sy = H / (view.a1 - view.a0);
  let drawn = 0;
  for (let i = 0; i < N; i++) {
    const s = D.start[i], e = D.end[i] + 1, a = D.offset[i], b = a + D.bytes[i];
    if (e <= view.s0 || s >= view.s1 || b <= view.a0 || a >= view.a1) continue;
    let x0 = Math.floor((s - view.s0) * sx), x1 = Math.ceil((e - view.s0) * sx);
    let y1 = H - Math.floor((a - view.a0) * sy), y0 = H - Math.ceil((b - view.a0) * sy);
    x0 = Math.max(x0, 0); x1 = Math.min(Math.max(x1, x0 + 1), W);
    y0 = Math.max(y0, 0); y1 = Math.min(Math.max(y1, y0 + 1), H);
    const c = FILL[D.kind[i]], edge = (x1 - x0 > 3 && y1 - y0 > 3) ? EDGE[D.kind[i]] : c;
    for (let y = y0; y < y1; y++) {
      const p = y * W;
      u32.fill(y === y0 ? edge : c, p + x0, p + x1); owner.fill(i, p + x0, p + x1);
      u32[p + x0] = edge;
    }
    drawn++;
  }
  ctx.putImageData(img, 0, 0);
  // forward/backward boundary and the budget
  const fb = D.step_phase.indexOf('B');
  ctx.strokeStyle = '#000'; ctx.setLineDash([4, 3]); ctx.beginPath();
  if (fb > 0) { const x = (fb - view.s0) * sx; ctx.moveTo(x, 0); ctx.lineTo(x, H); }
  ctx.stroke(); ctx.setLineDash([]);
  if (D.budget) { const y = H - (D.budget - view.a0) * sy; ctx.strokeStyle = '#d00';
    ctx.beginPath(); ctx.moveTo(0, y); ctx.lineTo(W, y); ctx.stroke(); }
  const ms = performance.now() - t0;
  document.getElementById('stats').textContent =
    `${N} stays, ${S} steps, ${drawn} in view, drawn in ${ms.toFixed(0)} ms`;
  document.body.dataset.drawMs = ms.toFixed(1); document.body.dataset.drawn = drawn;
}
function fmt(b) { return b >= 1<<30 ? (b/(1<<30)).toFixed(2)+' GiB' : b >= 1<<20 ?
  (b/(1<<20)).toFixed(1)+' MiB' : b >= 1024 ? (b/1024).toFixed(1)+' KiB' : b+' B'; }
function at(ev) { const r = cv.getBoundingClientRect(); return [ev.clientX - r.left, ev.clientY - r.top]; }
let drag = null;
cv.addEventListener('mousemove', ev => {
  const [x, y] = at(ev);
  if (drag) { const ds = (drag.x - x) * (view.s1 - view.s0) / W, da = (y - drag.y) * (view.a1 - view.a0) / H;
    view.s0 += ds; view.s1 += ds; view.a0 += da; view.a1 += da; drag = {x, y}; draw(); return; }
  const i = (x >= 0 && y >= 0 && x < W && y < H) ? owner[Math.floor(y) * W + Math.floor(x)] : -1;
  if (i < 0) { tip.style.display = 'none'; tip.textContent = ''; return; }
  const step = Math.floor(view.s0 + x * (view.s1 - view.s0) / W);
  tip.textContent = `${D.names[D.name[i]]}\n${D.kinds[D.kind[i]]}, ${fmt(D.bytes[i])} at offset ${D.offset[i]}\n` +
    `steps ${D.start[i]}..${D.end[i]}; here: step ${step} ${D.step_phase[step] || ''} ${D.step_layer[step] || ''}`;
  tip.style.left = (x + 14) + 'px'; tip.style.top = (y + 14) + 'px'; tip.style.display = 'block';
});
cv.addEventListener('mousedown', ev => { const [x, y] = at(ev); drag = {x, y}; });
window.addEventListener('mouseup', () => { drag = null; });
cv.addEventListener('dblclick', () => { reset(); draw(); });
cv.addEventListener('wheel', ev => {
  ev.preventDefault();
  const [x, y] = at(ev), f = ev.deltaY > 0 ? 1.25 : 0.8;
  if (ev.shiftKey) { const a = view.a0 + (H - y) * (view.a1 - view.a0) / H;
    view.a0 = a - (a - view.a0) * f; view.a1 = a + (view.a1 - a) * f; }
  else { const s = view.s0 + x * (view.s1 - view.s0) / W;
    view.s0 = s - (s - view.s0) * f; view.s1 = s + (view.s1 - s) * f; }
  draw();
}, {passive: false});
window.addEventListener('resize', resize);
reset(); resize();
</script></body></html>
"""
