"""The training graph (a network plus its loss) and the batches it is fed.

``with_loss`` closes a network of one data input and one per-sample output (K,) with a loss:
softmax cross-entropy on integer labels (classification, the default), or MSELoss on float
targets of the output's shape (regression: the DQN planner's Q-network). ``feed`` checks a
batch against it and names what is wrong (input, labels or targets; shape, dtype, range or a
non-finite value) before any step runs.
"""
from __future__ import annotations

import numpy as np

from .errors import DataError
from .graph import Graph
from .layers import Input, MSELoss, SoftmaxCrossEntropy
from .precision import is_real_float

LOSSES = ("softmax", "mse")


def with_loss(graph: Graph, loss: str = "softmax") -> Graph:
    """The training graph: graph inputs + targets -> outputs -> loss. ``loss``: "softmax"
    (softmax cross-entropy, integer labels) or "mse" (MSELoss: float targets of the output's
    shape, for regression such as the DQN planner's Q-network)."""
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {', '.join(LOSSES)}, got {loss!r}")
    cache = graph.__dict__.setdefault("_train_graphs", {})
    if loss in cache:
        return cache[loss]
    if len(graph.inputs) != 1:
        raise DataError(f"{graph.name}: training feeds one data input; this graph has "
                        f"{len(graph.inputs)} ({[t.name for t in graph.inputs]})")
    if len(graph.outputs) != 1 or len(graph.outputs[0].shape) != 1:
        raise DataError(f"{graph.name}: training needs one output of per-sample shape (K,), got "
                        f"{[t.shape for t in graph.outputs]}")
    if loss == "softmax":
        labels = Input((), dtype=np.int64, name="labels")()
        loss_layer = SoftmaxCrossEntropy(name="loss")
    else:
        labels = Input(graph.outputs[0].shape, name="labels")()
        loss_layer = MSELoss(name="loss")
    loss_layer.training_loss = True     # another Graph over these tensors is not "dangling"
    out = loss_layer(graph.outputs[0], labels)
    tg = Graph(graph.inputs + [labels], [out], name=graph.name)
    cache[loss] = tg
    if loss == "softmax":
        graph._train_graph = tg
    return tg


def feed(train_graph: Graph, batch: int, dtype, loss: str, x, y,
         check_finite: bool = True, as_is: tuple = ()) -> dict:
    """{producer name: array} for one training step, after checking the batch.
    ``check_finite`` False: the caller checks the images' finiteness on the device instead
    (the step guard's flag: a pass over the batch on the host costs milliseconds a step).
    Images that are one of ``as_is`` (a replay's staging buffers, in the type the step reads:
    bf16 in a bf16 run) are not cast to ``dtype``: a cast and back would cost two passes."""
    data, labels = train_graph.inputs
    x = np.asarray(x)
    if not is_real_float(x.dtype):  # complex loses its imaginary part, integers are unscaled
        raise DataError(f"input {data.name}: batch has dtype {x.dtype}; give normalized real "
                        "floating point images (e.g. x.astype(np.float32) / 255, then "
                        "standardized)")
    want = (batch, *data.shape)
    if x.shape != want:
        raise DataError(f"input {data.name}: batch has shape {x.shape}, the network expects "
                        f"{want}")
    y = np.asarray(y)
    if loss == "mse":
        return {data.producer.name: x.astype(dtype, copy=False),
                labels.producer.name: _regression_targets(train_graph, batch, dtype, x, y)}
    if y.shape != (batch,):
        raise DataError(f"labels: shape {y.shape}, expected ({batch},)")
    if not np.issubdtype(y.dtype, np.integer):
        raise DataError(f"labels: dtype {y.dtype} is not an integer type")
    k = train_graph.layers["loss"].num_classes
    if y.size and (y.min() < 0 or y.max() >= k):
        bad = y[(y < 0) | (y >= k)][0]
        raise DataError(f"labels: value {bad} out of range [0, {k}) for the loss layer")
    if check_finite and not np.all(np.isfinite(x)):
        raise DataError(nonfinite_input(data.name))
    keep = any(x is a for a in as_is)
    return {data.producer.name: x if keep else x.astype(dtype, copy=False),
            labels.producer.name: y.astype(np.int64, copy=False)}


def nonfinite_input(name: str) -> str:
    return f"input {name}: batch contains NaN or infinity"


def _regression_targets(train_graph, batch, dtype, x, y):
    """MSE targets: real floating point, finite, shape (batch, K)."""
    want = (batch, *train_graph.inputs[1].shape)
    if y.dtype.kind != "f":
        raise DataError(f"targets: dtype {y.dtype} is not a real floating type (the mse "
                        "loss regresses float targets)")
    if y.shape != want:
        raise DataError(f"targets: shape {y.shape}, expected {want} (batch, outputs)")
    if not np.all(np.isfinite(y)):
        raise DataError("targets: contain NaN or infinity")
    if not np.all(np.isfinite(x)):
        raise DataError("input: batch contains NaN or infinity")
    return y.astype(dtype, copy=False)
