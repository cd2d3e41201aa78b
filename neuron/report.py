"""Drawing memory traces (the SuperNeurons paper's Figure 10). matplotlib is optional."""
from __future__ import annotations


def plot_trace(traces: dict, path: str, title: str = "") -> None:
    """traces: label -> list of {step, phase, bytes_in_use}; one line per label."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("plotting needs matplotlib: pip install 'neuron[plot]'") from e
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for label, rows in traces.items():
        ax.plot([r["step"] for r in rows], [r["bytes_in_use"] / 2 ** 20 for r in rows],
                label=label, linewidth=1.2)
        fwd = [r["step"] for r in rows if r["phase"] == "F"]
        if fwd:
            ax.axvline(max(fwd) + 0.5, color="grey", linewidth=0.6, linestyle=":")
    ax.set_xlabel("step (forward, then backward)")
    ax.set_ylabel("bytes in use (MiB)")
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
