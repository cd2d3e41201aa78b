"""Size arguments of the API: a non-integer is a TypeError naming the argument, never truncated."""
import numpy as np
import pytest

import neuron as nn
from neuron.executor import Executor
from neuron.sizes import shape_arg, size_arg


@pytest.mark.parametrize("make,argument", [
    (lambda: nn.Conv2d(4.7, 3), "out_channels"),
    (lambda: nn.Conv2d(4, 3, stride=2.5), "stride"),
    (lambda: nn.Conv2d(4, (3, 2.0)), "kernel_size[1]"),
    (lambda: nn.Conv2d(4, 3, groups=1.5), "groups"),
    (lambda: nn.Input((3, 8.5, 8)), "shape[1]"),
    (lambda: nn.Input("abc"), "shape"),
    (lambda: nn.Linear(2.0), "out_features"),
    (lambda: nn.MaxPool2d(2.5), "kernel_size"),
    (lambda: nn.AvgPool2d(2, padding=0.5), "padding"),
    (lambda: nn.LRN(size=3.5), "size"),
])
def test_non_integer_sizes_are_type_errors_naming_the_argument(make, argument):
    with pytest.raises(TypeError, match=rf"{argument.replace('[', '.').replace(']', '.')} must be"):
        make()


def test_executor_batch_must_be_an_integer():
    x = nn.Input((2, 4, 4))
    g = nn.Graph(x, nn.Linear(3)(nn.GlobalAvgPool()(nn.Conv2d(2, 3)(x))))
    with pytest.raises(TypeError, match="batch must be an integer"):
        Executor(g, 2.5)
    assert Executor(g, np.int64(2)).batch == 2


def test_numpy_integers_and_bools():
    assert size_arg(np.int32(3), "n", "x") == 3
    assert shape_arg(5, "shape", "x") == (5,)
    with pytest.raises(TypeError, match="n must be an integer"):
        size_arg(True, "n", "x")


def test_byte_sizes_take_strings_and_integers_and_name_the_argument():
    from neuron.sizes import byte_size_arg
    assert byte_size_arg("64MiB", "budget", "Executor") == 64 << 20
    assert byte_size_arg(4096, "budget", "Executor") == 4096
    assert byte_size_arg(1e9, "budget", "Executor") == 10 ** 9
    assert byte_size_arg(None, "budget", "Executor") is None
    for bad, err in [("64XB", ValueError), (float("nan"), ValueError), (float("inf"), ValueError),
                     (-5, ValueError), (0, ValueError), (True, TypeError), ([1], TypeError)]:
        with pytest.raises(err, match="Executor: budget"):
            byte_size_arg(bad, "budget", "Executor")
