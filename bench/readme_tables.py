"""Every results table (and every measured number quoted in prose) of README.md, generated from
bench/results/*.json, so that the README cannot go stale.

README.md marks each generated region with HTML comments (invisible when rendered):

    <!-- gen:NAME -->...<!-- /gen:NAME -->

    python bench/readme_tables.py           rewrite every region from its JSON
    python bench/readme_tables.py --check   exit 1, naming the regions where README and JSON disagree

A new table is one function (JSON -> markdown) and one line in GENERATORS. A JSON that is not
there yet renders as "not yet measured" instead of failing, so a table can be placed in the
README before its benchmark has run. tests/bench/test_readme_tables.py runs the check.
"""
from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import sys
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
README = os.path.join(ROOT, "README.md")
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
            f"`{p['commit']}` on {p['device']}, {p['date']}{load_txt}.</sub>")


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
                     "not in this plan-only run (H100: [GPU contact](#gpu-contact))", "", ""])
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
    s, p = r["summary"], d["provenance"]
    load = p.get("load_average_at_start")
    return (f"The first reaches {100 * s['test_accuracy']:.2f}% test accuracy on the held-out "
            f"digits in {r['wall_seconds']:.0f} s wall clock ({s['iterations']} iterations, "
            f"{s['images_per_sec']:.0f} img/s, pool peak {s['peak_bytes'] / MIB:.1f} MiB = "
            f"planned peak {s['planned_peak_bytes'] / MIB:.1f} MiB; {p['device']}, {p['date']}, "
            f"commit `{p['commit'][:12]}`"
            + (f", load average {load[0]:.1f} when it started: the cores were shared" if load
               and load[0] >= 1.0 else "") + ").")


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


# name -> (results JSON without .json, renderer). One line per README region.
def gpu_contact_table(d: dict) -> str:
    """The GPU contact kit's stages and the models' agreement with the CPU (gpu_contact.json)."""
    for key in ("device", "stages", "models"):
        if key not in d:
            raise SchemaError(f"gpu_contact: missing {key}")
    stage_rows = [[name, "yes" if st.get("ok") else "**no**", st.get("verdict", "")[:160],
                   (st.get("date") or "")[:10]] for name, st in d["stages"].items()]
    model_rows = [[name, _e(m.get("loss_rel_err")), _e(m.get("update_max_rel_err")),
                   "yes" if m.get("ok") else "**no**"] for name, m in d["models"].items()]
    return ("\n" + table(["stage", "ok", "verdict", "date"], ["l", "l", "l", "l"], stage_rows)
            + "\n\n" + table(["model", "loss rel. err vs CPU", "update max rel. err vs CPU",
                               "within tolerance (vs float64)"], ["l", "r", "r", "l"],
                              model_rows)
            + f"\n\n<sub>Source: `bench/results/gpu_contact.json` ({d['device']}), written by "
            "`python bench/import_gpu_results.py` from the kit's outputs; the code each run "
            "ran is listed in `bench/results/gpu_raw/session_2026-11-23/PROVENANCE.md` (the "
            "device's copy named a stale commit).</sub>\n")


def _e(x) -> str:
    return "-" if x is None else f"{x:.1e}"


GENERATORS: dict[str, tuple[str, Callable[[dict], str]]] = {
    "quickstart": ("quickstart", quickstart_text),
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
    path = os.path.join(results, name + ".json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def render(name: str, results: str = RESULTS) -> str:
    if name not in GENERATORS:
        raise KeyError(f"README region gen:{name} has no generator; known: "
                       f"{', '.join(sorted(GENERATORS))}")
    json_name, fn = GENERATORS[name]
    data = load(json_name, results)
    if data is None:
        return f"not yet measured (`bench/results/{json_name}.json` is missing)"
    try:
        return fn(data)
    except (KeyError, StopIteration, TypeError, IndexError) as e:
        raise SchemaError(f"README region gen:{name}: bench/results/{json_name}.json lacks what "
                          f"the table reads ({type(e).__name__}: {e})") from e


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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="do not write; exit 1 if README.md and bench/results disagree")
    ap.add_argument("--readme", default=README, help="the README to read (default: %(default)s)")
    args = ap.parse_args(argv)
    text = open(args.readme).read()
    new = regenerate(text)
    if args.check:
        stale = stale_regions(text)
        if stale:
            diff = difflib.unified_diff(text.splitlines(), new.splitlines(), "README.md",
                                        "generated", lineterm="", n=0)
            print(f"README.md is stale in: {', '.join(stale)}; run python bench/readme_tables.py\n"
                  + "\n".join(diff), file=sys.stderr)
            return 1
        print(f"README.md agrees with bench/results ({len(REGION.findall(text))} regions)")
        return 0
    with open(args.readme, "w") as f:
        f.write(new)
    print(f"README.md: {len(REGION.findall(new))} regions regenerated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
