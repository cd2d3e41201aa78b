"""Import the outputs of bench/gpu/contact.sh into bench/results/.

    python -m bench.gpu.import_results SRC... [--results DIR]

Each SRC is a folder the kit wrote (or that a device run's files were fetched into) holding
``contact-*.tar.gz`` and/or the stage files themselves, or a tarball. For every stage found (the
latest by date when several runs have it):

* the raw files (stage JSON, log, junit XML) are copied to ``bench/results/gpu_raw/<stage>.*``;
* ``bench/results/gpu_contact.json`` is written with the readers' contract::

      {"device", "date", "commit", "tests": {passed, failed, skipped, errors},
       "models": {name: {loss_rel_err, param_max_rel_err}}, "stages": {stage: verdict...}}

* ``bench/results/throughput.json`` with one ``neuron_over_pytorch`` per configuration
  (``model:batch:precision``), and ``gpu_contact.md`` / ``throughput.md`` tables;
* a ``simulator`` stage (bench/gpu/simulator.py) becomes the "gpu" list of
  ``bench/results/simulator_error.{json,md}`` with its provenance (the "cpu" list is kept), and
  its profiles ``profile_<model>_b<batch>_<side>_<device>.json`` are copied into bench/results/;
  a run of that stage alone (its own command) updates gpu_contact.json's ``stages.simulator``
  and keeps the rest of the file (the earlier commands' results);
* an ``nccl`` stage (bench/gpu/nccl.py) becomes ``bench/results/data_parallel_gpu.{json,md}``:
  bench/data_parallel.py's payload and table for the one-GPU NCCL path, with the probe;
* ``bench/readme_tables.py`` (the README's tables from bench/results/*.json) is run if present.

Smoke runs (``--smoke`` on the CPU) are refused unless ``--allow-smoke``: they are not GPU results.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STAGES = ("env", "install", "tests", "models", "throughput", "pressure", "pool", "confirm",
          "simulator", "nccl")
#: stages that are a command of their own: importing one alone keeps gpu_contact.json's others
STANDALONE = {"simulator", "nccl"}


def collect(sources) -> dict[str, dict]:
    """stage -> {"json": dict, "files": [paths]} over every source, latest date winning. Tarballs
    are unpacked into a temporary folder that lives as long as the process."""
    found: dict[str, dict] = {}
    dirs = []
    for src in sources:
        if os.path.isfile(src) and src.endswith((".tar.gz", ".tgz")):
            dirs.append(_untar(src))
        elif os.path.isdir(src):
            dirs.append(src)
            for name in sorted(os.listdir(src)):
                if name.endswith(".tar.gz"):
                    dirs.append(_untar(os.path.join(src, name)))
        else:
            raise SystemExit(f"import_results: {src} is neither a folder nor a .tar.gz")
    for d in dirs:
        for stage in STAGES:
            path = os.path.join(d, f"{stage}.json")
            if not os.path.exists(path):
                continue
            with open(path) as f:
                data = json.load(f)
            files = [os.path.join(d, n) for n in sorted(os.listdir(d))
                     if n.split(".")[0] == stage]
            extra = []
            if stage == "simulator":        # its profiles, named in its rows, lie beside it
                named = {r.get("profile") for r in data.get("rows", []) if r.get("profile")}
                extra = [os.path.join(d, n) for n in sorted(named)
                         if os.path.basename(n) == n and os.path.exists(os.path.join(d, n))]
            old = found.get(stage)
            if old is None or data.get("date", "") >= old["json"].get("date", ""):
                found[stage] = {"json": data, "files": files, "profiles": extra}
    return found


def _untar(path) -> str:
    d = tempfile.mkdtemp(prefix="neuron_import_")
    with tarfile.open(path) as t:
        members = [m for m in t.getmembers() if m.isfile() and ".." not in m.name
                   and not m.name.startswith("/")]
        for m in members:
            m.name = os.path.basename(m.name)       # the kit's tarballs are flat
        if hasattr(tarfile, "data_filter"):
            t.extractall(d, members=members, filter="data")
        else:
            t.extractall(d, members=members)
    return d


def contact_summary(found: dict) -> dict:
    """The contract of bench/results/gpu_contact.json."""
    if not found:
        raise SystemExit("import_results: no stage results found")
    first = found.get("tests") or found.get("env") or next(iter(found.values()))
    meta = first["json"]
    out = {"device": meta.get("device"), "date": meta.get("date"), "commit": meta.get("commit"),
           "command": "bench/gpu/import_results.py <outputs of bash bench/gpu/contact.sh OUT "
                      + " ".join(s for s in STAGES if s in found) + ">",
           "tests": None, "models": {}, "stages": {}}
    t = found.get("tests", {}).get("json", {}).get("tests")
    if t:
        out["tests"] = {k: int(t[k]) for k in ("passed", "failed", "skipped", "errors")}
        out["test_failures"] = found["tests"]["json"].get("failures", [])
    for name, m in found.get("models", {}).get("json", {}).get("models", {}).items():
        out["models"][name] = {"loss_rel_err": m.get("loss_rel_err"),
                               "param_max_rel_err": m.get("param_max_rel_err"),
                               "update_max_rel_err": m.get("update_max_rel_err"),
                               "ok": m.get("ok"), **({"error": m["error"]} if "error" in m
                                                     else {})}
    for stage, rec in found.items():
        j = rec["json"]
        out["stages"][stage] = {"ok": j.get("ok"), "verdict": j.get("verdict"),
                                "date": j.get("date"), "commit": j.get("commit"),
                                "device": j.get("device"), "command": j.get("command")}
    return out


def throughput_summary(found: dict) -> dict | None:
    rec = found.get("throughput")
    if rec is None:
        return None
    j = rec["json"]
    configs = {}
    for r in j.get("rows", []):
        key = f"{r.get('model')}:{r.get('batch')}:{r.get('precision')}"
        configs[key] = {"neuron_over_pytorch": r.get("neuron_over_pytorch"),
                        "neuron_img_per_s": (r.get("neuron") or {}).get("img_per_s"),
                        "pytorch_img_per_s": (r.get("pytorch") or {}).get("img_per_s"),
                        "memory_bytes": r.get("memory_bytes"),
                        "errors": {s: (r.get(s) or {}).get("error") for s in ("neuron", "pytorch")
                                   if (r.get(s) or {}).get("error")} or None}
    return {"device": j.get("device"), "date": j.get("date"), "commit": j.get("commit"),
            "command": j.get("command"), "protocol": j.get("protocol"), "configs": configs}


def import_simulator(found: dict, results: str, commit: str | None = None) -> dict | None:
    """The simulator stage's rows -> ``results/simulator_error.{json,md}`` as the "gpu" list
    (the "cpu" list and its provenance kept), its profiles copied into ``results``. Returns the
    payload written, or None (no such stage, or a run without rows: the old list is kept)."""
    rec = found.get("simulator")
    if rec is None:
        return None
    j = rec["json"]
    rows = j.get("rows") or []
    if not rows:
        print(f"import_results: the simulator stage has no rows ({j.get('verdict')}); "
              "simulator_error.json left as it was", file=sys.stderr)
        return None
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from bench import simulator_error as SE
    prov = dict(j.get("provenance") or {})
    prov.setdefault("device", j.get("device"))
    if commit:
        prov["commit"] = commit[:12]
    prov["kit"] = {"stage": "simulator", "date": j.get("date"), "command": j.get("command"),
                   "verdict": j.get("verdict"), "smoke": bool(j.get("smoke"))}
    path = os.path.join(results, "simulator_error.json")
    old = None
    if os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
    payload = SE.merge(old, "gpu", rows, prov)
    os.makedirs(results, exist_ok=True)
    _dump(path, payload)
    with open(os.path.join(results, "simulator_error.md"), "w") as f:
        f.write(SE.markdown(payload))
    for src in rec.get("profiles", []):
        shutil.copy2(src, os.path.join(results, os.path.basename(src)))
    return payload


def import_nccl(found: dict, results: str) -> dict | None:
    """The nccl stage's measurement -> ``results/data_parallel_gpu.{json,md}`` (None: no such
    stage, or a failed one: nothing is written)."""
    rec = found.get("nccl")
    if rec is None or not rec["json"].get("ok"):
        if rec is not None:
            print(f"import_results: the nccl stage failed ({rec['json'].get('verdict')}); "
                  "data_parallel_gpu.json not written", file=sys.stderr)
        return None
    j = rec["json"]
    payload = {**j["result"], "probe": j.get("probe"), "device_name": j.get("device_name"),
               "kit": {"stage": "nccl", "date": j.get("date"), "commit": j.get("commit"),
                       "command": j.get("command"), "verdict": j.get("verdict")}}
    os.makedirs(results, exist_ok=True)
    _dump(os.path.join(results, "data_parallel_gpu.json"), payload)
    with open(os.path.join(results, "data_parallel_gpu.md"), "w") as f:
        f.write(f"<!-- {j.get('device_name')}: the kit's nccl stage, {j.get('date')}, commit "
                f"{j.get('commit')} -->\n" + j.get("markdown", ""))
    return payload


def _fmt(x, spec=".2e"):
    return "-" if x is None else format(x, spec)


def markdown_contact(s: dict) -> str:
    lines = [f"# GPU contact: {s['device']}", "",
             f"date {s['date']}, commit {s['commit']}", "", "| stage | ok | verdict |",
             "|---|---|---|"]
    for stage in STAGES:
        if stage in s["stages"]:
            v = s["stages"][stage]
            lines.append(f"| {stage} | {'yes' if v['ok'] else 'NO'} | {v['verdict']} |")
    if s["tests"]:
        t = s["tests"]
        lines += ["", f"GPU tests: {t['passed']} passed, {t['failed']} failed, "
                      f"{t['skipped']} skipped, {t['errors']} errors"]
    if s["models"]:
        lines += ["", "| model | loss rel. err | param max rel. err | update max rel. err |",
                  "|---|---:|---:|---:|"]
        for name, m in s["models"].items():
            lines.append(f"| {name} | {_fmt(m['loss_rel_err'])} | "
                         f"{_fmt(m['param_max_rel_err'])} | {_fmt(m.get('update_max_rel_err'))} |")
    return "\n".join(lines) + "\n"


def markdown_throughput(t: dict) -> str:
    lines = [f"# Training throughput, neuron vs PyTorch: {t['device']}", "",
             f"date {t['date']}, commit {t['commit']}, {t.get('protocol')}", "",
             "| configuration | neuron img/s | PyTorch img/s | neuron / PyTorch |",
             "|---|---:|---:|---:|"]
    for k, c in t["configs"].items():
        lines.append(f"| {k} | {_fmt(c['neuron_img_per_s'], '.1f')} | "
                     f"{_fmt(c['pytorch_img_per_s'], '.1f')} | "
                     f"{_fmt(c['neuron_over_pytorch'], '.2f')} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sources", nargs="+")
    ap.add_argument("--results", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--no-readme-tables", action="store_true",
                    help="do not run bench/readme_tables.py (tests of this script)")
    ap.add_argument("--allow-smoke", action="store_true",
                    help="import CPU smoke runs too (tests of this script)")
    ap.add_argument("--commit", default=None,
                    help="the commit the device ran, when its copy's .git named another (a "
                         "device machine may receive the tree with a stale .git)")
    args = ap.parse_args(argv)
    found = collect(args.sources)
    if args.commit:
        for rec in found.values():
            rec["json"]["commit"] = args.commit
    smoke = [s for s, r in found.items() if r["json"].get("smoke")]
    if smoke and not args.allow_smoke:
        raise SystemExit(f"import_results: stages {smoke} are CPU smoke runs, not GPU "
                         "results (pass --allow-smoke to import them anyway)")
    raw = os.path.join(args.results, "gpu_raw")
    os.makedirs(raw, exist_ok=True)
    for stage, rec in found.items():
        for path in rec["files"]:
            shutil.copy2(path, os.path.join(raw, os.path.basename(path)))
    contact = contact_summary(found)
    contact_path = os.path.join(args.results, "gpu_contact.json")
    if set(found) <= STANDALONE and os.path.exists(contact_path):
        # a command of its own: the earlier commands' results stay, this stage's entry is added
        with open(contact_path) as f:
            kept = json.load(f)
        kept.setdefault("stages", {}).update(contact["stages"])
        contact = kept
    _dump(contact_path, contact)
    with open(os.path.join(args.results, "gpu_contact.md"), "w") as f:
        f.write(markdown_contact(contact))
    import_simulator(found, args.results, args.commit)
    import_nccl(found, args.results)
    tp = throughput_summary(found)
    if tp is not None:
        _dump(os.path.join(args.results, "throughput.json"), tp)
        with open(os.path.join(args.results, "throughput.md"), "w") as f:
            f.write(markdown_throughput(tp))
    tables = os.path.join(ROOT, "bench", "readme_tables.py")
    if os.path.exists(tables) and not args.no_readme_tables:
        r = subprocess.run([sys.executable, tables], cwd=ROOT)
        if r.returncode:
            print(f"bench/readme_tables.py exited {r.returncode}", file=sys.stderr)
    print(markdown_contact(contact))
    return 0


def _dump(path, obj) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
