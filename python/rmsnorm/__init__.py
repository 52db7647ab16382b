"""rmsnorm - RMSNorm and LayerNorm forward and backward from librmsnorm, for numpy
arrays here and for CPU torch tensors in rmsnorm.torch (imported on first use).

    import numpy as np, rmsnorm
    y, rstd = rmsnorm.rms_norm(x, x.shape[-1:], weight, return_rstd=True)
    dx, dw, _ = rmsnorm.rms_norm_backward(dy, x, x.shape[-1:], weight, rstd=rstd)
    y, h = rmsnorm.fused_add_rms_norm(u, h, h.shape[-1:], weight)   # h + u, then RMSNorm
    q = rmsnorm.qk_norm(qkv[:, 0], q_weight)                        # every head of Q
    q = rmsnorm.qk_norm_rope(q, q_weight, rmsnorm.rope_table(n, 128))  # QK-norm + RoPE
    z = rmsnorm.rms_norm_linear(x, w_matrix, weight)                # RMSNorm(x) @ w_matrix
    q, scale = rmsnorm.rms_norm_int8(x, x.shape[-1:], weight)      # int8, per-row scale
    codes, _ = rmsnorm.rms_norm_quant(x, x.shape[-1:], weight, format="q8_0")  # ggml blocks

The functions are compiled (rmsnorm._native, over numpy's C API); large outputs
come from a cache of warm blocks (cache_info, set_cache_limit, empty_cache).
"""

from importlib import import_module as _import_module

from ._errors import ArgumentError, DtypeError, Error, NotAvailableError, OutOfMemoryError

try:
    from . import _native
except ImportError as err:  # pragma: no cover - says how to build
    raise ImportError(
        f"rmsnorm: the compiled module rmsnorm._native cannot be loaded ({err}). Install the "
        "package with `pip install ./python` from the repository root (a C/C++ compiler, "
        "CMake >= 3.20 and Python's headers are needed)."
    ) from None

from ._ops import FNS as _FNS  # noqa: E402

# the op table's numpy functions, then the settings and information
_FUNCTIONS = [fn.name for fn in _FNS if fn.where != "TORCH"] + [
    "linear_available", "set_num_threads", "get_num_threads", "isa", "cpu_features",
    "library_version", "cache_info", "set_cache_limit", "empty_cache"]
globals().update({name: getattr(_native, name) for name in _FUNCTIONS})
__version__ = _native.library_version()
__all__ = _FUNCTIONS + [
    "dequantize", "Error", "ArgumentError", "DtypeError", "OutOfMemoryError", "NotAvailableError"]


def dequantize(codes, scales, format, group=0):
    """The float32 values that rms_norm_quant's (codes, scales) in `format` (and `group`)
    stand for: of the codes' shape for int8, fp8_e4m3 and mxfp8, (*leading, d) for the
    blocks of q8_0, q8_1, q8_k and mxfp4; int8 and fp8_e4m3 scales of uint8 are E8M0 bytes
    (the C library's RMSNORM_QUANT_SCALE_E8M0). Decoded from the formats' definitions in
    numpy."""
    import numpy

    from . import _quant

    return _quant.dequantize(codes, scales, format, group, _quant.Ops(numpy))


def __getattr__(name):
    if name == "torch":  # imported on first use: numpy-only users never import torch
        return _import_module(".torch", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
