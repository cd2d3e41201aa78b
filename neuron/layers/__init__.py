"""The layer API: one file per layer family."""
from .activation import LeakyReLU, ReLU, Sigmoid, Tanh
from .base import Context, Layer, ParamSpec
from .conv import Conv2d
from .data import Input, input_tensor
from .dropout import Dropout
from .join import Add, AddReLU, Concat
from .linear import Linear
from .loss import MSELoss, SoftmaxCrossEntropy
from .norm import LRN, BatchNorm, BNReLU
from .pool import AvgPool2d, GlobalAvgPool, MaxPool2d

__all__ = ["Add", "AddReLU", "AvgPool2d", "BatchNorm", "BNReLU", "Concat", "Context", "Conv2d", "Dropout",
           "GlobalAvgPool", "Input", "LRN", "Layer", "LeakyReLU", "Linear", "MaxPool2d",
           "ParamSpec", "ReLU", "Sigmoid", "SoftmaxCrossEntropy", "MSELoss", "Tanh", "input_tensor"]
