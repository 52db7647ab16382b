"""test_autograd_modes.py - rmsnorm.torch under every autograd mode a user reaches: writes in
place in grad, no_grad and inference mode (version counters, inference tensors), forward-mode
AD and the torch.func transforms (jvp, jacfwd, jacrev, hessian, grad, vmap), checked against
torch's own norms and float64 finite differences."""

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from torch.func import grad, jacfwd, jacrev, jvp, vjp, vmap

import rmsnorm
import rmsnorm.torch as rt

D = 16


def rows(*shape, dtype=torch.float64, seed=0):
    """Real-looking activations: a few outlier channels and a nonzero mean."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=torch.float64) + 0.3
    x[..., 3] *= 12.0
    return x.to(dtype)


# ---- writes in place: version counters in every mode, inference tensors ------------------

def _write_rms_out(x):
    rt.rms_norm(torch.randn(x.shape, dtype=x.dtype), D, out=x)


def _write_layer_out(x):
    rt.layer_norm(torch.randn(x.shape, dtype=x.dtype), D, out=x)


def _write_qk(x):
    rt.qk_norm(x.view(x.shape[0], 2, D // 2), inplace=True)


def _write_add_input(x):
    rt.fused_add_rms_norm(x, torch.randn(x.shape, dtype=x.dtype), D, inplace=True)


def _write_add_residual(x):
    rt.fused_add_rms_norm(torch.randn(x.shape, dtype=x.dtype), x, D, inplace=True)


def _write_sandwich_input(x):
    rt.sandwich_rms_norm(x, torch.randn(x.shape, dtype=x.dtype), D, inplace=True)


def _write_sandwich_residual(x):
    rt.sandwich_rms_norm(torch.randn(x.shape, dtype=x.dtype), x, D, inplace=True)


WRITERS = [_write_rms_out, _write_layer_out, _write_qk, _write_add_input, _write_add_residual,
           _write_sandwich_input, _write_sandwich_residual]
MODES = {"grad": torch.enable_grad, "no_grad": torch.no_grad, "inference": torch.inference_mode}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("write", WRITERS, ids=lambda f: f.__name__[7:])
def test_overwriting_a_saved_tensor_fails_the_backward_as_torch_does(write, mode):
    """x is saved for the backward of rms_norm; writing it afterwards in any mode must make
    that backward raise, as torch's own x.mul_(2) in the same place does."""
    w = torch.randn(D, dtype=torch.float64, requires_grad=True)
    for writer in (lambda x: x.mul_(2), write):  # torch's own in-place op, then ours
        x = rows(4, D)
        before = x._version
        y = rt.rms_norm(x, D, w)
        with MODES[mode]():
            writer(x)
        assert x._version > before
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()


@pytest.mark.parametrize("write", WRITERS, ids=lambda f: f.__name__[7:])
def test_inference_tensors_are_written_only_inside_inference_mode(write):
    with torch.inference_mode():
        x = rows(4, D)
        write(x)  # inside inference mode, as x.mul_(2), allowed
    assert x.is_inference()
    with pytest.raises(RuntimeError, match="Inplace update to inference tensor"):
        x.mul_(2)  # torch refuses outside inference mode (after writing) ...
    keep = x.clone()
    with pytest.raises(RuntimeError, match="inference tensor .* outside inference mode"):
        write(x)  # ... and so do we, before writing anything
    assert torch.equal(x, keep)


def test_every_tensor_an_inference_tensor_is_refused_outside():
    with torch.inference_mode():
        a = rows(4, D)
        w = torch.ones(D, dtype=torch.float64)
    keep = a.clone()
    with pytest.raises(RuntimeError, match=r"rmsnorm::rms_norm\.out: cannot write an inference"):
        rt.rms_norm(a, D, w, out=a)
    with pytest.raises(RuntimeError, match="rmsnorm::qk_norm_inplace: cannot write an inference"):
        rt.qk_norm(a.view(4, 2, D // 2), inplace=True)
    assert torch.equal(a, keep)


def test_writing_in_place_refuses_forward_ad_tangents():
    x = rows(4, D)
    with fwAD.dual_level():
        xd = fwAD.make_dual(x, torch.ones_like(x))
        with pytest.raises(ValueError, match="does not take part in autograd"):
            rt.rms_norm(xd, D, out=torch.empty_like(x))


# ---- forward-mode AD and the torch.func transforms ---------------------------------------

def _fd_jvp(f, args, tangents, h=1e-6):
    """Central finite difference of f along the tangents, in float64."""
    plus = f(*[a + h * t for a, t in zip(args, tangents)])
    minus = f(*[a - h * t for a, t in zip(args, tangents)])
    if isinstance(plus, tuple):
        return tuple((p - m) / (2 * h) for p, m in zip(plus, minus))
    return (plus - minus) / (2 * h)


RMS_VARIANTS = [
    dict(),
    dict(offset=True),
    dict(eps_outside=True),
    dict(partial=0.25),
    dict(bias=True),
]


@pytest.mark.parametrize("kw", RMS_VARIANTS, ids=lambda k: ",".join(k) or "plain")
def test_rms_norm_jvp_matches_finite_differences(kw):
    kw = dict(kw)
    x, w = rows(3, 5, D), rows(D, seed=1)
    b = rows(D, seed=2) if kw.pop("bias", False) else None
    args = [x, w] + ([b] if b is not None else [])
    tangents = [rows(*a.shape, seed=10 + i) for i, a in enumerate(args)]

    def f(x, w, b=None):
        return rt.rms_norm(x, D, w, 1e-5, bias=b, **kw)

    y, t = jvp(f, tuple(args), tuple(tangents))
    torch.testing.assert_close(y, f(*args), rtol=0, atol=0)  # the primal is the plain call
    torch.testing.assert_close(t, _fd_jvp(f, args, tangents), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_forward_ad_matches_torch(dtype):
    x, w, b = rows(4, D, dtype=dtype), rows(D, dtype=dtype, seed=1), rows(D, dtype=dtype, seed=2)
    tx, tw, tb = (rows(*a.shape, dtype=dtype, seed=9 + i) for i, a in enumerate((x, w, b)))
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else {}
    with fwAD.dual_level():
        xd, wd, bd = (fwAD.make_dual(a, t) for a, t in ((x, tx), (w, tw), (b, tb)))
        for ours, theirs in [
            (rt.rms_norm(xd, D, wd, 1e-5), F.rms_norm(xd, [D], wd, 1e-5)),
            (rt.layer_norm(xd, D, wd, bd), F.layer_norm(xd, [D], wd, bd)),
            (rt.layer_norm(xd, D), F.layer_norm(xd, [D])),
            (rt.rms_norm_with_rstd(xd, D, wd, 1e-5)[0], F.rms_norm(xd, [D], wd, 1e-5)),
        ]:
            got, want = fwAD.unpack_dual(ours).tangent, fwAD.unpack_dual(theirs).tangent
            assert got is not None
            torch.testing.assert_close(got, want, **tol)


def test_forward_ad_of_the_other_ops():
    x, u, w = rows(2, 3, 2 * D), rows(2, 3, 2 * D, seed=3), rows(2 * D, seed=1)
    tx, tu, tw = rows(*x.shape, seed=7), rows(*u.shape, seed=8), rows(*w.shape, seed=9)

    def add(u, x, w):
        return rt.fused_add_rms_norm(u, x, 2 * D, w, 1e-6)

    def add_ref(u, x, w):
        h = x + u
        return F.rms_norm(h, [2 * D], w, 1e-6), h

    got = jvp(add, (u, x, w), (tu, tx, tw))[1]
    want = jvp(add_ref, (u, x, w), (tu, tx, tw))[1]
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r)

    heads = x.view(2, 3, 4, D // 2)
    th = tx.view(heads.shape)
    wq = rows(D // 2, seed=4)
    got = jvp(lambda q, w: rt.qk_norm(q, w, 1e-6), (heads, wq), (th, rows(D // 2, seed=5)))[1]
    want = jvp(lambda q, w: F.rms_norm(q, [D // 2], w, 1e-6), (heads, wq),
               (th, rows(D // 2, seed=5)))[1]
    torch.testing.assert_close(got, want)

    if rmsnorm.linear_available():
        W, bias = rows(2 * D, 5, seed=6), rows(5, seed=11)
        tW, tbias = rows(2 * D, 5, seed=12), rows(5, seed=13)

        def lin(x, W, w, bias):
            return rt.rms_norm_linear(x, W, w, 1e-6, bias)

        def lin_ref(x, W, w, bias):
            return F.rms_norm(x, [2 * D], w, 1e-6) @ W + bias

        args, tans = (x, W, w, bias), (tx, tW, tw, tbias)
        torch.testing.assert_close(jvp(lin, args, tans)[1], jvp(lin_ref, args, tans)[1])


def test_gradcheck_forward_and_batched_modes():
    x = rows(3, D).requires_grad_()
    w = rows(D, seed=1).requires_grad_()
    b = rows(D, seed=2).requires_grad_()
    for fn in (lambda x, w, b: rt.rms_norm(x, D, w, 1e-5, bias=b),
               lambda x, w, b: rt.rms_norm(x, D, w, 1e-5, offset=True, eps_outside=True),
               lambda x, w, b: rt.rms_norm(x, D, w, 1e-5, partial=0.5),
               lambda x, w, b: rt.layer_norm(x, D, w, b),
               lambda x, w, b: rt.fused_add_rms_norm(x, b.expand(3, D), D, w, 1e-5),
               lambda x, w, b: rt.qk_norm(x.view(3, 2, D // 2), w[: D // 2], 1e-5)):
        assert torch.autograd.gradcheck(fn, (x, w, b), check_forward_ad=True,
                                        check_batched_grad=True, check_batched_forward_grad=True)
        assert torch.autograd.gradgradcheck(fn, (x, w, b), check_fwd_over_rev=True,
                                            check_rev_over_rev=True)


def test_func_transforms_agree_with_torch():
    x, w = rows(3, D), rows(D, seed=1)

    def ours(x, w):
        return rt.rms_norm(x, D, w, 1e-5)

    def theirs(x, w):
        return F.rms_norm(x, [D], w, 1e-5)

    for transform in (jacfwd, jacrev):
        for argnums in (0, 1):
            torch.testing.assert_close(transform(ours, argnums=argnums)(x, w),
                                       transform(theirs, argnums=argnums)(x, w))
    scalar_ours = lambda x: ours(x, w).square().sum()  # noqa: E731
    scalar_theirs = lambda x: theirs(x, w).square().sum()  # noqa: E731
    torch.testing.assert_close(grad(scalar_ours)(x), grad(scalar_theirs)(x))
    torch.testing.assert_close(torch.func.hessian(scalar_ours)(x[0]),
                               torch.func.hessian(scalar_theirs)(x[0]))
    out, pull = vjp(ours, x, w)
    ct = rows(*out.shape, seed=5)
    for a, b in zip(pull(ct), vjp(theirs, x, w)[1](ct)):
        torch.testing.assert_close(a, b)
    # vmap (over a leading dim), and per-sample gradients vmap(grad)
    torch.testing.assert_close(vmap(ours, in_dims=(0, None))(x, w), theirs(x, w))
    per_ours = vmap(grad(lambda r, w: ours(r, w).sum(), argnums=1), in_dims=(0, None))(x, w)
    per_theirs = vmap(grad(lambda r, w: theirs(r, w).sum(), argnums=1), in_dims=(0, None))(x, w)
    torch.testing.assert_close(per_ours, per_theirs)


def test_layer_norm_func_transforms_agree_with_torch():
    x, w, b = rows(3, D), rows(D, seed=1), rows(D, seed=2)
    torch.testing.assert_close(jacfwd(lambda x: rt.layer_norm(x, D, w, b))(x),
                               jacfwd(lambda x: F.layer_norm(x, [D], w, b))(x))
    torch.testing.assert_close(jacrev(lambda w: rt.layer_norm(x, D, w, b))(w),
                               jacrev(lambda w: F.layer_norm(x, [D], w, b))(w))
