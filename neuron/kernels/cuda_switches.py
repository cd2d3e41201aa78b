"""The switches of the GPU kernels, read at call time by conv_algos.py, cuda_pool.py and cuda.py.

Their public home stays :mod:`neuron.kernels.cuda` (``neuron.kernels.cuda.deterministic =
True``): that module forwards reads and writes of these names here, so the kernel modules
below it read them without importing it.
"""
from __future__ import annotations

import os

#: only deterministic cuDNN algorithms, chosen by heuristic rank instead of by a (noisy) timing,
#: plus deterministic max-pool backward: bit-identical results from run to run
deterministic = False
#: let float32 convolutions use TF32 tensor cores (torch.backends.cudnn.allow_tf32). Off by
#: default so float32 results stay within float32 rounding of the NumPy reference; cuBLAS in
#: CuPy follows the CUPY_TF32 environment variable instead.
allow_tf32 = False
#: "find": measure with cudnnFind*AlgorithmEx (once per layer geometry and bucket);
#: "heuristic": cuDNN's ranking without running anything
conv_algo_search = "find"
#: with "find": time cuDNN's backend engine plans too (cudnn_engines.py), the kernels PyTorch's
#: cudnn.benchmark picks from; the fastest of both sets runs. NEURON_CONV_ENGINES=0 in the
#: environment starts with it off (a device session can rule the engines out without an edit)
conv_engines = os.environ.get("NEURON_CONV_ENGINES", "1").strip() not in ("0", "off", "false")
#: the optimizer step of all of a layer's (or a bucket's) parameters in one launch
#: (cuda.sgd_update_many) instead of one per tensor; NEURON_SGD_PER_LAYER=0 in the environment
#: starts with it off (the per-tensor kernels, same bits)
sgd_per_layer = os.environ.get("NEURON_SGD_PER_LAYER", "1").strip() not in ("0", "off", "false")
#: label stamped on conv_algo_trace records (the executor may set the current layer/step name)
trace_label = None

NAMES = ("deterministic", "allow_tf32", "conv_algo_search", "conv_engines", "sgd_per_layer",
         "trace_label")
