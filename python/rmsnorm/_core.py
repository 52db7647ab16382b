"""_core.py - what the numpy and torch front ends share: checking shapes and
dtypes, viewing an input as `rows x d` with a row stride (or copying it when
that view does not exist), allocating outputs, and calling the C operations.

A front end supplies a Backend: how to read shape, strides, dtype and address
of its arrays and how to make new ones. Everything else is written once here.
This is the per-call path of every operation, so it avoids needless work: a
contiguous input skips the stride analysis, configurations are cached.
"""

from __future__ import annotations

import ctypes
from math import prod
from operator import index
from typing import Any, NamedTuple, Optional, Sequence, Tuple

from . import _capi

RMS, LAYER = "rms_norm", "layer_norm"


class Backend:
    """How one array library's arrays are read and made (numpy or torch)."""

    def coerce(self, a: Any, what: str) -> Any:
        """The array itself, or a clear TypeError for what the library cannot take."""
        raise NotImplementedError

    def dtype_code(self, a: Any) -> Optional[int]:
        """The rmsnorm dtype of a, or None when it has none."""
        raise NotImplementedError

    def dtype_name(self, a: Any) -> str:
        raise NotImplementedError

    def shape(self, a: Any) -> tuple:
        raise NotImplementedError

    def is_contiguous(self, a: Any) -> bool:
        """Whether a is C-contiguous (row-major, no gaps)."""
        raise NotImplementedError

    def strides(self, a: Any) -> Optional[tuple]:
        """Strides in elements, or None when they are not whole elements."""
        raise NotImplementedError

    def contiguous(self, a: Any) -> Any:
        raise NotImplementedError

    def ptr(self, a: Any) -> int:
        raise NotImplementedError

    def empty(self, shape: tuple, code: int) -> Any:
        raise NotImplementedError

    def full(self, shape: tuple, code: int, value: float) -> Any:
        raise NotImplementedError

    def cast(self, a: Any, code: int) -> Any:
        raise NotImplementedError

    def copy(self, a: Any) -> Any:
        """A new contiguous array with a's values."""
        raise NotImplementedError

    def empty_quant(self, shape: tuple, qtype: int) -> Any:
        """A new array for 8-bit codes: int8, or float8 E4M3 (bytes) for fp8."""
        raise NotImplementedError

    def prepare_out(self, a: Any) -> Any:
        """An `out` array about to be written by the library: raise when it may
        not be, note the write where the library keeps count."""
        return a


# ---- shapes and layouts ------------------------------------------------------

def normalized(normalized_shape) -> Tuple[tuple, int]:
    """normalized_shape as a tuple of ints (an int means a 1-D shape, as in
    torch) and its number of elements d."""
    shape = normalized_shape
    if hasattr(shape, "__index__"):
        shape = (shape,)
    try:
        norm = tuple(map(index, shape))
    except TypeError:
        raise TypeError(
            f"normalized_shape must be an int or a sequence of ints, got {normalized_shape!r}"
        ) from None
    if not norm:
        raise ValueError(
            "Expected normalized_shape to be at least 1-dimensional, i.e., containing at "
            f"least one element, but got normalized_shape = {list(norm)}"
        )
    if min(norm) < 0:
        raise ValueError(f"normalized_shape must not be negative, got {list(norm)}")
    return norm, prod(norm)


def row_layout(shape: Sequence[int], strides: Optional[Sequence[int]], k: int):
    """(rows, d, ld) when the last k dims are one contiguous block of d elements
    and the leading dims collapse to rows equally spaced ld >= d elements apart;
    None when the array must be copied first."""
    n = len(shape) - k
    d = prod(shape[n:])
    rows = prod(shape[:n])
    if strides is None:
        return None
    if rows == 0 or d == 0:
        return rows, d, d
    expect = 1
    for size, stride in zip(reversed(shape[n:]), reversed(strides[n:])):
        if size != 1 and stride != expect:
            return None
        expect *= size
    ld = None
    for size, stride in zip(reversed(shape[:n]), reversed(strides[:n])):
        if size == 1:
            continue
        if ld is None:
            ld, expect = stride, stride * size
        elif stride != expect:
            return None
        else:
            expect *= size
    if ld is None:
        ld = d
    if ld < d:  # broadcast (stride 0), overlapping or reversed rows
        return None
    return rows, d, ld


class Rows(NamedTuple):
    """An array seen as rows x d, row i at ptr + i*ld elements."""

    array: Any  # the array whose memory is passed (the input, or a contiguous copy)
    rows: int
    d: int
    ld: int
    ptr: int


def as_rows(B: Backend, a: Any, shape: tuple, k: int, d: int) -> Rows:
    """a as rows x d with a row stride: itself when it has such a view, else a
    contiguous copy. shape is a's, already checked to end in the normalized dims."""
    if not B.is_contiguous(a):
        layout = row_layout(shape, B.strides(a), k)
        if layout is not None:
            return Rows(a, layout[0], d, layout[2], B.ptr(a))
        a = B.contiguous(a)
    return Rows(a, prod(shape[: len(shape) - k]), d, d, B.ptr(a))


def data_dtype(B: Backend, x: Any, what: str = "input") -> int:
    code = B.dtype_code(x)
    if code is None:
        raise TypeError(
            f"{what} has dtype {B.dtype_name(x)}; rmsnorm takes float32, float16, "
            "bfloat16 or float64"
        )
    return code


def check_input(shape: tuple, norm: tuple, what: str = "input") -> None:
    k = len(norm)
    if len(shape) < k or shape[len(shape) - k:] != norm:
        star = ", ".join(str(n) for n in norm)
        raise ValueError(
            f"Given normalized_shape={list(norm)}, expected {what} with shape [*, {star}], "
            f"but got {what} of size {list(shape)}"
        )


class Params(NamedTuple):
    weight: Any  # contiguous, in param_dtype, or None
    bias: Any
    param_dtype: int
    weight_dtype: Optional[int]  # the caller's dtypes, to give gradients back in
    bias_dtype: Optional[int]


def _param(B: Backend, p: Any, name: str, norm: tuple):
    p = B.coerce(p, name)
    code = data_dtype(B, p, name)
    shape = B.shape(p)
    if shape != norm:
        raise ValueError(
            f"Expected {name} to be of same shape as normalized_shape, but got {name} "
            f"of shape {list(shape)} and normalized_shape = {list(norm)}"
        )
    return p, code


def params(B: Backend, dt: int, norm: tuple, weight: Any, bias: Any) -> Params:
    """The weight and bias as the library takes them: shape normalized_shape,
    contiguous, and one parameter dtype for both, either the data's or float32
    (other dtypes are converted to float32: exactly for float16/bfloat16)."""
    wc = bc = None
    if weight is not None:
        weight, wc = _param(B, weight, "weight", norm)
    if bias is not None:
        bias, bc = _param(B, bias, "bias", norm)
    pdt = dt if (wc is None or wc == dt) and (bc is None or bc == dt) else _capi.F32
    if weight is not None:
        if wc != pdt:
            weight = B.cast(weight, pdt)
        if not B.is_contiguous(weight):
            weight = B.contiguous(weight)
    if bias is not None:
        if bc != pdt:
            bias = B.cast(bias, pdt)
        if not B.is_contiguous(bias):
            bias = B.contiguous(bias)
    return Params(weight, bias, pdt, wc, bc)


def stats_dtype(dt: int) -> int:
    """mean and rstd are float for fp32/fp16/bf16 data, double for fp64."""
    return _capi.F64 if dt == _capi.F64 else _capi.F32


def _stat_arg(B: Backend, s: Any, name: str, dt: int, rows: int):
    """A saved mean or rstd as the library takes it: rows contiguous values."""
    if s is None:
        return None, None
    s = B.coerce(s, name)
    want = stats_dtype(dt)
    if B.dtype_code(s) != want:
        raise TypeError(
            f"{name} has dtype {B.dtype_name(s)}; it must be {_capi.DTYPE_NAMES[want]} for "
            f"{_capi.DTYPE_NAMES[dt]} data (as the forward returns it)"
        )
    shape = B.shape(s)
    if prod(shape) != rows:
        raise ValueError(
            f"{name} has {prod(shape)} values (shape {list(shape)}); expected one per row, {rows}")
    if not B.is_contiguous(s):
        s = B.contiguous(s)
    return s, B.ptr(s)


def make_flags(offset: bool = False, eps_outside: bool = False,
               round_before_weight: bool = False) -> int:
    """The RMSNORM_FLAG_* bits for the front ends' keywords."""
    return ((_capi.FLAG_WEIGHT_OFFSET if offset else 0)
            | (_capi.FLAG_EPS_OUTSIDE if eps_outside else 0)
            | (_capi.FLAG_ROUND_BEFORE_WEIGHT if round_before_weight else 0))


def _check_flags(kind: str, flags: int) -> None:
    if kind == LAYER and flags & _capi.FLAG_EPS_OUTSIDE:
        raise ValueError("eps_outside applies to rms_norm only")


def _ptr(B: Backend, a: Any) -> Optional[int]:
    return None if a is None else B.ptr(a)


# ---- forward -----------------------------------------------------------------


class Forward(NamedTuple):
    y: Any
    mean: Any  # (*leading, 1, ..., 1), or None when not asked for
    rstd: Any
    x: Rows  # the input as passed to the library, for a backward to reuse


def _output(B: Backend, out: Any, shape: tuple, dt: int, k: int, d: int):
    """(y, ldy): a new contiguous output, or `out` when given (in place when it is
    the input), which must have the input's shape and dtype and a row stride."""
    if out is None:
        return B.empty(shape, dt), d
    out = B.coerce(out, "out")
    if B.shape(out) != shape:
        raise ValueError(f"out has shape {list(B.shape(out))}; expected the input's, {list(shape)}")
    if B.dtype_code(out) != dt:
        raise TypeError(f"out has dtype {B.dtype_name(out)}; expected the input's, "
                        f"{_capi.DTYPE_NAMES[dt]}")
    layout = (None, d, d) if B.is_contiguous(out) else row_layout(shape, B.strides(out), k)
    if layout is None:
        raise ValueError("out must hold the normalized dims contiguously and its rows at one "
                         "stride (a contiguous array, or a row slice of one)")
    return B.prepare_out(out), layout[2]


def forward(B: Backend, kind: str, x: Any, normalized_shape, weight: Any, bias: Any, eps,
            partial: float, flags: int, want_mean: bool, want_rstd: bool,
            threads: Optional[int], out: Any = None) -> Forward:
    x = B.coerce(x, "input")
    norm, d = normalized(normalized_shape)
    dt = data_dtype(B, x)
    shape = B.shape(x)
    check_input(shape, norm)
    p = params(B, dt, norm, weight, bias)
    _check_flags(kind, flags)
    k = len(norm)
    xr = as_rows(B, x, shape, k, d)
    if kind == LAYER and want_rstd:
        want_mean = True  # the backward takes both or recomputes both
    if kind == LAYER and want_mean:
        want_rstd = True
    if want_mean or want_rstd:
        stats_shape = shape[: len(shape) - k] + (1,) * k
        sdt = stats_dtype(dt)
    if d == 0:
        # Nothing to normalize: torch gives an empty output, mean 0 and rstd NaN.
        mean = B.full(stats_shape, sdt, 0.0) if want_mean else None
        rstd = B.full(stats_shape, sdt, float("nan")) if want_rstd else None
        return Forward(_output(B, out, shape, dt, k, d)[0], mean, rstd, xr)
    y, ldy = _output(B, out, shape, dt, k, d)
    mean = B.empty(stats_shape, sdt) if want_mean else None
    rstd = B.empty(stats_shape, sdt) if want_rstd else None
    cfg = _capi.config(dt, p.param_dtype, eps, partial, flags)
    ctx = _capi.context(threads)
    w, b = _ptr(B, p.weight), _ptr(B, p.bias)
    if kind == RMS:
        st = _capi.rms_forward(ctx, cfg, xr.rows, d, xr.ptr, xr.ld, w, b, B.ptr(y), ldy,
                               _ptr(B, rstd))
    else:
        st = _capi.ln_forward(ctx, cfg, xr.rows, d, xr.ptr, xr.ld, w, b, B.ptr(y), ldy,
                              _ptr(B, mean), _ptr(B, rstd))
    if st:
        _capi.check(st, "rmsnorm_forward" if kind == RMS else "rmsnorm_layernorm_forward")
    return Forward(y, mean, rstd, xr)


# ---- backward ----------------------------------------------------------------


def backward(B: Backend, kind: str, dy: Any, x: Any, normalized_shape, weight: Any, bias: Any,
             mean: Any, rstd: Any, eps, partial: float, flags: int, want_dweight: bool,
             want_dbias: bool, threads: Optional[int]):
    """(dx, dweight, dbias); dweight/dbias are None unless asked for and their
    parameter given (bias only tells the dtype and shape of dbias)."""
    x = B.coerce(x, "input")
    norm, d = normalized(normalized_shape)
    dt = data_dtype(B, x)
    shape = B.shape(x)
    check_input(shape, norm)
    dy = B.coerce(dy, "grad_output")
    if B.shape(dy) != shape:
        raise ValueError(
            f"grad_output has shape {list(B.shape(dy))}; expected the input's, {list(shape)}")
    if data_dtype(B, dy, "grad_output") != dt:
        raise TypeError(
            f"grad_output has dtype {B.dtype_name(dy)}; expected the input's, {B.dtype_name(x)}")
    p = params(B, dt, norm, weight, bias)
    _check_flags(kind, flags)
    want_dweight = want_dweight and p.weight is not None
    want_dbias = want_dbias and p.bias is not None
    k = len(norm)
    xr = as_rows(B, x, shape, k, d)
    dyr = as_rows(B, dy, shape, k, d)
    rows = xr.rows

    dx = B.empty(shape, dt)
    if d == 0:
        dw = B.full(norm, p.weight_dtype, 0.0) if want_dweight else None
        db = B.full(norm, p.bias_dtype, 0.0) if want_dbias else None
        return dx, dw, db
    # rows == 0: the library checks the configuration and writes nothing, so
    # the parameter gradients start as zeros.
    if rows:
        dw = B.empty(norm, p.param_dtype) if want_dweight else None
        db = B.empty(norm, p.param_dtype) if want_dbias else None
    else:
        dw = B.full(norm, p.param_dtype, 0.0) if want_dweight else None
        db = B.full(norm, p.param_dtype, 0.0) if want_dbias else None
    rstd, r = _stat_arg(B, rstd, "rstd", dt, rows)
    cfg = _capi.config(dt, p.param_dtype, eps, partial, flags)
    ctx = _capi.context(threads)
    w = _ptr(B, p.weight)
    if kind == RMS:
        st = _capi.rms_backward(ctx, cfg, rows, d, xr.ptr, xr.ld, dyr.ptr, dyr.ld, w, r,
                                B.ptr(dx), d, _ptr(B, dw), _ptr(B, db))
    else:
        mean, m = _stat_arg(B, mean, "mean", dt, rows)
        if (m is None) != (r is None):
            raise ValueError("layer_norm_backward takes both mean and rstd, or neither")
        st = _capi.ln_backward(ctx, cfg, rows, d, xr.ptr, xr.ld, dyr.ptr, dyr.ld, w, m, r,
                               B.ptr(dx), d, _ptr(B, dw), _ptr(B, db))
    if st:
        _capi.check(st, "rmsnorm_backward" if kind == RMS else "rmsnorm_layernorm_backward")
    if dw is not None and p.weight_dtype != p.param_dtype:
        dw = B.cast(dw, p.weight_dtype)
    if db is not None and p.bias_dtype != p.param_dtype:
        db = B.cast(db, p.bias_dtype)
    return dx, dw, db


# ---- fused operations of a transformer block -------------------------------------
# include/rmsnorm.h, "Inside a transformer block", and docs/README-fusions.md.


def _same_as(B: Backend, a: Any, ref: Any, shape: tuple, dt: int, what: str, ref_what: str):
    """a coerced and checked to have ref's shape and dtype."""
    a = B.coerce(a, what)
    if B.shape(a) != shape:
        raise ValueError(f"{what} has shape {list(B.shape(a))}; expected {ref_what}'s, "
                         f"{list(shape)}")
    if data_dtype(B, a, what) != dt:
        raise TypeError(f"{what} has dtype {B.dtype_name(a)}; expected {ref_what}'s, "
                        f"{B.dtype_name(ref)}")
    return a


def _writable_rows(B: Backend, a: Any, shape: tuple, k: int, what: str) -> int:
    """The row stride of an array the library writes in place."""
    if B.is_contiguous(a):
        ld = prod(shape[len(shape) - k:])
    else:
        layout = row_layout(shape, B.strides(a), k)
        if layout is None:
            raise ValueError(f"inplace=True needs {what} to hold the normalized dims "
                             "contiguously and its rows at one stride (a contiguous array, or "
                             "a row slice of one)")
        ld = layout[2]
    B.prepare_out(a)
    return ld


class AddForward(NamedTuple):
    y: Any
    h: Any  # h' = h + u: the residual updated in place, or a new array
    rstd: Any
    h_rows: Rows  # h' as passed to the library, for the backward


def add_forward(B: Backend, u: Any, h: Any, normalized_shape, weight: Any, bias: Any, eps,
                partial: float, flags: int, want_rstd: bool, threads: Optional[int],
                inplace: bool = False) -> AddForward:
    """h' = h + u (rounded to the data dtype) and y = RMSNorm(h') in one pass:
    rmsnorm_add_forward. u is the sub-layer output ("input"), h the residual
    stream. inplace: h' is written into h and y into u (both must have a row
    stride); otherwise h is copied and y is new."""
    u = B.coerce(u, "input")
    norm, d = normalized(normalized_shape)
    dt = data_dtype(B, u)
    shape = B.shape(u)
    check_input(shape, norm)
    h = _same_as(B, h, u, shape, dt, "residual", "input")
    p = params(B, dt, norm, weight, bias)
    _check_flags(RMS, flags)
    k = len(norm)
    if want_rstd:
        stats_shape = shape[: len(shape) - k] + (1,) * k
        sdt = stats_dtype(dt)
    if inplace:
        ldh = _writable_rows(B, h, shape, k, "residual")
        ldy = _writable_rows(B, u, shape, k, "input")
        hr = Rows(h, prod(shape[: len(shape) - k]), d, ldh, B.ptr(h))
        y = u
    else:
        hc = B.copy(h)  # the library updates it: the caller's residual is kept
        hr = Rows(hc, prod(shape[: len(shape) - k]), d, d, B.ptr(hc))
        y, ldy = B.empty(shape, dt), d
    ur = as_rows(B, u, shape, k, d) if not inplace else Rows(u, hr.rows, d, ldy, B.ptr(u))
    if d == 0:
        rstd = B.full(stats_shape, sdt, float("nan")) if want_rstd else None
        return AddForward(y, hr.array, rstd, hr)
    rstd = B.empty(stats_shape, sdt) if want_rstd else None
    cfg = _capi.config(dt, p.param_dtype, eps, partial, flags)
    st = _capi.add_forward(_capi.context(threads), cfg, hr.rows, d, hr.ptr, hr.ld, ur.ptr, ur.ld,
                           _ptr(B, p.weight), _ptr(B, p.bias), B.ptr(y), ldy, _ptr(B, rstd))
    if st:
        _capi.check(st, "rmsnorm_add_forward")
    return AddForward(y, hr.array, rstd, hr)


def add_backward(B: Backend, dy: Any, dres: Any, h: Any, normalized_shape, weight: Any,
                 bias: Any, rstd: Any, eps, partial: float, flags: int, want_dweight: bool,
                 want_dbias: bool, threads: Optional[int]):
    """(dh, dweight, dbias) of add_forward: dh = dres + RMSNorm backward at h'
    (the new residual), the gradient of both the input and the residual;
    dres None is zero (rmsnorm_add_backward)."""
    h = B.coerce(h, "new_residual")
    norm, d = normalized(normalized_shape)
    dt = data_dtype(B, h, "new_residual")
    shape = B.shape(h)
    check_input(shape, norm, "new_residual")
    dy = _same_as(B, dy, h, shape, dt, "grad_output", "new_residual")
    p = params(B, dt, norm, weight, bias)
    _check_flags(RMS, flags)
    want_dweight = want_dweight and p.weight is not None
    want_dbias = want_dbias and p.bias is not None
    k = len(norm)
    hr = as_rows(B, h, shape, k, d)
    dyr = as_rows(B, dy, shape, k, d)
    if dres is not None:
        dres = _same_as(B, dres, h, shape, dt, "grad_residual", "new_residual")
        drr = as_rows(B, dres, shape, k, d)
    rows = hr.rows
    dh = B.empty(shape, dt)
    if d == 0:
        dw = B.full(norm, p.weight_dtype, 0.0) if want_dweight else None
        db = B.full(norm, p.bias_dtype, 0.0) if want_dbias else None
        return dh, dw, db
    fill = B.empty if rows else (lambda s, c: B.full(s, c, 0.0))
    dw = fill(norm, p.param_dtype) if want_dweight else None
    db = fill(norm, p.param_dtype) if want_dbias else None
    rstd, r = _stat_arg(B, rstd, "rstd", dt, rows)
    cfg = _capi.config(dt, p.param_dtype, eps, partial, flags)
    st = _capi.add_backward(_capi.context(threads), cfg, rows, d, hr.ptr, hr.ld, dyr.ptr, dyr.ld,
                            None if dres is None else drr.ptr, d if dres is None else drr.ld,
                            _ptr(B, p.weight), r, B.ptr(dh), d, _ptr(B, dw), _ptr(B, db))
    if st:
        _capi.check(st, "rmsnorm_add_backward")
    if dw is not None and p.weight_dtype != p.param_dtype:
        dw = B.cast(dw, p.weight_dtype)
    if db is not None and p.bias_dtype != p.param_dtype:
        db = B.cast(db, p.bias_dtype)
    return dh, dw, db


QMAX = {_capi.Q_INT8: 127.0, _capi.Q_FP8_E4M3: 448.0}


def forward_quant(B: Backend, qtype: int, x: Any, normalized_shape, weight: Any, bias: Any, eps,
                  partial: float, flags: int, scale, threads: Optional[int]):
    """(q, scale): RMSNorm with an int8 or fp8 E4M3 output (rmsnorm_forward_quant).
    scale None: dynamic, one float32 per row, shape (*leading, 1, ..., 1); else the
    static scale (a positive finite number), given back as a 0-d float32 array."""
    x = B.coerce(x, "input")
    norm, d = normalized(normalized_shape)
    dt = data_dtype(B, x)
    shape = B.shape(x)
    check_input(shape, norm)
    p = params(B, dt, norm, weight, bias)
    _check_flags(RMS, flags)
    k = len(norm)
    xr = as_rows(B, x, shape, k, d)
    q = B.empty_quant(shape, qtype)
    static = None
    if scale is None:
        s = B.empty(shape[: len(shape) - k] + (1,) * k, _capi.F32)
    else:
        static = ctypes.c_float(float(scale))
        s = B.full((), _capi.F32, static.value)
    if d == 0:
        if scale is None:
            s = B.full(B.shape(s), _capi.F32, 0.0)
        return q, s
    cfg = _capi.config(dt, p.param_dtype, eps, partial, flags)
    st = _capi.forward_quant(_capi.context(threads), cfg, xr.rows, d, xr.ptr, xr.ld,
                             _ptr(B, p.weight), _ptr(B, p.bias), qtype,
                             None if static is None else ctypes.addressof(static), B.ptr(q), d,
                             B.ptr(s) if static is None else None, None)
    if st:
        _capi.check(st, "rmsnorm_forward_quant")
    return q, s


def compute_dtype(dt: int) -> int:
    """The type the matrices of rmsnorm_linear_* are in: double for fp64 data."""
    return _capi.F64 if dt == _capi.F64 else _capi.F32


def require_linear(what: str) -> None:
    if not _capi.linear_available():
        name = _capi.status_name(_capi.ERROR_NOT_AVAILABLE)
        raise _capi.NotAvailableError(
            f"{what}: this librmsnorm was built without a BLAS (cblas_sgemm), so "
            f"rmsnorm_linear_* is not available ({name})", _capi.ERROR_NOT_AVAILABLE, name)


class LinearArgs(NamedTuple):
    x: Rows
    dt: int
    shape: tuple  # the input's
    n: int
    w: Any  # (d, n), contiguous, compute type
    w_dtype: int  # the caller's, to give dW back in
    g: Any  # (d,), param dtype, or None
    bias: Any  # (n,), param dtype, or None
    param_dtype: int
    g_dtype: Optional[int]
    bias_dtype: Optional[int]


def linear_args(B: Backend, x: Any, w: Any, g: Any, bias: Any) -> LinearArgs:
    """Checks and converts the arguments of rms_norm_linear: x (*, d); w (d, n) of
    any float dtype, converted to the compute type; g (d,) and bias (n,) in one
    parameter dtype, the data's or float32 (as params())."""
    x = B.coerce(x, "input")
    dt = data_dtype(B, x)
    shape = B.shape(x)
    if len(shape) == 0:
        raise ValueError("input must have at least one dimension (the normalized one)")
    d = shape[-1]
    w = B.coerce(w, "weight_matrix")
    wc = data_dtype(B, w, "weight_matrix")
    if len(B.shape(w)) != 2 or B.shape(w)[0] != d:
        raise ValueError(f"weight_matrix has shape {list(B.shape(w))}; expected (d, n) with "
                         f"d = {d}, the input's last dim")
    n = B.shape(w)[1]
    if d == 0 or n == 0:
        raise ValueError(f"rms_norm_linear needs d > 0 and n > 0, got d = {d}, n = {n}")
    cdt = compute_dtype(dt)
    if wc != cdt:
        w = B.cast(w, cdt)
    if not B.is_contiguous(w):
        w = B.contiguous(w)
    gc = bc = None
    if g is not None:
        g, gc = _param(B, g, "norm_weight", (d,))
    if bias is not None:
        bias, bc = _param(B, bias, "bias", (n,))
    pdt = dt if (gc is None or gc == dt) and (bc is None or bc == dt) else _capi.F32
    if g is not None:
        g = B.contiguous(B.cast(g, pdt) if gc != pdt else g)
    if bias is not None:
        bias = B.contiguous(B.cast(bias, pdt) if bc != pdt else bias)
    xr = as_rows(B, x, shape, 1, d)
    return LinearArgs(xr, dt, shape, n, w, wc, g, bias, pdt, gc, bc)


def fold(B: Backend, a: LinearArgs, eps, partial: float, flags: int) -> Any:
    """W' = diag(g) W (diag(1 + g) with the offset flag): rmsnorm_fold_weight."""
    d, n = a.x.d, a.n
    wf = B.empty((d, n), compute_dtype(a.dt))
    cfg = _capi.config(a.dt, a.param_dtype, eps, partial, flags)
    st = _capi.fold_weight(cfg, d, n, _ptr(B, a.g), B.ptr(a.w), n, B.ptr(wf), n)
    if st:
        _capi.check(st, "rmsnorm_fold_weight")
    return wf


def linear_forward(B: Backend, a: LinearArgs, wf: Any, eps, partial: float, flags: int,
                   threads: Optional[int]):
    """(z, rstd): Z = diag(r) (X W') + bias, z of shape (*, n) in the data dtype,
    rstd (*, 1) (rmsnorm_linear_forward)."""
    require_linear("rms_norm_linear")
    n = a.n
    z = B.empty(a.shape[:-1] + (n,), a.dt)
    rstd = B.empty(a.shape[:-1] + (1,), stats_dtype(a.dt))
    cfg = _capi.config(a.dt, a.param_dtype, eps, partial, flags)
    st = _capi.linear_forward(_capi.context(threads), cfg, a.x.rows, a.x.d, n, a.x.ptr, a.x.ld,
                              B.ptr(wf), n, _ptr(B, a.bias), B.ptr(z), n, B.ptr(rstd))
    if st:
        _capi.check(st, "rmsnorm_linear_forward")
    return z, rstd


def linear_backward(B: Backend, a: LinearArgs, wf: Any, dz: Any, eps, partial: float, flags: int,
                    want_dx: bool, want_dg: bool, want_dw: bool, want_db: bool,
                    threads: Optional[int]):
    """(dx, dg, dW, dbias) of linear_forward, each None unless wanted (and its
    parameter given), in the caller's dtypes (rmsnorm_linear_backward)."""
    require_linear("rms_norm_linear_backward")
    d, n, rows, dt = a.x.d, a.n, a.x.rows, a.dt
    zshape = a.shape[:-1] + (n,)
    dz = B.coerce(dz, "grad_output")
    if B.shape(dz) != zshape:
        raise ValueError(f"grad_output has shape {list(B.shape(dz))}; expected {list(zshape)}")
    if data_dtype(B, dz, "grad_output") != dt:
        raise TypeError(f"grad_output has dtype {B.dtype_name(dz)}; expected the input's, "
                        f"{_capi.DTYPE_NAMES[dt]}")
    dzr = as_rows(B, dz, zshape, 1, n)
    want_dg = want_dg and a.g is not None
    want_db = want_db and a.bias is not None
    cdt = compute_dtype(dt)
    # the library always writes dx; rows == 0 writes nothing, so sums start at 0
    dx = B.empty(a.shape, dt)
    fill = B.empty if rows else (lambda s, c: B.full(s, c, 0.0))
    dg = fill((d,), a.param_dtype) if want_dg else None
    dw = fill((d, n), cdt) if want_dw else None
    db = fill((n,), a.param_dtype) if want_db else None
    cfg = _capi.config(dt, a.param_dtype, eps, partial, flags)
    st = _capi.linear_backward(_capi.context(threads), cfg, rows, d, n, a.x.ptr, a.x.ld,
                               _ptr(B, a.g), B.ptr(a.w), n, B.ptr(wf), n, dzr.ptr, dzr.ld,
                               B.ptr(dx), d, _ptr(B, dg), _ptr(B, dw), n, _ptr(B, db))
    if st:
        _capi.check(st, "rmsnorm_linear_backward")
    if dg is not None and a.g_dtype != a.param_dtype:
        dg = B.cast(dg, a.g_dtype)
    if db is not None and a.bias_dtype != a.param_dtype:
        db = B.cast(db, a.bias_dtype)
    if dw is not None and a.w_dtype != cdt:
        dw = B.cast(dw, a.w_dtype)
    return (dx if want_dx else None), dg, dw, db
