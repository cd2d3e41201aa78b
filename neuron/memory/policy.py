"""Memory policies by name. A policy decides what the pool frees, offloads and recomputes."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Policy:
    name: str
    free_dead: bool             # liveness: free a tensor after its last use
    offload: bool = False       # unified tensor pool: LRU eviction to host when short
    recompute: bool = False     # cost-aware recomputation of cheap segments
    compact: bool = True        # slide tensors together when free bytes are scattered
    compact_first: bool = False  # compact before evicting (planners: evict only real shortage)
    description: str = ""


POLICIES = {
    "baseline": Policy("baseline", free_dead=False, compact=False,
                       description="a buffer per tensor, nothing freed during the iteration"),
    "liveness": Policy("liveness", free_dead=True,
                       description="free every tensor right after its last use"),
    "offload": Policy("offload", free_dead=True, offload=True,
                      description="liveness + unified tensor pool (LRU offload, prefetch)"),
    "recompute": Policy("recompute", free_dead=True, recompute=True,
                        description="liveness + cost-aware recomputation"),
    "superneurons": Policy("superneurons", free_dead=True, offload=True, recompute=True,
                           description="liveness + offload + cost-aware recomputation"),
}


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None
