"""rmsnorm - RMSNorm and LayerNorm forward and backward from librmsnorm, for numpy
arrays here and for CPU torch tensors in rmsnorm.torch (imported on first use).

    import numpy as np, rmsnorm
    y, rstd = rmsnorm.rms_norm(x, x.shape[-1:], weight, return_rstd=True)
    dx, dw, _ = rmsnorm.rms_norm_backward(dy, x, x.shape[-1:], weight, rstd=rstd)
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
from ._numpy import layer_norm, layer_norm_backward, rms_norm, rms_norm_backward

__version__ = library_version()

__all__ = [
    "rms_norm",
    "rms_norm_backward",
    "layer_norm",
    "layer_norm_backward",
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
