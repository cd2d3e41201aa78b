"""neuron's modules import one another without cycles: each layer of the architecture imports
only downward.

The graph is read from the source with ``ast``: every ``import`` and ``from ... import``,
at the top of a module and inside functions alike (a function-local import hides a cycle from
Python's loader, not from the design), relative and absolute. ``from P import N`` is an edge to
the module P.N when N is a submodule, else to P. The models of the top-level models/ folder
count as neuron.models. Plug-ins that registries load by name (neuron.devices, memory/planners)
are not imports and are not counted.
"""
from __future__ import annotations

import ast
import os
from collections import deque

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = (("neuron", "neuron"), ("models", "neuron.models"))


def neuron_modules() -> dict[str, tuple[str, bool]]:
    """Module name -> (file, is a package) for every .py file of neuron (and its models)."""
    mods = {}
    for folder, prefix in PACKAGES:
        top = os.path.join(ROOT, folder)
        for d, dirs, files in os.walk(top):
            dirs[:] = [x for x in dirs if x != "__pycache__"]
            for f in files:
                if f.endswith(".py"):
                    parts = os.path.relpath(os.path.join(d, f), top)[:-3].split(os.sep)
                    is_pkg = parts[-1] == "__init__"
                    name = ".".join([prefix] + (parts[:-1] if is_pkg else parts))
                    mods[name] = (os.path.join(d, f), is_pkg)
    return mods


def imports_of(name: str, path: str, is_pkg: bool, mods) -> dict[str, int]:
    """The neuron modules ``name`` imports -> the first line that imports each."""
    package = name if is_pkg else name.rpartition(".")[0]
    out: dict[str, int] = {}

    def add(target, line):
        if target != name:
            out.setdefault(target, line)

    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in mods:
                    add(a.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = ".".join(base[:len(base) - node.level + 1])
                src = f"{base}.{node.module}" if node.module else base
            else:
                src = node.module or ""
            for a in node.names:
                if f"{src}.{a.name}" in mods:
                    add(f"{src}.{a.name}", node.lineno)
                elif src in mods:
                    add(src, node.lineno)
    return out


def import_graph() -> dict[str, dict[str, int]]:
    mods = neuron_modules()
    return {m: imports_of(m, path, is_pkg, mods) for m, (path, is_pkg) in mods.items()}


def strongly_connected(graph) -> list[list[str]]:
    """Tarjan's components with more than one module (a module never imports itself here)."""
    index, low, on_stack, stack, comps = {}, {}, set(), [], []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph[w])))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    comps.append(sorted(comp))
    return comps


def shortest_cycle(graph, start: str, members: set[str]) -> list[str]:
    """The shortest import path from ``start`` back to itself inside one component."""
    prev = {start: None}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in graph[v]:
            if w == start:
                path = [v]                                  # back from v to start
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return path[::-1] + [start]
            if w in members and w not in prev:
                prev[w] = v
                queue.append(w)
    return []


def cycles(graph) -> list[str]:
    """One line per distinct shortest cycle through each module of each component, naming the
    line of every import on it."""
    lines = []
    for comp in strongly_connected(graph):
        seen = set()
        for m in comp:
            cyc = shortest_cycle(graph, m, set(comp))
            key = frozenset(zip(cyc, cyc[1:]))
            if cyc and key not in seen:
                seen.add(key)
                lines.append(" -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(cyc, cyc[1:]))
                             + f" -> {cyc[-1]}")
    return lines


def test_the_graph_sees_every_kind_of_import():
    g = import_graph()
    assert "neuron.executor" in g["neuron"]                      # function-local, relative
    assert "neuron.layers.base" in g["neuron.layers.data"]      # relative, in a subpackage
    assert "neuron.errors" in g["neuron.layers.data"]           # relative, one level up
    assert "neuron.memory.planners.costs" in g["neuron.memory.planners.capuchin"]
    assert "neuron.layers" in g["neuron.models.resnet"]          # the models folder counts
    assert len(g) > 100


def test_a_cycle_is_found_and_printed():
    g = {"a": {"b": 3}, "b": {"c": 7}, "c": {"a": 1}, "d": {"a": 2}}
    (line,) = cycles(g)
    assert line.count("->") == 3 and "a (line 3)" in line and "c (line 1)" in line
    assert "d" not in line
    assert cycles({"a": {"b": 1}, "b": {}}) == []


def test_no_import_cycles():
    found = cycles(import_graph())
    for line in found:
        print(line)
    assert not found, f"{len(found)} import cycle(s) among neuron's modules:\n" + "\n".join(found)
