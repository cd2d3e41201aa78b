"""Every results table (and every measured number quoted in prose) of README.md and docs/*.md,
generated from bench/results/*.json, so that the documentation cannot go stale.

A document marks each generated region with HTML comments (invisible when rendered):

    <!-- gen:NAME -->...<!-- /gen:NAME -->

    python bench/readme_tables.py           rewrite every region of README.md and docs/*.md
    python bench/readme_tables.py --check   exit 1, naming the files and regions that disagree

A new table is one function (JSON -> markdown) and one line in GENERATORS; it may sit in any
of the documents. A JSON that is not there yet renders as "not yet measured" instead of
failing, so a table can be placed before its benchmark has run. A result whose commit is not
in this repository's history says so in its source line (its JSON's provenance has
"commit_on_main": false and a "not_on_main_reason"). tests/bench/test_readme_tables.py runs
the check.
"""
from __future__ import annotations

import argparse
import difflib
import glob
import os
import re
import sys
from typing import Callable

from bench._common import load_result

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
README = os.path.join(ROOT, "README.md")
DOCS = os.path.join(ROOT, "docs")
REGION = re.compile(r"<!-- gen:(?P<name>[\w-]+) -->(?P<body>.*?)<!-- /gen:(?P=name) -->", re.S)
MIB, GIB = 1 << 20, 1 << 30
PROVENANCE_FIELDS = ("command", "commit", "device", "date")


class SchemaError(RuntimeError):
    """A results JSON lacks what its README table reads (its benchmark changed shape)."""


# --------------------------------------------------------------------------- formatting


def mib(b: float) -> str:
    return f"{b / MIB:,.0f}"


def gib(b: float, digits: int = 2) -> str:
    return f"{b / GIB:,.{digits}f}"


def num(x) -> str:
    return f"{x:,}" if isinstance(x, int) else str(x)


def table(header: list[str], align: list[str], rows: list[list]) -> str:
    """A markdown table; align holds 'l' or 'r' per column."""
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def provenance_of(data: dict) -> dict:
    """A result's provenance: its "provenance" object, else one per device ("cpu_provenance",
    ...), else the same fields at the top level (the shapes benchmarks write)."""
    per_device = [v for k, v in data.items() if k.endswith("_provenance") and v]
    return data.get("provenance") or (per_device[0] if per_device else None) or \
        {k: data[k] for k in (*PROVENANCE_FIELDS,
                                                            "load_average_at_start",
                                                            "load_average_at_end") if k in data}


def not_on_main(p: dict) -> str:
    """The marker a result carries when its commit is not in this history (tests/test_provenance.py
    accepts a commit not on main only inside this text)."""
    if p.get("commit_on_main") is not False:
        return ""
    reason = p.get("not_on_main_reason")
    if not reason:
        raise SchemaError(f"commit {p.get('commit')}: commit_on_main is false without a "
                          "not_on_main_reason")
    return (f"; not reproducible from this history (produced at commit `{p['commit']}`, not on "
            f"main): {reason}")


def source(data: dict, script: str) -> str:
    """The line under each table: which command, commit, device and date produced it."""
    p = provenance_of(data)
    missing = [k for k in PROVENANCE_FIELDS if not p.get(k)]
    if missing:
        raise SchemaError(f"{script}: provenance lacks {', '.join(missing)}")
    load = p.get("load_average_at_start")
    load_txt = f", load average {load[0]:.1f} at start" if load else ""
    end = p.get("load_average_at_end")
    load_txt += f", {end[0]:.1f} at end (2 cores: above 2 the cores were shared)" if end else ""
    return (f"<sub>Source: `bench/results/{script}.json`, from `python {p['command']}` at commit "
            f"`{p['commit']}` on {p['device']}, {p['date']}{load_txt}{not_on_main(p)}.</sub>")


# --------------------------------------------------------------------------- the tables

POLICIES = ["baseline", "liveness", "offload", "recompute", "superneurons"]


def min_budget_table(d: dict) -> str:
    by = {(r["model"], r["policy"]): r for r in d["rows"]}
    models = list(dict.fromkeys(r["model"] for r in d["rows"]))
    rows = []
    for m in models:
        cells = [mib(by[m, p]["min_budget_bytes"]) if (m, p) in by else "-" for p in POLICIES]
        bound = next(r["lower_bound_bytes"] for r in d["rows"] if r["model"] == m)
        sn = by.get((m, "superneurons"))
        rows.append([m, *cells, mib(bound), f"{sn['min_budget_bytes'] / bound:.3f}" if sn else "-"])
    return "\n\n".join([table(["model", *[f"{p} (MiB)" for p in POLICIES], "lower bound (MiB)",
                                "superneurons / bound"], ["l"] + ["r"] * 7, rows),
                        source(d, "plan_min_budget")])


def min_budget_ratio(model: str) -> Callable[[dict], str]:
    def value(d: dict) -> str:
        r = next(r for r in d["rows"] if r["model"] == model and r["policy"] == "superneurons")
        return f"{r['min_budget_bytes'] / r['lower_bound_bytes']:.3f}x"
    return value


def plan_speed_table(d: dict) -> str:
    rows = [[f"`{r['command']}`", r["answer"], f"{r['seconds']:.1f}", f"{r['target_seconds']:.0f}"]
            for r in d["rows"]]
    return "\n\n".join([table(["command", "answer", "seconds", "target"], ["l", "l", "r", "r"],
                              rows), source(d, "plan_speed")])


def _system(r: dict) -> str:
    return f"neuron {r['policy']}" + (" + offload-params" if r["offload_params"] else "")


PAPER_DEEPEST = [("SuperNeurons (paper, K40 12 GB)", 1920), ("TensorFlow (paper, K40 12 GB)", 592)]


def deepest_table(d: dict) -> str:
    rows = [[_system(r), num(r["deepest"]), r["limited_by"], f"{r['search_seconds']:.0f}"]
            for r in d["neuron"] if r["family"] == "resnet" and r.get("deepest")]
    torch = d.get("torch") or []
    for name in ("PyTorch eager", "PyTorch checkpoint_sequential"):
        hit = [t for t in torch if t.get("system", "").startswith(name)]
        rows.append([name, num(hit[0]["deepest"]) if hit else
                     "not in this plan-only run (H100: [GPU](gpu.md))", "", ""])
    rows += [[n, num(v), "", ""] for n, v in PAPER_DEEPEST]
    return "\n\n".join([table(["system", "deepest", "limited by", "search s"],
                              ["l", "r", "l", "r"], rows), source(d, "deepest")])


def deepest_cifar(d: dict) -> str:
    cifar = [r for r in d["neuron"] if r["family"] == "resnet_cifar"]
    deep = {(r["policy"], r["offload_params"]): r for r in cifar if r.get("deepest")}
    wide = {(r["policy"], r["offload_params"]): r for r in cifar if r.get("widest")}
    sn_deep, sn_wide = deep[("superneurons", False)], wide[("superneurons", False)]
    depth = (f"deeper than the {num(sn_deep['max_depth'])} cap of the search" if sn_deep["capped"]
             else f"to depth {num(sn_deep['deepest'])}")
    return (f"CIFAR ResNet (6n+2) at batch {sn_deep['batch']}: superneurons plans {depth}; "
            f"ResNet-{sn_wide['depth']}'s largest batch is {num(sn_wide['widest'])} under "
            f"superneurons, {num(wide[('liveness', False)]['widest'])} under liveness (DTR's "
            f"artifact: PyTorch 64 on a 12 GB Titan V).")


def deepest_moved(d: dict) -> str:
    """Bytes moved per iteration at the deepest answers, as a range in GiB (from the .md's
    column: offload + prefetch)."""
    moved = [r.get("moved_bytes", r.get("offload_bytes", 0) + r.get("prefetch_bytes", 0))
             for r in d["neuron"] if r["family"] == "resnet" and r.get("deepest")
             and r["policy"] in ("offload", "superneurons")]
    return f"{min(moved) / GIB:,.0f}-{max(moved) / GIB:,.0f} GiB"


PAPER_WIDEST = {"alexnet": 1792, "vgg16": 224, "inception_v4": 240, "resnet50": 384,
                "resnet101": 256, "resnet152": 176}


def _widest(d: dict) -> dict:
    """(model, policy, offload_params) -> widest at layer granularity; (model, "chunked") ->
    widest with sub-layer chunking, where the result has it."""
    out = {}
    for r in d["neuron"]:
        if r.get("chunking", 1) == 1:
            out[r["model"], r["policy"], r["offload_params"]] = r["widest"]
        else:
            out[r["model"], "chunked"] = max(out.get((r["model"], "chunked"), 0), r["widest"])
    return out


def widest_table(d: dict) -> str:
    w = _widest(d)
    models = list(dict.fromkeys(r["model"] for r in d["neuron"]))
    rows = []
    chunked = any(k[1] == "chunked" for k in w)
    cols = [("liveness", False), ("superneurons", False), ("superneurons", True)]
    for m in models:
        keys = [(m, p, o) for p, o in cols] + ([(m, "chunked")] if chunked else [])
        best = max((w[k] for k in keys if k in w), default=None)
        paper = PAPER_WIDEST.get(m)
        rows.append([m, num(paper) if paper else "-", *[num(w[k]) if k in w else "-" for k in keys],
                     f"{best / paper:.2f}x" if paper and best else "-"])
    header = ["model", "paper SuperNeurons", "neuron liveness", "neuron superneurons",
              "neuron superneurons + offload-params"] + \
        (["neuron superneurons + sub-layer chunks"] if chunked else []) + ["best / paper"]
    return "\n\n".join([table(header, ["l"] + ["r"] * (len(header) - 1), rows),
                        source(d, "widest")])


PAPER_RECOMPUTE = {"alexnet": "14 / 23 / 17", "resnet50": "84 / 118 / 85",
                   "resnet101": "169 / 237 / 170"}


def recompute_table(d: dict) -> str:
    sn = [r for r in d["rows"] if r["policy"] == "superneurons"]
    by = {(r["model"], r["recompute_strategy"]): r for r in sn}
    models = list(dict.fromkeys(r["model"] for r in sn))
    rows = [[m, *[by[m, s]["extra_forward_steps"] for s in ("speed", "memory", "cost")],
             mib(by[m, "cost"]["min_budget_bytes"]), mib(by[m, "cost"]["lower_bound_bytes"]),
             PAPER_RECOMPUTE.get(m, "-")] for m in models]
    return "\n\n".join([table(["model", "speed-centric", "memory-centric", "cost-aware",
                               "min budget, cost-aware (MiB)", "lower bound (MiB)",
                               "paper (speed / memory / cost)"], ["l"] + ["r"] * 5 + ["l"], rows),
                        source(d, "recompute_table")])


PAPER_CACHE = {256: "0 / 2.56 GB", 512: "0 / 4.88 GB", 1024: "0.88 / 9.5 GB"}


def tensor_cache_table(d: dict) -> str:
    off = {(r["batch"], r["tensor_cache"]): r for r in d["rows"] if r["policy"] == "offload"}
    rows = [[b, gib(off[b, True]["moved_bytes"]), gib(off[b, False]["moved_bytes"]), paper]
            for b, paper in PAPER_CACHE.items() if (b, True) in off and (b, False) in off]
    return "\n\n".join([table(["batch", "with the LRU tensor cache (GiB)",
                               "without (offload policy, GiB)", "paper with / without"],
                              ["r", "r", "r", "l"], rows), source(d, "tensor_cache")])


PAPER_TRACE = {"liveness": 1489, "offload": 1132, "superneurons": 886}


def memory_trace_table(d: dict) -> str:
    runs = {r["label"]: r for r in d["runs"]}
    rows = []
    for label in d["plotted"]:
        r = runs[label]
        k = r["bytes_by_kind"]
        budget = f" ({mib(r['budget_bytes'])} MiB budget)" if r["budget_bytes"] else ""
        rows.append([label + budget, mib(r["peak_bytes"]),
                     mib(r["peak_bytes"] - k.get("param", 0) - k.get("opt_state", 0)),
                     num(PAPER_TRACE[r["policy"]]) if r["policy"] in PAPER_TRACE else "-"])
    return "\n\n".join([table(["run", "peak MiB", "without params + momentum", "paper MB"],
                              ["l", "r", "r", "r"], rows), source(d, "memory_trace")])


def quickstart_text(d: dict) -> str:
    r = d["rows"][0]
    s = r["summary"]
    return (f"The first reaches {100 * s['test_accuracy']:.2f}% test accuracy on the held-out "
            f"digits in {r['wall_seconds']:.0f} s wall clock ({s['iterations']} iterations, "
            f"{s['images_per_sec']:.0f} img/s, pool peak {s['peak_bytes'] / MIB:.1f} MiB = "
            f"planned peak {s['planned_peak_bytes'] / MIB:.1f} MiB).\n"
            + source(d, "quickstart"))


def _date(x: str) -> str:
    return x[:10]


def _deepest_gpu_rows(dg: dict | None) -> list:
    """The fastest timed run of deepest_gpu.json (bench/gpu/deepest_run.py), with the PyTorch
    runs of the same command (same date and commit) beside it."""
    runs = [r for r in (dg or {}).get("runs", []) if r.get("seconds_per_iter")]
    if not runs:
        return []
    r = min(runs, key=lambda r: r["seconds_per_iter"])
    how = ", ".join(x for x in (
        ("parameters on the host" + (f" but {r['resident_params_bytes'] / (1 << 30):g} GiB"
                                     if r.get("resident_params_bytes") else ""))
        if r.get("offload_params") else "",
        f"planner {r['planner']}" if r.get("planner") else "",
        f"replay {r['replay']}" if r.get("replay") else "",
        r.get("precision") or "", "fused" if r.get("fuse") else "") if x)
    torch = [p for p in dg.get("pytorch", []) if p.get("commit") == r["commit"]
             and p.get("date", "")[:10] == r["date"][:10]]
    theirs = ", ".join(f"{p['mode']} {num(p['depth'])}: " + (
        f"{p['seconds_per_iter']:.2f} s" if p.get("seconds_per_iter") else "does not fit")
        for p in torch) or "-"
    return [[f"deepest ResNet, batch 16, 12 GiB, run ({how})",
             f"{num(r['depth'])} ({r['seconds_per_iter']:.2f} s/iteration)", theirs, "",
             f"{r['device']}, {_date(r['date'])}"]]


def headline_table(d: dict) -> str:
    """The README's results at a glance: depth and width (planned on the CPU, run on the GPU)
    and speed against PyTorch, each row with its device and date."""
    deep, wide, gpu, conf = d["deepest"], d["widest"], d["throughput"], d["gpu_raw/confirm"]
    cpu, prec = d["cpu_speed"], d["precision_planned"]
    dp, wp, pp = provenance_of(deep), provenance_of(wide), provenance_of(prec)
    best_deep = max((r for r in deep["neuron"] if r["family"] == "resnet" and r.get("deepest")),
                    key=lambda r: r["deepest"])
    r50 = [r for r in wide["neuron"] if r["model"] == "resnet50"]
    best_wide = max(r50, key=lambda r: r["widest"])
    parts = conf["parts"]
    cdev, cdate = conf["device"], _date(conf["date"])
    chunks = ", sub-layer chunks" if best_wide.get("chunking", 1) != 1 else ""
    speed = ", ".join(f"{k.split(':')[0]} batch {k.split(':')[1]} {v['neuron_over_pytorch']:.2f}x"
                      for k, v in gpu["configs"].items() if k.endswith(":fp32"))
    rows = [
        ["deepest ResNet (Table 4 family), batch 16, 12 GiB, planned",
         f"{num(best_deep['deepest'])} ({_system(best_deep)[7:]})", "-", num(PAPER_DEEPEST[0][1]),
         f"{dp['device'].replace(', planning only', '')}, {dp['date']}"],
        ["deepest ResNet, batch 16, 12 GiB, run (superneurons)",
         f"{num(parts['deepest']['depth'])} "
         f"({parts['deepest']['run']['seconds_per_iter']:.1f} s/iteration)",
         f"eager {num(parts['torch_eager']['depth'])}, checkpoint_sequential "
         f"{num(parts['torch_checkpoint']['depth'])}", "", f"{cdev}, {cdate}"],
        *_deepest_gpu_rows(d.get("deepest_gpu")),
        ["largest ResNet-50 batch, 12 GiB, planned",
         f"{num(best_wide['widest'])} ({best_wide['policy']}{chunks})", "-",
         num(PAPER_WIDEST["resnet50"]), f"{wp['device'].replace(', planning only', '')}, {wp['date']}"],
        ["largest ResNet-50 batch, 12 GiB, run (superneurons)",
         f"{num(parts['widest']['batch'])} "
         f"({parts['widest']['run']['seconds_per_iter']:.1f} s/iteration)", "-", "",
         f"{cdev}, {cdate}"],
        ["largest batch, 12 GiB, planned, bf16 (fp32 in brackets)",
         ", ".join(f"{r['model']} {num(r['bf16'])} ({num(r['fp32'])})" for r in prec["widest"]),
         "-", "", f"{pp['device'].replace(', planning only', '')}, {pp['date']}"],
        ["deepest ResNet, batch 16, 12 GiB, planned, bf16 (fp32 in brackets)",
         ", ".join(f"{num(r['bf16'])} ({num(r['fp32'])})"
                   + (" with offload-params" if r["offload_params"] else "")
                   for r in prec["deepest"]),
         "-", "", f"{pp['device'].replace(', planning only', '')}, {pp['date']}"],
        ["training speed, fp32, no budget (neuron / PyTorch eager img/s)", speed, "1.00x", "",
         f"{gpu['device']}, {_date(gpu['date'])}"],
        ["training speed, quick-start model on the CPU (neuron / PyTorch img/s)",
         f"{cpu['neuron_over_pytorch']:.2f}x (replay {cpu['neuron_mode']}; off "
         f"{cpu['neuron']['off']['over_pytorch']:.2f}x)", "1.00x", "",
         f"{provenance_of(cpu)['device'].split('), ')[0]}), {provenance_of(cpu)['date']}, "
         f"{cpu['threads']['torch']} thread"],
    ]
    srcs = ", ".join(f"`bench/results/{n}.json` (commit `{provenance_of(x)['commit'][:12]}`)"
                     for n, x in d.items())
    return "\n\n".join([table(["result", "neuron", "PyTorch", "SuperNeurons paper (K40)",
                                "device, date"], ["l", "l", "l", "r", "l"], rows),
                         f"<sub>Source: {srcs}; details and commands in "
                         "[docs/benchmarks.md](docs/benchmarks.md) and [docs/gpu.md](docs/gpu.md)."
                         "</sub>"])


def timeline_html_text(d: dict) -> str:
    r = d["rows"][0]
    return "\n\n".join([table(
        ["network", "steps", "tensor stays", "HTML", "page load s", "full redraw ms",
         "zoomed redraw ms", "hover ms"], ["l"] + ["r"] * 7,
        [[f"`{r['model']} --depth {r['depth']} --batch {r['batch']}` ({num(r['layers'])} layers"
          f", {r['policy']}{' + offload-params' if r.get('offload_params') else ''})",
          num(r["steps"]), num(r["stays"]), f"{r['html_bytes'] / MIB:.1f} MiB",
          f"{r['page_load_seconds']:.2f}", f"{r['full_redraw_ms_median']:.0f}",
          f"{r['zoomed_redraw_ms_median']:.0f}", f"{r['hover_ms_median']:.0f}"]]),
        source(d, "timeline_html")])


def image_loader_table(d: dict) -> str:
    st = d["settings"]
    rows = [[r["workers"], num(r["images"]), f"{r['seconds']:.1f}", f"{r['images_per_sec']:.1f}"]
            for r in d["rows"]]
    return "\n\n".join([f"{st['images']} generated {st['source_side']}x{st['source_side']} "
                         f"JPEGs to {st['size']}x{st['size']} crops, batch {st['batch']}:",
                         table(["threads", "images", "seconds", "images/s"], ["r"] * 4, rows),
                         source(d, "image_loader")])


def gpu_contact_table(d: dict) -> str:
    """The GPU contact kit's stages and the models' agreement with the CPU (gpu_contact.json)."""
    for key in ("device", "stages", "models"):
        if key not in d:
            raise SchemaError(f"gpu_contact: missing {key}")
    stage_rows = [[name, "yes" if st.get("ok") else "**no**", st.get("verdict", "")[:160],
                   _short_device(st.get("device") or d["device"]), (st.get("date") or "")[:10]]
                  for name, st in d["stages"].items()]
    commits = ", ".join(f"`{c[:12]}`" for c in sorted({st["commit"] for st in d["stages"].values()
                                                         if st.get("commit")}))
    model_rows = [[name, _e(m.get("loss_rel_err")), _e(m.get("update_max_rel_err")),
                   "yes" if m.get("ok") else "**no**"] for name, m in d["models"].items()]
    return ("\n" + table(["stage", "ok", "verdict", "device", "date"], ["l", "l", "l", "l", "l"],
                         stage_rows)
            + "\n\n" + table(["model", "loss rel. err vs CPU", "update max rel. err vs CPU",
                               "within tolerance (vs float64)"], ["l", "r", "r", "l"],
                              model_rows)
            + "\n\n<sub>Source: `bench/results/gpu_contact.json`, written by "
            "`python -m bench.gpu.import_results` from the kit's outputs; the stages ran at "
            f"commits {commits}: each stage's is in the JSON, the 2026-11-23 ones in "
            "`bench/results/gpu_raw/session_2026-11-23/PROVENANCE.md` (the device's copy named a "
            "stale commit), the later ones' raw outputs beside it in `bench/results/gpu_raw/`."
            "</sub>\n")


def _short_device(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100', 'NVIDIA H200' -> 'H200'."""
    for word in str(name).split():
        if word[:1] in "HABLV" and any(ch.isdigit() for ch in word):
            return word
    return str(name)


def _e(x) -> str:
    return "-" if x is None else f"{x:.1e}"


# name -> (results JSON without .json, or a tuple of them: the renderer then gets a dict of
# name -> JSON, renderer). One line per region, wherever it sits (README.md or docs/).
GENERATORS: dict[str, tuple[str | tuple[str, ...], Callable[[dict], str]]] = {
    "quickstart": ("quickstart", quickstart_text),
    "headline": (("deepest", "widest", "throughput", "gpu_raw/confirm", "cpu_speed",
                  "precision_planned", "deepest_gpu"),
                 headline_table),
    "min_budget": ("plan_min_budget", min_budget_table),
    "resnet50_ratio": ("plan_min_budget", min_budget_ratio("resnet50")),
    "plan_speed": ("plan_speed", plan_speed_table),
    "deepest": ("deepest", deepest_table),
    "deepest_cifar": ("deepest", deepest_cifar),
    "deepest_moved": ("deepest", deepest_moved),
    "widest": ("widest", widest_table),
    "recompute": ("recompute_table", recompute_table),
    "tensor_cache": ("tensor_cache", tensor_cache_table),
    "memory_trace": ("memory_trace", memory_trace_table),
    "timeline_html": ("timeline_html", timeline_html_text),
    "image_loader": ("image_loader", image_loader_table),
    "gpu_contact": ("gpu_contact", gpu_contact_table),
}


# --------------------------------------------------------------------------- the machinery


def load(name: str, results: str = RESULTS) -> dict | None:
    return load_result(name, results)


def render(name: str, results: str = RESULTS) -> str:
    if name not in GENERATORS:
        raise KeyError(f"region gen:{name} has no generator; known: "
                       f"{', '.join(sorted(GENERATORS))}")
    json_names, fn = GENERATORS[name]
    names = (json_names,) if isinstance(json_names, str) else json_names
    datas = {n: load(n, results) for n in names}
    absent = [n for n, x in datas.items() if x is None]
    if absent:
        return "not yet measured (" + ", ".join(f"`bench/results/{n}.json`" for n in absent) + \
            (" is" if len(absent) == 1 else " are") + " missing)"
    try:
        return fn(datas[names[0]] if isinstance(json_names, str) else datas)
    except (KeyError, StopIteration, TypeError, IndexError, ValueError) as e:
        raise SchemaError(f"region gen:{name}: {', '.join(f'bench/results/{n}.json' for n in names)}"
                          f" lacks what the table reads ({type(e).__name__}: {e})") from e


def regenerate(text: str, results: str = RESULTS) -> str:
    """The README text with every marked region replaced by what its JSON says."""
    def sub(m: re.Match) -> str:
        body = render(m["name"], results)
        if "\n" in body:            # a block (table): keep it on its own lines
            body = f"\n{body}\n"
        return f"<!-- gen:{m['name']} -->{body}<!-- /gen:{m['name']} -->"
    return REGION.sub(sub, text)


def stale_regions(text: str, results: str = RESULTS) -> list[str]:
    """Names of the regions whose README text differs from what the JSON gives."""
    fresh = {m["name"]: m["body"] for m in REGION.finditer(regenerate(text, results))}
    return [m["name"] for m in REGION.finditer(text) if m["body"] != fresh[m["name"]]]


def documents() -> list[str]:
    """The files that may hold generated regions: README.md and every page of docs/."""
    return [README] + sorted(glob.glob(os.path.join(DOCS, "*.md")))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="do not write; exit 1 if a document and bench/results disagree")
    ap.add_argument("files", nargs="*", help="the documents (default: README.md and docs/*.md)")
    args = ap.parse_args(argv)
    status = 0
    for path in args.files or documents():
        rel = os.path.relpath(path, ROOT)
        text = open(path).read()
        new = regenerate(text)
        if args.check:
            stale = stale_regions(text)
            if stale:
                diff = difflib.unified_diff(text.splitlines(), new.splitlines(), rel,
                                            "generated", lineterm="", n=0)
                print(f"{rel} is stale in: {', '.join(stale)}; run python bench/readme_tables.py\n"
                      + "\n".join(diff), file=sys.stderr)
                status = 1
            else:
                print(f"{rel} agrees with bench/results ({len(REGION.findall(text))} regions)")
            continue
        if new != text:
            with open(path, "w") as f:
                f.write(new)
        print(f"{rel}: {len(REGION.findall(new))} regions regenerated")
    return status


if __name__ == "__main__":
    sys.exit(main())
