"""neuron.models lives in the repository's top-level models/ folder (the design card's layout).

An installed neuron has it at neuron/models (setup.py's package_dir copies it there). Run from
a source checkout (or an editable install of one), neuron/ has no models/ subfolder; this
finder maps the name neuron.models (and nothing else) to ../models instead.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
MODELS_DIR = os.path.join(os.path.dirname(_HERE), "models")


class _ModelsFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != "neuron.models":
            return None
        return importlib.util.spec_from_file_location(
            fullname, os.path.join(MODELS_DIR, "__init__.py"),
            submodule_search_locations=[MODELS_DIR])


def install() -> None:
    """Add the finder when neuron/models is absent and ../models is there (a source tree)."""
    # an installed package has neuron/models/__init__.py; a checkout may still hold a stale
    # neuron/models/__pycache__ from before the move, which must not count
    if os.path.isfile(os.path.join(_HERE, "models", "__init__.py")):
        return
    if not os.path.isfile(os.path.join(MODELS_DIR, "__init__.py")):
        return
    # first in line: another neuron's editable-install finder (an older layout installed on
    # the same Python) would otherwise answer for neuron.models with its own copy
    if not any(isinstance(f, _ModelsFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _ModelsFinder())
