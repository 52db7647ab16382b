"""rmsnorm - RMSNorm and LayerNorm forward and backward from librmsnorm, for numpy
arrays here and for CPU torch tensors in rmsnorm.torch (imported on first use).

    import numpy as np, rmsnorm
    y, rstd = rmsnorm.rms_norm(x, x.shape[-1:], weight, return_rstd=True)
    dx, dw, _ = rmsnorm.rms_norm_backward(dy, x, x.shape[-1:], weight, rstd=rstd)
    y, h = rmsnorm.fused_add_rms_norm(u, h, h.shape[-1:], weight)   # h + u, then RMSNorm
    z = rmsnorm.rms_norm_linear(x, w_matrix, weight)                # RMSNorm(x) @ w_matrix
    q, scale = rmsnorm.rms_norm_int8(x, x.shape[-1:], weight)      # int8, per-row scale
"""

from ._capi import (
    ArgumentError,
    DtypeError,
    Error,
    NotAvailableError,
    OutOfMemoryError,
    cpu_features,
    get_num_threads,
    isa,
    set_num_threads,
)
from ._capi import version as library_version
from ._numpy import (
    fused_add_rms_norm,
    fused_add_rms_norm_backward,
    layer_norm,
    layer_norm_backward,
    rms_norm,
    rms_norm_backward,
    rms_norm_fp8,
    rms_norm_int8,
    rms_norm_linear,
    rms_norm_linear_backward,
)
from ._capi import linear_available

__version__ = library_version()

__all__ = [
    "rms_norm",
    "rms_norm_backward",
    "layer_norm",
    "layer_norm_backward",
    "fused_add_rms_norm",
    "fused_add_rms_norm_backward",
    "rms_norm_linear",
    "rms_norm_linear_backward",
    "linear_available",
    "rms_norm_int8",
    "rms_norm_fp8",
    "set_num_threads",
    "get_num_threads",
    "isa",
    "cpu_features",
    "library_version",
    "Error",
    "ArgumentError",
    "DtypeError",
    "OutOfMemoryError",
    "NotAvailableError",
]


def __getattr__(name):
    # `rmsnorm.torch` without importing torch for numpy-only users.
    if name == "torch":
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
