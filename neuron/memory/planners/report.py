"""What `neuron plan --planner NAME` reports about a planner's decisions."""
from __future__ import annotations


def decisions_report(ex, planner) -> dict:
    d = ex.decisions
    return {"planner": getattr(planner, "name", planner), "tensor_decisions": d.counts(),
            "planner_info": {k: v for k, v in d.info.items()}}
