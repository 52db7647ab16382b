"""test_nonfinite.py - the rule for non-finite inputs (docs/numerics.md, "Non-finite inputs"):
every torch op, forward and backward, against torch's own formulas on the same inputs with a
NaN, +inf, -inf, or +inf and -inf, at the first, middle and last column of one row (of the
input, the residual, the gate or the output gradient): F.rms_norm and F.layer_norm with
autograd (for LayerNorm with an infinite gradient, torch's decomposition of its backward,
torch._decomp's native_layer_norm_backward, as torch's CPU and CUDA kernels disagree with
each other there), transformers' gated norms (MambaRMSNormGated, Qwen3NextRMSNormGated), the
rotary embedding (rotate_half), and the compositions the fused ops stand for. NaN, the
infinities and exact zeros must fall where torch's give them; other values agree within the
dtype's rounding. Quantized outputs: a block (row, group) whose y holds a NaN dequantizes to
NaN throughout, others to finite values."""

import itertools

import numpy as np
import pytest

import rmsnorm

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch._decomp import decompositions as decomp  # noqa: E402

import rmsnorm.torch as rt  # noqa: E402

INF, NAN = float("inf"), float("nan")
KINDS = ["nan", "+inf", "-inf", "+inf,-inf"]
DTYPES = [torch.float32, torch.bfloat16, torch.float64]
TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float64: 1e-10}
ROWS, SROW = 5, 1


def cases(dims=(7, 64)):
    for d in dims:
        for pos in sorted({0, d // 2, d - 1}):
            for kind in KINDS:
                yield d, pos, kind


CASES = list(cases())


def ids(c):
    return f"d{c[0]}-at{c[1]}-{c[2]}"


def poison(t, pos, kind, row=SROW):
    """t with the case's value(s) in row `row` (the last dim is the row's)."""
    t = t.clone()
    flat = t.reshape(-1, t.shape[-1])
    flat[row, pos] = NAN if kind == "nan" else -INF if kind == "-inf" else INF
    if kind == "+inf,-inf":
        flat[row, (pos + 1 + t.shape[-1] // 3) % t.shape[-1]] = -INF
    return flat.reshape(t.shape)


def same_pattern(got, want, what, dtype):
    """NaN, infinities and zeros where want has them; finite values close."""
    got, want = got.detach().double(), want.detach().double()
    assert got.shape == want.shape, what
    assert torch.equal(got.isnan(), want.isnan()), f"{what}: NaN at {got.isnan().nonzero()[:4]}, want {want.isnan().nonzero()[:4]}"
    inf = want.isinf()
    assert torch.equal(got.isinf(), inf) and torch.equal(got[inf], want[inf]), f"{what}: infinities"
    fin = want.isfinite()
    assert got[fin].isfinite().all(), f"{what}: non-finite where torch is finite"
    zero = want == 0
    assert torch.equal(got == 0, zero), f"{what}: zeros at {(got == 0).nonzero()[:4]}, want {zero.nonzero()[:4]}"
    if fin.any():
        scale = float(want[fin].abs().max().clamp(min=1e-30))
        err = float((got[fin] - want[fin]).abs().max())
        assert err <= TOL[dtype] * scale * 10, f"{what}: max error {err} (scale {scale})"


def grads(fn, inputs, dy):
    """Outputs of fn and the gradients of its inputs (leaves cloned)."""
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(*leaves)
    out.backward(dy)
    return out, [t.grad for t in leaves]


def check_op(ours, ref, inputs, dy, dtype, names, what):
    y, g = grads(ours, inputs, dy)
    y0, g0 = grads(ref, inputs, dy)
    same_pattern(y, y0, f"{what} y", dtype)
    for a, b, n in zip(g, g0, names):
        same_pattern(a, b, f"{what} d{n}", dtype)


def randn(*shape, dtype):
    return torch.randn(*shape, dtype=torch.float64).to(dtype)


def torch_rms(x, w, eps):
    """torch's rms_norm computed in float32 (float64 for float64), as its CPU path does
    for float16/bfloat16 input."""
    ct = torch.float64 if x.dtype == torch.float64 else torch.float32
    return F.rms_norm(x.to(ct), (x.shape[-1],), None if w is None else w.to(ct), eps)


# ---- RMSNorm and LayerNorm ----------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=ids)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("side", ["x", "dy"])
def test_rms_norm(case, dtype, side):
    d, pos, kind = case
    x, w, dy = randn(ROWS, d, dtype=dtype), randn(d, dtype=dtype), randn(ROWS, d, dtype=dtype)
    if side == "x":
        x = poison(x, pos, kind)
    else:
        dy = poison(dy, pos, kind)
    check_op(lambda x, w: rt.rms_norm(x, d, w, 1e-6), lambda x, w: torch_rms(x, w, 1e-6),
             [x, w], dy, dtype, "xw", f"rms_norm {side}")


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_rms_norm_options(case):
    """bias and eps outside the root, against the formula written with torch ops."""
    d, pos, kind = case
    x, w, b = poison(torch.randn(ROWS, d), pos, kind), torch.randn(d), torch.randn(d)
    dy = torch.randn(ROWS, d)

    def ref(x, w, b):
        r = 1 / (x.pow(2).mean(-1, keepdim=True).sqrt() + 1e-5)
        return x * r * w + b

    check_op(lambda x, w, b: rt.rms_norm(x, d, w, 1e-5, bias=b, eps_outside=True), ref,
             [x, w, b], dy, torch.float32, "xwb", "rms_norm eps_outside")


@pytest.mark.parametrize("case", CASES, ids=ids)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("side", ["x", "dy"])
def test_layer_norm(case, dtype, side):
    d, pos, kind = case
    x, w, b = randn(ROWS, d, dtype=dtype), randn(d, dtype=dtype), randn(d, dtype=dtype)
    dy = randn(ROWS, d, dtype=dtype)
    if side == "x":
        x = poison(x, pos, kind)
    else:
        dy = poison(dy, pos, kind)
    ours = lambda x, w, b: rt.layer_norm(x, d, w, b, 1e-5)  # noqa: E731
    if side == "x" or kind == "nan":  # every implementation of torch agrees here
        ct = torch.float64 if dtype == torch.float64 else torch.float32
        check_op(ours, lambda x, w, b: F.layer_norm(x.to(ct), (d,), w.to(ct), b.to(ct), 1e-5),
                 [x, w, b], dy, dtype, "xwb", f"layer_norm {side}")
        return
    # an infinite gradient: torch's decomposition of the backward
    y, (gx, gw, gb) = grads(ours, [x, w, b], dy)
    xd, wd, bd, dyd = (t.double() for t in (x, w, b, dy))
    mean = xd.mean(-1, keepdim=True)
    rstd = torch.rsqrt(((xd - mean) ** 2).mean(-1, keepdim=True) + 1e-5)
    want = decomp.native_layer_norm_backward(dyd, xd, [d], mean, rstd, wd, bd, [True] * 3)
    for got, w0, n in zip((gx, gw, gb), want, "xwb"):
        same_pattern(got, w0, f"layer_norm dy d{n}", dtype)


# ---- the fused ops ------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=ids)
@pytest.mark.parametrize("side", ["input", "residual", "dy"])
def test_fused_add_rms_norm(case, side):
    d, pos, kind = case
    u, h, w = torch.randn(ROWS, d), torch.randn(ROWS, d), torch.randn(d)
    dy = torch.randn(ROWS, d)
    if side == "input":
        u = poison(u, pos, kind)
    elif side == "residual":
        h = poison(h, pos, kind)
    else:
        dy = poison(dy, pos, kind)

    def ours(u, h, w):
        out, new_res = rt.fused_add_rms_norm(u, h, d, w, 1e-6)
        return torch.cat([out, new_res])

    def ref(u, h, w):
        new_res = h + u
        return torch.cat([F.rms_norm(new_res, (d,), w, 1e-6), new_res])

    dcat = torch.cat([dy, torch.randn(ROWS, d)])
    check_op(ours, ref, [u, h, w], dcat, torch.float32, "uhw", f"fused_add {side}")


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_qk_norm(case):
    d, pos, kind = case
    x, w = poison(torch.randn(2, 3, d), pos, kind, row=4), torch.randn(d)
    dy = torch.randn(2, 3, d)
    check_op(lambda x, w: rt.qk_norm(x, w, 1e-6), lambda x, w: F.rms_norm(x, (d,), w, 1e-6),
             [x, w], dy, torch.float32, "xw", "qk_norm")


def rotate_half(t):
    h = t.shape[-1] // 2
    return torch.cat((-t[..., h:], t[..., :h]), dim=-1)


@pytest.mark.parametrize("case", list(cases((8, 64))), ids=ids)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_qk_norm_rope(case, dtype):
    """transformers' apply_rotary_pos_emb on the RMSNorm of each head (Qwen3)."""
    d, pos, kind = case
    tokens, heads = 3, 2
    x = poison(randn(tokens, heads, d, dtype=dtype), pos, kind, row=2)
    w, dy = randn(d, dtype=dtype), randn(tokens, heads, d, dtype=dtype)
    table = torch.from_numpy(rmsnorm.rope_table(tokens, d, dtype="float64")).to(dtype)
    cos = torch.cat([table[:, : d // 2]] * 2, -1)[:, None, :]
    sin = torch.cat([table[:, d // 2:]] * 2, -1)[:, None, :]

    def ref(x, w):
        n = F.rms_norm(x, (d,), w, 1e-6)
        return n * cos + rotate_half(n) * sin

    check_op(lambda x, w: rt.qk_norm_rope(x, w, table, 1e-6), ref, [x, w], dy, dtype, "xw",
             "qk_norm_rope")


def mamba_gated(x, z, w, eps, group):
    """transformers' MambaRMSNormGated (grouped as Bamba's / NemotronH's)."""
    h = x * F.silu(z)
    hg = h.unflatten(-1, (-1, group))
    hg = hg * torch.rsqrt(hg.pow(2).mean(-1, keepdim=True) + eps)
    return w * hg.flatten(-2)


def qwen3next_gated(x, z, w, eps):
    """transformers' Qwen3NextRMSNormGated."""
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return w * h * F.silu(z)


@pytest.mark.parametrize("case", CASES, ids=ids)
@pytest.mark.parametrize("side", ["x", "gate", "dy"])
@pytest.mark.parametrize("order", ["gate_first", "gate_first_grouped", "norm_first"])
def test_gated(case, side, order):
    d, pos, kind = case
    x, z, w, dy = torch.randn(ROWS, d), torch.randn(ROWS, d), torch.randn(d), torch.randn(ROWS, d)
    if side == "x":
        x = poison(x, pos, kind)
    elif side == "gate":
        z = poison(z, pos, kind)
    else:
        dy = poison(dy, pos, kind)
    group = d // 2 if order == "gate_first_grouped" and d % 2 == 0 else d
    if order == "norm_first":
        ours = lambda x, z, w: rt.gated_rms_norm(x, z, w, 1e-6, norm_before_gate=True)  # noqa: E731
        ref = lambda x, z, w: qwen3next_gated(x, z, w, 1e-6)  # noqa: E731
    else:
        ours = lambda x, z, w: rt.gated_rms_norm(x, z, w, 1e-6, group_size=group)  # noqa: E731
        ref = lambda x, z, w: mamba_gated(x, z, w, 1e-6, group)  # noqa: E731
    check_op(ours, ref, [x, z, w], dy, torch.float32, "xzw", f"gated {order} {side}")


@pytest.mark.parametrize("case", CASES, ids=ids)
@pytest.mark.parametrize("side", ["input", "residual"])
def test_sandwich(case, side):
    """Gemma 2/3: new_residual = residual + post_norm(input), output = pre_norm(new_residual)."""
    d, pos, kind = case
    a, h, wp, wq = torch.randn(ROWS, d), torch.randn(ROWS, d), torch.randn(d), torch.randn(d)
    if side == "input":
        a = poison(a, pos, kind)
    else:
        h = poison(h, pos, kind)

    def ours(a, h, wp, wq):
        return torch.cat(rt.sandwich_rms_norm(a, h, d, wp, wq, 1e-6, offset=True))

    def ref(a, h, wp, wq):
        h2 = h + F.rms_norm(a, (d,), 1 + wp, 1e-6)
        return torch.cat([F.rms_norm(h2, (d,), 1 + wq, 1e-6), h2])

    check_op(ours, ref, [a, h, wp, wq], torch.randn(2 * ROWS, d), torch.float32, "ahpq",
             f"sandwich {side}")


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_rms_norm_linear(case):
    d, pos, kind = case
    if not rmsnorm.linear_available():
        pytest.skip("no BLAS")
    x, W, g, b = poison(torch.randn(ROWS, d), pos, kind), torch.randn(d, 6), torch.randn(d), torch.randn(6)
    check_op(lambda x, W, g, b: rt.rms_norm_linear(x, W, g, 1e-6, b),
             lambda x, W, g, b: F.rms_norm(x, (d,), g, 1e-6) @ W + b,
             [x, W, g, b], torch.randn(ROWS, 6), torch.float32, "xWgb", "rms_norm_linear")


# ---- quantized outputs ----------------------------------------------------------------------

QFORMATS = [("int8", 0), ("fp8_e4m3", 0), ("int8", 32), ("fp8_e4m3", 64), ("q8_0", 0),
            ("q8_1", 0), ("q8_k", 0), ("mxfp4", 0), ("mxfp8", 0)]


QCASES = list(cases((256,))) + [(256, p, "nan weight") for p in (0, 128, 255)]


@pytest.mark.parametrize("case", QCASES, ids=ids)
@pytest.mark.parametrize("fmt,group", QFORMATS)
def test_quant(case, fmt, group):
    """The value in the input, or a NaN weight (every row's column pos)."""
    d, pos, kind = case
    x, w = torch.randn(ROWS, d), torch.randn(d)
    if kind == "nan weight":
        w[pos] = NAN
    else:
        x = poison(x, pos, kind)
    codes, scales = rt.rms_norm_quant(x, d, w, 1e-6, format=fmt, group=group)
    deq = rt.dequantize(codes, scales, fmt, group).reshape(ROWS, d)
    y = F.rms_norm(x, (d,), w, 1e-6)
    block = {"q8_k": 256, "q8_0": 32, "q8_1": 32, "mxfp4": 32, "mxfp8": 32}.get(fmt, group or d)
    nan_blocks = y.unflatten(-1, (-1, block)).isnan().any(-1, keepdim=True)
    blocks = deq.unflatten(-1, (-1, block))
    assert torch.equal(blocks.isnan(), nan_blocks.expand_as(blocks)), f"{fmt}: NaN blocks"
    assert not blocks.isinf().any()
