"""Every constructor argument of every layer is checked when the layer is made: a wrong type, a
NaN, an out-of-range number or a dtype that cannot be computed with is an error naming the layer
and the argument there, not an unrelated failure in a later step."""
import inspect

import numpy as np
import pytest

import neuron.layers as L
from neuron.layers.base import Layer

NAME = [3, ""]
#: layer -> (required arguments, {argument: bad values}); every argument must be listed
CASES = {
    L.Add: ({}, {"name": NAME}), L.AddReLU: ({}, {"name": NAME}), L.Concat: ({}, {"name": NAME}),
    L.ReLU: ({}, {"name": NAME}), L.Sigmoid: ({}, {"name": NAME}), L.Tanh: ({}, {"name": NAME}),
    L.GlobalAvgPool: ({}, {"name": NAME}), L.SoftmaxCrossEntropy: ({}, {"name": NAME}),
    L.MSELoss: ({}, {"name": NAME}),
    L.LeakyReLU: ({}, {"slope": [0, -1, float("nan"), "0.1"], "name": NAME}),
    L.Dropout: ({}, {"p": [1.0, -0.1, float("nan"), "0.5", None], "name": NAME}),
    L.BatchNorm: ({}, {"momentum": [-0.1, 1.5, float("inf"), "0.1"],
                       "eps": [-1, 0, float("nan"), None], "name": NAME}),
    L.BNReLU: ({}, {"momentum": [-0.1, 1.5, float("inf"), "0.1"],
                    "eps": [-1, 0, float("nan"), None], "name": NAME}),
    L.LRN: ({}, {"size": [0, 17, 2.5], "alpha": [float("nan"), "1e-4"], "beta": [0, float("inf")],
                 "k": [0, -1, float("nan")], "name": NAME}),
    L.Input: ({"shape": (1, 8, 8)}, {"shape": [(0, 8, 8), (1, 8.5, 8), "1,8,8"],
                                     "dtype": [np.int64, np.complex64, "no such dtype", np.bool_],
                                     "name": NAME}),
    L.Linear: ({"out_features": 4}, {"out_features": [0, 2.5, "4"], "bias": ["no", 1, None],
                                     "init": [5, "he"], "name": NAME}),
    L.Conv2d: ({"out_channels": 4, "kernel_size": 3},
               {"out_channels": [0, 4.0], "kernel_size": [0, (3, 3, 3), 2.5],
                "stride": [0, (1, 0)], "padding": [-1, 0.5], "dilation": [0, "1"],
                "groups": [0, 1.5], "bias": ["no", 0], "init": [5], "name": NAME}),
    L.MaxPool2d: ({"kernel_size": 2}, {"kernel_size": [0, 2.5], "stride": [0, "2"],
                                       "padding": [-1, 2], "ceil_mode": ["yes", 1],
                                       "name": NAME}),
    L.AvgPool2d: ({"kernel_size": 2}, {"kernel_size": [0, 2.5], "stride": [0, "2"],
                                       "padding": [-1, 2], "ceil_mode": ["yes", 1],
                                       "name": NAME}),
}


def _layer_classes():
    return [c for n in L.__all__ if inspect.isclass(c := getattr(L, n))
            and issubclass(c, Layer) and c is not Layer]


def test_every_argument_of_every_layer_has_cases():
    for cls in _layer_classes():
        assert cls in CASES, f"{cls.__name__}: add its constructor arguments to CASES"
        params = set(inspect.signature(cls).parameters)
        assert params == set(CASES[cls][1]), (cls.__name__, params ^ set(CASES[cls][1]))


def _cases():
    for cls, (required, bad) in CASES.items():
        for arg, values in bad.items():
            for v in values:
                yield pytest.param(cls, required, arg, v, id=f"{cls.__name__}-{arg}={v!r}")


@pytest.mark.parametrize("cls,required,arg,value", list(_cases()))
def test_a_bad_argument_is_refused_at_construction_naming_layer_and_argument(
        cls, required, arg, value):
    kw = {**required, arg: value}
    if arg != "name":
        kw["name"] = "probe"
    with pytest.raises((TypeError, ValueError)) as e:
        cls(**kw)
    msg = str(e.value)
    assert arg in msg, msg
    assert ("probe" if arg != "name" else cls.type_name) in msg, msg


def test_good_arguments_still_build():
    L.BatchNorm(momentum=0, eps=1e-3)
    L.Dropout(0.0)
    L.Input((), dtype=np.int64)                  # a labels input
    L.Input((3, 4, 4), dtype=np.float64)
    L.LRN(size=5, alpha=0, beta=0.75, k=2)
    L.Linear(3, bias=np.bool_(False), init=lambda rng, shape: np.zeros(shape, np.float32))
    L.MaxPool2d((2, 3), stride=np.int64(1), ceil_mode=True)
