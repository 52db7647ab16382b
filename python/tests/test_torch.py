"""test_torch.py - rmsnorm.torch against torch.nn.functional.rms_norm/layer_norm
and autograd: every dtype, 1-D to 4-D inputs, multi-dim normalized_shape,
non-contiguous inputs and gradients, gradcheck in float64, the RMSNorm and
LayerNorm modules' state_dict compatibility, threads."""

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import rmsnorm  # noqa: E402
import rmsnorm.torch as rt  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
TOL = {torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float64: 1e-13}
SHAPES = [((16,), 1), ((5, 16), 1), ((2, 3, 16), 1), ((2, 2, 3, 16), 1), ((3, 4, 8), 2),
          ((2, 2, 3, 8), 3)]


def err(a, b):
    return float((a.detach().double() - b.detach().double()).abs().max()) if a.numel() else 0.0


def scale(t):
    return max(1.0, float(t.detach().double().abs().max())) if t.numel() else 1.0


def run(fn, x, dy, params):
    """fn's output and the gradients of input and params, for upstream gradient dy."""
    x = x.detach().requires_grad_()
    ps = [None if p is None else p.detach().requires_grad_() for p in params]
    y = fn(x, *ps)
    y.backward(dy)
    return [y.detach(), x.grad] + [None if p is None else p.grad for p in ps]


def check_against_torch(ours, theirs, x, dy, params, what):
    """Ours is within a few ulps of the float64 result, and no less accurate than
    torch's own kernels at the same dtype."""
    dt = x.dtype
    exact = run(theirs, x.double(), dy.double(), [None if p is None else p.double() for p in params])
    got = run(ours, x, dy, params)
    ref = run(theirs, x, dy, params)
    names = ["y", "grad input"] + ["grad weight", "grad bias"][: len(params)]
    for name, g, r, e in zip(names, got, ref, exact):
        if e is None:
            assert g is None, (what, name)
            continue
        assert g is not None, f"{what}: no {name}"
        assert g.dtype == r.dtype and g.shape == r.shape, (what, name, g.dtype, r.dtype)
        tol = TOL[dt] * scale(e)
        assert err(g, e) <= max(tol, err(r, e)), f"{what} {name}: {err(g, e)} vs torch {err(r, e)}"
        assert err(g, r) <= tol + err(r, e), f"{what} {name} differs from torch by {err(g, r)}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,k", SHAPES, ids=str)
@pytest.mark.parametrize("affine", ["none", "weight"])
def test_rms_norm_matches_torch(dtype, shape, k, affine):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(shape, generator=g).to(dtype)
    dy = torch.randn(shape, generator=g).to(dtype)
    nshape = shape[len(shape) - k:]
    params = [torch.randn(nshape, generator=g).to(dtype)] if affine == "weight" else []

    def ours(x, *p):
        return rt.rms_norm(x, nshape, *p)

    def theirs(x, *p):
        return F.rms_norm(x, nshape, *p)

    check_against_torch(ours, theirs, x, dy, params, f"rms_norm {dtype} {shape}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,k", SHAPES, ids=str)
@pytest.mark.parametrize("affine", ["none", "weight+bias"])
def test_layer_norm_matches_torch(dtype, shape, k, affine):
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(shape, generator=g) * 2 + 0.5).to(dtype)
    dy = torch.randn(shape, generator=g).to(dtype)
    nshape = shape[len(shape) - k:]
    params = ([torch.randn(nshape, generator=g).to(dtype), torch.randn(nshape, generator=g).to(dtype)]
              if affine != "none" else [])

    def ours(x, *p):
        return rt.layer_norm(x, nshape, *p)

    def theirs(x, *p):
        return F.layer_norm(x, nshape, *p)

    check_against_torch(ours, theirs, x, dy, params, f"layer_norm {dtype} {shape}")


def test_rms_norm_bias_matches_composite():
    g = torch.Generator().manual_seed(3)
    x, dy = torch.randn(4, 3, 16, generator=g), torch.randn(4, 3, 16, generator=g)
    w, b = torch.randn(16, generator=g), torch.randn(16, generator=g)
    check_against_torch(lambda x, w, b: rt.rms_norm(x, 16, w, bias=b),
                        lambda x, w, b: F.rms_norm(x, [16], w) + b, x, dy, [w, b], "bias")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_mixed_parameter_dtypes(dtype):
    # torch takes float32 parameters with half data (and the converse for rms_norm).
    g = torch.Generator().manual_seed(4)
    x, dy = torch.randn(6, 32, generator=g).to(dtype), torch.randn(6, 32, generator=g).to(dtype)
    w, b = torch.randn(32, generator=g), torch.randn(32, generator=g)
    check_against_torch(lambda x, w: rt.rms_norm(x, 32, w), lambda x, w: F.rms_norm(x, [32], w),
                        x, dy, [w], "half data, float32 weight")
    check_against_torch(lambda x, w, b: rt.layer_norm(x, 32, w, b),
                        lambda x, w, b: F.layer_norm(x, [32], w, b), x, dy, [w, b],
                        "half data, float32 weight and bias")
    check_against_torch(lambda x, w: rt.rms_norm(x, 32, w), lambda x, w: F.rms_norm(x, [32], w),
                        x.float(), dy.float(), [w.to(dtype)], "float32 data, half weight")


# ---- layouts ----------------------------------------------------------------------------


def layouts():
    g = torch.Generator().manual_seed(5)
    base = torch.randn(6, 5, 48, generator=g)
    yield "row-strided slice", base[:, :, :32], 1
    yield "every other row", base[::2, :, :32], 1
    yield "transposed leading dims", base.transpose(0, 1), 1
    yield "inner stride 2", base[:, :, ::2], 1
    yield "expanded rows", base[0, 0].expand(4, 48), 1
    yield "column-major", base[:, 0, :].t().contiguous().t(), 1
    yield "channels last", torch.randn(2, 8, 3, 3, generator=g).to(memory_format=torch.channels_last), 2
    yield "two normalized dims of a slice", base[1:5, :, :32], 2
    yield "storage offset", base.reshape(-1)[7: 7 + 3 * 48].view(3, 48), 1


@pytest.mark.parametrize("name,x,k", list(layouts()), ids=lambda v: v if isinstance(v, str) else "")
def test_non_contiguous(name, x, k):
    nshape = x.shape[x.dim() - k:]
    g = torch.Generator().manual_seed(6)
    w, b = torch.randn(nshape, generator=g), torch.randn(nshape, generator=g)
    # a non-contiguous upstream gradient as well
    dy = torch.randn(tuple(reversed(x.shape)), generator=g).permute(*reversed(range(x.dim())))
    check_against_torch(lambda x, w: rt.rms_norm(x, nshape, w),
                        lambda x, w: F.rms_norm(x, nshape, w), x, dy, [w], name)
    check_against_torch(lambda x, w, b: rt.layer_norm(x, nshape, w, b),
                        lambda x, w, b: F.layer_norm(x, nshape, w, b), x, dy, [w, b], name)


def test_expanded_gradient_from_sum():
    # y.sum().backward() hands the backward a stride-0 gradient.
    x = torch.randn(4, 16, requires_grad=True)
    w = torch.randn(16, requires_grad=True)
    rt.rms_norm(x, [16], w).sum().backward()
    gx, gw = x.grad, w.grad
    x.grad = w.grad = None
    F.rms_norm(x, [16], w).sum().backward()
    torch.testing.assert_close(gx, x.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gw, w.grad, rtol=1e-5, atol=1e-5)


# ---- gradcheck in float64 ------------------------------------------------------------------


@pytest.mark.parametrize("kw", [{}, {"offset": True}, {"eps_outside": True}, {"partial": 0.5},
                                {"eps_outside": True, "partial": 0.3, "offset": True}], ids=str)
def test_gradcheck_rms_norm(kw):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(3, 4, 10, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 10, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, 10, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w, b: rt.rms_norm(x, (4, 10), w, 1e-3, bias=b, **kw),
                                    (x, w, b))
    assert torch.autograd.gradcheck(lambda x: rt.rms_norm(x, 10, None, 1e-3, **kw), (x,))
    xt = x.detach().transpose(0, 1).requires_grad_()  # non-contiguous input
    assert torch.autograd.gradcheck(lambda x: rt.rms_norm(x, 10, w[0], **kw), (xt,))


def test_gradcheck_layer_norm():
    g = torch.Generator().manual_seed(8)
    x = torch.randn(3, 4, 10, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 10, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, 10, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w, b: rt.layer_norm(x, (4, 10), w, b), (x, w, b))
    assert torch.autograd.gradcheck(lambda x, w: rt.layer_norm(x, 10, w[0], None, offset=True),
                                    (x, w))


# ---- autograd behaviour ----------------------------------------------------------------------


def test_only_what_requires_grad_gets_a_gradient():
    x = torch.randn(3, 8)
    w = torch.randn(8, requires_grad=True)
    b = torch.randn(8)
    rt.layer_norm(x, 8, w, b).sum().backward()
    assert w.grad is not None and x.grad is None and b.grad is None


def test_no_grad_path_gives_the_same_values():
    x = torch.randn(5, 32, requires_grad=True)
    w = torch.randn(32, requires_grad=True)
    y = rt.rms_norm(x, 32, w)
    with torch.no_grad():
        y0 = rt.rms_norm(x, 32, w)
    assert y.requires_grad and not y0.requires_grad
    assert torch.equal(y.detach(), y0)


def test_gradients_accumulate_like_torch():
    x = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(8, requires_grad=True)
    for _ in range(2):
        rt.rms_norm(x, 8, w).pow(2).sum().backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    for _ in range(2):
        F.rms_norm(x, [8], w).pow(2).sum().backward()
    torch.testing.assert_close(gx, x.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gw, w.grad, rtol=1e-5, atol=1e-5)


# ---- modules -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rmsnorm_module_loads_torch_state_dict(dtype):
    g = torch.Generator().manual_seed(9)
    theirs = torch.nn.RMSNorm((4, 16), eps=1e-5, dtype=dtype)
    with torch.no_grad():
        theirs.weight.copy_(torch.randn(4, 16, generator=g))
    ours = rt.RMSNorm((4, 16), eps=1e-5, dtype=dtype)
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["weight"]
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(3, 4, 16, generator=g).to(dtype)
    y0 = theirs(x)
    torch.testing.assert_close(ours(x), y0, rtol=TOL[dtype] * 4, atol=TOL[dtype] * scale(y0))
    theirs.load_state_dict(ours.state_dict())  # and back
    assert repr(ours).replace("rmsnorm.torch.", "") == repr(theirs).replace("torch.nn.", "")


def test_rmsnorm_module_options():
    m = rt.RMSNorm(8)  # eps None: torch's default for the dtype
    x = torch.full((2, 8), 1e-4)
    torch.testing.assert_close(m(x), torch.nn.RMSNorm(8)(x))
    m = rt.RMSNorm(8, elementwise_affine=False)
    assert m.weight is None and dict(m.named_parameters()) == {}
    m = rt.RMSNorm(8, bias=True)
    assert sorted(m.state_dict()) == ["bias", "weight"]
    with torch.no_grad():
        m.bias.fill_(2.0)
    torch.testing.assert_close(m(x), torch.nn.RMSNorm(8)(x) + 2.0)
    m = rt.RMSNorm(8, 1e-6, True, None, torch.float64)  # torch's positional order
    assert m.weight.dtype == torch.float64 and m.eps == 1e-6


def test_layernorm_module_matches_torch():
    g = torch.Generator().manual_seed(10)
    theirs = torch.nn.LayerNorm(32)
    with torch.no_grad():
        theirs.weight.copy_(torch.randn(32, generator=g))
        theirs.bias.copy_(torch.randn(32, generator=g))
    ours = rt.LayerNorm(32)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(4, 32, generator=g)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)
    assert sorted(rt.LayerNorm(8, bias=False).state_dict()) == ["weight"]


# ---- threads -------------------------------------------------------------------------------


def test_threads_follow_torch():
    before = torch.get_num_threads()
    x = torch.randn(512, 1024)
    try:
        outs = []
        for n in (1, 2):
            torch.set_num_threads(n)
            outs.append(rt.rms_norm(x, 1024))
            assert rmsnorm._native._context_threads() == n  # read in C++ on the call
        assert torch.equal(outs[0], outs[1])
    finally:
        torch.set_num_threads(before)


def test_out_without_autograd():
    x = torch.randn(4, 16)
    w = torch.randn(16)
    want = F.rms_norm(x, [16], w, 1e-5)
    out = torch.empty(4, 16)
    assert rt.rms_norm(x, 16, w, 1e-5, out=out) is out
    torch.testing.assert_close(out, want)
    y = x.clone()
    rt.rms_norm(y, 16, w, 1e-5, out=y)  # in place
    torch.testing.assert_close(y, want)
    xg = x.clone().requires_grad_()
    with pytest.raises(ValueError, match=r"rmsnorm::layer_norm.out: writing in place \(out=, "
                       r"inplace=True\) does not take part in autograd"):
        rt.layer_norm(xg, 16, out=out)
    with torch.no_grad():
        rt.layer_norm(xg, 16, out=out)
    torch.testing.assert_close(out, F.layer_norm(x, [16]))
