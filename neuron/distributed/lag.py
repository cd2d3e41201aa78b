"""`neuron plan --data-parallel K --time --dp-lag auto`: how many backward steps a gradient
bucket's collective gets before its updates wait for it (distributed/overlap.py), chosen on
the simulated clock.

A longer lag hides a slower link under more of backward, and keeps the bucket's gradients
alive longer (in the plan's bytes, so under a budget it can stop fitting). The lags tried are
the default (3) and its doublings, each a whole plan at that lag, until the all-reduce is
hidden (what stays exposed is within ``tolerance`` of its time), the lag passes the last
backward step, or the plan stops fitting. The answer is the smallest lag whose simulated
iteration is within ``tolerance`` of the fastest tried: `train --dp-lag N` then runs it.
"""
from __future__ import annotations

from .overlap import DEFAULT_LAG


def choose_lag(graph, batch: int, *, cost, comm, grad_buckets: int, budget=None,
               tolerance: float = 0.01, **kw) -> tuple[int, list[dict]]:
    """(the lag, one row per lag tried). ``kw``: plan()'s policy options."""
    from ..plan import plan
    tried, lag = [], DEFAULT_LAG
    while True:
        r = plan(graph, batch, budget=budget, search_min=False, trace=False, cost=cost,
                 comm=comm, grad_buckets=grad_buckets, grad_lag=lag, **kw)
        if not r["fits"]:
            tried.append({"lag": lag, "fits": False})
            break
        tried.append({"lag": lag, "fits": True, "simulated_time_s": r["simulated_time_s"],
                      "allreduce_exposed_s": r["allreduce_exposed_s"],
                      "peak_bytes": r["peak_bytes"]})
        if r["allreduce_exposed_s"] <= tolerance * r["allreduce_time_s"] \
                or lag >= r["num_layers"]:
            break
        lag *= 2
    ok = [t for t in tried if t["fits"]]
    if not ok:
        return DEFAULT_LAG, tried       # the plan at the default says why it does not fit
    best = min(t["simulated_time_s"] for t in ok)
    return min(t["lag"] for t in ok if t["simulated_time_s"] <= best * (1 + tolerance)), tried
