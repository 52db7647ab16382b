"""_numpy.py - the numpy front end: rms_norm, layer_norm and their backwards on
numpy arrays (float32, float16, float64, and bfloat16 as ml_dtypes.bfloat16), and
the fused operations of a transformer block: residual add + RMSNorm, RMSNorm +
linear with the gain folded, RMSNorm with an int8 or fp8 output."""

from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from . import _capi, _core

try:
    import ml_dtypes

    _BF16 = np.dtype(ml_dtypes.bfloat16)
    _FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
except ImportError:  # bfloat16 arrays cannot exist without it; fp8 codes come as uint8
    _BF16 = None
    _FP8 = np.dtype(np.uint8)

_DTYPES = {_capi.F32: np.dtype(np.float32), _capi.F16: np.dtype(np.float16),
           _capi.F64: np.dtype(np.float64)}
if _BF16 is not None:
    _DTYPES[_capi.BF16] = _BF16
_CODES = {dt: code for code, dt in _DTYPES.items()}


class NumpyBackend(_core.Backend):
    def coerce(self, a: Any, what: str) -> np.ndarray:
        a = np.asarray(a)
        if not a.dtype.isnative:
            a = a.astype(a.dtype.newbyteorder("="))
        return a

    def dtype_code(self, a: np.ndarray) -> Optional[int]:
        return _CODES.get(a.dtype)

    def dtype_name(self, a: np.ndarray) -> str:
        return str(a.dtype)

    def shape(self, a: np.ndarray) -> tuple:
        return a.shape

    def is_contiguous(self, a: np.ndarray) -> bool:
        return a.flags.c_contiguous

    def strides(self, a: np.ndarray):
        size = a.itemsize
        if any(s % size for s in a.strides):
            return None
        return tuple(s // size for s in a.strides)

    def contiguous(self, a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a)

    def ptr(self, a: np.ndarray) -> int:
        return a.__array_interface__["data"][0]

    def empty(self, shape: tuple, code: int) -> np.ndarray:
        out = np.empty(shape, _DTYPES[code])
        _capi.advise_huge_pages(out.ctypes.data, out.nbytes)
        return out

    def full(self, shape: tuple, code: int, value: float) -> np.ndarray:
        return np.full(shape, value, _DTYPES[code])

    def cast(self, a: np.ndarray, code: int) -> np.ndarray:
        return a.astype(_DTYPES[code])

    def copy(self, a: np.ndarray) -> np.ndarray:
        return np.array(a, order="C", copy=True)

    def empty_quant(self, shape: tuple, qtype: int) -> np.ndarray:
        return np.empty(shape, np.int8 if qtype == _capi.Q_INT8 else _FP8)

    def prepare_out(self, a: np.ndarray) -> np.ndarray:
        if not a.flags.writeable:
            raise ValueError("out is read-only")
        return a


NUMPY = NumpyBackend()


def rms_norm(input, normalized_shape, weight=None, eps: Optional[float] = None, *, bias=None,
             offset: bool = False, eps_outside: bool = False, partial: float = 1.0,
             round_before_weight: bool = False, return_rstd: bool = False, out=None):
    """RMSNorm over the trailing dims `normalized_shape` of `input`, as
    torch.nn.functional.rms_norm: y = x / sqrt(mean(x^2) + eps) * weight (+ bias).

    input: a numpy array of float32, float16, bfloat16 (ml_dtypes) or float64, any
    leading shape, any strides. weight, bias: arrays of shape normalized_shape, of
    the input's dtype or float32. eps None: float32's machine epsilon (float64's for
    float64 data), as torch. offset: multiply by (1 + weight), as Gemma.
    eps_outside: 1/(sqrt(mean(x^2)) + eps). partial: pRMSNorm, the statistic over the
    first ceil(partial*d) elements. round_before_weight: for float16/bfloat16, round
    the normalized value to the input dtype before the weight (HF Llama's order).

    Returns y (a new contiguous array of the input's shape and dtype, or `out`),
    or (y, rstd) with return_rstd, rstd of shape (*leading, 1, ..., 1) in float32
    (float64 for float64 data): what rms_norm_backward takes to skip recomputing it.
    out: an array of the input's shape and dtype to write y into (rows at one
    stride); the input itself normalizes in place.
    """
    r = _core.forward(NUMPY, _core.RMS, input, normalized_shape, weight, bias, eps, partial,
                      _core.make_flags(offset, eps_outside, round_before_weight), False,
                      return_rstd, None, out)
    return (r.y, r.rstd) if return_rstd else r.y


def rms_norm_backward(grad_output, input, normalized_shape, weight=None,
                      eps: Optional[float] = None, *, bias=None, rstd=None, offset: bool = False,
                      eps_outside: bool = False, partial: float = 1.0
                      ) -> Tuple[np.ndarray, Optional[np.ndarray], Optional[np.ndarray]]:
    """Gradients of rms_norm, called with the forward's arguments after grad_output.

    Returns (grad_input, grad_weight, grad_bias): grad_weight when a weight is given
    (the gradient of weight itself, also with offset), grad_bias when a bias is
    given (its values are not used), each in its parameter's dtype, else None.
    rstd: what rms_norm(..., return_rstd=True) returned; None recomputes it.
    """
    return _core.backward(NUMPY, _core.RMS, grad_output, input, normalized_shape, weight, bias,
                          None, rstd, eps, partial, _core.make_flags(offset, eps_outside, False),
                          True, True, None)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps: Optional[float] = 1e-5, *,
               offset: bool = False, round_before_weight: bool = False,
               return_mean_rstd: bool = False, out=None):
    """LayerNorm over the trailing dims `normalized_shape`, as
    torch.nn.functional.layer_norm: y = (x - mean) / sqrt(var + eps) * weight + bias
    (biased variance). Same dtypes and layouts as rms_norm; eps None is the dtype's
    default as for rms_norm.

    Returns y, or (y, mean, rstd) with return_mean_rstd (shape (*leading, 1, ..., 1)).
    out: as for rms_norm.
    """
    r = _core.forward(NUMPY, _core.LAYER, input, normalized_shape, weight, bias, eps, 1.0,
                      _core.make_flags(offset, False, round_before_weight), return_mean_rstd,
                      return_mean_rstd, None, out)
    return (r.y, r.mean, r.rstd) if return_mean_rstd else r.y


def layer_norm_backward(grad_output, input, normalized_shape, weight=None, bias=None,
                        eps: Optional[float] = 1e-5, *, mean=None, rstd=None, offset: bool = False
                        ) -> Tuple[np.ndarray, Optional[np.ndarray], Optional[np.ndarray]]:
    """Gradients of layer_norm, called with the forward's arguments after
    grad_output: (grad_input, grad_weight or None, grad_bias or None). mean and
    rstd: what layer_norm(..., return_mean_rstd=True) returned (both or neither)."""
    return _core.backward(NUMPY, _core.LAYER, grad_output, input, normalized_shape, weight, bias,
                          mean, rstd, eps, 1.0, _core.make_flags(offset, False, False), True, True, None)


# ---- fused operations of a transformer block -------------------------------------


def fused_add_rms_norm(input, residual, normalized_shape, weight=None,
                       eps: Optional[float] = None, *, bias=None, offset: bool = False,
                       eps_outside: bool = False, partial: float = 1.0, inplace: bool = False,
                       return_rstd: bool = False):
    """Residual add + RMSNorm in one pass over memory (rmsnorm_add_forward), as in a
    pre-norm transformer block where `input` is a sub-layer's output:

        new_residual = residual + input      (rounded to the dtype)
        output       = rms_norm(new_residual, normalized_shape, weight, eps, ...)

    Returns (output, new_residual), or (output, new_residual, rstd) with return_rstd.
    input and residual must have the same shape and dtype; the keywords are rms_norm's.
    inplace=False (the default) leaves both arguments untouched and returns new
    contiguous arrays. inplace=True is vLLM's fused_add_rms_norm: new_residual is
    written into `residual` and output into `input` (both must be writable, with rows
    at one stride), and those two arrays are returned.
    """
    r = _core.add_forward(NUMPY, input, residual, normalized_shape, weight, bias, eps, partial,
                          _core.make_flags(offset, eps_outside, False), return_rstd, None,
                          inplace)
    return (r.y, r.h, r.rstd) if return_rstd else (r.y, r.h)


def fused_add_rms_norm_backward(grad_output, grad_residual, new_residual, normalized_shape,
                                weight=None, eps: Optional[float] = None, *, bias=None,
                                rstd=None, offset: bool = False, eps_outside: bool = False,
                                partial: float = 1.0):
    """Gradients of fused_add_rms_norm (rmsnorm_add_backward): given the gradients of
    output and of new_residual (None: zero) and new_residual itself, returns
    (grad, grad_weight, grad_bias) where grad = grad_residual + the norm's grad_input
    is the gradient of both input and residual; grad_weight/grad_bias as for
    rms_norm_backward."""
    return _core.add_backward(NUMPY, grad_output, grad_residual, new_residual, normalized_shape,
                              weight, bias, rstd, eps, partial,
                              _core.make_flags(offset, eps_outside, False), True, True, None)


def rms_norm_linear(input, weight_matrix, norm_weight=None, eps: Optional[float] = None,
                    bias=None, offset: bool = False, *, eps_outside: bool = False,
                    partial: float = 1.0, return_rstd: bool = False):
    """RMSNorm followed by a linear layer, Z = rms_norm(input, d, norm_weight, eps) @
    weight_matrix + bias, computed with the gain folded into the matrix (FlashNorm):
    W' = diag(norm_weight) @ weight_matrix (rmsnorm_fold_weight), then
    Z = diag(r) (X W') + bias (rmsnorm_linear_forward: one GEMM, the row scale after it).

    input: (*, d) of any rmsnorm dtype; weight_matrix: (d, n), converted to the compute
    type (float32; float64 for float64 input); norm_weight: (d,), bias: (n,), of the
    input's dtype or float32. Z: (*, n) in the input's dtype, equal to the unfused
    composition within float32 (float64) rounding. rstd (return_rstd): (*, 1).
    Raises rmsnorm.NotAvailableError when the library was built without a BLAS.
    """
    a = _core.linear_args(NUMPY, input, weight_matrix, norm_weight, bias)
    flags = _core.make_flags(offset, eps_outside, False)
    wf = _core.fold(NUMPY, a, eps, partial, flags)
    z, rstd = _core.linear_forward(NUMPY, a, wf, eps, partial, flags, None)
    return (z, rstd) if return_rstd else z


def rms_norm_linear_backward(grad_output, input, weight_matrix, norm_weight=None,
                             eps: Optional[float] = None, bias=None, offset: bool = False, *,
                             eps_outside: bool = False, partial: float = 1.0):
    """Gradients of rms_norm_linear (rmsnorm_linear_backward), called with the
    forward's arguments after grad_output (*, n): returns (grad_input,
    grad_weight_matrix, grad_norm_weight or None, grad_bias or None), each in its
    argument's dtype."""
    a = _core.linear_args(NUMPY, input, weight_matrix, norm_weight, bias)
    flags = _core.make_flags(offset, eps_outside, False)
    wf = _core.fold(NUMPY, a, eps, partial, flags)
    dx, dg, dw, db = _core.linear_backward(NUMPY, a, wf, grad_output, eps, partial, flags, True,
                                           True, True, True, None)
    return dx, dw, dg, db


def _quant(qtype, input, normalized_shape, weight, eps, bias, scale, offset, eps_outside,
           partial):
    return _core.forward_quant(NUMPY, qtype, input, normalized_shape, weight, bias, eps, partial,
                               _core.make_flags(offset, eps_outside, False), scale, None)


def rms_norm_int8(input, normalized_shape, weight=None, eps: Optional[float] = None, *,
                  bias=None, scale: Optional[float] = None, offset: bool = False,
                  eps_outside: bool = False, partial: float = 1.0):
    """RMSNorm with an int8 output and a symmetric scale (rmsnorm_forward_quant):
    with y the rms_norm value in the compute type,

        scale None (dynamic, per row):  s = max|y| / 127 (float32), one per row
        scale given (static):           s = scale (finite, > 0)
        q = round_half_even(clip(y / s, -128, 127))   (NaN -> 0)

    Returns (q, s): q int8 of the input's shape, s float32 of shape (*leading, 1, ...,
    1) (dynamic) or a 0-d array (static). Dequantize with q * s."""
    return _quant(_capi.Q_INT8, input, normalized_shape, weight, eps, bias, scale, offset,
                  eps_outside, partial)


def rms_norm_fp8(input, normalized_shape, weight=None, eps: Optional[float] = None, *,
                 bias=None, scale: Optional[float] = None, offset: bool = False,
                 eps_outside: bool = False, partial: float = 1.0):
    """RMSNorm with an fp8 E4M3 (OCP "FN", max 448) output, as rms_norm_int8 with
    s = max|y| / 448 (dynamic) or the given scale, and q = e4m3(y / s) rounded to
    nearest even, saturated to +-448. q is an ml_dtypes.float8_e4m3fn array (its
    bytes are the codes)."""
    return _quant(_capi.Q_FP8_E4M3, input, normalized_shape, weight, eps, bias, scale, offset,
                  eps_outside, partial)
