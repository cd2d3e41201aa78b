"""Drawing memory: per-step traces (the SuperNeurons paper's Figure 10) and one recorded
iteration at a glance (`neuron plan --plot`). matplotlib is optional."""
from __future__ import annotations


def plot_trace(traces: dict, path: str, title: str = "") -> None:
    """traces: label -> list of {step, phase, bytes_in_use}; one line per label."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for label, rows in traces.items():
        ax.plot([r["step"] for r in rows], [r["bytes_in_use"] / 2 ** 20 for r in rows],
                label=label, linewidth=1.2)
        fwd = [r["step"] for r in rows if r["phase"] == "F"]
        if fwd:
            ax.axvline(max(fwd) + 0.5, color="grey", linewidth=0.6, linestyle=":")
    ax.set_xlabel("step (forward, then backward)")
    ax.set_ylabel("bytes in use (MiB)")
    ax.set_title(title, pad=38)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("plotting needs matplotlib: pip install 'neuron-arena[plot]' (in a checkout: pip install -e '.[plot]')") from e
    return plt


def plot_recording(rec, path: str, title: str = "", budget: int | None = None,
                   min_budget: int | None = None) -> dict:
    """One iteration at a glance: bytes in use per step against the budget, the forward /
    backward boundary, recomputation steps shaded, compactions marked; below, bytes moved to
    and from the host per step. ``rec``: a memory/recorder.py Recording. Returns what it
    marked."""
    from ..memory.clock_plot import budget_lines
    from ..memory.recorder import per_step
    plt = _pyplot()
    mib = 2 ** 20
    ps = per_step(rec)
    steps = list(range(len(rec.steps)))
    phases = [s.phase for s in rec.steps]
    fig, (ax, mv) = plt.subplots(2, 1, figsize=(11, 6), sharex=True,
                                 gridspec_kw={"height_ratios": [3, 1.2]})
    ax.fill_between(steps, [h / mib for h in ps["high"]], step="mid", alpha=0.35,
                    color="tab:blue", label="most bytes in use during the step")
    ax.plot(steps, [s.used_bytes / mib for s in rec.steps], color="tab:blue", linewidth=0.8,
            label="bytes in use after the step")
    budget_lines(ax, budget, min_budget)
    first_b = next((i for i, p in enumerate(phases) if p == "B"), None)
    for a in (ax, mv):
        if first_b is not None:
            a.axvline(first_b - 0.5, color="black", linewidth=1, linestyle=":")
    if first_b is not None:
        for text, ha in ((" backward \u2192", "left"), ("\u2190 forward ", "right")):
            ax.text(first_b - 0.5, 0.02, text, transform=ax.get_xaxis_transform(), ha=ha,
                    fontsize=8, bbox=dict(facecolor="white", alpha=0.8, linewidth=0))
    # one artist per series, not one per step: a 10^4-layer plan has 3x10^4 steps
    is_r = [p == "R" for p in phases]
    if any(is_r):
        ax.fill_between(steps, 0, 1, where=is_r, step="mid", color="tab:orange", alpha=0.3,
                        linewidth=0, transform=ax.get_xaxis_transform(),
                        label=f"recomputation ({sum(is_r)} steps)")
    comp = [i for i, c in enumerate(ps["compactions"]) if c]
    if comp:
        ax.scatter(comp, [ps["high"][i] / mib for i in comp], marker="x", color="tab:red",
                   zorder=5, label=f"compaction ({len(rec.compactions)})")
    ax.set_ylabel("arena bytes (MiB)")
    ax.set_ylim(bottom=0)
    ax.set_title(title, pad=38)
    ax.legend(loc="lower left", bbox_to_anchor=(0, 1.01), ncol=3, fontsize=8, frameon=False)
    ax.grid(alpha=0.3)
    off = [-b / mib for b in ps["offload"]]
    fetch = [b / mib for b in ps["fetch"]]
    mv.fill_between(steps, fetch, step="mid", color="tab:green", linewidth=0,
                    label=f"host \u2192 device (prefetch/fetch) {sum(ps['fetch']) / mib:,.0f} MiB")
    mv.fill_between(steps, off, step="mid", color="tab:purple", linewidth=0,
                    label=f"device \u2192 host (offload) {sum(ps['offload']) / mib:,.0f} MiB")
    mv.axhline(0, color="black", linewidth=0.5)
    mv.set_ylabel("moved (MiB)")
    mv.set_xlabel("step (forward, recomputations, backward)")
    mv.legend(loc="lower left", fontsize=8, framealpha=0.9)
    mv.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return {"budget": budget, "min_budget": min_budget, "backward_starts": first_b,
            "recompute_steps": sum(is_r), "compaction_steps": comp,
            "offload_bytes": sum(ps["offload"]), "fetch_bytes": sum(ps["fetch"])}
