"""Import the outputs of bench/gpu/contact.sh into bench/results/.

    python -m bench.gpu.import_results SRC... [--results DIR]

Each SRC is a folder the kit wrote (or that a device run's files were fetched into) holding
``contact-*.tar.gz`` and/or the stage files themselves, or a tarball. For every stage found (the
latest by date when several runs have it):

* the raw files (stage JSON, log, junit XML) are copied to ``bench/results/gpu_raw/<stage>.*``;
* ``bench/results/gpu_contact.json`` is written with the readers' contract::

      {"device", "date", "commit", "tests": {passed, failed, skipped, errors},
       "models": {name: {loss_rel_err, param_max_rel_err, update_max_rel_err, ok}},
       "stages": {stage: {ran, target_met, ok, verdict, date, commit, device, command}}}

  ``ok`` (kept for older readers) is ``ran and target_met is not False``. The stages imported
  replace theirs; the file's other stages (an earlier command's) are kept;
* ``bench/results/throughput.json``: ``configs[model:batch:precision]`` with
  ``neuron_over_pytorch`` (the fastest replay mode that ran), per mode, and the target; the
  ``throughput`` (fp32, tf32) and ``throughput_mixed`` (bf16, fp16: PyTorch under autocast in
  its faster layout, ``pytorch_layout`` and ``pytorch_img_per_s_by_layout``) stages both add
  theirs, each config with its own device, date and commit; configs already there that this
  import does not measure are kept;
  ``gpu_contact.md`` / ``throughput.md`` tables;
* the ``deepest`` and ``deepest_offload`` stages (bench/gpu/deepest_run.py) add their rows to
  ``bench/results/deepest_gpu.json``: ``runs: [{device, date, commit, depth, batch,
  budget_bytes, offload_params, compress, replay, seconds_per_iter, tensor_peak_bytes,
  planned_tensor_peak_bytes}]`` and ``pytorch: [{mode, depth, seconds_per_iter}]`` (issue 36);
* the ``pressure`` stage becomes ``bench/results/pressure.json``: ``device, date, commit`` and
  ``configs: {"<model>:<batch>": {unbudgeted_s, pytorch_checkpoint: {batch, img_per_s}, runs:
  {NAME: {seconds_per_iter, overhead, img_per_s, hidden_copy_fraction, moved_bytes,
  planned_moved_bytes}}}}`` (issue 37; other models' configs already there are kept);
* a ``simulator`` stage (bench/gpu/simulator.py) becomes the "gpu" list of
  ``bench/results/simulator_error.{json,md}`` with its provenance (the "cpu" list is kept), and
  its profiles ``profile_<model>_b<batch>_<side>_<device>.json`` are copied into bench/results/;
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
STAGES = ("env", "install", "tests", "models", "throughput", "throughput_mixed", "deepest",
          "replay_tests", "mixed_tests", "profile_step",
          "codec_tests", "pressure", "deepest_offload", "nccl", "simulator", "pool", "confirm")


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
        ran = j.get("ran", j.get("ok"))         # a run of the kit before ran/target_met: its ok
        met = j.get("target_met")
        out["stages"][stage] = {"ran": ran, "target_met": met,
                                "ok": bool(ran) and met is not False,
                                "verdict": j.get("verdict"),
                                "date": j.get("date"), "commit": j.get("commit"),
                                "device": j.get("device"), "command": j.get("command")}
    return out


def throughput_summary(found: dict, old: dict | None = None) -> dict | None:
    recs = [found[s] for s in ("throughput", "throughput_mixed") if s in found]
    if not recs:
        return None
    configs = dict((old or {}).get("configs", {}))
    for rec in recs:
        configs.update(_throughput_configs(rec["json"]))
    j = recs[0]["json"]
    return {"device": j.get("device"), "date": j.get("date"), "commit": j.get("commit"),
            "command": j.get("command"), "protocol": j.get("protocol"), "configs": configs}


def _throughput_configs(j: dict) -> dict:
    configs = {}
    for r in j.get("rows", []):
        key = f"{r.get('model')}:{r.get('batch')}:{r.get('precision')}"
        neuron = r.get("neuron") or {}
        if "img_per_s" in neuron or "error" in neuron:      # a row before the replay modes
            neuron = {"off": neuron}
        best = r.get("neuron_mode") or ("off" if "off" in neuron else None)
        errors = {f"neuron {m}": v["error"] for m, v in neuron.items() if v.get("error")}
        if (r.get("pytorch") or {}).get("error"):
            errors["pytorch"] = r["pytorch"]["error"]
        configs[key] = {"neuron_over_pytorch": r.get("neuron_over_pytorch"),
                        "neuron_mode": best,
                        "neuron_over_pytorch_by_mode": r.get("neuron_over_pytorch_by_mode"),
                        "neuron_img_per_s": (neuron.get(best) or {}).get("img_per_s"),
                        "neuron_img_per_s_by_mode": {m: v.get("img_per_s")
                                                     for m, v in neuron.items()},
                        "replay_by_mode": {m: v.get("replay") for m, v in neuron.items()},
                        # the host's time per replayed step (issue 36's <= 1 ms)
                        "host_ms_by_mode": {m: v["host_ms"] for m, v in neuron.items()
                                            if v.get("host_ms") is not None} or None,
                        "tape_operations_by_mode": {
                            m: v["tape_operations"] for m, v in neuron.items()
                            if v.get("tape_operations") is not None} or None,
                        "pytorch_img_per_s": (r.get("pytorch") or {}).get("img_per_s"),
                        "pytorch_layout": (r.get("pytorch") or {}).get("layout"),
                        "pytorch_img_per_s_by_layout": {
                            k: v.get("img_per_s") for k, v in
                            ((r.get("pytorch") or {}).get("layouts") or {}).items()} or None,
                        "target": r.get("target"), "target_met": r.get("target_met"),
                        "memory_bytes": r.get("memory_bytes"), "errors": errors or None,
                        "device": j.get("device"), "date": j.get("date"),
                        "commit": j.get("commit")}
    return configs


DEEPEST_ROW = ("device", "date", "commit", "depth", "batch", "budget_bytes", "offload_params",
               "compress", "replay", "seconds_per_iter", "tensor_peak_bytes",
               "planned_tensor_peak_bytes", "planner", "prefetch_ahead", "precision",
               "moved_bytes_per_iter", "resident_params_bytes", "fuse")


def deepest_summary(found: dict, old: dict | None) -> dict | None:
    """The deepest stages' rows added to deepest_gpu.json's (a row of the same device, date and
    configuration replaces its copy: importing twice changes nothing)."""
    recs = [found[s] for s in ("deepest", "deepest_offload") if s in found]
    if not recs:
        return None
    out = {"runs": list((old or {}).get("runs", [])), "pytorch": list((old or {}).get("pytorch",
                                                                                     []))}

    def put(lst, row, key):
        lst[:] = [r for r in lst if tuple(r.get(k) for k in key) != tuple(row.get(k)
                                                                             for k in key)]
        lst.append(row)

    for rec in recs:
        j = rec["json"]
        for r in j.get("runs", []):
            row = {k: r.get(k) for k in DEEPEST_ROW}
            row["commit"] = j.get("commit") or row["commit"]
            row.update(fits=r.get("fits"), error=r.get("error"), stage=j.get("stage"),
                       command=j.get("command"), verdict=j.get("verdict"))
            put(out["runs"], row, ("device", "date", "depth", "offload_params", "compress",
                                   "replay", "planner", "prefetch_ahead", "precision",
                                   "resident_params_bytes", "fuse"))
        for p in j.get("pytorch", []):
            row = {"mode": p.get("mode"), "depth": p.get("depth"),
                   "seconds_per_iter": p.get("seconds_per_iter"), "device": j.get("device"),
                   "date": j.get("date"), "commit": j.get("commit"), "batch": (j.get("runs") or
                                                                             [{}])[0].get("batch"),
                   "budget_bytes": j.get("budget_bytes"), "error": p.get("error")}
            put(out["pytorch"], row, ("device", "date", "mode", "depth"))
    latest = max(out["runs"], key=lambda r: r.get("date") or "")
    # the file's provenance: its newest run's (each row keeps its own)
    out["provenance"] = {k: latest.get(k) for k in ("command", "commit", "device", "date")}
    return out


def pressure_summary(found: dict, old: dict | None) -> dict | None:
    """The pressure stage's configs, over pressure.json's (other models' configs kept)."""
    rec = found.get("pressure")
    if rec is None or not rec["json"].get("configs"):
        return None
    j = rec["json"]
    configs = dict((old or {}).get("configs", {}))
    for key, c in j["configs"].items():
        configs[key] = {**c, "device": j.get("device"), "date": j.get("date"),
                        "commit": j.get("commit"), "budget_bytes": j.get("budget_bytes"),
                        "torch_eager": j.get("torch_eager"), "targets": j.get("targets"),
                        "verdict": j.get("verdict")}
    return {"device": j.get("device"), "date": j.get("date"), "commit": j.get("commit"),
            "command": j.get("command"), "configs": configs}


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
    if rec is None or not rec["json"].get("ran", rec["json"].get("ok")):
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
    lines = [f"# GPU contact (the environment stage: {s['device']})", "",
             f"date {s['date']}, commit {s['commit']}; each stage names its own device", "",
             "| stage | ran | target met | verdict | device | date |", "|---|---|---|---|---|---|"]
    for stage in STAGES:
        if stage in s["stages"]:
            v = s["stages"][stage]
            ran = v.get("ran", v.get("ok"))
            met = {True: "yes", False: "NO", None: "-"}[v.get("target_met")]
            lines.append(f"| {stage} | {'yes' if ran else 'NO'} | {met} | {v['verdict']} | "
                         f"{v.get('device') or s['device']} | {(v.get('date') or '')[:10]} |")
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
             "| configuration | neuron img/s (mode) | PyTorch img/s | neuron / PyTorch | target |",
             "|---|---:|---:|---:|---|"]
    for k, c in t["configs"].items():
        met = {True: "met", False: "NOT met", None: "-"}[c.get("target_met")]
        layout = f" ({c['pytorch_layout']})" if c.get("pytorch_layout") else ""
        lines.append(f"| {k} | {_fmt(c.get('neuron_img_per_s'), '.1f')} "
                     f"({c.get('neuron_mode')}) | "
                     f"{_fmt(c.get('pytorch_img_per_s'), '.1f')}{layout} | "
                     f"{_fmt(c.get('neuron_over_pytorch'), '.2f')} | "
                     f">= {c.get('target')}: {met} |")
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
    kept = _load(contact_path)
    if kept:
        # the stages imported replace theirs; an earlier command's stages (and its tests and
        # models figures, unless those stages are imported now) stay
        kept.setdefault("stages", {}).update(contact["stages"])
        for k in ("tests", "test_failures", "models"):
            if k in contact and (contact[k] or k not in kept):
                kept[k] = contact[k]
        if found.keys() & {"tests", "env"}:
            kept.update({k: contact[k] for k in ("device", "date", "commit", "command")})
        contact = kept
    _dump(contact_path, contact)
    with open(os.path.join(args.results, "gpu_contact.md"), "w") as f:
        f.write(markdown_contact(contact))
    import_simulator(found, args.results, args.commit)
    import_nccl(found, args.results)
    deep = deepest_summary(found, _load(os.path.join(args.results, "deepest_gpu.json")))
    if deep is not None:
        _dump(os.path.join(args.results, "deepest_gpu.json"), deep)
    pr = pressure_summary(found, _load(os.path.join(args.results, "pressure.json")))
    if pr is not None:
        _dump(os.path.join(args.results, "pressure.json"), pr)
    tp = throughput_summary(found, _load(os.path.join(args.results, "throughput.json")))
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


def _load(path) -> dict | None:
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def _dump(path, obj) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
