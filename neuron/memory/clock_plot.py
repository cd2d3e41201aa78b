"""`neuron plan --time --plot`: memory and the two streams against simulated time."""
from __future__ import annotations


def plot_timeline(timeline: list, trace: list, path: str, title: str = "") -> None:
    """timeline: (stream, start, end, what) from clock.makespan(..., timeline=True); trace:
    per step {step, bytes_in_use} in the order the steps ran."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("plotting needs matplotlib: pip install 'neuron-arena[plot]' (in a checkout: pip install -e '.[plot]')") from e
    fig, (mem, streams) = plt.subplots(2, 1, figsize=(10, 5.5), sharex=True,
                                       gridspec_kw={"height_ratios": [3, 1]})
    ends = [e for s, _, e, w in timeline if s == "compute" and w != "compact"]
    n = min(len(ends), len(trace))
    mem.step([0.0] + [e * 1e3 for e in ends[:n]],
             [0.0] + [r["bytes_in_use"] / 2 ** 20 for r in trace[:n]], where="pre")
    mem.set_ylabel("bytes in use (MiB)")
    mem.set_title(title)
    mem.grid(alpha=0.3)
    colors = {"compute": "tab:blue", "compact": "tab:red", "prefetch": "tab:green",
              "fetch": "tab:orange", "offload": "tab:purple", "all-reduce": "tab:brown"}
    rows = {"compute": 1, "comm": -1}      # copies and codec on row 0
    for stream, start, end, what in timeline:
        y = rows.get(stream, 0)
        c = colors.get(what if what in colors else stream, "tab:blue")
        streams.broken_barh([(start * 1e3, (end - start) * 1e3)], (y - 0.4, 0.8), color=c)
    if any(s == "comm" for s, _, _, _ in timeline):    # data parallelism's all-reduces
        streams.set_yticks([-1, 0, 1], ["comm", "copy", "compute"])
    else:
        streams.set_yticks([0, 1], ["copy", "compute"])
    streams.set_xlabel("simulated time (ms)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
