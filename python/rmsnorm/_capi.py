"""_capi.py - the one module that touches the C library: loading it with ctypes,
the prototypes of include/rmsnorm.h, status codes turned into exceptions, and
one rmsnorm_context per Python thread.

ctypes.CDLL releases the GIL for the length of every foreign call, so several
Python threads run the C code at once, each on its own context.
"""

from __future__ import annotations

import ctypes
import os
import threading
import weakref

# ---- constants, pinned by include/rmsnorm.h ---------------------------------

F32, F16, BF16, F64 = 0, 1, 2, 3
DTYPE_NAMES = {F32: "float32", F16: "float16", BF16: "bfloat16", F64: "float64"}

FLAG_EPS_OUTSIDE = 1 << 0
FLAG_WEIGHT_OFFSET = 1 << 1
FLAG_ROUND_BEFORE_WEIGHT = 1 << 2
FLAG_ACCUMULATE = 1 << 3

Q_INT8, Q_FP8_E4M3 = 0, 1  # rmsnorm_qtype

OK = 0
ERROR_BAD_DTYPE = 6
ERROR_OUT_OF_MEMORY = 9
ERROR_NOT_AVAILABLE = 11


# ---- errors ------------------------------------------------------------------


class Error(Exception):
    """A status other than RMSNORM_OK from the C library.

    ``status`` is the numeric code, ``name`` its enumerator name. The concrete
    classes also derive from the matching built-in exception, so ``except
    ValueError`` catches bad arguments.
    """

    def __init__(self, message: str, status: int, name: str):
        super().__init__(message)
        self.status = status
        self.name = name


class ArgumentError(Error, ValueError):
    """An invalid size, stride, eps, partial fraction, flag or buffer overlap."""


class DtypeError(Error, TypeError):
    """An unknown dtype or a parameter dtype the library does not take."""


class OutOfMemoryError(Error, MemoryError):
    """The library could not allocate its scratch memory."""


class NotAvailableError(Error, RuntimeError):
    """A kernel set this build or CPU lacks, or the linear functions in a build
    without a BLAS."""


for _cls in (Error, ArgumentError, DtypeError, OutOfMemoryError, NotAvailableError):
    _cls.__module__ = "rmsnorm"


# ---- loading -----------------------------------------------------------------

_HERE = os.path.dirname(os.path.abspath(__file__))


def _library_path() -> str:
    override = os.environ.get("RMSNORM_LIBRARY")
    if override:
        return override
    return os.path.join(_HERE, "_librmsnorm.so")


def _load() -> ctypes.CDLL:
    path = _library_path()
    try:
        return ctypes.CDLL(path)
    except OSError as err:
        raise ImportError(
            f"rmsnorm: cannot load the C library {path!r} ({err}). Install the package "
            "with `pip install ./python` from the repository root, or point the "
            "RMSNORM_LIBRARY environment variable at a built librmsnorm.so."
        ) from None


class Config(ctypes.Structure):
    """struct rmsnorm_config."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("dtype", ctypes.c_int),
        ("param_dtype", ctypes.c_int),
        ("eps", ctypes.c_double),
        ("partial", ctypes.c_double),
        ("flags", ctypes.c_uint),
    ]


lib = _load()

_vp, _sz, _int, _uint = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_uint
_cfgp = ctypes.POINTER(Config)


def _proto(name: str, restype, *argtypes):
    fn = getattr(lib, name)
    fn.restype = restype
    fn.argtypes = list(argtypes)
    return fn


_version_string = _proto("rmsnorm_version_string", ctypes.c_char_p)
_status_message = _proto("rmsnorm_status_message", ctypes.c_char_p, _int)
_status_name = _proto("rmsnorm_status_name", ctypes.c_char_p, _int)
_context_create = _proto("rmsnorm_context_create", _int, ctypes.POINTER(_vp))
_context_free = _proto("rmsnorm_context_free", None, _vp)
_cpu_features = _proto("rmsnorm_cpu_features", _int, ctypes.POINTER(_uint))
_isa_name = _proto("rmsnorm_isa_name", ctypes.c_char_p, _int)
_context_get_isa = _proto("rmsnorm_context_get_isa", _int, _vp, ctypes.POINTER(_int))
_context_set_threads = _proto("rmsnorm_context_set_threads", _int, _vp, _int)
_context_get_threads = _proto("rmsnorm_context_get_threads", _int, _vp, ctypes.POINTER(_int))
_default_eps = _proto("rmsnorm_default_eps", _int, _int, ctypes.POINTER(ctypes.c_double))
_config_init_size = _proto("rmsnorm_config_init_size", _int, _cfgp, _sz, _int)
# The four operations. Called with a context handle, a config() pointer, sizes,
# and pointers as Python ints (None for NULL), strides in elements; they return
# the status, to pass to check() when not zero.
# (ctx, cfg, rows, d, x, ldx, weight, bias, y, ldy, rstd)
rms_forward = _proto("rmsnorm_forward", _int, _vp, _cfgp, _sz, _sz, _vp, _sz, _vp, _vp, _vp, _sz, _vp)
# (ctx, cfg, rows, d, x, ldx, dy, lddy, weight, rstd, dx, lddx, dweight, dbias)
rms_backward = _proto(
    "rmsnorm_backward", _int, _vp, _cfgp, _sz, _sz, _vp, _sz, _vp, _sz, _vp, _vp, _vp, _sz, _vp, _vp
)
# (ctx, cfg, rows, d, x, ldx, weight, bias, y, ldy, mean, rstd)
ln_forward = _proto(
    "rmsnorm_layernorm_forward", _int, _vp, _cfgp, _sz, _sz, _vp, _sz, _vp, _vp, _vp, _sz, _vp, _vp
)
# (ctx, cfg, rows, d, x, ldx, dy, lddy, weight, mean, rstd, dx, lddx, dweight, dbias)
ln_backward = _proto(
    "rmsnorm_layernorm_backward",
    _int, _vp, _cfgp, _sz, _sz, _vp, _sz, _vp, _sz, _vp, _vp, _vp, _vp, _sz, _vp, _vp,
)


# The fused operations of a transformer block (include/rmsnorm.h, "Inside a
# transformer block"), called as the four above.
# (ctx, cfg, rows, d, h, ldh, u, ldu, weight, bias, y, ldy, rstd)
add_forward = _proto(
    "rmsnorm_add_forward", _int, _vp, _cfgp, _sz, _sz, _vp, _sz, _vp, _sz, _vp, _vp, _vp, _sz, _vp
)
# (ctx, cfg, rows, d, h, ldh, dy, lddy, dres, lddres, weight, rstd, dh, lddh, dweight, dbias)
add_backward = _proto(
    "rmsnorm_add_backward",
    _int, _vp, _cfgp, _sz, _sz, _vp, _sz, _vp, _sz, _vp, _sz, _vp, _vp, _vp, _sz, _vp, _vp,
)
# (ctx, cfg, rows, d, x, ldx, weight, bias, qtype, static_scale, q, ldq, scale, rstd)
forward_quant = _proto(
    "rmsnorm_forward_quant",
    _int, _vp, _cfgp, _sz, _sz, _vp, _sz, _vp, _vp, _int, _vp, _vp, _sz, _vp, _vp,
)
_linear_available = _proto("rmsnorm_linear_available", _int)
# (cfg, d, n, weight, w, ldw, w_folded, ldwf)
fold_weight = _proto("rmsnorm_fold_weight", _int, _cfgp, _sz, _sz, _vp, _vp, _sz, _vp, _sz)
# (ctx, cfg, rows, d, n, x, ldx, w_folded, ldwf, bias, z, ldz, rstd)
linear_forward = _proto(
    "rmsnorm_linear_forward",
    _int, _vp, _cfgp, _sz, _sz, _sz, _vp, _sz, _vp, _sz, _vp, _vp, _sz, _vp,
)
# (ctx, cfg, rows, d, n, x, ldx, weight, w, ldw, w_folded, ldwf, dz, lddz, dx, lddx,
#  dweight, dw, lddw, dbias)
linear_backward = _proto(
    "rmsnorm_linear_backward",
    _int, _vp, _cfgp, _sz, _sz, _sz, _vp, _sz, _vp, _vp, _sz, _vp, _sz, _vp, _sz, _vp, _sz,
    _vp, _vp, _sz, _vp,
)


def linear_available() -> bool:
    """Whether the rmsnorm_linear_* functions can run (a BLAS was built in)."""
    return _linear_available() == OK


def status_name(status: int) -> str:
    return _status_name(status).decode()


def status_message(status: int) -> str:
    return _status_message(status).decode()


def check(status: int, what: str) -> None:
    """Raises the exception for a status other than RMSNORM_OK."""
    if status == OK:
        return
    name = status_name(status)
    cls = {
        ERROR_BAD_DTYPE: DtypeError,
        ERROR_OUT_OF_MEMORY: OutOfMemoryError,
        ERROR_NOT_AVAILABLE: NotAvailableError,
    }.get(status, ArgumentError)
    raise cls(f"{what}: {status_message(status)} ({name})", status, name)


def version() -> str:
    """The version string of the loaded C library."""
    return _version_string().decode()


def default_eps(dtype: int) -> float:
    """torch's eps for eps=None: float32's machine epsilon, float64's for fp64 data."""
    eps = ctypes.c_double()
    check(_default_eps(dtype, ctypes.byref(eps)), "rmsnorm_default_eps")
    return eps.value


DEFAULT_EPS = {dt: default_eps(dt) for dt in DTYPE_NAMES}

# rmsnorm_config_init's result per dtype: each configuration copies one and
# changes what differs.
_CONFIG_TEMPLATES = {}
for _dt in DTYPE_NAMES:
    _cfg = Config()
    check(_config_init_size(ctypes.byref(_cfg), ctypes.sizeof(_cfg), _dt), "rmsnorm_config_init")
    _CONFIG_TEMPLATES[_dt] = bytes(_cfg)

_CONFIGS = {}  # (dtype, param_dtype, eps, partial, flags) -> pointer to a Config


def config(dtype: int, param_dtype: int, eps, partial: float, flags: int):
    """A pointer to a filled rmsnorm_config, cached: the library only reads it.
    eps None means the library's default for dtype."""
    key = (dtype, param_dtype, eps, partial, flags)
    try:
        return _CONFIGS[key]
    except (KeyError, TypeError):
        pass
    cfg = Config.from_buffer_copy(_CONFIG_TEMPLATES[dtype])
    cfg.param_dtype = param_dtype
    cfg.eps = DEFAULT_EPS[dtype] if eps is None else float(eps)
    cfg.partial = float(partial)
    cfg.flags = flags
    ptr = ctypes.pointer(cfg)
    if len(_CONFIGS) > 256:
        _CONFIGS.clear()
    try:
        _CONFIGS[key] = ptr
    except TypeError:
        pass
    return ptr


# ---- contexts: one per Python thread ----------------------------------------

# Threads a call may use when the caller does not say (0: the library default,
# the number of online CPUs). Changed by set_num_threads().
_default_threads = 0


class _Context:
    """An rmsnorm_context owned by one Python thread, freed with it."""

    __slots__ = ("handle", "threads", "__weakref__")

    def __init__(self):
        handle = _vp()
        check(_context_create(ctypes.byref(handle)), "rmsnorm_context_create")
        self.handle = handle.value
        self.threads = None  # what set_threads was last given

    def use_threads(self, threads: int) -> None:
        if threads != self.threads:
            check(_context_set_threads(self.handle, threads), "rmsnorm_context_set_threads")
            self.threads = threads

    def __del__(self, _free=_context_free):
        if self.handle:
            _free(self.handle)
            self.handle = None


_local = threading.local()
_all_contexts: "weakref.WeakSet[_Context]" = weakref.WeakSet()


def context(threads=None) -> int:
    """The calling thread's context handle, set to run `threads` threads
    (None: the process-wide setting of set_num_threads)."""
    ctx = getattr(_local, "ctx", None)
    if ctx is None:
        ctx = _local.ctx = _Context()
        _all_contexts.add(ctx)
    ctx.use_threads(_default_threads if threads is None else threads)
    return ctx.handle


def _after_fork_in_child() -> None:
    # The parent's contexts may hold thread pools whose threads do not exist in
    # the child (freeing one would wait for them forever) or a mutex another
    # thread held: leak them and start afresh.
    global _local
    for ctx in list(_all_contexts):
        ctx.handle = None
    _all_contexts.clear()
    _local = threading.local()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def set_num_threads(threads: int) -> None:
    """Sets the most threads one call of the numpy functions may use, for every
    Python thread; 0 restores the default (the number of online CPUs). The
    rmsnorm.torch functions follow torch.get_num_threads() instead."""
    global _default_threads
    threads = int(threads)
    context(threads)  # the library's own range check, raised here and now
    _default_threads = threads


def get_num_threads() -> int:
    """The most threads one call of the numpy functions may use."""
    n = _int()
    check(_context_get_threads(context(), ctypes.byref(n)), "rmsnorm_context_get_threads")
    return n.value


def isa() -> str:
    """The kernel set the calling thread's context runs: "scalar", "avx2" or "avx512"."""
    value = _int()
    check(_context_get_isa(context(), ctypes.byref(value)), "rmsnorm_context_get_isa")
    return _isa_name(value.value).decode()


def cpu_features() -> list:
    """The CPU features the library detected (OS support checked)."""
    names = ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512bf16"]
    bits = _uint()
    check(_cpu_features(ctypes.byref(bits)), "rmsnorm_cpu_features")
    return [name for i, name in enumerate(names) if bits.value >> i & 1]


# ---- large outputs on transparent huge pages ---------------------------------
# A fresh output of tens of MiB costs more in first-touch page faults (one per
# 4 KiB page) than the normalization itself. Where the kernel's transparent
# huge pages are in "madvise" mode, advising a fresh, still untouched output
# makes those faults one per 2 MiB. Only memory this package has just allocated
# is advised, and failures are ignored: it is advice.
_HUGE = 2 << 20
_MADV_HUGEPAGE = 14  # Linux
_madvise = None
if os.uname().sysname == "Linux" and os.environ.get("RMSNORM_NO_HUGEPAGES") is None:
    try:
        _libc = ctypes.CDLL(None, use_errno=True)
        _madvise = _libc.madvise
        _madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _madvise.restype = ctypes.c_int
    except (OSError, AttributeError):
        _madvise = None


def advise_huge_pages(ptr: int, nbytes: int) -> None:
    """Advises the whole 2 MiB pages inside [ptr, ptr + nbytes) to be huge."""
    if _madvise is None or nbytes < 2 * _HUGE:
        return
    lo = (ptr + _HUGE - 1) & ~(_HUGE - 1)
    hi = (ptr + nbytes) & ~(_HUGE - 1)
    if hi > lo:
        _madvise(lo, hi - lo, _MADV_HUGEPAGE)
