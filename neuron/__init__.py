"""neuron: a deep-learning framework whose runtime owns every byte of device memory.

    import neuron as nn
    x = nn.Input((3, 32, 32))
    h = nn.ReLU()(nn.BatchNorm()(nn.Conv2d(16, 3, padding=1)(x)))
    y = nn.Linear(10)(nn.GlobalAvgPool()(nn.Add()(h, nn.Conv2d(16, 1)(x))))
    net = nn.Graph(x, y)
    ex = nn.Executor(net, batch=32, optimizer=nn.SGD(lr=0.1))
    loss = ex.train_step(images, labels)
"""
from . import _source_layout
from .errors import (DataError, GraphError, MemoryBudgetError, NeuronError, NonFiniteLossError,
                     NonFiniteUpdateError, ShapeError)
from .graph import Graph, Tensor
from .layers import (LRN, Add, AvgPool2d, BatchNorm, Concat, Conv2d, Dropout, GlobalAvgPool,
                     LeakyReLU, Linear, MaxPool2d, ReLU, Sigmoid, SoftmaxCrossEntropy, Tanh)
from .layers import input_tensor as Input
from .optim import SGD

__version__ = "0.1.0"

_source_layout.install()       # neuron.models from the top-level models/ of a source checkout


def __getattr__(name):
    # the executor pulls in the memory runtime (and the compiled heap): load it on first use
    if name == "Executor":
        from .executor import Executor
        return Executor
    raise AttributeError(f"module 'neuron' has no attribute {name!r}")


__all__ = ["Add", "AvgPool2d", "BatchNorm", "Concat", "Conv2d", "DataError", "Dropout",
           "Executor", "GlobalAvgPool", "Graph", "GraphError", "Input", "LRN", "LeakyReLU",
           "Linear", "MaxPool2d", "MemoryBudgetError", "NeuronError", "NonFiniteLossError",
           "NonFiniteUpdateError", "ReLU", "SGD", "ShapeError", "Sigmoid", "SoftmaxCrossEntropy", "Tanh", "Tensor"]
