"""_numpy.py - the numpy front end: rms_norm, layer_norm and their backwards on
numpy arrays (float32, float16, float64, and bfloat16 as ml_dtypes.bfloat16)."""

from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from . import _capi, _core

try:
    import ml_dtypes

    _BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # bfloat16 arrays cannot exist without it
    _BF16 = None

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
        return np.empty(shape, _DTYPES[code])

    def full(self, shape: tuple, code: int, value: float) -> np.ndarray:
        return np.full(shape, value, _DTYPES[code])

    def cast(self, a: np.ndarray, code: int) -> np.ndarray:
        return a.astype(_DTYPES[code])

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
