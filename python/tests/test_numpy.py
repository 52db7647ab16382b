"""test_numpy.py - the numpy functions against float64 oracles written here in
numpy: every dtype, 1-D to 4-D inputs, multi-dim normalized_shape, strided and
non-contiguous inputs, weight/bias/offset/eps_outside/partial, threads."""

import math
import threading

import ml_dtypes
import numpy as np
import pytest

import rmsnorm

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.dtype(np.float32), np.dtype(np.float16), BF16, np.dtype(np.float64)]
# Per-dtype tolerance, relative to the largest magnitude of the oracle: a few
# units in the last place of the storage type.
TOL = {np.dtype(np.float32): 2e-6, np.dtype(np.float16): 2e-3, BF16: 1.6e-2,
       np.dtype(np.float64): 1e-13}


def default_eps(dtype):
    return float(np.finfo(np.float64).eps if dtype == np.float64 else np.finfo(np.float32).eps)


def close(got, want, dtype, what=""):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    err = float(np.max(np.abs(got - want))) if want.size else 0.0
    assert err <= TOL[np.dtype(dtype)] * scale, f"{what}: max error {err} (scale {scale})"


# ---- float64 oracles -----------------------------------------------------------------


def rms_oracle(x, k, w=None, b=None, eps=None, offset=False, eps_outside=False, partial=1.0,
               dy=None):
    """Forward (y, rstd) and, given dy, backward (dx, dw, db) in float64 over the
    last k dims."""
    shape = x.shape
    d = math.prod(shape[len(shape) - k:])
    x2 = x.astype(np.float64).reshape(-1, d)
    kk = d if partial == 1.0 else math.ceil(partial * d)
    ms = (x2[:, :kk] ** 2).sum(1, keepdims=True) / kk
    s = np.sqrt(ms)
    r = 1 / (s + eps) if eps_outside else 1 / np.sqrt(ms + eps)
    weff = np.ones(d) if w is None else w.astype(np.float64).reshape(d) + (1.0 if offset else 0.0)
    y = x2 * r * weff + (0 if b is None else b.astype(np.float64).reshape(d))
    if dy is None:
        return y.reshape(shape), r
    dy2 = dy.astype(np.float64).reshape(-1, d)
    g = dy2 * weff
    dr_dms = -1 / ((s + eps) ** 2 * 2 * s) if eps_outside else -0.5 * (ms + eps) ** -1.5
    dms_dx = np.zeros_like(x2)
    dms_dx[:, :kk] = 2 * x2[:, :kk] / kk
    dx = r * g + dr_dms * (g * x2).sum(1, keepdims=True) * dms_dx
    dw = (dy2 * x2 * r).sum(0).reshape(shape[len(shape) - k:])
    db = dy2.sum(0).reshape(shape[len(shape) - k:])
    return dx.reshape(shape), dw, db


def ln_oracle(x, k, w=None, b=None, eps=1e-5, offset=False, dy=None):
    shape = x.shape
    d = math.prod(shape[len(shape) - k:])
    x2 = x.astype(np.float64).reshape(-1, d)
    mean = x2.mean(1, keepdims=True)
    rstd = 1 / np.sqrt(((x2 - mean) ** 2).mean(1, keepdims=True) + eps)
    xhat = (x2 - mean) * rstd
    weff = np.ones(d) if w is None else w.astype(np.float64).reshape(d) + (1.0 if offset else 0.0)
    y = xhat * weff + (0 if b is None else b.astype(np.float64).reshape(d))
    if dy is None:
        return y.reshape(shape), mean, rstd
    dy2 = dy.astype(np.float64).reshape(-1, d)
    g = dy2 * weff
    dx = rstd * (g - g.mean(1, keepdims=True) - xhat * (g * xhat).mean(1, keepdims=True))
    nshape = shape[len(shape) - k:]
    return dx.reshape(shape), (dy2 * xhat).sum(0).reshape(nshape), dy2.sum(0).reshape(nshape)


def data(rng, shape, dtype, scale=1.0, shift=0.0):
    return (rng.standard_normal(shape) * scale + shift).astype(dtype)


# ---- forward and backward, every dtype and rank ------------------------------------

SHAPES = [((16,), 1), ((5, 16), 1), ((2, 3, 16), 1), ((2, 2, 3, 16), 1),
          ((3, 4, 8), 2), ((2, 2, 3, 8), 3), ((7, 33), 1)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,k", SHAPES, ids=str)
@pytest.mark.parametrize("affine", ["none", "weight", "weight+bias", "bias"])
def test_rms_norm(rng, dtype, shape, k, affine):
    x = data(rng, shape, dtype)
    nshape = shape[len(shape) - k:]
    w = data(rng, nshape, dtype) if "weight" in affine else None
    b = data(rng, nshape, dtype) if "bias" in affine else None
    eps = default_eps(dtype)
    y, rstd = rmsnorm.rms_norm(x, nshape, w, bias=b, return_rstd=True)
    assert y.dtype == dtype and y.shape == shape and y.flags.c_contiguous
    assert rstd.shape == shape[: len(shape) - k] + (1,) * k
    assert rstd.dtype == (np.float64 if dtype == np.float64 else np.float32)
    want_y, want_r = rms_oracle(x, k, w, b, eps)
    close(y, want_y, dtype, "y")
    close(rstd.reshape(-1), want_r.reshape(-1), np.float32 if dtype != np.float64 else dtype, "rstd")

    dy = data(rng, shape, dtype)
    want = rms_oracle(x, k, w, b, eps, dy=dy)
    for saved in (rstd, None):  # with the forward's rstd, and recomputed
        dx, dw, db = rmsnorm.rms_norm_backward(dy, x, nshape, w, bias=b, rstd=saved)
        close(dx, want[0], dtype, "dx")
        assert (dw is None) == (w is None) and (db is None) == (b is None)
        if w is not None:
            assert dw.dtype == dtype and dw.shape == nshape
            close(dw, want[1], dtype, "dweight")
        if b is not None:
            close(db, want[2], dtype, "dbias")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,k", SHAPES, ids=str)
@pytest.mark.parametrize("affine", ["none", "weight+bias"])
def test_layer_norm(rng, dtype, shape, k, affine):
    x = data(rng, shape, dtype, 2.0, 0.5)
    nshape = shape[len(shape) - k:]
    w = data(rng, nshape, dtype) if affine != "none" else None
    b = data(rng, nshape, dtype) if affine != "none" else None
    y, mean, rstd = rmsnorm.layer_norm(x, nshape, w, b, return_mean_rstd=True)
    want_y, want_m, want_r = ln_oracle(x, k, w, b)
    close(y, want_y, dtype, "y")
    sdt = np.float64 if dtype == np.float64 else np.float32
    close(mean.reshape(-1), want_m.reshape(-1), sdt, "mean")
    close(rstd.reshape(-1), want_r.reshape(-1), sdt, "rstd")
    close(rmsnorm.layer_norm(x, nshape, w, b), want_y, dtype, "y without stats")

    dy = data(rng, shape, dtype)
    want = ln_oracle(x, k, w, b, dy=dy)
    for m, r in ((mean, rstd), (None, None)):
        dx, dw, db = rmsnorm.layer_norm_backward(dy, x, nshape, w, b, mean=m, rstd=r)
        close(dx, want[0], dtype, "dx")
        if w is not None:
            close(dw, want[1], dtype, "dweight")
            close(db, want[2], dtype, "dbias")


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=str)
@pytest.mark.parametrize("offset,eps_outside,partial",
                         [(True, False, 1.0), (False, True, 1.0), (False, False, 0.25),
                          (True, True, 0.5)])
def test_rms_norm_options(rng, dtype, offset, eps_outside, partial):
    x = data(rng, (6, 40), dtype)
    w = data(rng, (40,), dtype)
    eps = 1e-3
    kw = dict(offset=offset, eps_outside=eps_outside, partial=partial)
    y, rstd = rmsnorm.rms_norm(x, 40, w, eps, return_rstd=True, **kw)
    close(y, rms_oracle(x, 1, w, None, eps, **kw)[0], dtype, "y")
    dy = data(rng, (6, 40), dtype)
    dx, dw, _ = rmsnorm.rms_norm_backward(dy, x, 40, w, eps, rstd=rstd, **kw)
    want = rms_oracle(x, 1, w, None, eps, dy=dy, **kw)
    close(dx, want[0], dtype, "dx")
    close(dw, want[1], dtype, "dweight")


@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=str)
def test_round_before_weight(rng, dtype):
    # HF Llama: normalize in float32, round to the data dtype, multiply by the
    # weight and round again.
    x, w = data(rng, (8, 64), dtype), data(rng, (64,), dtype)
    n = rms_oracle(x, 1, eps=1e-6)[0].astype(np.float32).astype(dtype)
    want = (n.astype(np.float32) * w.astype(np.float32)).astype(dtype)
    got = rmsnorm.rms_norm(x, 64, w, 1e-6, round_before_weight=True)
    assert np.mean(got == want) > 0.99  # equal but for a rare ulp from the float32 math
    close(got, want, dtype)


def test_layer_norm_offset(rng):
    x, w = data(rng, (4, 24), np.float32), data(rng, (24,), np.float32)
    close(rmsnorm.layer_norm(x, 24, w, None, offset=True), ln_oracle(x, 1, w, None, offset=True)[0],
          np.float32)


@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=str)
def test_float32_parameters_with_half_data(rng, dtype):
    x = data(rng, (4, 32), dtype)
    w, b = data(rng, (32,), np.float32), data(rng, (32,), np.float32)
    close(rmsnorm.rms_norm(x, 32, w, bias=b), rms_oracle(x, 1, w, b, default_eps(dtype))[0], dtype)
    dy = data(rng, (4, 32), dtype)
    _, dw, db = rmsnorm.rms_norm_backward(dy, x, 32, w, bias=b)
    assert dw.dtype == np.float32 and db.dtype == np.float32
    want = rms_oracle(x, 1, w, b, default_eps(dtype), dy=dy)
    close(dw, want[1], dtype, "dweight")


def test_other_parameter_dtypes_are_converted(rng):
    # A float16 weight with float32 data: computed with the weight in float32,
    # and its gradient given back as float16.
    x = data(rng, (4, 32), np.float32)
    w = data(rng, (32,), np.float16)
    close(rmsnorm.rms_norm(x, 32, w), rms_oracle(x, 1, w, None, default_eps(np.float32))[0],
          np.float32)
    _, dw, _ = rmsnorm.rms_norm_backward(np.ones_like(x), x, 32, w)
    assert dw.dtype == np.float16


def test_eps_none_is_torchs_default(rng):
    x = np.full((2, 4), 1e-4, np.float32)  # mean square 1e-8: eps matters
    for dtype, eps in ((np.float32, 2.0 ** -23), (np.float16, 2.0 ** -23), (BF16, 2.0 ** -23),
                       (np.float64, 2.0 ** -52)):
        xt = x.astype(dtype)
        close(rmsnorm.rms_norm(xt, 4), rmsnorm.rms_norm(xt, 4, eps=eps), dtype)
        close(rmsnorm.rms_norm(xt, 4), rms_oracle(xt, 1, eps=eps)[0], dtype)


# ---- layouts ---------------------------------------------------------------------------


def strided_cases(rng, dtype):
    base = data(rng, (6, 5, 48), dtype)
    yield "row-strided slice", base[:, :, :32], 1          # ld > d, passed through
    yield "every other row", base[::2, :, :32], 1           # still one row stride
    yield "leading dims transposed", base.transpose(1, 0, 2), 1  # copy
    yield "inner stride 2", base[:, :, ::2], 1              # copy
    yield "reversed rows", base[::-1], 1                    # negative stride: copy
    yield "reversed inside", base[:, :, ::-1], 1            # copy
    yield "broadcast rows", np.broadcast_to(base[0, 0], (4, 48)), 1  # stride 0: copy
    yield "two normalized dims", base[1:5, :, :32], 2       # (5, 32) normalized, ld = 5*48
    yield "fortran order", np.asfortranarray(base[:, 0, :]), 1
    yield "misaligned bytes", np.frombuffer(
        np.zeros(2 * 48 * base.itemsize + 1, np.uint8), dtype, 2 * 48, 1).reshape(2, 48), 1


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_non_contiguous_inputs(rng, dtype):
    for name, x, k in strided_cases(rng, dtype):
        nshape = x.shape[x.ndim - k:]
        w = data(rng, nshape, dtype)
        y, rstd = rmsnorm.rms_norm(x, nshape, w, return_rstd=True)
        close(y, rms_oracle(np.ascontiguousarray(x), k, w, None, default_eps(dtype))[0], dtype, name)
        close(rmsnorm.layer_norm(x, nshape, w), ln_oracle(np.ascontiguousarray(x), k, w)[0], dtype,
              name)
        # A strided grad_output too: a transposed copy viewed back.
        dy = np.ascontiguousarray(np.swapaxes(data(rng, x.shape, dtype), 0, -1))
        dy = np.swapaxes(dy, 0, -1)
        dx, dw, _ = rmsnorm.rms_norm_backward(dy, x, nshape, w, rstd=rstd)
        want = rms_oracle(np.ascontiguousarray(x), k, w, None, default_eps(dtype), dy=dy)
        close(dx, want[0], dtype, name + " dx")
        close(dw, want[1], dtype, name + " dweight")


def test_non_contiguous_weight(rng):
    x = data(rng, (3, 16), np.float32)
    w2 = data(rng, (16, 2), np.float32)
    close(rmsnorm.rms_norm(x, 16, w2[:, 0]), rms_oracle(x, 1, w2[:, 0], None, 2.0 ** -23)[0],
          np.float32)


def test_inputs_are_not_modified(rng):
    x = data(rng, (4, 16), np.float32)
    dy = data(rng, (4, 16), np.float32)
    x0, dy0 = x.copy(), dy.copy()
    rmsnorm.rms_norm(x, 16)
    rmsnorm.rms_norm_backward(dy, x, 16)
    assert np.array_equal(x, x0) and np.array_equal(dy, dy0)


def test_byte_swapped_and_list_inputs():
    x = np.arange(8, dtype=">f4").reshape(2, 4)
    want = rmsnorm.rms_norm(x.astype("<f4"), 4)
    assert np.array_equal(rmsnorm.rms_norm(x, 4), want)
    assert rmsnorm.rms_norm([[0.0, 1.0, 2.0, 3.0]], [4]).dtype == np.float64


def test_empty_inputs():
    y, rstd = rmsnorm.rms_norm(np.zeros((0, 8), np.float32), 8, return_rstd=True)
    assert y.shape == (0, 8) and rstd.shape == (0, 1)
    dx, dw, db = rmsnorm.rms_norm_backward(np.zeros((0, 8), np.float32), np.zeros((0, 8), np.float32),
                                           8, np.ones(8, np.float32), bias=np.ones(8, np.float32))
    assert dx.shape == (0, 8) and np.all(dw == 0) and np.all(db == 0)
    # d == 0: an empty output, mean 0 and rstd NaN (as torch.native_layer_norm)
    y, mean, rstd = rmsnorm.layer_norm(np.zeros((3, 0), np.float32), 0, return_mean_rstd=True)
    assert y.shape == (3, 0) and np.all(mean == 0) and np.all(np.isnan(rstd))


def test_zero_rows_give_bias_not_nan():
    x = np.zeros((2, 8), np.float32)
    b = np.arange(8, dtype=np.float32)
    assert np.array_equal(rmsnorm.rms_norm(x, 8, np.ones(8, np.float32), 0.0, bias=b)[0], b)


# ---- threads -----------------------------------------------------------------------------


def test_thread_setting_roundtrip():
    before = rmsnorm.get_num_threads()
    try:
        rmsnorm.set_num_threads(1)
        assert rmsnorm.get_num_threads() == 1
        rmsnorm.set_num_threads(0)
        assert rmsnorm.get_num_threads() >= 1
        for bad in (-1, 100000):
            with pytest.raises(ValueError, match="invalid argument"):
                rmsnorm.set_num_threads(bad)
    finally:
        rmsnorm.set_num_threads(0)
    assert rmsnorm.get_num_threads() == before


def test_results_do_not_depend_on_threads(rng):
    x = data(rng, (512, 1024), np.float32)  # 2 MiB: large enough to split
    w = data(rng, (1024,), np.float32)
    dy = data(rng, (512, 1024), np.float32)
    outs = []
    try:
        for n in (1, 2, 3):
            rmsnorm.set_num_threads(n)
            y = rmsnorm.rms_norm(x, 1024, w)
            outs.append((y,) + rmsnorm.rms_norm_backward(dy, x, 1024, w)[:2])
    finally:
        rmsnorm.set_num_threads(0)
    for other in outs[1:]:
        for a, b in zip(outs[0], other):
            assert np.array_equal(a, b)


def test_concurrent_python_threads(rng):
    # Each Python thread gets its own context; the GIL is released in the C call.
    xs = [data(rng, (256, 512), np.float32) for _ in range(4)]
    want = [rmsnorm.rms_norm(x, 512) for x in xs]
    got = [None] * len(xs)
    errors = []

    def work(i):
        try:
            for _ in range(5):
                got[i] = rmsnorm.rms_norm(xs[i], 512)
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for g, w in zip(got, want):
        assert np.array_equal(g, w)


def _child_after_fork(queue):
    x = np.ones((1024, 1024), np.float32)
    queue.put(float(rmsnorm.rms_norm(x, 1024).sum()))


def test_fork_after_threaded_call():
    # The parent's context may hold a thread pool; a forked child must not use it.
    import multiprocessing as mp

    rmsnorm.rms_norm(np.ones((1024, 1024), np.float32), 1024)
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_after_fork, args=(queue,))
    child.start()
    child.join(120)
    if child.is_alive():
        child.kill()
        pytest.fail("the forked child hung in rms_norm")
    assert child.exitcode == 0
    assert queue.get(timeout=10) == pytest.approx(1024 * 1024, rel=1e-5)


_FORK_SCRIPT = """
import os, sys
import numpy as np, rmsnorm
x = np.ones((1024, 1024), np.float32)
rmsnorm.rms_norm(x, 1024)
pid = os.fork()
if pid == 0:
    ok = abs(float(rmsnorm.rms_norm(x, 1024).sum()) - 1024 * 1024) < 1
    sys.exit(0 if ok else 3)  # a full exit: the child frees the context it inherited
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_forked_child_uses_and_frees_the_inherited_context():
    # The library's atfork handlers leave the parent's contexts usable (and freeable) in
    # the child; the child's interpreter exit frees the context without hanging.
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _FORK_SCRIPT], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr


def test_info():
    assert rmsnorm.isa() in ("scalar", "avx2", "avx512", "neon")
    assert isinstance(rmsnorm.cpu_features(), list)
    assert rmsnorm.__version__ == rmsnorm.library_version()


# ---- out= ------------------------------------------------------------------------------


def test_out_and_in_place(rng):
    x = data(rng, (6, 32), np.float32)
    w = data(rng, (32,), np.float32)
    want = rms_oracle(x, 1, w, None, 1e-5)[0]
    out = np.empty_like(x)
    assert rmsnorm.rms_norm(x, 32, w, 1e-5, out=out) is out
    close(out, want, np.float32)
    big = np.zeros((6, 40), np.float32)  # a row slice of a larger array
    rmsnorm.rms_norm(x, 32, w, 1e-5, out=big[:, 4:36])
    close(big[:, 4:36], want, np.float32)
    assert not big[:, :4].any() and not big[:, 36:].any()
    y = x.copy()
    rmsnorm.rms_norm(y, 32, w, 1e-5, out=y)  # in place
    close(y, want, np.float32)
    y = x.copy()
    rmsnorm.layer_norm(y, 32, w, None, out=y)
    close(y, ln_oracle(x, 1, w)[0], np.float32)


def test_bad_out(rng):
    x = data(rng, (6, 32), np.float32)
    with pytest.raises(ValueError, match="out has shape"):
        rmsnorm.rms_norm(x, 32, out=np.empty((6, 31), np.float32))
    with pytest.raises(TypeError, match="out has dtype float64"):
        rmsnorm.rms_norm(x, 32, out=np.empty((6, 32)))
    with pytest.raises(ValueError, match="out must hold the normalized dims contiguously"):
        rmsnorm.rms_norm(x, 32, out=np.empty((32, 6), np.float32).T)
    ro = np.empty_like(x)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="out is read-only"):
        rmsnorm.rms_norm(x, 32, out=ro)
    buf = np.zeros((7, 32), np.float32)
    buf[:6] = x
    with pytest.raises(ValueError, match="overlaps"):  # the library's overlap check
        rmsnorm.rms_norm(buf[:6], 32, out=buf[1:])


# ---- out= and inplace=True write where the caller's array is, or refuse -------------------


def test_out_and_inplace_refuse_what_they_cannot_write_in_place(rng):
    x = data(rng, (4, 8), np.float32)
    swapped = np.zeros((4, 8), ">f4")  # non-native byte order
    with pytest.raises(ValueError, match=r"out has a non-native byte order \(>f4\)"):
        rmsnorm.rms_norm(x, 8, out=swapped)
    assert not swapped.any()
    with pytest.raises(TypeError, match="out must be a numpy.ndarray to be written in place"):
        rmsnorm.rms_norm(x, 8, out=[[0.0] * 8] * 4)
    strided = np.zeros((8, 4), np.float32).T  # columns: no row stride
    with pytest.raises(ValueError, match="out must hold the normalized dims contiguously"):
        rmsnorm.layer_norm(x, 8, out=strided)
    assert not strided.any()
    h, u = data(rng, (4, 8), np.float32), data(rng, (4, 8), np.float32)
    for bad_h in (h.astype(">f4"), h.tolist()):
        before = np.array(bad_h, dtype=np.float32)
        with pytest.raises((ValueError, TypeError), match="residual"):
            rmsnorm.fused_add_rms_norm(u.copy(), bad_h, 8, inplace=True)
        assert np.array_equal(np.asarray(bad_h, dtype=np.float32), before)
    with pytest.raises(ValueError, match="input has a non-native byte order"):
        rmsnorm.fused_add_rms_norm(u.astype(">f4"), h.copy(), 8, inplace=True)
    q = data(rng, (3, 2, 8), np.float32).astype(">f4")
    with pytest.raises(ValueError, match="input has a non-native byte order"):
        rmsnorm.qk_norm(q, inplace=True)
    # inputs, by contrast, are converted: the same result as from a native copy
    assert np.array_equal(rmsnorm.rms_norm(x.astype(">f4"), 8), rmsnorm.rms_norm(x, 8))


# ---- arrays whose data start at any byte offset -------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("offset", range(1, 8))
def test_misaligned_arrays(dtype, offset):
    """Arrays whose data start at an odd byte offset (np.frombuffer), as inputs,
    parameters and outputs: the same bits as from aligned arrays."""
    rng = np.random.default_rng(offset)
    shape, d = (5, 24), 24

    def misaligned(a):
        buf = bytearray(a.nbytes + offset)
        m = np.frombuffer(buf, dtype=a.dtype, count=a.size, offset=offset).reshape(a.shape)
        m[...] = a
        return m

    x, dy = data(rng, shape, dtype), data(rng, shape, dtype)
    w, b = data(rng, (d,), dtype, 0.2, 1.0), data(rng, (d,), dtype)
    xm, dym, wm, bm = map(misaligned, (x, dy, w, b))
    y, rstd = rmsnorm.rms_norm(x, d, w, bias=b, return_rstd=True)
    ym, rstdm = rmsnorm.rms_norm(xm, d, wm, bias=bm, return_rstd=True)
    assert np.array_equal(y, ym) and np.array_equal(rstd, rstdm)
    out = misaligned(np.zeros(shape, dtype))
    rmsnorm.rms_norm(xm, d, wm, out=out)
    assert np.array_equal(out, rmsnorm.rms_norm(x, d, w))
    for a, b_ in zip(rmsnorm.rms_norm_backward(dy, x, d, w, bias=b),
                     rmsnorm.rms_norm_backward(dym, xm, d, wm, bias=bm)):
        assert np.array_equal(a, b_)
    assert np.array_equal(rmsnorm.layer_norm(x, d, w, b), rmsnorm.layer_norm(xm, d, wm, bm))
    for a, b_ in zip(rmsnorm.fused_add_rms_norm(dy, x, d, w), rmsnorm.fused_add_rms_norm(dym, xm, d, wm)):
        assert np.array_equal(a, b_)
    q = x.reshape(5, 3, 8)
    assert np.array_equal(rmsnorm.qk_norm(q, w[:8]), rmsnorm.qk_norm(misaligned(q), wm[:8]))


# ---- QK-norm ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_qk_norm_in_a_fused_qkv_array(rng, dtype):
    tokens, heads, hd = 6, 4, 16
    qkv = data(rng, (tokens, 3, heads, hd), dtype)
    wq, wk = data(rng, (hd,), dtype, 0.2, 1.0), data(rng, (hd,), dtype, 0.2, 1.0)
    q, k = qkv[:, 0], qkv[:, 1]  # views at the token stride 3*heads*hd: read in place
    want_q = rmsnorm.rms_norm(np.ascontiguousarray(q), hd, wq, 1e-6)
    got_q, rstd = rmsnorm.qk_norm(q, wq, 1e-6, return_rstd=True)
    assert np.array_equal(got_q, want_q) and rstd.shape == (tokens, heads, 1)
    close(got_q, rms_oracle(np.ascontiguousarray(q), 1, wq, None, 1e-6)[0], dtype)
    v_before, want_k = qkv[:, 2].copy(), rmsnorm.rms_norm(np.ascontiguousarray(k), hd, wk, 1e-6)
    assert rmsnorm.qk_norm(k, wk, 1e-6, inplace=True) is k  # in place, inside qkv
    assert np.array_equal(qkv[:, 1], want_k)
    assert np.array_equal(qkv[:, 2], v_before)  # V untouched
    # backward: dx as rms_norm_backward row by row, dweight summed over tokens and heads
    x, dy = np.ascontiguousarray(q), data(rng, q.shape, dtype)
    dx, dw, _ = rmsnorm.qk_norm_backward(dy, q, wq, 1e-6)
    wdx, wdw, _ = rmsnorm.rms_norm_backward(dy, x, hd, wq, 1e-6)
    assert np.array_equal(dx, wdx)
    close(dw, wdw, dtype)


def test_qk_norm_errors(rng):
    with pytest.raises(ValueError, match=r"input must have shape \(\*, heads, head_dim\)"):
        rmsnorm.qk_norm(np.ones(8, np.float32))
    with pytest.raises(ValueError, match="weight to be of same shape"):
        rmsnorm.qk_norm(np.ones((2, 3, 8), np.float32), np.ones(3, np.float32))
    x = np.ones((8, 3, 2), np.float32).transpose(0, 2, 1)  # head_dim not contiguous
    with pytest.raises(ValueError, match="qk_norm in place needs"):
        rmsnorm.qk_norm(x, inplace=True)
    assert rmsnorm.qk_norm(x).flags.c_contiguous  # copied when not in place


# ---- the output cache ----------------------------------------------------------------------


def test_output_cache_reuses_blocks_and_can_be_released():
    x = np.ones((512, 1024), np.float32)  # a 2 MiB output
    rmsnorm.empty_cache()
    before = rmsnorm.cache_info()
    y = rmsnorm.rms_norm(x, 1024, eps=0.0)
    assert type(y.base).__name__ == "PyCapsule" and not y.flags.owndata
    assert rmsnorm.cache_info()["live_blocks"] == before["live_blocks"] + 1
    del y
    info = rmsnorm.cache_info()
    assert info["cached_blocks"] >= 1 and info["cached_bytes"] >= 2 << 20
    for _ in range(3):
        y = rmsnorm.rms_norm(x, 1024, eps=0.0)
        assert float(y[0, 0]) == 1.0
        del y
    after = rmsnorm.cache_info()
    assert after["hits"] >= info["hits"] + 3 and after["misses"] == info["misses"]
    kept = rmsnorm.rms_norm(x, 1024, eps=0.0)  # a live output survives releasing the cache
    rmsnorm.empty_cache()
    assert rmsnorm.cache_info()["cached_bytes"] == 0
    assert float(kept.sum()) == 512 * 1024
    old = rmsnorm.set_cache_limit(0)
    try:
        del kept
        assert rmsnorm.cache_info()["cached_bytes"] == 0  # nothing kept at limit 0
    finally:
        rmsnorm.set_cache_limit(old)
    with pytest.raises(ValueError):
        rmsnorm.set_cache_limit(-1)
