"""dist_worker.py - one rank of the rmsnorm.torch.distributed tests (test_distributed.py
starts `world` of them on localhost with gloo): every rank builds the same full rows from
one seed, takes its columns, runs each named check, and writes {check: "ok" or the
traceback} to OUTDIR/rank<R>.json. The checks compare with the unsharded rmsnorm.torch
(bit for bit where README.md promises it, else its measured bounds) and with a float64
oracle written here from the formula, never with the library's own code path.

    python dist_worker.py RANK WORLD INIT_METHOD OUTDIR
"""

import json
import math
import os
import sys
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

import rmsnorm.torch as rt
from rmsnorm.torch import distributed as rd

RANK, WORLD = int(sys.argv[1]), int(sys.argv[2])
BITS = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16,
        torch.float64: torch.int64}
# float64 oracle bounds of y relative to each row's largest |y64|, and of the gradients
# relative to the largest magnitude (the library's README bounds, plus the half dtypes'
# own rounding)
Y_TOL = {torch.float32: 2e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float64: 1e-13}
G_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float64: 1e-12}


def ulps(a, b):
    """Largest distance in units in the last place between same-dtype tensors."""
    if a.numel() == 0:
        return 0
    ia, ib = a.view(BITS[a.dtype]).long(), b.view(BITS[b.dtype]).long()
    sign = 1 << (8 * a.element_size() - 1)
    oa = torch.where(ia < 0, -(ia + sign), ia)
    ob = torch.where(ib < 0, -(ib + sign), ib)
    return int((oa - ob).abs().max())


def data(rows, d, dtype, seed=7, outlier=True):
    """x, dy, weight, bias of the whole rows: the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, d, generator=g, dtype=torch.float64)
    if outlier and d > 5:
        x[:, 5] *= 50.0  # an outlier channel
    dy = torch.randn(rows, d, generator=g, dtype=torch.float64)
    w = 1.0 + 0.5 * torch.randn(d, generator=g, dtype=torch.float64)
    b = 0.1 * torch.randn(d, generator=g, dtype=torch.float64)
    return x.to(dtype), dy.to(dtype), w.to(dtype), b.to(dtype)


def oracle(x, dy, w, b, eps, offset=False, eps_outside=False, partial=1.0):
    """y and the gradients in float64 from the formula (torch autograd of it)."""
    x, dy = x.double().requires_grad_(), dy.double()
    w = None if w is None else w.double().requires_grad_()
    b = None if b is None else b.double().requires_grad_()
    d = x.shape[-1]
    k = min(d, max(1, math.ceil(partial * d - 1e-12)))
    ms = (x[..., :k] ** 2).mean(-1, keepdim=True)
    r = 1 / (ms.sqrt() + eps) if eps_outside else 1 / (ms + eps).sqrt()
    y = x * r
    if w is not None:
        y = y * ((1 + w) if offset else w)
    if b is not None:
        y = y + b
    y.backward(dy)
    return y.detach(), x.grad, None if w is None else w.grad, None if b is None else b.grad


def cuts_of(widths):
    offs = [0]
    for w in widths:
        offs.append(offs[-1] + w)
    return offs


def sharded(x, dy, w, b, widths, explicit=False, **kw):
    """This rank's y, dx, dw, db from rd.rms_norm."""
    offs = cuts_of(widths)
    lo, hi = offs[RANK], offs[RANK + 1]
    xs = x[:, lo:hi].clone().requires_grad_()
    ws = None if w is None else w[lo:hi].clone().requires_grad_()
    bs = None if b is None else b[lo:hi].clone().requires_grad_()
    extra = dict(column_offset=lo, d_global=offs[-1]) if explicit else {}
    y = rd.rms_norm(xs, ws, bias=bs, **kw, **extra)
    y.backward(dy[:, lo:hi])
    return (y.detach(), xs.grad, None if ws is None else ws.grad,
            None if bs is None else bs.grad), (lo, hi)


def unsharded(x, dy, w, b, **kw):
    xs = x.clone().requires_grad_()
    ws = None if w is None else w.clone().requires_grad_()
    bs = None if b is None else b.clone().requires_grad_()
    y = rt.rms_norm(xs, x.shape[-1], ws, bias=bs, **kw)
    y.backward(dy)
    return y.detach(), xs.grad, None if ws is None else ws.grad, None if bs is None else bs.grad


def compare(dtype, widths, rows=37, bias=True, weight=True, y_ulps=0, bitwise_grads=None,
            explicit=False, **kw):
    """The sharded result against the unsharded one (y within y_ulps ulps, 0: bit for bit;
    gradients bit for bit when bitwise_grads, else the backward bound) and the oracle."""
    d = sum(widths)
    x, dy, w, b = data(rows, d, dtype)
    w = w if weight else None
    b = b if bias else None
    kw.setdefault("eps", 1e-6)
    got, (lo, hi) = sharded(x, dy, w, b, widths, explicit=explicit, **kw)
    ref = unsharded(x, dy, w, b, **kw)
    ora = oracle(x, dy, w, b, kw["eps"], kw.get("offset", False), kw.get("eps_outside", False),
                 kw.get("partial", 1.0))
    names = ("y", "dx", "dweight", "dbias")
    if bitwise_grads is None:
        bitwise_grads = y_ulps == 0
    for i, (name, g, r, o) in enumerate(zip(names, got, ref, ora)):
        if o is None:
            assert g is None, name
            continue
        r, o = (r[:, lo:hi], o[:, lo:hi]) if i < 2 else (r[lo:hi], o[lo:hi])
        assert g.dtype == dtype and g.shape == r.shape, (name, g.dtype, g.shape, r.shape)
        if i == 0:
            n = ulps(g, r)
            assert n <= y_ulps, f"{name}: {n} ulps from the unsharded result (allowed {y_ulps})"
            e = 0.0
            if g.numel():
                row_max = o.abs().amax(-1, keepdim=True).clamp_min(1e-300)
                e = float(((g.double() - o).abs() / row_max).max())
            assert e <= Y_TOL[dtype], f"y: {e} of the row's largest from the oracle"
        else:
            if bitwise_grads:
                assert torch.equal(g, r), f"{name}: not the unsharded bits ({ulps(g, r)} ulps)"
            scale = max(float(o.abs().max()) if o.numel() else 0.0, 1e-300)
            e = float((g.double() - o).abs().max()) / scale if g.numel() else 0.0
            assert e <= G_TOL[dtype], f"{name}: {e} of the largest from the oracle"
            e = float((g.double() - r.double()).abs().max()) / scale if g.numel() else 0.0
            assert e <= G_TOL[dtype], f"{name}: {e} of the largest from the unsharded result"


# ---- the checks ------------------------------------------------------------------------------


def check_aligned_bitwise():
    # every cut on a multiple of 1024 columns: the unsharded bits, for every half/float dtype
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        compare(dtype, [1024, 2048], rows=19)
        compare(dtype, [2048, 1024], rows=19, bias=False, offset=True)
    compare(torch.float32, [1024, 1024], rows=9, weight=False, bias=False, eps_outside=True)


def check_off_block():
    # cuts inside a block: README's measured bounds (rows without bias)
    for dtype, n in ((torch.float32, 4), (torch.float16, 1), (torch.bfloat16, 1),
                     (torch.float64, 4)):
        compare(dtype, [300, 701], bias=False, y_ulps=n)
        compare(dtype, [1000, 25], bias=False, y_ulps=n, offset=True, eps_outside=True)
    compare(torch.float16, [77, 300], bias=False, y_ulps=2, round_before_weight=True)
    # with a bias the sum can cancel: the oracle bounds only
    compare(torch.float32, [300, 701], y_ulps=1 << 30)


def check_float64():
    # fp64's block sums are doubles: within 4 ulps at any cut, even 512-aligned ones
    compare(torch.float64, [512, 1024], bias=False, y_ulps=4)


def check_uneven_cuts():
    # widths that differ per rank (and 0 in the middle with 3 or more ranks), on and off the
    # blocks; the sums of 3 or more partials are added in the backend's order
    compare(torch.float32, [1024 * (i + 1) for i in range(WORLD)], rows=7,
            y_ulps=0 if WORLD == 2 else 1)
    widths = [0 if i == 1 and WORLD > 2 else 100 + 37 * i for i in range(WORLD)]
    for dtype, n in ((torch.float32, 4), (torch.bfloat16, 1), (torch.float64, 4)):
        compare(dtype, widths, bias=False, y_ulps=n, partial=0.9)


def check_param_dtype():
    # float32 weight and bias on bfloat16 data (the library's float32 parameters)
    x, dy, w, b = data(11, 2048, torch.bfloat16)
    w32, b32 = w.float() * 1.001, b.float()
    got, (lo, hi) = sharded(x, dy, w32, b32, [1024, 1024], eps=1e-6)
    ref = unsharded(x, dy, w32, b32, eps=1e-6)
    assert torch.equal(got[0], ref[0][:, lo:hi])
    assert torch.equal(got[1], ref[1][:, lo:hi])
    assert got[2].dtype == torch.float32 and torch.equal(got[2], ref[2][lo:hi])
    assert torch.equal(got[3], ref[3][lo:hi])


def check_width_zero():
    # rank 0 holds no columns: the other's result is the unsharded one, bit for bit
    # (with more ranks the others cut the row off the blocks: ulps without a bias)
    widths = [0, 96] if WORLD == 2 else [0] + [96 // (WORLD - 1)] * (WORLD - 1)
    for explicit in (False, True):
        compare(torch.float32, widths, y_ulps=0 if WORLD == 2 else 4, explicit=explicit,
                bias=WORLD == 2)
    compare(torch.float32, widths, rows=0, explicit=True)  # no rows either


def check_partial():
    # pRMSNorm: k = ceil(p * d_global) inside the first shard, on the cut, and across it
    for p in (0.25, 0.5, 0.8):
        compare(torch.float32, [500, 500], partial=p, bias=False, y_ulps=4)
    compare(torch.float32, [1024, 1024], partial=0.75, rows=5)  # k = 1536: aligned, bitwise
    compare(torch.float64, [3, 5], partial=0.6, y_ulps=4, offset=True, bias=False)
    compare(torch.float64, [3, 5], partial=0.6, y_ulps=1 << 62, offset=True)  # oracle only


def check_leading_dims_and_strides():
    # (batch, seq, width) and a non-contiguous shard (a column slice of a wider tensor)
    x, dy, w, _ = data(12, 1024 * WORLD, torch.float32)
    x3 = x.view(3, 4, -1)
    lo, hi = 1024 * RANK, 1024 * (RANK + 1)
    xs = x3[..., lo:hi].requires_grad_()  # a view: rows 1024 * WORLD apart
    assert not xs.is_contiguous()
    y = rd.rms_norm(xs, w[lo:hi], 1e-6)
    y.backward(dy.view(3, 4, -1)[..., lo:hi])
    xr = x3.clone().requires_grad_()
    yr = rt.rms_norm(xr, x3.shape[-1], w, 1e-6)
    yr.backward(dy.view(3, 4, -1))
    assert torch.equal(y, yr[..., lo:hi].detach()) and torch.equal(xs.grad, xr.grad[..., lo:hi])


class _Scatter(torch.autograd.Function):
    """Full tensor -> this rank's columns; backward: the full gradient from every rank's
    columns (a sum of zero-padded pieces, exact)."""

    @staticmethod
    def forward(ctx, t, lo, hi):
        ctx.cut = (lo, hi, t.shape)
        return t[..., lo:hi].clone()

    @staticmethod
    def backward(ctx, g):
        lo, hi, shape = ctx.cut
        full = g.new_zeros(shape)
        full[..., lo:hi] = g
        dist.all_reduce(full)
        return full, None, None


class _Gather(torch.autograd.Function):
    """This rank's columns -> the full tensor on every rank; backward: this rank's columns of
    the (identical) upstream gradient."""

    @staticmethod
    def forward(ctx, t, lo, hi, d):
        ctx.cut = (lo, hi)
        full = t.new_zeros(t.shape[:-1] + (d,))
        full[..., lo:hi] = t
        dist.all_reduce(full)
        return full

    @staticmethod
    def backward(ctx, g):
        lo, hi = ctx.cut
        return g[..., lo:hi], None, None, None


def check_gradcheck():
    # float64 gradcheck of the whole sharded function: every rank sees the same function of
    # the same full inputs (scatter -> rd.rms_norm -> gather), so every rank makes the same
    # collective calls in the same order
    widths = [3, 5] if WORLD == 2 else [2, 3, 3]
    offs = cuts_of(widths)
    lo, hi, d = offs[RANK], offs[RANK + 1], offs[-1]
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, d, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(d, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(d, generator=g, dtype=torch.float64, requires_grad=True)
    for kw in ({}, {"partial": 0.6, "offset": True}, {"eps_outside": True}):
        def fn(x, w, b, kw=kw):
            y = rd.rms_norm(_Scatter.apply(x, lo, hi), _Scatter.apply(w, lo, hi), 1e-5,
                            bias=_Scatter.apply(b, lo, hi), **kw)
            return _Gather.apply(y, lo, hi, d)
        assert torch.autograd.gradcheck(fn, (x, w, b), eps=1e-6, atol=1e-8, rtol=1e-6), kw


def expect_error(exc, text, fn):
    try:
        fn()
    except exc as err:
        assert text in str(err), f"{exc.__name__} without {text!r}: {err}"
    else:
        raise AssertionError(f"no {exc.__name__} ({text!r})")
    # the group still works afterwards
    t = torch.ones(1)
    dist.all_reduce(t)
    assert float(t) == WORLD


def check_disagreement_errors():
    # with checks asked for (RMSNORM_DISTRIBUTED_CHECK=1 here): every rank raises
    w = torch.ones(4)
    x = torch.randn(3 + RANK, 4)
    expect_error(ValueError, "disagree on the rows", lambda: rd.rms_norm(x, w))
    x = torch.randn(3, 4, dtype=torch.float32 if RANK == 0 else torch.float64)
    expect_error(TypeError, "disagree on the dtype", lambda: rd.rms_norm(x))
    x = torch.randn(3, 4)
    expect_error(ValueError, "disagree on eps", lambda: rd.rms_norm(x, None, 1e-5 * (RANK + 1)))
    expect_error(ValueError, "disagree on partial",
                 lambda: rd.rms_norm(x, partial=1.0 if RANK else 0.5))
    # d_global not the sum of the widths, overlaps, gaps
    expect_error(ValueError, "exactly once", lambda: rd.rms_norm(
        x, column_offset=4 * RANK, d_global=4 * WORLD + 1))
    expect_error(ValueError, "exactly once", lambda: rd.rms_norm(
        x, column_offset=2 * RANK, d_global=4 * WORLD))
    expect_error(ValueError, "disagree on d_global", lambda: rd.rms_norm(
        x, column_offset=4 * RANK, d_global=4 * WORLD + RANK))
    # one rank's own bad argument: an error on every rank, naming that rank
    wr = torch.ones(5 if RANK == 1 else 4)
    text = "weight has shape" if RANK == 1 else "rank 1 of the group failed"
    expect_error(ValueError, text, lambda: rd.rms_norm(x, wr))
    xi = torch.ones(3, 4, dtype=torch.int64 if RANK == 0 else torch.float32)
    text = "dtype int64" if RANK == 0 else "rank 0 of the group failed"
    expect_error(TypeError, text, lambda: rd.rms_norm(xi))
    # a good call still works, with and without checks
    for check in (True, False):
        y = rd.rms_norm(x, torch.ones(4), check=check)
        assert y.shape == x.shape


def check_always_on_agreement():
    # checks off, and on for rank 0 only: the same errors on every rank, nobody waiting
    w = torch.ones(4)
    x = torch.randn(3, 4)
    for check in (False, RANK == 0):
        xr = torch.randn(3 + RANK, 4)
        expect_error(ValueError, "disagree on the rows", lambda: rd.rms_norm(xr, w, check=check))
        xd = torch.randn(3, 4, dtype=torch.float32 if RANK == 0 else torch.float64)
        expect_error(TypeError, "disagree on the dtype", lambda: rd.rms_norm(xd, check=check))
        expect_error(ValueError, "disagree on eps",
                     lambda: rd.rms_norm(x, None, 1e-5 * (RANK + 1), check=check))
        expect_error(ValueError, "disagree on d_global", lambda: rd.rms_norm(
            x, column_offset=4 * RANK, d_global=4 * WORLD + RANK, check=check))
        expect_error(ValueError, "exactly once", lambda: rd.rms_norm(
            x, column_offset=2 * RANK, d_global=4 * WORLD, check=check))
        expect_error(ValueError, "some ranks give column_offset", lambda: rd.rms_norm(
            x, column_offset=0 if RANK == 0 else None, d_global=4 if RANK == 0 else None,
            check=check))
        wr = torch.ones(5 if RANK == 1 else 4)
        text = "weight has shape" if RANK == 1 else "rank 1 of the group failed"
        expect_error(ValueError, text, lambda: rd.rms_norm(x, wr, check=check))
        # a forward on rank 0 meets a backward on the others
        xg = torch.randn(3, 4, requires_grad=True)
        y = rd.rms_norm(xg, check=check)
        expect_error(ValueError, "different calls",
                     (lambda: rd.rms_norm(x, check=check)) if RANK == 0 else
                     (lambda: y.sum().backward()))
        # and good calls work, with the shards found or given
        y = rd.rms_norm(x, w, check=check)
        ref = rd.rms_norm(x, w, check=check, column_offset=4 * RANK, d_global=4 * WORLD)
        assert torch.equal(y, ref)


def check_equal_arguments_agree():
    # eps 0.0 against -0.0, and eps None against the dtype's default written out, are the
    # same arguments: no error, and the bits of the call where every rank writes the same
    x, dy, w, _ = data(6, 128 * WORLD, torch.float32)
    for check in (True, False):
        for same, mixed in ((0.0, 0.0 if RANK else -0.0),
                            (None, None if RANK else torch.finfo(torch.float32).eps)):
            got = sharded(x, dy, w, None, [128] * WORLD, eps=mixed, check=check)[0]
            ref = sharded(x, dy, w, None, [128] * WORLD, eps=same, check=check)[0]
            for g, r in zip(got, ref):
                assert (g is None and r is None) or torch.equal(g, r)


def check_row_counts():
    # row counts around the 4096 the first all_reduce carries, shards given and found
    for rows in (1, 4095, 4096, 4097):
        compare(torch.float32, [96] * WORLD, rows=rows, bias=False, y_ulps=4)
        compare(torch.bfloat16, [96] * WORLD, rows=rows, bias=False, y_ulps=1, explicit=True)


def check_backward_check():
    # with checks, the backward checks too: forward and backward on the same step pair up
    x = torch.randn(5, 64, requires_grad=True)
    y = rd.rms_norm(x, check=True)
    y.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape


CHECKS = [check_aligned_bitwise, check_off_block, check_float64, check_uneven_cuts,
          check_param_dtype,
          check_width_zero, check_partial, check_leading_dims_and_strides, check_gradcheck,
          check_backward_check, check_disagreement_errors, check_equal_arguments_agree,
          check_row_counts, check_always_on_agreement]


def main():
    init, outdir = sys.argv[3], sys.argv[4]
    only = set(sys.argv[5].split(",")) if len(sys.argv) > 5 and sys.argv[5] else None
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=RANK, world_size=WORLD,
                            timeout=timedelta(seconds=60))
    results = {}
    path = os.path.join(outdir, f"rank{RANK}.json")
    try:
        for check in CHECKS:
            name = check.__name__[len("check_"):]
            if only and name not in only:
                continue
            try:
                check()
                results[name] = "ok"
            except Exception:  # reported by the test, per check
                results[name] = traceback.format_exc()
            with open(path, "w") as f:  # as far as it got, should a later check hang
                json.dump(results, f)
            dist.barrier()
    finally:
        with open(path, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
