"""Memory planners as plug-ins (one file each); see base.py for the interface."""
from __future__ import annotations

from .base import KEEP, RECOMPUTE, SWAP, Decisions, PlanContext, Planner

_REGISTRY = {
    "superneurons": ("superneurons", "SuperNeurons"),
    "sublinear": ("sublinear", "Sublinear"),
    "sublinear-sqrt": ("sublinear", "SublinearSqrt"),
    "sublinear-recursive": ("sublinear_recursive", "SublinearRecursive"),
    "vdnn": ("vdnn", "VdnnAll"),
    "vdnn-conv": ("vdnn", "VdnnConv"),
    "capuchin": ("capuchin", "Capuchin"),
    "checkmate": ("checkmate", "Checkmate"),
    "home": ("home", "Home"),
    "dqn": ("dqn", "Dqn"),
}


def planner_names() -> list[str]:
    return list(_REGISTRY)


def get_planner(name_or_planner) -> Planner:
    """A planner by name; "name:key=value,..." passes options (e.g. "home:seed=3";
    "compress=2" on any planner adds FreeLunch compression, planners/compress.py)."""
    if isinstance(name_or_planner, Planner):
        return name_or_planner
    name_or_planner, _, opts = str(name_or_planner).partition(":")
    try:
        module, cls = _REGISTRY[name_or_planner]
    except KeyError:
        raise ValueError(f"unknown planner {name_or_planner!r}; choose one of "
                         f"{', '.join(_REGISTRY)}") from None
    import importlib
    path = module if "." in module else f"{__name__}.{module}"
    cls = getattr(importlib.import_module(path), cls)
    opts = parse_options(name_or_planner, opts)
    rate = opts.pop("compress", None)       # FreeLunch COMPRESS over any planner
    if rate is not None and getattr(cls, "plans_compression", False):
        opts["compress"], rate = rate, None  # it decides per tensor (HOME's fourth code)
    opts = _typed_options(name_or_planner, cls, opts)
    try:
        planner = cls(**opts)
    except TypeError as e:          # an option the planner does not take
        raise ValueError(f"planner {name_or_planner!r}: {e}") from None
    if rate is None:
        return planner
    from .compress import Compressed
    return Compressed(planner, rate)


def parse_options(name: str, opts: str) -> dict:
    """"seed=3,search_seconds=20" -> {"seed": 3, "search_seconds": 20.0}."""
    out = {}
    for item in filter(None, opts.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"planner {name!r}: option {item!r} is not key=value")
        try:
            out[key] = int(value)
        except ValueError:
            try:
                out[key] = float(value)
            except ValueError:
                out[key] = value
    return out


def _option_kind(param):
    """int, float, bool or str: what a planner's constructor parameter takes (its default's
    type, else the first of them its annotation names); None: unknown, passed as given."""
    d = param.default
    for kind in (bool, int, float, str):
        if isinstance(d, kind):
            return kind
    ann = param.annotation if isinstance(param.annotation, str) else \
        getattr(param.annotation, "__name__", str(param.annotation))
    for word in ann.replace(" ", "").split("|"):
        kind = {"bool": bool, "int": int, "float": float, "str": str}.get(word)
        if kind is not None:
            return kind
    return None


def _typed_options(name: str, cls, opts: dict) -> dict:
    """The options checked against the planner's constructor: an unknown name or a value of
    the wrong type (seed=abc, search_seconds=nan) is a ValueError naming the planner, the
    option and what it takes, before any planning."""
    import inspect
    import math
    params = inspect.signature(cls).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return opts
    out = {}
    for key, value in opts.items():
        p = params.get(key)
        if p is None:
            raise ValueError(f"planner {name!r}: unknown option {key!r}; it takes "
                             f"{', '.join(params) or 'no options'}")
        kind = _option_kind(p)
        bad = f"planner {name!r}: option {key} must be"
        if kind is bool:
            if value not in (0, 1, "true", "false"):
                raise ValueError(f"{bad} true or false (1 or 0), got {value!r}")
            value = value in (1, "true")
        elif kind is int:
            if not isinstance(value, int):
                raise ValueError(f"{bad} an integer, got {value!r}")
        elif kind is float:
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{bad} a finite number, got {value!r}")
            value = float(value)
        elif kind is str:
            value = str(value)
        out[key] = value
    return out


def register(name: str, module: str, cls: str) -> None:
    """For planners outside this package (HOME, DQN, ...): module is an absolute import path
    or a module of this package."""
    _REGISTRY[name] = (module, cls)


__all__ = ["KEEP", "SWAP", "RECOMPUTE", "Decisions", "PlanContext", "Planner", "get_planner",
           "planner_names", "register"]
