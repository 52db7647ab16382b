"""rmsnorm - RMSNorm and LayerNorm forward and backward from librmsnorm, for numpy
arrays here and for CPU torch tensors in rmsnorm.torch (imported on first use).

    import numpy as np, rmsnorm
    y, rstd = rmsnorm.rms_norm(x, x.shape[-1:], weight, return_rstd=True)
    dx, dw, _ = rmsnorm.rms_norm_backward(dy, x, x.shape[-1:], weight, rstd=rstd)
    y, h = rmsnorm.fused_add_rms_norm(u, h, h.shape[-1:], weight)   # h + u, then RMSNorm
    q = rmsnorm.qk_norm(qkv[:, 0], q_weight)                        # every head of Q
    z = rmsnorm.rms_norm_linear(x, w_matrix, weight)                # RMSNorm(x) @ w_matrix
    q, scale = rmsnorm.rms_norm_int8(x, x.shape[-1:], weight)      # int8, per-row scale

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

from ._native import (  # noqa: E402
    cache_info, cpu_features, empty_cache, fused_add_rms_norm, fused_add_rms_norm_backward,
    get_num_threads, isa, layer_norm, layer_norm_backward, library_version, linear_available,
    qk_norm, qk_norm_backward, rms_norm, rms_norm_backward, rms_norm_fp8, rms_norm_int8,
    rms_norm_linear, rms_norm_linear_backward, set_cache_limit, set_num_threads,
)

__version__ = library_version()

__all__ = [
    "rms_norm", "rms_norm_backward", "layer_norm", "layer_norm_backward",
    "fused_add_rms_norm", "fused_add_rms_norm_backward", "qk_norm", "qk_norm_backward",
    "rms_norm_linear", "rms_norm_linear_backward", "linear_available",
    "rms_norm_int8", "rms_norm_fp8",
    "set_num_threads", "get_num_threads", "isa", "cpu_features", "library_version",
    "cache_info", "set_cache_limit", "empty_cache",
    "Error", "ArgumentError", "DtypeError", "OutOfMemoryError", "NotAvailableError",
]


def __getattr__(name):
    if name == "torch":  # imported on first use: numpy-only users never import torch
        return _import_module(".torch", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
