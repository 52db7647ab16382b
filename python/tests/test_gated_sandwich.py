"""test_gated_sandwich.py - gated RMSNorm (Mamba2's gate first, Qwen3-Next's norm first) and
the Gemma 2/3 sandwich norms: the numpy functions and torch ops against float64 torch
compositions, gradcheck/gradgradcheck in float64 (forward mode too), compile and export,
the drop-in modules against transformers' own (bit for bit with exact_hf), and patch() on
tiny random Mamba2, Qwen3-Next and Gemma 2/3 models: logits and gradients of the unpatched
model, and compile(fullgraph=True) without a graph break."""

import copy
import warnings

import numpy as np
import pytest

import rmsnorm

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import rmsnorm.torch as rt  # noqa: E402

ml_dtypes = pytest.importorskip("ml_dtypes")

NP_DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16, np.float64]
TORCH_OF = {np.dtype(np.float32): torch.float32, np.dtype(np.float16): torch.float16,
            np.dtype(ml_dtypes.bfloat16): torch.bfloat16, np.dtype(np.float64): torch.float64}
# the rounding of one result to the dtype, relative to the result's scale
TOL = {torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float64: 1e-13}
ops = torch.ops.rmsnorm


def t64(a):
    return torch.from_numpy(np.asarray(a).astype(np.float64))


def eps_of(dt):
    return 2.0 ** -52 if np.dtype(dt) == np.float64 else 2.0 ** -23


def close(got, want, tol):
    got = t64(got) if isinstance(got, np.ndarray) else got.double()
    want = want.double()
    assert got.shape == want.shape, (got.shape, want.shape)
    scale = max(1.0, float(want.abs().max())) if want.numel() else 1.0
    err = float((got - want).abs().max()) if want.numel() else 0.0
    assert err <= tol * scale, f"max error {err} > {tol} x {scale}"


def gated_ref(x, z, w, eps, group=0, norm_first=False, act="silu", offset=False):
    """Gated RMSNorm as a torch composition (float64 in, float64 out)."""
    a = F.silu(z) if act == "silu" else torch.sigmoid(z)
    v = x if norm_first else x * a
    d = x.shape[-1]
    g = group or d
    vg = v.unflatten(-1, (d // g, g))
    y = (vg * torch.rsqrt(vg.pow(2).mean(-1, keepdim=True) + eps)).flatten(-2)
    if w is not None:
        y = y * ((1 + w) if offset else w)
    return y * a if norm_first else y


def sandwich_ref(a, h, d, w_post, w_pre, eps, offset=True):
    """(output, new_residual) of the sandwich as three torch steps."""
    def gain(w):
        return None if w is None else (1 + w if offset else w)

    h2 = h + F.rms_norm(a, (d,), gain(w_post), eps)
    return F.rms_norm(h2, (d,), gain(w_pre), eps), h2


GATED_CASES = [dict(), dict(group=8), dict(norm_first=True), dict(norm_first=True, group=16),
               dict(act="sigmoid", offset=True), dict(norm_first=True, act="sigmoid", group=4)]


def gated_kw(case):
    return dict(group_size=case.get("group", 0), norm_before_gate=case.get("norm_first", False),
                activation=case.get("act", "silu"), offset=case.get("offset", False))


# ---- gated: numpy ------------------------------------------------------------------------


@pytest.mark.parametrize("dt", NP_DTYPES)
@pytest.mark.parametrize("case", GATED_CASES, ids=str)
def test_gated_numpy(rng, dt, case):
    shape, d = (2, 5, 32), 32
    x = rng.standard_normal(shape).astype(dt)
    z = (2 * rng.standard_normal(shape)).astype(dt)
    w = (0.1 * rng.standard_normal(d) + (0 if case.get("offset") else 1)).astype(dt)
    x0, z0 = x.copy(), z.copy()
    y, rstd = rmsnorm.gated_rms_norm(x, z, w, 1e-5, **gated_kw(case), return_rstd=True)
    assert y.dtype == x.dtype and y.shape == shape
    groups = d // case["group"] if case.get("group") else 1
    assert rstd.shape == shape[:-1] + (groups,)
    assert rstd.dtype == (np.float64 if dt == np.float64 else np.float32)
    want = gated_ref(t64(x), t64(z), t64(w), 1e-5, case.get("group", 0),
                     case.get("norm_first", False), case.get("act", "silu"), case.get("offset"))
    close(y, want, 2 * TOL[TORCH_OF[np.dtype(dt)]])
    # rstd: one r per group of the normalized value
    a = F.silu(t64(z)) if case.get("act", "silu") == "silu" else torch.sigmoid(t64(z))
    v = t64(x) if case.get("norm_first") else t64(x) * a
    want_r = torch.rsqrt(v.unflatten(-1, (groups, d // groups)).pow(2).mean(-1) + 1e-5)
    close(rstd, want_r, 1e-6 if dt != np.float64 else 1e-13)
    # no weight: 1; the inputs are left as they were
    close(rmsnorm.gated_rms_norm(x, z, None, 1e-5, **{**gated_kw(case), "offset": False}),
          gated_ref(t64(x), t64(z), None, 1e-5, case.get("group", 0),
                    case.get("norm_first", False), case.get("act", "silu")),
          2 * TOL[TORCH_OF[np.dtype(dt)]])
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(z, z0)


def test_gated_numpy_layouts(rng):
    # row slices are read in place, other layouts copied: the same values
    big = rng.standard_normal((6, 48)).astype(np.float32)
    z = rng.standard_normal((6, 48)).astype(np.float32)
    want = rmsnorm.gated_rms_norm(np.ascontiguousarray(big[:, :32]),
                                  np.ascontiguousarray(z[:, 16:]), group_size=8)
    np.testing.assert_array_equal(rmsnorm.gated_rms_norm(big[:, :32], z[:, 16:], group_size=8),
                                  want)
    np.testing.assert_array_equal(
        rmsnorm.gated_rms_norm(np.asfortranarray(big[:, :32]), z[:, 16:], group_size=8), want)
    # a 1-D row, and the group of the whole row
    np.testing.assert_array_equal(rmsnorm.gated_rms_norm(big[0], z[0]),
                                  rmsnorm.gated_rms_norm(big[0], z[0], group_size=48))


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("case", GATED_CASES, ids=str)
def test_gated_numpy_backward(rng, dt, case):
    shape, d = (3, 4, 16), 16
    x = rng.standard_normal(shape).astype(dt)
    z = (2 * rng.standard_normal(shape)).astype(dt)
    w = (0.1 * rng.standard_normal(d) + (0 if case.get("offset") else 1)).astype(dt)
    dy = rng.standard_normal(shape).astype(dt)
    kw = gated_kw(case)
    _, rstd = rmsnorm.gated_rms_norm(x, z, w, 1e-5, **kw, return_rstd=True)
    tx, tz, tw = (t64(a).requires_grad_() for a in (x, z, w))
    y = gated_ref(tx, tz, tw, 1e-5, case.get("group", 0), case.get("norm_first", False),
                  case.get("act", "silu"), case.get("offset"))
    (y * t64(dy)).sum().backward()
    for r in (rstd, None):
        dx, dz, dw = rmsnorm.gated_rms_norm_backward(dy, x, z, w, 1e-5, rstd=r, **kw)
        tol = 8 * TOL[TORCH_OF[np.dtype(dt)]]
        for got, want in ((dx, tx.grad), (dz, tz.grad), (dw, tw.grad)):
            assert got.dtype == np.dtype(dt)
            close(got, want, tol)
    dx, dz, dw = rmsnorm.gated_rms_norm_backward(dy, x, z, None, 1e-5, **{**kw, "offset": False})
    assert dw is None


def test_gated_numpy_errors(rng):
    x = rng.standard_normal((3, 12)).astype(np.float32)
    with pytest.raises(ValueError, match="activation must be 'silu'.* got 'gelu'"):
        rmsnorm.gated_rms_norm(x, x, activation="gelu")
    with pytest.raises(ValueError, match="group_size must be 0 .* last dim, 12; got 5"):
        rmsnorm.gated_rms_norm(x, x, group_size=5)
    with pytest.raises(ValueError, match="group_size must be 0"):
        rmsnorm.gated_rms_norm(x, x, group_size=-4)
    with pytest.raises(ValueError, match="gate has shape"):
        rmsnorm.gated_rms_norm(x, x[:2])
    with pytest.raises(TypeError, match="gate has dtype float64"):
        rmsnorm.gated_rms_norm(x, x.astype(np.float64))
    with pytest.raises(ValueError, match="Expected weight to be of same shape"):
        rmsnorm.gated_rms_norm(x, x, np.ones(6, np.float32))
    with pytest.raises(rmsnorm.ArgumentError, match="RMSNORM_ERROR_BAD_EPS"):
        rmsnorm.gated_rms_norm(x, x, eps=-1.0)
    with pytest.raises(ValueError, match="rstd has 3 values"):
        rmsnorm.gated_rms_norm_backward(x, x, x, rstd=np.ones(3, np.float32), group_size=4)


# ---- sandwich: numpy ---------------------------------------------------------------------


@pytest.mark.parametrize("dt", NP_DTYPES)
@pytest.mark.parametrize("shape", [(16,), (3, 40), (2, 3, 64)])
def test_sandwich_numpy(rng, dt, shape):
    d = shape[-1]
    a = (4 * rng.standard_normal(shape)).astype(dt)
    h = rng.standard_normal(shape).astype(dt)
    wp, wq = (0.3 * rng.standard_normal(d)).astype(dt), (0.3 * rng.standard_normal(d)).astype(dt)
    a0, h0 = a.copy(), h.copy()
    y, h2, r_post, r_pre = rmsnorm.sandwich_rms_norm(a, h, d, wp, wq, 1e-6, offset=True,
                                                     return_rstd=True)
    assert y.dtype == h2.dtype == a.dtype and r_post.shape == shape[:-1] + (1,)
    # bit for bit the three separate steps
    post, want_rpost = rmsnorm.rms_norm(a, d, wp, 1e-6, offset=True, return_rstd=True)
    np.testing.assert_array_equal(h2, h + post)
    want_y, want_rpre = rmsnorm.rms_norm(h2, d, wq, 1e-6, offset=True, return_rstd=True)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(r_post, want_rpost)
    np.testing.assert_array_equal(r_pre, want_rpre)
    # and near the float64 composition
    want_y, want_h = sandwich_ref(t64(a), t64(h), d, t64(wp), t64(wq), 1e-6)
    close(h2, want_h, 2 * TOL[TORCH_OF[np.dtype(dt)]])
    # inplace=False: neither argument is touched
    np.testing.assert_array_equal(a, a0)
    np.testing.assert_array_equal(h, h0)


def test_sandwich_numpy_inplace_and_options(rng):
    a = rng.standard_normal((6, 32)).astype(np.float32)
    h = rng.standard_normal((6, 32)).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(32)).astype(np.float32)
    want_y, want_h = rmsnorm.sandwich_rms_norm(a, h, 32, w, None, eps_outside=True, partial=0.5)
    post = rmsnorm.rms_norm(a, 32, w, eps_outside=True, partial=0.5)
    np.testing.assert_array_equal(want_h, h + post)
    np.testing.assert_array_equal(want_y, rmsnorm.rms_norm(h + post, 32, eps_outside=True,
                                                           partial=0.5))
    y, h2 = rmsnorm.sandwich_rms_norm(a, h, 32, w, None, eps_outside=True, partial=0.5,
                                      inplace=True)
    assert y is a and h2 is h  # output in input, new_residual in residual
    np.testing.assert_array_equal(h, want_h)
    np.testing.assert_array_equal(a, want_y)
    # float32 weights with bfloat16 data, a float64 one converted
    ab, hb = a.astype(ml_dtypes.bfloat16), h.astype(ml_dtypes.bfloat16)
    wb = w.astype(ml_dtypes.bfloat16)
    y1, h1 = rmsnorm.sandwich_rms_norm(ab, hb, 32, w, wb)
    y2, h2 = rmsnorm.sandwich_rms_norm(ab, hb, 32, w, wb.astype(np.float64))
    np.testing.assert_array_equal(y1.view(np.uint16), y2.view(np.uint16))
    np.testing.assert_array_equal(h1.view(np.uint16), h2.view(np.uint16))
    with pytest.raises(ValueError, match="residual has shape"):
        rmsnorm.sandwich_rms_norm(a, h[:2], 32)
    with pytest.raises(ValueError, match="Expected pre_weight to be of same shape"):
        rmsnorm.sandwich_rms_norm(a, h, 32, None, np.ones(4, np.float32))
    with pytest.raises(ValueError, match="read-only"):
        ro = h.copy()
        ro.flags.writeable = False
        rmsnorm.sandwich_rms_norm(a, ro, 32, inplace=True)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_sandwich_numpy_backward(rng, dt):
    shape, d = (4, 5, 24), 24
    a = rng.standard_normal(shape).astype(dt)
    h = rng.standard_normal(shape).astype(dt)
    wp, wq = (0.2 * rng.standard_normal(d)).astype(dt), (0.2 * rng.standard_normal(d)).astype(dt)
    dy, dres = rng.standard_normal(shape).astype(dt), rng.standard_normal(shape).astype(dt)
    y, h2, rp, rq = rmsnorm.sandwich_rms_norm(a, h, d, wp, wq, 1e-6, offset=True, return_rstd=True)
    for g_res, rstds in ((dres, (rp, rq)), (None, (None, None))):
        da, dh, dwp, dwq = rmsnorm.sandwich_rms_norm_backward(
            dy, g_res, a, h2, d, wp, wq, 1e-6, rstd_post=rstds[0], rstd_pre=rstds[1], offset=True)
        ta, th, twp, twq = (t64(v).requires_grad_() for v in (a, h, wp, wq))
        ty, th2 = sandwich_ref(ta, th, d, twp, twq, 1e-6)
        loss = (ty * t64(dy)).sum() + ((th2 * t64(g_res)).sum() if g_res is not None else 0)
        loss.backward()
        tol = 8 * TOL[TORCH_OF[np.dtype(dt)]]
        for got, want in ((da, ta.grad), (dh, th.grad), (dwp, twp.grad), (dwq, twq.grad)):
            close(got, want, tol)
        # bit for bit the separate steps: the pre norm's backward, the add, the post norm's
        dx_pre, dwq_sep, _ = rmsnorm.rms_norm_backward(dy, h2, d, wq, 1e-6, offset=True)
        want_dh = dx_pre + g_res if g_res is not None else dx_pre
        np.testing.assert_array_equal(dh, want_dh)
        dx_post, dwp_sep, _ = rmsnorm.rms_norm_backward(want_dh, a, d, wp, 1e-6, offset=True)
        np.testing.assert_array_equal(da, dx_post)
        np.testing.assert_array_equal(dwq, dwq_sep)
        np.testing.assert_array_equal(dwp, dwp_sep)


# ---- torch: values and gradients ---------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("case", GATED_CASES, ids=str)
def test_torch_gated(dtype, case):
    gen = torch.Generator().manual_seed(7)
    shape, d = (3, 5, 32), 32
    x = torch.randn(shape, generator=gen).to(dtype)
    z = (2 * torch.randn(shape, generator=gen)).to(dtype)
    w = (0.1 * torch.randn(d, generator=gen) + (0 if case.get("offset") else 1)).to(dtype)
    dy = torch.randn(shape, generator=gen).to(dtype)
    kw = gated_kw(case)

    def grads(fn, cast):
        ts = [cast(t).detach().clone().requires_grad_() for t in (x, z, w)]
        y = fn(*ts)
        y.backward(cast(dy))
        return [y.detach()] + [t.grad for t in ts]

    ours = grads(lambda x_, z_, w_: rt.gated_rms_norm(x_, z_, w_, 1e-5, **kw), lambda t: t)
    # with rstd: the same output and gradients, rstd that of the numpy function
    y, rstd = rt.gated_rms_norm_with_rstd(x, z, w, 1e-5, **kw)
    assert torch.equal(y, ours[0]) and not rstd.requires_grad
    if dtype != torch.bfloat16:
        want_r = rmsnorm.gated_rms_norm(x.numpy(), z.numpy(), w.numpy(), 1e-5, **kw,
                                        return_rstd=True)[1]
        assert torch.equal(rstd, torch.from_numpy(want_r))
        assert torch.equal(ours[0], torch.from_numpy(rmsnorm.gated_rms_norm(
            x.numpy(), z.numpy(), w.numpy(), 1e-5, **kw)))
    want = grads(lambda x_, z_, w_: gated_ref(x_, z_, w_, 1e-5, case.get("group", 0),
                                             case.get("norm_first", False),
                                             case.get("act", "silu"), case.get("offset")),
                 lambda t: t.double())
    for got, ref in zip(ours, want):
        assert got.dtype == dtype
        close(got, ref, 8 * TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("use_residual", [False, True])
def test_torch_sandwich(dtype, use_residual):
    gen = torch.Generator().manual_seed(8)
    shape, d = (3, 5, 32), 32
    a, h = (torch.randn(shape, generator=gen).to(dtype) for _ in range(2))
    wp, wq = ((0.3 * torch.randn(d, generator=gen)).to(dtype) for _ in range(2))
    dy, dres = (torch.randn(shape, generator=gen).to(dtype) for _ in range(2))

    def grads(fn):
        ts = [t.detach().clone().requires_grad_() for t in (a, h, wp, wq)]
        y, h2 = fn(*ts)
        loss = (y.double() * dy.double()).sum()
        if use_residual:
            loss = loss + (h2.double() * dres.double()).sum()
        loss.backward()
        return [y.detach(), h2.detach()] + [t.grad for t in ts]

    ours = grads(lambda a_, h_, p_, q_: rt.sandwich_rms_norm(a_, h_, d, p_, q_, 1e-6, offset=True))
    theirs = grads(lambda a_, h_, p_, q_: sandwich_ref(a_, h_, d, p_, q_, 1e-6))
    # the values: bit for bit the unfused steps of rmsnorm.torch
    post = rt.rms_norm(a, d, wp, 1e-6, offset=True)
    assert torch.equal(ours[1], h + post)
    assert torch.equal(ours[0], rt.rms_norm(h + post, d, wq, 1e-6, offset=True))
    for got, want in zip(ours, theirs):
        close(got, want, 8 * TOL[dtype])


def test_torch_inplace_variants():
    a, h = torch.randn(4, 16), torch.randn(4, 16)
    want_y, want_h = rt.sandwich_rms_norm(a, h, 16)
    y, h2 = rt.sandwich_rms_norm(a, h, 16, inplace=True)
    assert y.data_ptr() == a.data_ptr() and h2.data_ptr() == h.data_ptr()
    assert torch.equal(h, want_h) and torch.equal(a, want_y)
    with pytest.raises(ValueError, match="sandwich_rms_norm_inplace: writing in place .* does "
                                         "not take part in autograd"):
        rt.sandwich_rms_norm(a, h.requires_grad_(), 16, inplace=True)


def f64(*shape, gen, shift=0.0):
    return (torch.randn(shape, generator=gen, dtype=torch.float64) + shift).requires_grad_()


@pytest.mark.parametrize("case", GATED_CASES, ids=str)
def test_gradcheck_gated(case):
    gen = torch.Generator().manual_seed(3)
    x, z, w = f64(3, 16, gen=gen), f64(3, 16, gen=gen), f64(16, gen=gen, shift=1.0)
    kw = gated_kw(case)

    def f(x_, z_, w_):
        return rt.gated_rms_norm(x_, z_, w_, 1e-3, **kw)

    assert torch.autograd.gradcheck(f, (x, z, w), check_forward_ad=True)
    assert torch.autograd.gradgradcheck(f, (x, z, w))
    # without a weight, and only some inputs requiring grad
    assert torch.autograd.gradcheck(lambda z_: rt.gated_rms_norm(x.detach(), z_, None, 1e-3, **kw),
                                    (z,), check_forward_ad=True)


@pytest.mark.parametrize("kw", [dict(offset=True), dict(eps_outside=True), dict(partial=0.5)],
                         ids=str)
def test_gradcheck_sandwich(kw):
    gen = torch.Generator().manual_seed(4)
    a, h, wp, wq = f64(3, 8, gen=gen), f64(3, 8, gen=gen), f64(8, gen=gen), f64(8, gen=gen)

    def f(a_, h_, p_, q_):
        return rt.sandwich_rms_norm(a_, h_, 8, p_, q_, 1e-3, **kw)

    assert torch.autograd.gradcheck(f, (a, h, wp, wq), check_forward_ad=True)
    assert torch.autograd.gradgradcheck(f, (a, h, wp, wq))
    # only the output used: no gradient arrives on new_residual
    assert torch.autograd.gradcheck(lambda a_, q_: f(a_, h.detach(), None, q_)[0], (a, wq),
                                    check_forward_ad=True)


def test_first_order_is_the_fast_kernel():
    # create_graph=False runs the library's backward, create_graph=True the aten composite
    gen = torch.Generator().manual_seed(5)
    x, z, w = f64(4, 16, gen=gen), f64(4, 16, gen=gen), f64(16, gen=gen, shift=1.0)
    for kw in (dict(group_size=4), dict(norm_before_gate=True, activation="sigmoid")):
        y = rt.gated_rms_norm(x, z, w, 1e-5, **kw)
        dy = torch.randn_like(y)
        fast = torch.autograd.grad(y, (x, z, w), dy, retain_graph=True)
        slow = torch.autograd.grad(y, (x, z, w), dy, create_graph=True)
        assert slow[0].requires_grad
        for p, q in zip(fast, slow):
            torch.testing.assert_close(p, q.detach(), rtol=1e-12, atol=1e-12)
    a, h, w2 = f64(4, 16, gen=gen), f64(4, 16, gen=gen), f64(16, gen=gen)
    for ws in ((w, w2), (w, w)):  # two weights, and one shared by both norms
        y, h2 = rt.sandwich_rms_norm(a, h, 16, *ws, offset=True)
        dy, dh = torch.randn_like(y), torch.randn_like(h2)
        inputs = (a, h) + tuple(dict.fromkeys(ws))
        fast = torch.autograd.grad((y, h2), inputs, (dy, dh), retain_graph=True)
        slow = torch.autograd.grad((y, h2), inputs, (dy, dh), create_graph=True)
        for p, q in zip(fast, slow):
            torch.testing.assert_close(p, q.detach(), rtol=1e-12, atol=1e-12)


def test_meta_and_fake_tensors():
    x = torch.empty(5, 3, 32, device="meta", dtype=torch.bfloat16)
    y, rstd = rt.gated_rms_norm_with_rstd(x, x, torch.empty(32, device="meta"), group_size=8)
    assert y.shape == x.shape and y.dtype == torch.bfloat16
    assert rstd.shape == (5, 3, 4) and rstd.dtype == torch.float32
    out, h2 = rt.sandwich_rms_norm(x, x, 32)
    assert out.shape == h2.shape == x.shape
    with pytest.raises(ValueError, match="rmsnorm::gated_rms_norm: group_size must be 0"):
        rt.gated_rms_norm(x, x, group_size=5)
    with pytest.raises(ValueError, match="rmsnorm::gated_rms_norm: activation must be"):
        rt.gated_rms_norm(x, x, activation="relu")
    # the CPU kernel says the same
    with pytest.raises(ValueError, match="rmsnorm::gated_rms_norm: group_size must be 0"):
        rt.gated_rms_norm(torch.randn(2, 32), torch.randn(2, 32), group_size=5)


def test_compile_and_export_equal_eager():
    gen = torch.Generator().manual_seed(6)
    x, z, h = (torch.randn(2, 6, 32, generator=gen) for _ in range(3))
    w = 1 + 0.1 * torch.randn(32, generator=gen)

    def f(x, z, h, w):
        y = rt.gated_rms_norm(x, z, w, 1e-6, group_size=8)
        out, h2 = rt.sandwich_rms_norm(y, h, 32, w, w, 1e-6, offset=True)
        return out * 2 + h2

    want = f(x, z, h, w)
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, dynamic=False)
    assert torch.equal(compiled(x, z, h, w), want)
    # and its backward through AOTAutograd
    xs = [t.clone().requires_grad_() for t in (x, z, h, w)]
    compiled(*xs).sum().backward()
    ys = [t.clone().requires_grad_() for t in (x, z, h, w)]
    f(*ys).sum().backward()
    for p, q in zip(xs, ys):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-6)

    class M(torch.nn.Module):
        def forward(self, x, z, h, w):
            return f(x, z, h, w)

    ep = torch.export.export(M(), (x, z, h, w))
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert {"rmsnorm.gated_rms_norm.default", "rmsnorm.sandwich_rms_norm.default"} <= targets
    assert torch.equal(ep.module()(x, z, h, w), want)


# ---- transformers' gated norms ---------------------------------------------------------------

transformers = pytest.importorskip("transformers")


def hf_class(module, name):
    """transformers.models.<module>.modeling_<module>.<name>, or a skip. name may be a
    tuple of the names a class has had across transformers versions: the first found."""
    import importlib

    try:
        mod = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
    except ImportError:
        pytest.skip(f"transformers has no {module}")
    for n in (name,) if isinstance(name, str) else name:
        if hasattr(mod, n):
            return getattr(mod, n)
    pytest.skip(f"transformers has no {name}")


# Mamba2's gated norm: MambaRMSNormGated in older transformers, Mamba2RMSNormGated in newer
MAMBA2_GATED = ("MambaRMSNormGated", "Mamba2RMSNormGated")


HF_GATED = [("mamba2", MAMBA2_GATED, True), ("bamba", "BambaRMSNormGated", True),
            ("nemotron_h", "NemotronHRMSNormGated", True),
            ("qwen3_next", "Qwen3NextRMSNormGated", False)]
HALF_ULP = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -9, torch.float16: 2.0 ** -11}


def ulps(a, b, dtype):
    fi = torch.finfo(dtype)
    scale = a.double().abs().clamp_min(fi.smallest_normal)
    return (a.double() - b.double()).abs() / (scale.log2().floor().exp2() * fi.eps)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("hf", HF_GATED, ids=lambda h: h[0])
def test_gated_modules_match_transformers(hf, dtype):
    module, name, grouped = hf
    cls = hf_class(module, name)
    d, group = 128, 32
    theirs = (cls(d, group, eps=1e-6) if grouped else cls(d, eps=1e-6)).to(dtype)
    ours_cls = rt.MambaRMSNormGated if grouped else rt.Qwen3NextRMSNormGated
    args = (d, group) if grouped else (d,)
    ours, exact = (ours_cls(*args, eps=1e-6, exact_hf=e).to(dtype) for e in (False, True))
    gen = torch.Generator().manual_seed(9)
    with torch.no_grad():
        theirs.weight.copy_(1 + 0.3 * torch.randn(d, generator=gen))
    for m in (ours, exact):
        assert list(m.state_dict()) == list(theirs.state_dict())
        m.load_state_dict(theirs.state_dict())
    x = (3 * torch.randn(4, 7, d, generator=gen)).to(dtype)
    z = (2 * torch.randn(4, 7, d, generator=gen)).to(dtype)
    with torch.no_grad():
        a, b, c = theirs(x, z), ours(x, z), exact(x, z)
        assert torch.equal(a, c)  # exact_hf: bit for bit
        assert a.dtype == b.dtype and a.shape == b.shape
        # float16/bfloat16: HF's roundings are reproduced, r may differ in its last float32
        # bit, so almost every element is equal; float32: HF rounds each step, we once
        if dtype == torch.float32:
            assert float(ulps(a, b, dtype).max()) <= 8.0
        else:
            assert float(ulps(a, b, dtype).max()) <= 1.0 + float(theirs.weight.detach().abs().max())
            assert float((a != b).double().mean()) < 0.01
        if grouped:  # no gate: RMSNorm per group
            assert torch.equal(theirs(x), exact(x))
            assert float(ulps(theirs(x), ours(x), dtype).max()) <= 8.0
    # gradients
    dy = torch.randn(x.shape, generator=gen).to(dtype)
    grads = []
    for m in (theirs, ours):
        xx, zz = x.clone().requires_grad_(), z.clone().requires_grad_()
        m.zero_grad()
        m(xx, zz).backward(dy)
        grads.append((xx.grad, zz.grad, m.weight.grad))
    for ga, gb, what in zip(*grads, ["input", "gate", "weight"]):
        tol = 64 * HALF_ULP[dtype] * max(1.0, float(ga.abs().max()))
        assert float((ga.double() - gb.double()).abs().max()) <= tol, what


def test_gated_mixed_precision_weight():
    # float32 weights with bfloat16 activations: transformers' product promotes
    for module, name, grouped in HF_GATED[::3]:
        cls = hf_class(module, name)
        theirs = cls(64, 16) if grouped else cls(64)
        with torch.no_grad():
            theirs.weight.normal_()
        ours = (rt.MambaRMSNormGated(64, 16) if grouped else rt.Qwen3NextRMSNormGated(64))
        ours.load_state_dict(theirs.state_dict())
        x, z = torch.randn(3, 64).bfloat16(), torch.randn(3, 64).bfloat16()
        with torch.no_grad():
            a, b = theirs(x, z), ours(x, z)
        assert a.dtype == b.dtype
        assert float(ulps(a, b, a.dtype).max()) <= 2.0 + float(theirs.weight.detach().abs().max())


def test_patch_gated_modules_and_unknown_ones():
    kimi = None
    try:
        kimi = hf_class("kimi_linear", "KimiLinearRMSNormGated")(32)
    except pytest.skip.Exception:
        pass

    class OddRMSNormGated(torch.nn.Module):  # a gated norm by name, another formula
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(32))
            self.variance_epsilon = 1e-6
            self.activation = "silu"

        def forward(self, x, gate):
            return self.weight * x * torch.sigmoid(gate)

    mods = [hf_class("mamba2", MAMBA2_GATED)(32, 8),
            hf_class("qwen3_next", "Qwen3NextRMSNormGated")(32), OddRMSNormGated()]
    model = torch.nn.ModuleList(mods + ([kimi] if kimi is not None else []))
    with pytest.warns(UserWarning, match="left .*OddRMSNormGated in place"):
        rt.patch(model)
    assert type(model[0]) is rt.MambaRMSNormGated and model[0].group_size == 8
    assert model[0].weight is mods[0].weight
    assert isinstance(model[1], rt.RMSNormGated) and model[1].norm_before_gate
    assert model[1].hf_rounding
    assert type(model[2]) is OddRMSNormGated
    if kimi is not None:  # strict float32, sigmoid: one rounding
        assert isinstance(model[3], rt.RMSNormGated) and model[3].activation == "sigmoid"
        assert not model[3].hf_rounding
        x, z = torch.randn(4, 32).bfloat16(), torch.randn(4, 32).bfloat16()
        with torch.no_grad():
            kimi.weight.normal_()
            assert float(ulps(kimi(x, z), model[3](x, z), torch.bfloat16).max()) <= 1.0
    with pytest.warns(UserWarning, match="OddRMSNormGated"):
        rt.patch(model, exact_hf=True)
    assert model[0].exact_hf and model[1].exact_hf


# ---- whole models ----------------------------------------------------------------------------


def forward_backward(model, ids):
    model.zero_grad()
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                 if p.grad is not None}


def assert_same_training_step(model, patched, ids, what):
    logits0, grads0 = forward_backward(model, ids)
    logits1, grads1 = forward_backward(patched, ids)
    torch.testing.assert_close(logits1, logits0, rtol=1e-4, atol=1e-5)
    assert grads1.keys() == grads0.keys()
    for n in grads0:
        g0, g1 = grads0[n], grads1[n]
        torch.testing.assert_close(g1, g0, rtol=1e-3, atol=1e-5 * max(1.0, float(g0.abs().max())),
                                   msg=lambda m: f"{what} grad {n}: {m}")


def randomize_norms(model, center):
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.normal_(0.0, 0.3).add_(center)


def build_mamba2():
    if not hasattr(transformers, "Mamba2ForCausalLM"):
        pytest.skip("transformers has no Mamba2")
    torch.manual_seed(12)
    cfg = transformers.Mamba2Config(vocab_size=97, hidden_size=64, num_hidden_layers=2,
                                    num_heads=8, head_dim=16, state_size=16, n_groups=2, expand=2,
                                    conv_kernel=4, chunk_size=8)
    model = transformers.Mamba2ForCausalLM(cfg)
    randomize_norms(model, 1.0)
    return model.float().eval()


def build_qwen3_next():
    if not hasattr(transformers, "Qwen3NextForCausalLM"):
        pytest.skip("transformers has no Qwen3-Next")
    torch.manual_seed(13)
    cfg = transformers.Qwen3NextConfig(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_value_heads=4,
        linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, max_position_embeddings=64,
        layer_types=["linear_attention", "full_attention"])
    cfg._attn_implementation = "eager"
    model = transformers.Qwen3NextForCausalLM(cfg)
    randomize_norms(model, 0.0)  # Qwen3-Next's plain norms are (1 + w), its gated norm w
    with torch.no_grad():
        for m in model.modules():
            if type(m).__name__ == "Qwen3NextRMSNormGated":
                m.weight.add_(1.0)
    return model.float().eval()


def build_gemma(version):
    config, causal_lm = {2: ("Gemma2Config", "Gemma2ForCausalLM"),
                         3: ("Gemma3TextConfig", "Gemma3ForCausalLM")}[version]
    if not hasattr(transformers, causal_lm):
        pytest.skip(f"transformers has no {causal_lm}")
    torch.manual_seed(14)
    cfg = getattr(transformers, config)(vocab_size=97, hidden_size=64, intermediate_size=128,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, head_dim=16,
                                        max_position_embeddings=64, sliding_window=8)
    cfg._attn_implementation = "eager"
    model = getattr(transformers, causal_lm)(cfg)
    randomize_norms(model, 0.0)
    return model.float().eval()


IDS = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(15))


# patch() takes any *RMSNormGated, whichever name Mamba2's has
@pytest.mark.parametrize("build,gated", [(build_mamba2, MAMBA2_GATED),
                                         (build_qwen3_next, ("Qwen3NextRMSNormGated",))],
                         ids=["mamba2", "qwen3_next"])
def test_patched_gated_model_matches(build, gated):
    model = build()
    patched = copy.deepcopy(model)
    before = {n: m.weight for n, m in patched.named_modules() if type(m).__name__ in gated}
    assert before
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every norm is recognised: no warning
        rt.patch(patched)
    for n, m in patched.named_modules():
        if n in before:
            assert isinstance(m, rt.RMSNormGated) and m.weight is before[n], n
        assert "RMSNorm" not in type(m).__name__ or type(m).__module__ == rt.__name__, n
    assert list(patched.state_dict()) == list(model.state_dict())
    assert_same_training_step(model, patched, IDS, gated[0])


@pytest.mark.parametrize("version", [2, 3])
def test_patched_gemma_sandwich_matches_and_compiles(version):
    model = build_gemma(version)
    patched = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rt.patch(patched, sandwich=True)
    layers = [m for m in patched.modules() if type(m).__name__ == f"Gemma{version}DecoderLayer"]
    assert layers and all("forward" in m.__dict__ for m in layers)
    assert isinstance(layers[0].post_attention_layernorm, rt.GemmaRMSNorm)
    assert list(patched.state_dict()) == list(model.state_dict())
    # the fused op runs once per layer
    calls = []
    with _Count(calls):
        with torch.no_grad():
            patched(input_ids=IDS)
    assert calls.count("sandwich_rms_norm") == len(layers)
    assert_same_training_step(model, patched, IDS, f"gemma{version}")
    rt.patch(patched, sandwich=True)  # again: nothing changes
    # compiled: no graph break, the same logits
    torch._dynamo.reset()
    compiled = torch.compile(patched, fullgraph=True)
    with torch.no_grad():
        want = patched(input_ids=IDS).logits
        got = compiled(input_ids=IDS).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


class _Count(torch.overrides.TorchFunctionMode):
    """Records the rmsnorm.torch functions called (their __torch_function__ dispatch)."""

    def __init__(self, calls):
        super().__init__()
        self.calls = calls

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls.append(getattr(func, "__name__", ""))
        return func(*args, **(kwargs or {}))
