"""test_fused.py - the fused operations of a transformer block, numpy and torch:
fused_add_rms_norm (against rms_norm of h + u and autograd of that composition),
rms_norm_linear (against rms_norm(x) @ W + b and its autograd), rms_norm_int8/fp8
(against a float64 oracle of the documented formula), gradcheck in float64, the
in-place contract and the error cases."""

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
TOL = {torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float64: 1e-13}
needs_blas = pytest.mark.skipif(not rmsnorm.linear_available(),
                                reason="librmsnorm built without a BLAS")


def t64(a):
    """A numpy array of any of our dtypes as a float64 tensor."""
    return torch.from_numpy(np.asarray(a).astype(np.float64))


def eps_of(dt):
    return 2.0 ** -52 if np.dtype(dt) == np.float64 else 2.0 ** -23


def close(got, want, tol):
    got, want = t64(got) if isinstance(got, np.ndarray) else got.double(), want.double()
    scale = max(1.0, float(want.abs().max())) if want.numel() else 1.0
    assert got.shape == want.shape
    err = float((got - want).abs().max()) if want.numel() else 0.0
    assert err <= tol * scale, f"max error {err} > {tol} x {scale}"


# ---- fused_add_rms_norm: numpy -----------------------------------------------------


@pytest.mark.parametrize("dt", NP_DTYPES)
@pytest.mark.parametrize("shape", [(16,), (3, 40), (2, 3, 64)])
def test_fused_add_numpy(rng, dt, shape):
    d = shape[-1]
    h = rng.standard_normal(shape).astype(dt)
    u = rng.standard_normal(shape).astype(dt)
    w = (1 + 0.1 * rng.standard_normal(d)).astype(dt)
    b = rng.standard_normal(d).astype(dt)
    h0, u0 = h.copy(), u.copy()
    y, h2, rstd = rmsnorm.fused_add_rms_norm(u, h, d, w, bias=b, return_rstd=True)
    # h' is h + u rounded once to the dtype, as numpy adds
    np.testing.assert_array_equal(h2, h + u)
    assert h2.dtype == h.dtype and y.dtype == h.dtype and rstd.shape == shape[:-1] + (1,)
    # y is bit for bit rms_norm of that h'
    ref, ref_rstd = rmsnorm.rms_norm(h2, d, w, bias=b, return_rstd=True)
    np.testing.assert_array_equal(y, ref)
    np.testing.assert_array_equal(rstd, ref_rstd)
    # and near the float64 composition
    want = F.rms_norm(t64(h2), (d,), t64(w), eps_of(dt)) + t64(b)
    close(y, want, 2 * TOL[TORCH_OF[np.dtype(dt)]])
    # inplace=False: neither argument is touched
    np.testing.assert_array_equal(h, h0)
    np.testing.assert_array_equal(u, u0)


def test_fused_add_numpy_inplace(rng):
    h = rng.standard_normal((6, 32)).astype(np.float32)
    u = rng.standard_normal((6, 32)).astype(np.float32)
    want_y, want_h = rmsnorm.fused_add_rms_norm(u, h, 32)
    y, h2 = rmsnorm.fused_add_rms_norm(u, h, 32, inplace=True)
    assert y is u and h2 is h  # vLLM's contract: output in input, h + u in residual
    np.testing.assert_array_equal(h, want_h)
    np.testing.assert_array_equal(u, want_y)
    # row slices are written where they lie
    big_h = rng.standard_normal((6, 48)).astype(np.float32)
    big_u = rng.standard_normal((6, 48)).astype(np.float32)
    want_y, want_h = rmsnorm.fused_add_rms_norm(big_u[:, :32], big_h[:, :32], 32)
    rest = big_h[:, 32:].copy()
    rmsnorm.fused_add_rms_norm(big_u[:, :32], big_h[:, :32], 32, inplace=True)
    np.testing.assert_array_equal(big_h[:, :32], want_h)
    np.testing.assert_array_equal(big_u[:, :32], want_y)
    np.testing.assert_array_equal(big_h[:, 32:], rest)
    # no row-strided view, or read-only: refused, nothing written
    with pytest.raises(ValueError, match="residual must hold the normalized dims contiguously"):
        rmsnorm.fused_add_rms_norm(u, np.asfortranarray(h), 32, inplace=True)
    ro = h.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        rmsnorm.fused_add_rms_norm(u, ro, 32, inplace=True)
    # the same array as input and residual overlaps the output: a library error
    with pytest.raises(rmsnorm.ArgumentError, match="RMSNORM_ERROR_OVERLAP"):
        rmsnorm.fused_add_rms_norm(h, h, 32, inplace=True)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_fused_add_numpy_backward(rng, dt):
    shape, d = (4, 5, 24), 24
    h = rng.standard_normal(shape).astype(dt)
    u = rng.standard_normal(shape).astype(dt)
    w = (1 + 0.1 * rng.standard_normal(d)).astype(dt)
    b = rng.standard_normal(d).astype(dt)
    dy = rng.standard_normal(shape).astype(dt)
    dres = rng.standard_normal(shape).astype(dt)
    y, h2, rstd = rmsnorm.fused_add_rms_norm(u, h, d, w, bias=b, offset=True, return_rstd=True)
    for g_res in (dres, None):
        dh, dw, db = rmsnorm.fused_add_rms_norm_backward(dy, g_res, h2, d, w, bias=b, rstd=rstd,
                                                         offset=True)
        # torch autograd of the composition h' = h + u, y = rms_norm(h') * (1 + w) + b
        th, tu, tw, tb = (t64(a).requires_grad_() for a in (h, u, w, b))
        th2 = th + tu
        ty = F.rms_norm(th2, (d,), 1 + tw, eps_of(dt)) + tb
        loss = (ty * t64(dy)).sum() + ((th2 * t64(g_res)).sum() if g_res is not None else 0)
        loss.backward()
        tol = 4 * TOL[TORCH_OF[np.dtype(dt)]]
        close(dh, th.grad, tol)
        close(dh, tu.grad, tol)
        close(dw, tw.grad, tol)
        close(db, tb.grad, tol)


def test_fused_add_numpy_errors(rng):
    h = rng.standard_normal((3, 8)).astype(np.float32)
    with pytest.raises(ValueError, match="residual has shape"):
        rmsnorm.fused_add_rms_norm(h, h[:2], 8)
    with pytest.raises(TypeError, match="residual has dtype float64"):
        rmsnorm.fused_add_rms_norm(h, h.astype(np.float64), 8)
    with pytest.raises(ValueError, match="expected input with shape"):
        rmsnorm.fused_add_rms_norm(h, h, 4)
    with pytest.raises(ValueError, match="Expected weight to be of same shape"):
        rmsnorm.fused_add_rms_norm(h, h, 8, np.ones(4, np.float32))
    with pytest.raises(rmsnorm.ArgumentError, match="RMSNORM_ERROR_BAD_EPS"):
        rmsnorm.fused_add_rms_norm(h, h, 8, eps=float("nan"))
    with pytest.raises(ValueError, match="grad_output has shape"):
        rmsnorm.fused_add_rms_norm_backward(h[:1], None, h, 8)


# ---- rms_norm_linear: numpy --------------------------------------------------------


@needs_blas
@pytest.mark.parametrize("dt", NP_DTYPES)
@pytest.mark.parametrize("offset", [False, True])
def test_linear_numpy(rng, dt, offset):
    x = rng.standard_normal((2, 5, 32)).astype(dt)
    W = (rng.standard_normal((32, 12)) / 6).astype(np.float64 if dt == np.float64 else np.float32)
    g = (0.1 * rng.standard_normal(32) + (0 if offset else 1)).astype(dt)
    b = rng.standard_normal(12).astype(dt)
    z, rstd = rmsnorm.rms_norm_linear(x, W, g, bias=b, offset=offset, return_rstd=True)
    assert z.shape == (2, 5, 12) and z.dtype == x.dtype and rstd.shape == (2, 5, 1)
    # the unfused composition in float64
    gain = 1 + t64(g) if offset else t64(g)
    want = F.rms_norm(t64(x), (32,), gain, eps_of(dt)) @ t64(W) + t64(b)
    close(z, want, 4 * TOL[TORCH_OF[np.dtype(dt)]] + 1e-6 * (dt != np.float64))
    np.testing.assert_array_equal(rstd, rmsnorm.rms_norm(x, 32, return_rstd=True)[1])


@needs_blas
def test_linear_numpy_matrix_dtypes(rng):
    x = rng.standard_normal((4, 16)).astype(np.float32)
    W = rng.standard_normal((16, 3))
    # a float64 matrix with float32 data is converted to the compute type, float32
    np.testing.assert_array_equal(rmsnorm.rms_norm_linear(x, W),
                                  rmsnorm.rms_norm_linear(x, W.astype(np.float32)))
    # a transposed (non-contiguous) matrix is copied first
    Wt = np.ascontiguousarray(W.T.astype(np.float32)).T
    np.testing.assert_array_equal(rmsnorm.rms_norm_linear(x, Wt),
                                  rmsnorm.rms_norm_linear(x, W.astype(np.float32)))


@needs_blas
@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_linear_numpy_backward(rng, dt):
    x = rng.standard_normal((3, 4, 16)).astype(dt)
    W = rng.standard_normal((16, 6)).astype(dt)
    g = (1 + 0.1 * rng.standard_normal(16)).astype(dt)
    b = rng.standard_normal(6).astype(dt)
    dz = rng.standard_normal((3, 4, 6)).astype(dt)
    dx, dW, dg, db = rmsnorm.rms_norm_linear_backward(dz, x, W, g, bias=b)
    tx, tW, tg, tb = (t64(a).requires_grad_() for a in (x, W, g, b))
    ((F.rms_norm(tx, (16,), tg, eps_of(dt)) @ tW + tb) * t64(dz)).sum().backward()
    tol = 8 * TOL[TORCH_OF[np.dtype(dt)]]
    for got, want in ((dx, tx.grad), (dW, tW.grad), (dg, tg.grad), (db, tb.grad)):
        assert got.dtype == np.dtype(dt)
        close(got, want, tol)


def test_linear_numpy_errors(rng):
    x = rng.standard_normal((3, 8)).astype(np.float32)
    with pytest.raises(ValueError, match=r"weight_matrix has shape \[4, 3\]; expected \(d, n\)"):
        rmsnorm.rms_norm_linear(x, np.ones((4, 3), np.float32))
    with pytest.raises(ValueError, match="weight_matrix has shape"):
        rmsnorm.rms_norm_linear(x, np.ones(8, np.float32))
    with pytest.raises(ValueError, match="d > 0 and n > 0"):
        rmsnorm.rms_norm_linear(x, np.ones((8, 0), np.float32))
    with pytest.raises(ValueError, match="Expected norm_weight to be of same shape"):
        rmsnorm.rms_norm_linear(x, np.ones((8, 3), np.float32), np.ones(3, np.float32))
    with pytest.raises(ValueError, match="Expected bias to be of same shape"):
        rmsnorm.rms_norm_linear(x, np.ones((8, 3), np.float32), bias=np.ones(8, np.float32))
    with pytest.raises(TypeError, match="weight_matrix has dtype int64"):
        rmsnorm.rms_norm_linear(x, np.ones((8, 3), np.int64))
    if not rmsnorm.linear_available():
        with pytest.raises(rmsnorm.NotAvailableError, match="without a BLAS"):
            rmsnorm.rms_norm_linear(x, np.ones((8, 3), np.float32))


# ---- quantized output: numpy and torch --------------------------------------------


def quant_oracle(x, w, eps, qmax, static=None):
    """The documented formula in float64 from the float32 forward values."""
    y = F.rms_norm(t64(x), (x.shape[-1],), t64(w), eps).numpy().astype(np.float32)
    y = y.astype(np.float64)
    if static is None:
        s = (np.abs(y).max(axis=-1, keepdims=True) / qmax).astype(np.float32)
    else:
        s = np.float32(static)
    # t = y * inv with inv = 1/s rounded to float32 once per row (README); the product
    # of two float32 values is exact in float64, its rounding to float32 is the library's
    inv = (1.0 / np.where(s == 0, 1, s).astype(np.float64)).astype(np.float32)
    t = np.where(s == 0, 0.0, (y * inv.astype(np.float64)).astype(np.float32).astype(np.float64))
    return t, s


@pytest.mark.parametrize("dt", NP_DTYPES)
@pytest.mark.parametrize("static", [None, 0.02])
def test_int8(rng, dt, static):
    x = rng.standard_normal((5, 7, 64)).astype(dt)
    w = (1 + 0.2 * rng.standard_normal(64)).astype(np.float32)
    q, s = rmsnorm.rms_norm_int8(x, 64, w, scale=static)
    assert q.dtype == np.int8 and q.shape == x.shape
    t, want_s = quant_oracle(x, w, eps_of(dt), 127.0, static)
    if static is None:
        assert s.dtype == np.float32 and s.shape == (5, 7, 1)
        np.testing.assert_allclose(s, want_s, rtol=1e-6)
        assert np.abs(q).max() == 127
    else:
        assert s.shape == () and float(s) == np.float32(static)
    want_q = np.rint(np.clip(t, -128, 127))
    diff = np.abs(q.astype(np.float64) - want_q)
    assert diff.max() <= 1 and (diff == 0).mean() > 0.99  # ties decided by float32 rounding
    # torch gives the same codes and scales
    tq, ts = rt.rms_norm_int8(torch.from_numpy(x.astype(np.float32)) if dt == ml_dtypes.bfloat16
                              else torch.from_numpy(x), 64, torch.from_numpy(w), scale=static)
    assert tq.dtype == torch.int8
    if dt != ml_dtypes.bfloat16:
        np.testing.assert_array_equal(tq.numpy(), q)
        np.testing.assert_array_equal(ts.numpy(), s)


@pytest.mark.parametrize("static", [None, 0.004])
def test_fp8(rng, static):
    x = (3 * rng.standard_normal((6, 128))).astype(np.float32)
    w = (1 + 0.2 * rng.standard_normal(128)).astype(np.float32)
    q, s = rmsnorm.rms_norm_fp8(x, 128, w, scale=static)
    assert q.dtype == np.dtype(ml_dtypes.float8_e4m3fn) and q.shape == x.shape
    t, want_s = quant_oracle(x, w, eps_of(np.float32), 448.0, static)
    if static is None:
        np.testing.assert_allclose(s, want_s, rtol=1e-6)
    # e4m3 of t: nearest even, saturating at +-448 (ml_dtypes' cast does not saturate)
    want = np.clip(t.astype(np.float32), -448, 448).astype(ml_dtypes.float8_e4m3fn)
    codes, want_codes = q.view(np.uint8).astype(int), want.view(np.uint8).astype(int)
    assert (codes != want_codes).mean() < 0.01
    np.testing.assert_allclose(q.astype(np.float64), want.astype(np.float64), rtol=0.07)
    if static is not None:
        assert np.abs(q.astype(np.float32)).max() == 448  # saturated, not NaN
    tq, ts = rt.rms_norm_fp8(torch.from_numpy(x), 128, torch.from_numpy(w), scale=static)
    assert tq.dtype == torch.float8_e4m3fn
    np.testing.assert_array_equal(tq.view(torch.uint8).numpy(), q.view(np.uint8))


def test_quant_errors(rng):
    x = rng.standard_normal((2, 8)).astype(np.float32)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(rmsnorm.ArgumentError, match="RMSNORM_ERROR_BAD_ARGUMENT"):
            rmsnorm.rms_norm_int8(x, 8, scale=bad)
    with pytest.raises(ValueError, match="expected input with shape"):
        rmsnorm.rms_norm_fp8(x, 4)
    # a zero row: scale 0 and codes 0 (eps = 0 keeps r finite by the contract)
    q, s = rmsnorm.rms_norm_int8(np.zeros((1, 8), np.float32), 8, eps=0.0)
    assert float(s[0, 0]) == 0 and not q.any()


# ---- torch: autograd ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("use_residual", [False, True])
def test_torch_fused_add(dtype, use_residual):
    gen = torch.Generator().manual_seed(7)
    shape, d = (3, 5, 32), 32
    h, u = (torch.randn(shape, generator=gen, dtype=dtype) for _ in range(2))
    w = (1 + 0.1 * torch.randn(d, generator=gen)).to(dtype)
    b = torch.randn(d, generator=gen).to(dtype)
    dy, dres = (torch.randn(shape, generator=gen, dtype=dtype) for _ in range(2))

    def grads(fn):
        ts = [t.detach().clone().requires_grad_() for t in (u, h, w, b)]
        y, h2 = fn(*ts)
        loss = (y.float() * dy.float()).sum()
        if use_residual:
            loss = loss + (h2.float() * dres.float()).sum()
        loss.backward()
        return [y.detach(), h2.detach()] + [t.grad for t in ts]

    ours = grads(lambda u_, h_, w_, b_: rt.fused_add_rms_norm(u_, h_, d, w_, 1e-6, bias=b_))

    def composition(u_, h_, w_, b_):
        h2 = h_ + u_
        return F.rms_norm(h2, (d,), w_, 1e-6) + b_, h2

    theirs = grads(composition)
    assert torch.equal(ours[1], theirs[1])  # h' is the same rounded sum
    tol = 8 * TOL[dtype]
    for a, want in zip(ours, theirs):
        close(a, want, tol)
    # the input's and the residual's gradients are the same values, not one tensor
    assert torch.equal(ours[2], ours[3])


def test_torch_fused_add_inplace():
    h, u = torch.randn(4, 16), torch.randn(4, 16)
    want_y, want_h = rt.fused_add_rms_norm(u, h, 16)
    y, h2 = rt.fused_add_rms_norm(u, h, 16, inplace=True)
    assert y.data_ptr() == u.data_ptr() and h2.data_ptr() == h.data_ptr()
    assert torch.equal(h, want_h) and torch.equal(u, want_y)
    with pytest.raises(ValueError, match="fused_add_rms_norm_inplace: writing in place .* does not take part in autograd"):
        rt.fused_add_rms_norm(u, h.requires_grad_(), 16, inplace=True)


def test_gradcheck_fused_add():
    gen = torch.Generator().manual_seed(3)
    u, h = (torch.randn(3, 8, generator=gen, dtype=torch.float64, requires_grad=True)
            for _ in range(2))
    w = (1 + 0.1 * torch.randn(8, generator=gen, dtype=torch.float64)).requires_grad_()
    b = torch.randn(8, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda u_, h_, w_, b_: rt.fused_add_rms_norm(u_, h_, 8, w_, 1e-6, bias=b_), (u, h, w, b))
    assert torch.autograd.gradcheck(  # only y used: the residual's gradient is NULL
        lambda u_, h_, w_: rt.fused_add_rms_norm(u_, h_, 8, w_, offset=True)[0], (u, h, w))


@needs_blas
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("offset", [False, True])
def test_torch_linear(dtype, offset):
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(2, 6, 48, generator=gen).to(dtype)
    W = (torch.randn(48, 20, generator=gen) / 7).to(dtype)
    g = (0.1 * torch.randn(48, generator=gen) + (0 if offset else 1)).to(dtype)
    b = torch.randn(20, generator=gen).to(dtype)
    dz = torch.randn(2, 6, 20, generator=gen).to(dtype)
    eps = 1e-6

    def grads(fn, cast):
        ts = [cast(t).detach().clone().requires_grad_() for t in (x, W, g, b)]
        z = fn(*ts)
        z.backward(cast(dz))
        return [z.detach()] + [t.grad for t in ts]

    ours = grads(lambda x_, W_, g_, b_: rt.rms_norm_linear(x_, W_, g_, eps, b_, offset),
                 lambda t: t)
    gain = (lambda g_: 1 + g_) if offset else (lambda g_: g_)
    # the unfused composition, in float64
    want = grads(lambda x_, W_, g_, b_: F.rms_norm(x_, (48,), gain(g_), eps) @ W_ + b_,
                 lambda t: t.double())
    for a, ref in zip(ours, want):
        assert a.dtype == dtype
        close(a, ref, 8 * TOL[dtype] + (1e-5 if dtype == torch.float32 else 0))


@needs_blas
def test_gradcheck_linear():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(4, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    W = torch.randn(8, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    g = (1 + 0.1 * torch.randn(8, generator=gen, dtype=torch.float64)).requires_grad_()
    b = torch.randn(5, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda x_, W_, g_, b_: rt.rms_norm_linear(x_, W_, g_, 1e-5, b_), (x, W, g, b))
    assert torch.autograd.gradcheck(
        lambda x_, W_, g_: rt.rms_norm_linear(x_, W_, g_, offset=True, eps_outside=True),
        (x, W, g))
    assert torch.autograd.gradcheck(lambda x_, W_: rt.rms_norm_linear(x_, W_), (x, W))


@needs_blas
def test_torch_linear_no_grad_and_errors():
    x, W = torch.randn(3, 8), torch.randn(8, 4)
    with torch.no_grad():
        z = rt.rms_norm_linear(x, W)
    close(z, F.rms_norm(x.double(), (8,), eps=torch.finfo(torch.float32).eps) @ W.double(), 1e-5)
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        rt.rms_norm_linear(x, W.numpy())
    with pytest.raises(ValueError, match="weight_matrix has shape"):
        rt.rms_norm_linear(x, W.T)
