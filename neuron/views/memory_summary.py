"""`neuron memory`: where the bytes of one iteration go, in the spirit of
torch.cuda.memory_summary(): bytes by kind at the peak, the steps and tensors that make the
peak, fragmentation (largest free block against free bytes), compactions and bytes moved each
way. Everything comes from the plan `neuron plan` computes (plan.make_plan, the same function
and arguments), replayed once with a log of every event (memory/recorder.py): under a budget
its offloaded bytes, host peak and step count are plan's.
"""
from __future__ import annotations

from ..memory.recorder import per_step
from ..plan import make_plan
from ..units import fmt_bytes


def memory_summary(graph, batch: int, *, budget: int | None = None, top: int = 10,
                   model: str | None = None, **kw) -> dict:
    """Plan the iteration, then record that plan under ``budget`` (default: the minimum budget,
    the tightest arena the plan completes in, where fragmentation and moves matter most)."""
    planned = make_plan(graph, batch, budget=budget, model=model, trace=False, **kw)
    p = planned.report
    arena = budget if budget is not None else p["min_budget_bytes"]
    out = {"model": p["model"], "batch": batch, "policy": p["policy"],
           "planner": p.get("planner"), "precision": p.get("precision", "fp32"),
           "offload_params": p["offload_params"], "arena_bytes": arena,
           "arena_is_minimum": budget is None, "unbounded_peak_bytes": p["unbounded_peak_bytes"],
           "min_budget_bytes": p["min_budget_bytes"], "lower_bound_bytes": p["lower_bound_bytes"],
           "num_steps": p["num_steps"], "extra_forward_steps": p["extra_forward_steps"],
           "fits": p["fits"], "error": p["error"]}
    if not p["fits"]:
        return out
    rec, run = planned.record(arena)
    if not run["fits"]:             # the minimum budget is verified: only a bug gets here
        raise RuntimeError(f"memory: the plan did not replay in {arena} bytes: {run['error']}")
    out.update(summarize_recording(rec, run, top))
    return out


def summarize_recording(rec, run: dict, top: int = 10) -> dict:
    steps = rec.steps
    high = per_step(rec)["high"]        # the most bytes in use at any moment of each step
    peak = rec.events[rec.peak_event]
    peak_step = steps[peak.step] if 0 <= peak.step < len(steps) else None
    resident = sorted(rec.resident_at(rec.peak_event).values(), key=lambda e: -e.nbytes)
    frag = [(s, 1 - s.largest_free / s.free_bytes) for s in steps if s.free_bytes > 0]
    worst = max(frag, key=lambda f: f[1]) if frag else None
    moved_kinds = {"offload": 0, "fetch": 0, "prefetch": 0}
    for e in rec.events:
        if e.op in moved_kinds:
            moved_kinds[e.op] += 1
    return {
        "peak_bytes": rec.peak_bytes,
        "peak_step": _step_dict(peak_step, len(steps)) if peak_step else None,
        "bytes_by_kind_at_peak": {k: v for k, v in run["bytes_by_kind_at_peak"].items() if v},
        "tensors_at_peak": len(resident),
        "largest_tensors_at_peak": [{"name": e.name, "kind": e.kind, "bytes": e.nbytes,
                                     "since_step": max(e.step, 0)} for e in resident[:top]],
        "fullest_steps": [dict(_step_dict(steps[i], len(steps)), most_bytes=high[i],
                               bytes_after=steps[i].used_bytes)
                          for i in sorted(range(len(steps)), key=lambda i: -high[i])[:top]],
        "fragmentation": {
            "at_peak_step": _frag(peak_step) if peak_step else None,
            "worst": dict(_frag(worst[0]), **_step_dict(worst[0], len(steps))) if worst else None,
            "mean": sum(f for _, f in frag) / len(frag) if frag else 0.0,
        },
        "compactions": len(rec.compactions), "compacted_bytes": run.get("compacted_bytes", 0),
        "compaction_steps": rec.compactions[:top],
        # the names and numbers `neuron plan` reports for the same run
        "offload_bytes": run.get("offload_bytes", 0), "offloads": moved_kinds["offload"],
        "prefetch_bytes": run.get("prefetch_bytes", 0),
        "prefetches_ahead": moved_kinds["prefetch"], "fetches_on_miss": moved_kinds["fetch"],
        "host_peak_bytes": run.get("host_peak_bytes", 0),
    }


def _step_dict(s, n: int) -> dict:
    return {"step": s.step, "of": n, "phase": s.phase, "layer": s.layer}


def _frag(s) -> dict:
    return {"free_bytes": s.free_bytes, "largest_free_block": s.largest_free,
            "fragmentation": 1 - s.largest_free / s.free_bytes if s.free_bytes else 0.0}


def format_summary(r: dict) -> str:
    """The report as text: one block per question, numbers aligned."""
    op = " + offload-params" if r["offload_params"] else ""
    if r.get("precision", "fp32") != "fp32":
        op += f", precision {r['precision']}"
    arena = fmt_bytes(r["arena_bytes"]) + (" (the minimum budget)" if r["arena_is_minimum"]
                                           else "")
    how = f"planner {r['planner']}" if r.get("planner") else f"policy {r['policy']}"
    lines = [f"neuron memory: {r['model']} batch {r['batch']}, {how}{op}, "
             f"arena {arena}", "=" * 78]
    if not r["fits"]:
        lines.append(f"does NOT fit: {r['error']}; the minimum budget is "
                     f"{r['min_budget_bytes']} bytes ({fmt_bytes(r['min_budget_bytes'])})")
        return "\n".join(lines)
    ps = r["peak_step"]
    lines += [f"peak                    {fmt_bytes(r['peak_bytes']):>12}   at step {ps['step']} "
              f"of {ps['of']} ({ps['phase']} {ps['layer']}), {r['tensors_at_peak']} tensors",
              f"peak (unbounded arena)  {fmt_bytes(r['unbounded_peak_bytes']):>12}   "
              "the plan for no budget, as `neuron plan` says",
              f"minimum budget          {fmt_bytes(r['min_budget_bytes']):>12}   "
              "the smallest arena the plan for no budget completes in",
              f"neuron's layer bound    {fmt_bytes(r['lower_bound_bytes']):>12}",
              "", "bytes by kind at the peak"]
    total = sum(r["bytes_by_kind_at_peak"].values()) or 1
    for k, v in sorted(r["bytes_by_kind_at_peak"].items(), key=lambda kv: -kv[1]):
        lines.append(f"  {k:22}{fmt_bytes(v):>12}  {100 * v / total:5.1f}%")
    lines += ["", "largest tensors at the peak"]
    for t in r["largest_tensors_at_peak"]:
        lines.append(f"  {t['name'][:44]:44} {t['kind']:12}{fmt_bytes(t['bytes']):>12}  "
                     f"since step {t['since_step']}")
    lines += ["", "fullest steps               most in use during the step   after it"]
    for s in r["fullest_steps"]:
        lines.append(f"  step {s['step']:>6} {s['phase']} {s['layer'][:32]:32}"
                     f"{fmt_bytes(s['most_bytes']):>12}{fmt_bytes(s['bytes_after']):>12}")
    f = r["fragmentation"]
    lines += ["", "fragmentation = 1 - largest free block / free bytes (end of each step)"]
    for label, d in (("at the peak step", f["at_peak_step"]), ("worst step", f["worst"])):
        if d:
            where = f" (step {d['step']} {d['phase']} {d['layer']})" if "step" in d else ""
            lines.append(f"  {label:18}{d['fragmentation']:6.3f}: largest free "
                         f"{fmt_bytes(d['largest_free_block'])} of {fmt_bytes(d['free_bytes'])} "
                         f"free{where}")
    lines.append(f"  {'mean':18}{f['mean']:6.3f}")
    lines += ["", f"compactions             {r['compactions']:>12}   "
              f"{fmt_bytes(r['compacted_bytes'])} moved inside the arena",
              f"offloaded               {fmt_bytes(r['offload_bytes']):>12}   "
              f"device -> host, {r['offloads']} offloads",
              f"brought back            {fmt_bytes(r['prefetch_bytes']):>12}   "
              "host -> device, "
              f"{r['prefetches_ahead']} prefetched ahead, {r['fetches_on_miss']} fetched on a "
              "miss",
              f"host peak               {fmt_bytes(r['host_peak_bytes']):>12}",
              f"recomputed forwards     {r['extra_forward_steps']:>12}"]
    return "\n".join(lines)
