"""A ctypes binding to cuDNN 9's legacy API (``libcudnn.so.9``), loaded on first use.

Why ctypes: CuPy 14 dropped every cuDNN binding, cudnn-frontend drags in dependencies the project
does not allow, and a compiled extension would need a build per Python version. The legacy API is
deprecated since cuDNN 9.0 but still exported by the 9.x shim, and it is exactly what the memory
runtime needs: per-algorithm workspace bytes and measured times, and an explicit workspace pointer
on every call, so every byte cuDNN touches can come from neuron's own arena
(shared/reference/cuda-stack.md has the evidence).

This module is the binding's single entry point (``from neuron.kernels import cudnn as dnn``); the
code lives in four modules, bottom up:

* :mod:`~neuron.kernels.cudnn_api`: enum values and struct layouts copied from the cuDNN 9.28
  headers, the prototype table, errors, library discovery (:func:`find_library`) and lazy loading
  (:func:`lib`): ``import neuron`` and this module work on a machine without CUDA or cuDNN;
* :mod:`~neuron.kernels.cudnn_descriptors`: descriptor objects with a cache keyed by
  shape/parameters (creating descriptors costs a few ctypes calls; a training step would
  otherwise rebuild thousands of them) and the per-thread handles;
* :mod:`~neuron.kernels.cudnn_ops`: thin pointer-level wrappers for the operations neuron uses.
  They take raw device pointers and descriptors and know nothing about CuPy;
  :mod:`neuron.kernels.cuda` composes them;
* :mod:`~neuron.kernels.cudnn_engines`: convolutions on the backend API's engines (heuristics,
  execution plans, timing), the kernels PyTorch's cudnn.benchmark chooses from;
* :mod:`~neuron.kernels.cudnn_headers`: :func:`check_headers`, which compiles a probe against the
  installed headers and compares them with the hand-copied values (the only way hand-copied
  constants stay honest).

Every call goes through :func:`call`, which raises :class:`CudnnError` with the function name and
cuDNN's own message.
"""
from __future__ import annotations

from . import cudnn_api as _api
from . import cudnn_descriptors as _descriptors
from . import cudnn_engines as _engines
from . import cudnn_headers as _headers
from . import cudnn_ops as _ops

_PARTS = (_api, _descriptors, _ops, _engines, _headers)
#: rebound after import (the library once loaded): never copied, always read from cudnn_api
_LIVE = ("annotations", "_lib", "_lib_path")
for _m in _PARTS:
    globals().update({k: v for k, v in vars(_m).items()
                      if not k.startswith("__") and k not in _LIVE})
del _m


def __getattr__(name):
    """Module state that changes after import (``_lib`` once loaded) is read from its home."""
    for m in _PARTS:
        if name in vars(m):
            return getattr(m, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
