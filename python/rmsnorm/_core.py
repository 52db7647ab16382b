"""_core.py - what the numpy and torch front ends share: checking shapes and
dtypes, viewing an input as `rows x d` with a row stride (or copying it when
that view does not exist), allocating outputs, and calling the C operations.

A front end supplies a Backend: how to read shape, strides, dtype and address
of its arrays and how to make new ones. Everything else is written once here.
This is the per-call path of every operation, so it avoids needless work: a
contiguous input skips the stride analysis, configurations are cached.
"""

from __future__ import annotations

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
