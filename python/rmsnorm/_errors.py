"""_errors.py - the exceptions raised for a status from the C library (the
numpy functions raise them; rmsnorm.torch raises torch's own ValueError /
TypeError with the same message)."""


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
    """An invalid size, stride, eps, partial fraction, flag or buffer overlap, a position or
    cache slot out of range (RMSNORM_ERROR_OUT_OF_RANGE), or a rotation that cannot be
    (RMSNORM_ERROR_BAD_ROPE)."""


class DtypeError(Error, TypeError):
    """An unknown dtype or a parameter dtype the library does not take."""


class OutOfMemoryError(Error, MemoryError):
    """The library could not allocate its scratch memory."""


class NotAvailableError(Error, RuntimeError):
    """A kernel set this build or CPU lacks, or the linear functions in a build
    without a BLAS."""


for _cls in (Error, ArgumentError, DtypeError, OutOfMemoryError, NotAvailableError):
    _cls.__module__ = "rmsnorm"
