"""numpy_ref SGD: the formula, and bit-identical to torch.optim.SGD in float32."""
import numpy as np
import pytest

from neuron.kernels import numpy_ref as K
from numpy_ref_helpers import F64, rng, torch_or_skip


# --------------------------------------------------------------------------
# SGD
# --------------------------------------------------------------------------

SGD_CASES = [
    # lr, momentum, weight_decay, nesterov
    (0.1, 0.0, 0.0, False),
    (0.1, 0.0, 5e-4, False),
    (0.05, 0.9, 0.0, False),
    (0.1, 0.9, 5e-4, False),
    (0.1, 0.9, 1e-4, True),
    (0.3, 0.5, 0.0, True),
]


def _sgd_reference(p, grads, lr, mom, wd, nest):
    """Straightforward float64 transcription of torch.optim.SGD."""
    p = p.astype(F64)
    buf = None
    for g in grads:
        d = g + wd * p
        if mom:
            buf = d.copy() if buf is None else mom * buf + d
            d = d + mom * buf if nest else buf
        p = p - lr * d
    return p


@pytest.mark.parametrize("lr,mom,wd,nest", SGD_CASES)
def test_sgd_matches_formula(lr, mom, wd, nest):
    r = rng(25)
    p0 = r.standard_normal(50)
    grads = [r.standard_normal(50) for _ in range(3)]
    p = p0.copy()
    v = np.zeros_like(p) if mom else None
    for g in grads:
        g_copy = g.copy()
        K.sgd_update(p, g, v, lr, mom, wd, nest)
        np.testing.assert_array_equal(g, g_copy)          # grad untouched
    np.testing.assert_allclose(p, _sgd_reference(p0, grads, lr, mom, wd, nest), rtol=1e-13)
    # first_step=True with a dirty buffer == zero-initialized buffer
    if mom:
        p2 = p0.copy()
        v2 = np.full_like(p0, 123.0)
        for i, g in enumerate(grads):
            K.sgd_update(p2, g, v2, lr, mom, wd, nest, first_step=(i == 0))
        np.testing.assert_array_equal(p2, p)
        np.testing.assert_array_equal(v2, v)


@pytest.mark.parametrize("lr,mom,wd,nest", SGD_CASES)
def test_sgd_vs_torch_bit_identical_float32(lr, mom, wd, nest):
    """float32, 3 steps, zero-initialized velocity: BIT-IDENTICAL (0 ulp) to
    torch.optim.SGD on AVX2/AVX512 CPUs, including non-vector-multiple
    tails (<= 1 ulp accepted on other torch CPU capabilities)."""
    torch = torch_or_skip()
    r = rng(26)
    shapes = [(37, 29), (16, 3, 3, 3), (7,), (1000,)]
    params = [r.standard_normal(s).astype(np.float32) for s in shapes]
    grads = [[(r.standard_normal(s) * 0.1).astype(np.float32) for s in shapes] for _ in range(3)]
    # torch's CPU add(alpha=...) is a fused multiply-add on its AVX2/AVX512
    # paths, which sgd_update reproduces exactly; a build without FMA
    # vector kernels rounds twice and may differ by 1 ulp.
    cap = getattr(torch.backends.cpu, "get_cpu_capability", lambda: "")()
    max_ulp = 0 if cap in ("AVX2", "AVX512") else 1
    tparams = [torch.nn.Parameter(torch.tensor(p.copy())) for p in params]
    opt = torch.optim.SGD(tparams, lr=lr, momentum=mom, weight_decay=wd, nesterov=nest)
    vel = [np.zeros_like(p) if mom else None for p in params]
    for step in range(3):
        for tp, g in zip(tparams, grads[step]):
            tp.grad = torch.tensor(g)
        opt.step()
        for p, v, g in zip(params, vel, grads[step]):
            K.sgd_update(p, g, v, lr, mom, wd, nest)
        for p, tp in zip(params, tparams):
            _assert_same_f32(p, tp.detach().numpy(), max_ulp)
        if mom:
            for v, tp in zip(vel, tparams):
                _assert_same_f32(v, opt.state[tp]["momentum_buffer"].numpy(), max_ulp)


def _assert_same_f32(a, b, max_ulp):
    if max_ulp == 0:
        np.testing.assert_array_equal(a, b)
    else:
        np.testing.assert_array_max_ulp(a, b, maxulp=max_ulp)
