"""rmsnorm.torch - the library for CPU torch tensors, as torch ops (docs/python.md).

Importing it registers the ops torch.ops.rmsnorm.* (rmsnorm._torch, compiled by the first
import against the running torch; fake kernels in rmsnorm._torch_fake), which work under
autograd (any order), torch.compile(fullgraph=True), torch.export, fake and meta tensors.
The functions here call those ops; the modules RMSNorm, LayerNorm, LlamaRMSNorm and
GemmaRMSNorm replace torch's and transformers', and patch(model) swaps a model's norms for
them in place. Calls run on up to torch.get_num_threads() threads (read on each call);
results do not depend on it. Sharded rows: rmsnorm.torch.distributed.
"""

from __future__ import annotations

import numbers
import warnings
from typing import Optional, Sequence, Union

import torch
from torch import nn

from .._torch_build import load as _load_compiled

_C = _load_compiled()  # ImportError saying why when it cannot be compiled or loaded

from .. import _torch_fake  # noqa: E402,F401  (the fake kernels)
from .._ops import FNS as _FNS  # noqa: E402

__all__ = [fn.name for fn in _FNS if fn.where != "NUMPY"] + [
    "dequantize", "RMSNorm", "LayerNorm", "LlamaRMSNorm", "GemmaRMSNorm", "patch"]

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
    f.__module__, f.__doc__ = __name__, f"{fn.doc}\n\nOp rmsnorm::{fn.op}."
    globals()[fn.name] = f


for _fn in _FNS:
    if _fn.where in ("TORCH", "BOTH"):
        _define(_fn)


def dequantize(codes, scales, format, group=0):
    """rmsnorm.dequantize for tensors: the float32 values of rms_norm_quant's (codes,
    scales), computed with torch operations."""
    from .. import _quant

    return _quant.dequantize(codes, scales, format, group, _quant.Ops(torch))


# ---- modules ---------------------------------------------------------------------------


def _param(module: nn.Module, name: str) -> Optional[torch.Tensor]:
    """module.<name> for the modules' forward: one dict read for a registered parameter
    (not Module.__getattr__), else the attribute (a parametrization, functional_call)."""
    p = module._parameters
    return p[name] if name in p else getattr(module, name)


class _AffineNorm(nn.Module):
    """What RMSNorm and LayerNorm share with torch's modules: normalized_shape,
    eps, the optional weight (ones) and bias (zeros), registered in torch's order."""

    __constants__ = ["normalized_shape", "eps", "elementwise_affine"]

    def __init__(self, normalized_shape: _Shape, eps: Optional[float], elementwise_affine: bool,
                 bias: bool, device, dtype) -> None:
        super().__init__()
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        for name, on in (("weight", elementwise_affine), ("bias", elementwise_affine and bias)):
            self.register_parameter(name, nn.Parameter(torch.empty(
                self.normalized_shape, device=device, dtype=dtype)) if on else None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


class RMSNorm(_AffineNorm):
    """torch.nn.RMSNorm on the C library: the same constructor (with one more
    keyword, bias), parameter names, state_dict keys and numerics."""

    def __init__(self, normalized_shape: _Shape, eps: Optional[float] = None,
                 elementwise_affine: bool = True, device=None, dtype=None, *,
                 bias: bool = False) -> None:
        super().__init__(normalized_shape, eps, elementwise_affine, bias, device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():  # TorchScript compiles this branch only
            return torch.ops.rmsnorm.rms_norm(x, list(self.normalized_shape), self.weight,
                                              self.eps, bias=self.bias)
        return rms_norm(x, self.normalized_shape, _param(self, "weight"), self.eps,
                        bias=_param(self, "bias"))


class LayerNorm(_AffineNorm):
    """torch.nn.LayerNorm on the C library: the same constructor, parameter names,
    state_dict keys and numerics."""

    def __init__(self, normalized_shape: _Shape, eps: float = 1e-5,
                 elementwise_affine: bool = True, bias: bool = True, device=None,
                 dtype=None) -> None:
        super().__init__(normalized_shape, eps, elementwise_affine, bias, device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():
            return torch.ops.rmsnorm.layer_norm(x, list(self.normalized_shape), self.weight,
                                                self.bias, self.eps)
        return layer_norm(x, self.normalized_shape, _param(self, "weight"), _param(self, "bias"),
                          self.eps)


class LlamaRMSNorm(nn.Module):
    """transformers' LlamaRMSNorm (also Mistral's, Qwen2's, ...): weight starts at ones,
    attribute variance_epsilon. Numerics: normalize in float32, round to the input dtype,
    then multiply by the weight (HF's order; round_before_weight); a weight of another dtype
    than the input gives its promoted dtype, as HF.

    In float16/bfloat16 the result can differ from HF's where HF's float32 row statistic
    differs from ours in its last bits (docs/python.md, "HF numerics"). exact_hf=True
    computes as HF does, with torch's own ops: the same bits as transformers' module."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, *, exact_hf: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps
        self.exact_hf = exact_hf

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():
            weight = self.weight
            if self.exact_hf:
                return hf_rms_norm(hidden_states, weight, self.variance_epsilon)
            if weight.dtype == hidden_states.dtype:
                return torch.ops.rmsnorm.rms_norm(hidden_states, weight.shape, weight,
                                                  self.variance_epsilon, round_before_weight=True)
            return weight * torch.ops.rmsnorm.rms_norm(hidden_states, weight.shape, None,
                                                       self.variance_epsilon)
        weight = _param(self, "weight")
        if self.exact_hf:
            return hf_rms_norm(hidden_states, weight, self.variance_epsilon)
        if weight.dtype == hidden_states.dtype:
            return rms_norm(hidden_states, weight.shape, weight, self.variance_epsilon,
                            round_before_weight=True)
        # HF's `weight * normalized.to(input_dtype)` promotes: keep its dtype rules.
        return weight * rms_norm(hidden_states, weight.shape, None, self.variance_epsilon)

    def extra_repr(self) -> str:
        hf = ", exact_hf=True" if self.exact_hf else ""
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}{hf}"


def hf_rms_norm(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm.forward, operation for operation (the reference
    exact_hf=True keeps)."""
    input_dtype = hidden_states.dtype
    h = hidden_states.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(input_dtype)


class GemmaRMSNorm(nn.Module):
    """transformers' GemmaRMSNorm (Gemma 1-3): weight starts at zeros, attribute
    eps; y = x * rstd * (1 + weight) computed in float32 and rounded once to the
    input dtype (offset=True)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():
            return torch.ops.rmsnorm.rms_norm(x, self.weight.shape, self.weight, self.eps,
                                              offset=True)
        weight = _param(self, "weight")
        return rms_norm(x, weight.shape, weight, self.eps, offset=True)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}"


# ---- patch(model) ------------------------------------------------------------------------

_OURS = (RMSNorm, LayerNorm, LlamaRMSNorm, GemmaRMSNorm)


def _hf_candidate(module: nn.Module, exact_hf: bool) -> Optional[nn.Module]:
    """Ours in place of an HF-style RMSNorm (a class named *RMSNorm holding only a
    1-D weight), Gemma's form when the class name says Gemma, else Llama's."""
    params = dict(module.named_parameters(recurse=False))
    weight = params.get("weight")
    if (set(params) != {"weight"} or weight.dim() != 1 or list(module.buffers())
            or list(module.children())):
        return None
    eps = [getattr(module, name, None) for name in ("variance_epsilon", "eps")]
    eps = [float(v) for v in eps if isinstance(v, numbers.Real) and not isinstance(v, bool)]
    if not eps:
        return None
    gemma = "gemma" in type(module).__name__.lower()
    new = GemmaRMSNorm(weight.shape[0], eps[0]) if gemma else \
        LlamaRMSNorm(weight.shape[0], eps[0], exact_hf=exact_hf)
    new.weight = weight
    return new


def _same_numerics(old: nn.Module, new: nn.Module) -> bool:
    """Runs both modules on one random float32 input, with a random weight put in for the
    check (all ones or zeros could hide a difference), and compares; the global RNG is kept."""
    weight = old.weight
    gen = torch.Generator().manual_seed(0x5eed)
    x = torch.randn(3, weight.shape[0], generator=gen)
    saved = weight.detach().clone()
    try:
        with torch.no_grad():
            weight.copy_(torch.randn(weight.shape, generator=gen).to(weight.dtype))
            a, b = old(x), new(x)
    except Exception:  # a forward that needs more than one input, or another shape
        return False
    finally:
        with torch.no_grad():
            weight.copy_(saved)
    return (isinstance(a, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype
            and torch.allclose(a, b, rtol=1e-5, atol=1e-6))


def _replacement(module: nn.Module, layer_norm: bool, verify: bool,
                 exact_hf: bool) -> Optional[nn.Module]:
    if isinstance(module, _OURS):
        if isinstance(module, LlamaRMSNorm):
            module.exact_hf = exact_hf
        return None
    for p in module.parameters(recurse=False):
        if p.device.type != "cpu":
            raise TypeError(
                f"rmsnorm.torch.patch: {type(module).__name__} has parameters on {p.device}; "
                "rmsnorm.torch runs on CPU tensors only (patch the model on the CPU)")
    if isinstance(module, nn.RMSNorm) and type(module).forward is nn.RMSNorm.forward:
        new = RMSNorm(module.normalized_shape, module.eps, module.elementwise_affine)
        new.weight = module.weight
        return new
    if (layer_norm and isinstance(module, nn.LayerNorm)
            and type(module).forward is nn.LayerNorm.forward):
        new = LayerNorm(module.normalized_shape, module.eps, module.elementwise_affine,
                        bias=module.bias is not None)
        new.weight, new.bias = module.weight, module.bias
        return new
    if not type(module).__name__.endswith("RMSNorm"):
        return None
    new = _hf_candidate(module, exact_hf)
    if new is None or (verify and not _same_numerics(module, new)):
        warnings.warn(
            f"rmsnorm.torch.patch: left {type(module).__module__}.{type(module).__name__} "
            "in place: its parameters or numerics are not those of Llama's or Gemma's RMSNorm",
            stacklevel=3,
        )
        return None
    return new


def patch(model: nn.Module, *, layer_norm: bool = False, verify: bool = True,
          exact_hf: bool = False) -> nn.Module:
    """Replaces, in place, every RMSNorm-like module of `model` with ours: torch.nn.RMSNorm
    with rmsnorm.torch.RMSNorm; classes named *RMSNorm in the style of transformers (a 1-D
    `weight` and an eps in `variance_epsilon` or `eps`) with LlamaRMSNorm, or GemmaRMSNorm
    when the class name contains "Gemma"; with layer_norm=True also torch.nn.LayerNorm with
    rmsnorm.torch.LayerNorm. The new modules hold the same Parameter objects (optimizers and
    tied weights are unaffected) and keep training/eval mode.

    verify: first run each HF-style module and its replacement on a random input and keep
    the original (with a warning) unless they agree. exact_hf: the LlamaRMSNorm
    replacements keep HF's numerics bit for bit. Returns the model, or the replacement when
    the model itself is such a module.
    """
    done = {}
    for module in list(model.modules()):  # each module once, however often it is shared
        new = _replacement(module, layer_norm, verify, exact_hf)
        if new is not None:
            new.train(module.training)
            done[id(module)] = new
    for module in list(model.modules()):
        for name, child in list(module._modules.items()):
            if child is not None and id(child) in done:
                module._modules[name] = done[id(child)]
    return done.get(id(model), model)
