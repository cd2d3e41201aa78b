"""GPU: cuDNN's backend engine plans (kernels/cudnn_engines.py) are built, timed and run, compute
what the legacy algorithms compute, are captured in a CUDA graph, and are chosen in a network's
step where they are faster (conv_algos.py)."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu

GEOMETRIES = [  # x, w, padding, stride, dilation
    ((16, 64, 56, 56), (64, 64, 3, 3), (1, 1), (1, 1), (1, 1)),
    ((16, 256, 56, 56), (128, 256, 1, 1), (0, 0), (2, 2), (1, 1)),
    ((8, 32, 28, 28), (64, 8, 3, 3), (1, 1), (1, 1), (1, 1)),        # groups = 4
]


def _operands(cp, x_shape, w_shape, padding, stride, dilation, dtype, seed=0):
    from neuron.kernels.numpy_ref import conv2d_out_hw
    rng = np.random.default_rng(seed)
    ho, wo = conv2d_out_hw(x_shape[2], x_shape[3], w_shape[2], w_shape[3], stride, padding,
                           dilation)
    y_shape = (x_shape[0], w_shape[0], ho, wo)
    return [cp.asarray(rng.standard_normal(s).astype(dtype)) for s in (x_shape, w_shape,
                                                                        y_shape)]


@pytest.mark.parametrize("kind", ["fwd", "bwd_data", "bwd_filter"])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: "x".join(map(str, g[0])))
def test_every_plan_computes_what_the_legacy_algorithm_computes(kind, geometry):
    import cupy as cp
    from neuron.kernels import cuda as K
    from neuron.kernels import cudnn as dnn
    x_shape, w_shape, padding, stride, dilation = geometry
    x, w, y = _operands(cp, *geometry, np.float32)
    groups = x_shape[1] // w_shape[1]
    K.allow_tf32 = False
    ws = cp.empty(256 << 20, cp.uint8)
    h = dnn.get_handle()
    plans, skipped = dnn.conv_engine_plans(h, kind, x.shape, w.shape, y.shape, padding, stride,
                                           dilation, np.float32, limit_bytes=ws.nbytes - 256)
    assert plans, f"no engine plan for {kind} {geometry}: {skipped}"
    out = {"fwd": y, "bwd_data": x, "bwd_filter": w}[kind]
    ref = cp.empty_like(out)        # the legacy algorithms' answer (engines off for it)
    K.conv_engines = False
    try:
        if kind == "fwd":
            K.conv2d_forward(x, w, None, ref, stride, padding, dilation, groups, ws)
        elif kind == "bwd_data":
            K.conv2d_backward(x, w, y, ref, None, None, stride, padding, dilation, groups, ws)
        else:
            K.conv2d_backward(x, w, y, None, ref, None, stride, padding, dilation, groups, ws)
    finally:
        K.conv_engines = True
    ws_ptr, _ = K.aligned_workspace(ws)
    ptrs = (x.data.ptr, w.data.ptr, y.data.ptr)
    times = dnn.time_calls([lambda p=p: dnn.run_conv_plan(h, p, ptrs, ws_ptr) for p in plans])
    assert all(t > 0 for t in times), times
    for plan in plans:
        out.fill(np.nan)
        dnn.run_conv_plan(h, plan, ptrs, ws_ptr)
        cp.cuda.get_current_stream().synchronize()
        got, want = cp.asnumpy(out).astype(np.float64), cp.asnumpy(ref).astype(np.float64)
        err = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert err < 1e-5, (plan.name, plan.notes, err)


def test_a_plan_is_captured_in_a_cuda_graph():
    import cupy as cp
    from neuron.kernels import cuda as K
    from neuron.kernels import cudnn as dnn
    geometry = GEOMETRIES[0]
    x, w, y = _operands(cp, *geometry, np.float32)
    ws = cp.empty(256 << 20, cp.uint8)
    ws_ptr, ws_bytes = K.aligned_workspace(ws)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        h = dnn.get_handle()
        plans, _ = dnn.conv_engine_plans(h, "fwd", x.shape, w.shape, y.shape, *geometry[2:],
                                         np.float32, limit_bytes=ws_bytes)
        ptrs = (x.data.ptr, w.data.ptr, y.data.ptr)
        dnn.run_conv_plan(h, plans[0], ptrs, ws_ptr)        # warm
        stream.begin_capture()
        try:
            dnn.run_conv_plan(h, plans[0], ptrs, ws_ptr)
        finally:
            graph = stream.end_capture()
        y.fill(0)
        x[...] = cp.asarray(np.random.default_rng(3).standard_normal(x.shape).astype(np.float32))
        graph.launch(stream=stream)
        stream.synchronize()
        want = cp.empty_like(y)
        padding, stride, dilation = geometry[2:]
        K.conv_engines = False
        try:
            K.conv2d_forward(x, w, None, want, stride, padding, dilation, 1, ws)
        finally:
            K.conv_engines = True
        stream.synchronize()
    np.testing.assert_allclose(cp.asnumpy(y), cp.asnumpy(want), rtol=1e-4, atol=1e-4)


def test_a_network_step_chooses_plans_where_they_are_faster():
    import cupy as cp  # noqa: F401 - the GPU
    import neuron as nn
    from neuron.devices.cuda import CudaDevice
    from neuron.executor import Executor
    from neuron.kernels import conv_algos
    from neuron.kernels import cuda as K
    from neuron.models import build_model
    K.deterministic, K.allow_tf32, K.conv_algo_search = False, False, "find"
    conv_algos.clear_conv_algo_cache()
    g = build_model("resnet50", in_shape=(3, 112, 112), num_classes=100)
    ex = Executor(g, 16, device=CudaDevice(), seed=0, optimizer=nn.SGD(lr=0.01, momentum=0.9))
    rng = np.random.default_rng(0)
    for _ in range(2):
        loss = ex.train_step(rng.standard_normal((16, 3, 112, 112)).astype(np.float32),
                             rng.integers(0, 100, 16))
    assert np.isfinite(loss)
    report = conv_algos.choice_report()
    both = [r for r in report if r["engine_fastest_ms"] is not None
            and r["legacy_fastest_ms"] is not None]
    engines = [r for r in report if str(r["algo"]).startswith("engine")]
    print(f"{len(engines)} of {len(report)} convolution calls run an engine plan; "
          f"{len(both)} timed both ways; skips: "
          f"{dict(list(conv_algos.engine_skips.items())[:3])}")
    assert both, conv_algos.engine_skips            # the engines were built and timed
    # the fastest by the one clock runs, where its workspace fits the call (backward data may
    # add into a gradient another branch wrote: beta = 1 keeps the legacy algorithms)
    for r in (r for r in both if r["kind"] != "bwd_data"):
        if r["engine_fastest_ms"] < r["legacy_fastest_ms"] and \
                r["fastest_workspace_bytes"] <= r["limit_bytes"]:
            assert str(r["algo"]).startswith("engine"), r
