"""Memory planners as plug-ins (one file each); see base.py for the interface."""
from __future__ import annotations

from .base import KEEP, RECOMPUTE, SWAP, Decisions, PlanContext, Planner

_REGISTRY = {
    "superneurons": ("superneurons", "SuperNeurons"),
    "sublinear": ("sublinear", "Sublinear"),
    "sublinear-sqrt": ("sublinear", "SublinearSqrt"),
    "vdnn": ("vdnn", "VdnnAll"),
    "vdnn-conv": ("vdnn", "VdnnConv"),
    "capuchin": ("capuchin", "Capuchin"),
    "checkmate": ("checkmate", "Checkmate"),
}


def planner_names() -> list[str]:
    return list(_REGISTRY)


def get_planner(name_or_planner) -> Planner:
    if isinstance(name_or_planner, Planner):
        return name_or_planner
    try:
        module, cls = _REGISTRY[name_or_planner]
    except KeyError:
        raise ValueError(f"unknown planner {name_or_planner!r}; choose one of "
                         f"{', '.join(_REGISTRY)}") from None
    import importlib
    path = module if "." in module else f"{__name__}.{module}"
    return getattr(importlib.import_module(path), cls)()


def register(name: str, module: str, cls: str) -> None:
    """For planners outside this package (HOME, DQN, ...): module is an absolute import path
    or a module of this package."""
    _REGISTRY[name] = (module, cls)


__all__ = ["KEEP", "SWAP", "RECOMPUTE", "Decisions", "PlanContext", "Planner", "get_planner",
           "planner_names", "register"]
