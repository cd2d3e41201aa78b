"""GPU: the step guard's device-side finiteness flag and a rolled-back step on the CUDA arena."""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def test_cuda_nonfinite_flag_matches_numpy_ref():
    import cupy as cp
    from neuron.kernels import cuda as K
    from neuron.kernels import numpy_ref as R
    for values in ([1.0, 2.0], [1.0, np.inf], [np.nan, 0.0], [3e38, -3e38]):
        a = np.array(values, np.float32)
        fr, fc = R.nonfinite_flag_new(), K.nonfinite_flag_new()
        R.nonfinite_flag_update(fr, a)
        K.nonfinite_flag_update(fc, cp.asarray(a))
        assert K.nonfinite_flag_read(fc) == R.nonfinite_flag_read(fr)
        K.nonfinite_flag_clear(fc)
        assert not K.nonfinite_flag_read(fc)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_interrupted_cuda_step_is_undone(interrupt_at):
    import neuron as nn
    from neuron.executor import Executor
    x = nn.Input((2, 5, 5), name="data")
    h = nn.ReLU(name="r")(nn.BatchNorm(name="bn")(nn.Conv2d(3, 3, padding=1, name="c")(x)))
    g = nn.Graph(x, nn.Linear(4, name="fc")(nn.GlobalAvgPool(name="gap")(h)))
    ex = Executor(g, 4, device="cuda", optimizer=nn.SGD(lr=0.1, momentum=0.9))
    rng = np.random.default_rng(0)
    xb, yb = rng.standard_normal((4, 2, 5, 5)).astype(np.float32), rng.integers(0, 4, 4)
    ex.train_step(xb, yb)
    before = ex.state_dict()
    undo = interrupt_at(ex, len(ex.steps) - 1)
    with pytest.raises(KeyboardInterrupt):
        ex.train_step(xb, yb)
    undo()
    after = ex.state_dict()
    assert all(before[k].tobytes() == after[k].tobytes() for k in before)
    assert ex.iteration == 1


def test_the_finiteness_check_of_many_tensors_is_the_per_tensor_one():
    """nonfinite_flag_update_many (one launch over a pointer table: the step guard's check of
    a step's BatchNorm statistics) sets the flag where any one of its tensors would."""
    import cupy as cp
    from neuron.kernels import cuda as K
    sizes = (2048 * 3 + 7, 1, 64, 4096)
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        for bad in (None, (0, 2048 * 3 + 6), (1, 0), (3, 4095)):
            arrays = [cp.asarray(rng.standard_normal(n).astype(dtype)) for n in sizes]
            if bad is not None:
                arrays[bad[0]][bad[1]] = np.nan
            flag = K.nonfinite_flag_new()
            K.nonfinite_flag_update_many(flag, arrays)
            assert K.nonfinite_flag_read(flag) == (bad is not None), (dtype, bad)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_nonfinite_statistic_in_a_range_snapshotted_step_is_undone_on_the_gpu():
    """The blocks stay put (no offload): snapshotted as arena ranges when the step starts, the
    statistics checked in one launch; an infinite running variance is refused and undone."""
    import neuron as nn
    from neuron.errors import NonFiniteUpdateError
    from neuron.executor import Executor
    x = nn.Input((2, 5, 5), name="data")
    h = nn.ReLU(name="r")(nn.BatchNorm(name="bn")(nn.Conv2d(3, 3, padding=1, name="c")(x)))
    g = nn.Graph(x, nn.Linear(4, name="fc")(nn.GlobalAvgPool(name="gap")(h)))
    ex = Executor(g, 4, device="cuda", optimizer=nn.SGD(lr=0.1, momentum=0.9))
    try:
        rng = np.random.default_rng(0)
        xb, yb = rng.standard_normal((4, 2, 5, 5)).astype(np.float32), rng.integers(0, 4, 4)
        ex.train_step(xb, yb)
        assert ex._snapshots_at_start()
        var = {t.name: t for t in ex.state_tensors}["bn.running_var"]
        ex.pool.view(var)[0] = np.inf
        before = ex.state_dict()
        with pytest.raises(NonFiniteUpdateError):
            ex.train_step(xb, yb)
        after = ex.state_dict()
        assert all(before[k].tobytes() == after[k].tobytes() for k in before)
        assert ex.iteration == 1
    finally:
        ex.device.close()
