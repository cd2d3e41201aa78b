"""`neuron plan --time --plot`: memory and the streams against simulated time, with the same
marks as the per-step chart (views/report.py): the budget, the minimum budget, the forward/backward
boundary and a legend."""
from __future__ import annotations

MIB = 2 ** 20


def budget_lines(ax, budget: int | None, min_budget: int | None) -> None:
    """The budget (solid) and, where it differs, the minimum budget (dashed), in MiB: the marks
    both memory charts draw."""
    if budget:
        ax.axhline(budget / MIB, color="tab:red", linewidth=1.2,
                   label=f"budget {budget / MIB:,.0f} MiB")
    if min_budget and min_budget != budget:
        ax.axhline(min_budget / MIB, color="tab:red", linewidth=0.8, linestyle="--",
                   label=f"minimum budget {min_budget / MIB:,.0f} MiB")


def plot_timeline(timeline: list, trace: list, path: str, title: str = "",
                  budget: int | None = None, min_budget: int | None = None) -> dict:
    """timeline: (stream, start, end, what) from clock.makespan(..., timeline=True); trace:
    per step {step, phase, bytes_in_use} in the order the steps ran. Returns what it marked."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError as e:
        raise ImportError("plotting needs matplotlib: pip install 'neuron-arena[plot]' (in a checkout: pip install -e '.[plot]')") from e
    mib = 2 ** 20
    fig, (mem, streams) = plt.subplots(2, 1, figsize=(10, 5.5), sharex=True,
                                       gridspec_kw={"height_ratios": [3, 1]})
    ends = [e for s, _, e, w in timeline if s == "compute" and w != "compact"]
    n = min(len(ends), len(trace))
    mem.step([0.0] + [e * 1e3 for e in ends[:n]],
             [0.0] + [r["bytes_in_use"] / mib for r in trace[:n]], where="pre",
             label="bytes in use after each step")
    budget_lines(mem, budget, min_budget)
    first_b = next((i for i in range(n) if trace[i].get("phase") == "B"), None)
    boundary_ms = None
    if first_b is not None:
        boundary_ms = (ends[first_b - 1] if first_b > 0 else 0.0) * 1e3
        for a in (mem, streams):
            a.axvline(boundary_ms, color="black", linewidth=1, linestyle=":")
        for text, ha in ((" backward \u2192", "left"), ("\u2190 forward ", "right")):
            mem.text(boundary_ms, 0.02, text, transform=mem.get_xaxis_transform(), ha=ha,
                     fontsize=8, bbox=dict(facecolor="white", alpha=0.8, linewidth=0))
    mem.set_ylabel("arena bytes (MiB)")
    mem.set_ylim(bottom=0)
    mem.set_title(title, pad=38)
    mem.legend(loc="lower left", bbox_to_anchor=(0, 1.01), ncol=3, fontsize=8, frameon=False)
    mem.grid(alpha=0.3)
    colors = {"compute": "tab:blue", "compact": "tab:red", "prefetch": "tab:green",
              "fetch": "tab:orange", "offload": "tab:purple", "codec": "tab:olive",
              "all-reduce": "tab:brown"}
    rows = {"compute": 1, "comm": -1}      # copies and codec on row 0
    used = set()
    for stream, start, end, what in timeline:
        y = rows.get(stream, 0)
        key = what if what in colors else "offload" if str(what).startswith("offload") \
            else stream                     # a step's name on compute, encode/decode on codec
        used.add(key)
        streams.broken_barh([(start * 1e3, (end - start) * 1e3)], (y - 0.4, 0.8),
                            color=colors.get(key, "tab:gray"))
    if any(s == "comm" for s, _, _, _ in timeline):    # data parallelism's all-reduces
        streams.set_yticks([-1, 0, 1], ["comm", "copy", "compute"])
    else:
        streams.set_yticks([0, 1], ["copy", "compute"])
    streams.legend(handles=[Patch(color=c, label=k) for k, c in colors.items() if k in used],
                   loc="upper right", fontsize=7, ncol=3, framealpha=0.9)
    streams.set_xlabel("simulated time (ms)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return {"budget": budget, "min_budget": min_budget, "backward_starts_ms": boundary_ms,
            "steps_drawn": n}
