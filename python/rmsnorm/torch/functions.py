"""rmsnorm.torch.functions - the functions of rmsnorm.torch, one per row of the op table
(rmsnorm/_ops.py) that torch has: each calls its torch.ops.rmsnorm op (the compiled eager
entry point, or torch.ops when tracing), plus dequantize and cos_sin_table. Importing it
compiles (once) and loads the ops and their fake kernels. rmsnorm.torch re-exports all."""

from __future__ import annotations

from typing import Sequence, Union

import torch

from .._torch_build import load as _load_compiled

_C = _load_compiled()  # ImportError saying why when it cannot be compiled or loaded

from .. import _torch_fake  # noqa: E402,F401  (the fake kernels)
from .._ops import FNS as _FNS  # noqa: E402

__all__ = [fn.name for fn in _FNS if fn.where != "NUMPY"] + ["dequantize", "cos_sin_table"]

_Shape = Union[int, Sequence[int], torch.Size]
_ops = torch.ops.rmsnorm


def _ns(normalized_shape):
    """normalized_shape as the ops' SymInt[] (an int means a 1-D shape, as in torch)."""
    if isinstance(normalized_shape, (int, torch.SymInt)):
        return (normalized_shape,)
    return normalized_shape


def _variant(op: str, overload: str, test: str) -> tuple:
    """The lines that call op.overload (under `if test:`): (eager, traced). Eager: the
    compiled entry point, the same op without torch's per-argument Python conversion (then
    torch.ops when it returns NotImplemented: an argument only torch.ops can take); traced
    (under torch.compile/export): the torch.ops call."""
    schema = getattr(getattr(_ops, op), overload or "default")._schema
    args = schema.arguments
    handle = _C.op(f"rmsnorm::{op}", overload)
    fast = ", ".join(a.name for a in args)
    slow = ", ".join(
        (f"{a.name}=" if a.kwarg_only else "")
        + (f"_ns({a.name})" if a.name == "normalized_shape" else a.name) for a in args)
    slow = f"_ops.{op}{'.' + overload if overload else ''}({slow})"
    written = [a.name for a in args if a.alias_info is not None and a.alias_info.is_write]
    ind = "        " if test else "    "
    head = [f"    if {test}:"] if test else []
    if written:
        ret = f"{ind}return {', '.join(written)}"
        return (head + [f"{ind}if _C.call({handle}, {fast}) is NotImplemented:",
                        f"{ind}    {slow}", ret], head + [f"{ind}{slow}", ret])
    slow = f"return {'tuple' if len(schema.returns) > 1 else ''}({slow})"
    return (head + [f"{ind}if (r := _C.call({handle}, {fast})) is NotImplemented:",
                    f"{ind}    {slow}", f"{ind}return r"], head + [f"{ind}{slow}"])


def _define(fn) -> None:
    """rmsnorm.torch.<fn.name> from its row of the op table: its signature (the numpy
    function's without return_*), then with __torch_function__ subclasses or modes their
    handler, then the op variant its arguments ask for."""
    params = [p for p in fn.params if not p.name.startswith("return_")]
    sig = [p.name if p.default is None else f"{p.name}={p.default}" for p in params]
    kw = next((i for i, p in enumerate(params) if p.kwonly), len(params))
    sig[kw:kw] = ["*"] if kw < len(params) else []
    names = {p.name for p in params}
    # __torch_function__ looks at the op's Tensor arguments (and out=)
    schema = getattr(_ops, fn.op).default._schema
    tensors = [a.name for a in schema.arguments if "Tensor" in str(a.type)]
    tensors += ["out"] if "out" in names else []
    call = ", ".join(p.name if not p.kwonly else f"{p.name}={p.name}" for p in params)
    variants = [_variant(fn.op, "out", "out is not None")] if "out" in names else []
    variants += [_variant(fn.op + "_inplace", "", "inplace")] if "inplace" in names else []
    variants += [_variant(fn.op, "", "")]
    # one is_compiling() a call: its traced lines, else __torch_function__, else eager
    lines = [f"def {fn.name}({', '.join(sig)}):", "    if _compiling():"]
    lines += ["    " + line for _, traced in variants for line in traced]
    lines += [f"    if _has_tf({', '.join(tensors)}):",
              f"        return _handle_tf({fn.name}, ({', '.join(tensors)},), {call})"]
    lines += [line for eager, _ in variants for line in eager]
    scope = {"_ops": _ops, "_C": _C, "_ns": _ns, "_compiling": torch.compiler.is_compiling,
             "_has_tf": torch._C._has_torch_function_variadic,
             "_handle_tf": torch.overrides.handle_torch_function}
    exec(compile("\n".join(lines), f"<rmsnorm.torch.{fn.name}>", "exec"), scope)
    f = scope[fn.name]
    f.__module__, f.__doc__ = "rmsnorm.torch", f"{fn.doc}\n\nOp rmsnorm::{fn.op}."
    globals()[fn.name] = f


for _fn in _FNS:
    if _fn.where in ("TORCH", "BOTH"):
        _define(_fn)


def dequantize(codes, scales, format, group=0):
    """rmsnorm.dequantize for tensors: the float32 values of rms_norm_quant's (codes,
    scales), computed with torch operations."""
    from .. import _quant

    return _quant.dequantize(codes, scales, format, group, _quant.Ops(torch))


def cos_sin_table(cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """qk_norm_rope's cos_sin from transformers' position embeddings: the (cos, sin) a rotary
    embedding module returns, of shape (*, rotary_dim) with the two halves equal (NeoX style,
    cat(freqs, freqs)), one row per token. Returns (tokens, rotary_dim), row t =
    cat(cos[t, :rotary_dim/2], sin[t, :rotary_dim/2]), float32 (float64 for float64 cos);
    pass it with positions=None to qk_norm_rope of an input whose leading dims are cos's
    (expand cos and sin to them first when they broadcast, as over the batch). A bfloat16
    cos converts exactly, so the table holds the values transformers rotates with."""
    half = cos.shape[-1] // 2
    dtype = torch.float64 if cos.dtype == torch.float64 else torch.float32
    return torch.cat((cos[..., :half], sin[..., :half]), dim=-1).to(dtype).reshape(-1, 2 * half)
