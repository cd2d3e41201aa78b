"""A GPU's guarded training step leaves its loss on the device until the step has been issued
whole (layers/loss.py, ctx.loss_sink): CudaDevice over the CUDA stand-ins. Reading it at the
loss layer would make the host wait for forward before it issues backward."""
from __future__ import annotations

import numpy as np
import pytest

from neuron.errors import NonFiniteLossError
from neuron.executor import Executor
from neuron.models import build_model


def _executor(device, **kw):
    g = build_model("resnet_cifar", depth=8, in_shape=(3, 8, 8))
    return Executor(g, 4, device=device, seed=1, **kw)


def _batches(steps=3):
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((4, 3, 8, 8)).astype(np.float32), rng.integers(0, 10, 4))
            for _ in range(steps)]


def test_a_guarded_step_reads_the_device_only_once_it_has_issued_every_step(
        gpu_kernels, cuda_standins, monkeypatch):
    from neuron.devices.cuda import CudaDevice
    dev = CudaDevice(64 << 20, headroom_bytes=0)
    try:
        ex = _executor(dev, replay="off")
        issued, reads = [0], []
        compute = ex._compute

        def counted(step, ctx, ws):
            compute(step, ctx, ws)
            issued[0] += 1
        ex._compute = counted
        get = cuda_standins.DevArray.get
        monkeypatch.setattr(cuda_standins.DevArray, "get",
                            lambda self, stream=None: (reads.append(issued[0]), get(self))[1])
        for x, y in _batches(2):
            issued[0], reads[:] = 0, []
            loss = ex.train_step(x, y)
            assert np.isfinite(loss) and issued[0] == len(ex.steps)
            # the loss and the step guard's flag: read after the last step, not at the loss
            assert reads and all(r == len(ex.steps) for r in reads), reads
    finally:
        dev.close()


@pytest.mark.parametrize("kw", [{}, {"chunks": 2, "policy": "superneurons"}])
def test_the_loss_left_on_the_device_has_the_bits_of_the_loss_read_at_once(gpu_kernels, kw):
    from neuron.devices.cuda import CudaDevice
    runs = []
    for on_device in (True, False):
        dev = CudaDevice(64 << 20, headroom_bytes=0)
        dev.loss_on_device = on_device
        try:
            ex = _executor(dev, replay="off", **kw)
            losses = [ex.train_step(x, y) for x, y in _batches()]
            runs.append((losses, ex.state_dict()))
        finally:
            dev.close()
    (la, sa), (lb, sb) = runs
    assert np.array(la).tobytes() == np.array(lb).tobytes()
    for name in sa:
        assert sa[name].tobytes() == sb[name].tobytes(), name


@pytest.mark.parametrize("replay", ["off", "tape"])
def test_a_nonfinite_loss_left_on_the_device_is_named_and_undone(gpu_kernels, monkeypatch,
                                                                 replay):
    """The check runs on the device into the guard's flag; when the flag is read the loss is
    read too, and a non-finite one is the error (the updates it caused undone)."""
    from neuron.devices.cuda import CudaDevice
    dev = CudaDevice(64 << 20, headroom_bytes=0)
    try:
        ex = _executor(dev, replay=replay)
        batches = _batches(5)
        for x, y in batches[:4]:
            ex.train_step(x, y)
        assert ex.replay["ran"] == replay
        before = {k: v.copy() for k, v in ex.state_dict().items()}
        rows_kernel = gpu_kernels.softmax_xent_rows

        def nan_rows(logits, labels, probs, rows):
            rows_kernel(logits, labels, probs, rows)
            rows[0] = np.nan
        monkeypatch.setattr(gpu_kernels, "softmax_xent_rows", nan_rows)
        with pytest.raises(NonFiniteLossError, match="loss is nan at iteration 4"):
            ex.train_step(*batches[4])
        after = ex.state_dict()
        for name, v in before.items():
            assert after[name].tobytes() == v.tobytes(), name
    finally:
        dev.close()
