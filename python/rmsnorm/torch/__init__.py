"""rmsnorm.torch - the library for CPU torch tensors, as torch ops (docs/python.md).

Importing it registers the ops torch.ops.rmsnorm.* (rmsnorm._torch, compiled by the first
import against the running torch; fake kernels in rmsnorm._torch_fake), which work under
autograd (any order), torch.compile(fullgraph=True), torch.export, fake and meta tensors.
The functions here call those ops; the modules RMSNorm, LayerNorm, LlamaRMSNorm,
GemmaRMSNorm and the gated RMSNormGated (MambaRMSNormGated, Qwen3NextRMSNormGated) replace
torch's and transformers', and patch(model) swaps a model's norms for them in place (and
with sandwich=True fuses Gemma 2/3's sandwich norms). Calls run on up to
torch.get_num_threads() threads (read on each call); results do not depend on it. Sharded
rows: rmsnorm.torch.distributed.
"""

from __future__ import annotations

import inspect
import numbers
import sys
import types
import warnings
from typing import Optional, Sequence, Union

import torch
from torch import nn

from .._torch_build import load as _load_compiled

_C = _load_compiled()  # ImportError saying why when it cannot be compiled or loaded

from .. import _torch_fake  # noqa: E402,F401  (the fake kernels)
from .._ops import FNS as _FNS  # noqa: E402

__all__ = [fn.name for fn in _FNS if fn.where != "NUMPY"] + [
    "dequantize", "cos_sin_table", "RMSNorm", "LayerNorm", "LlamaRMSNorm", "GemmaRMSNorm",
    "RMSNormGated", "MambaRMSNormGated", "Qwen3NextRMSNormGated", "patch"]

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


_ACTIVATIONS = {"silu": torch.nn.functional.silu, "swish": torch.nn.functional.silu,
                "sigmoid": torch.sigmoid}


class RMSNormGated(nn.Module):
    """Gated RMSNorm (rmsnorm::gated_rms_norm) with transformers' attribute names: weight
    (ones), variance_epsilon, group_size (None: the whole row), norm_before_gate and
    activation ('silu' or 'sigmoid'). forward(hidden_states, gate=None):

    gate first (norm_before_gate=False, Mamba2's): y = rms_norm(x * act(gate)) * weight, the
    statistic per group of group_size columns; norm first (Qwen3-Next's): y = rms_norm(x) *
    weight * act(gate). gate None: no gate. hf_rounding=True rounds as transformers' modules
    do in float16/bfloat16 (MambaRMSNormGated, Qwen3NextRMSNormGated: the normalized value
    to the input dtype before the weight, ...); False computes in float32 and rounds once
    (KimiLinearRMSNormGated's strict float32). A weight of another dtype than the input gives
    the promoted dtype, as transformers. exact_hf=True computes as transformers does with
    torch's own ops (hf_gated_rms_norm): the same bits, at their speed."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, *, group_size: Optional[int] = None,
                 norm_before_gate: bool = False, activation: str = "silu",
                 hf_rounding: bool = True, exact_hf: bool = False) -> None:
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be 'silu' or 'sigmoid', got {activation!r}")
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps
        self.group_size = group_size
        self.norm_before_gate = norm_before_gate
        self.activation = activation
        self.hf_rounding = hf_rounding
        self.exact_hf = exact_hf

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, hidden_states: torch.Tensor,
                gate: Optional[torch.Tensor] = None) -> torch.Tensor:
        weight = _param(self, "weight")
        eps, group = self.variance_epsilon, self.group_size
        if self.exact_hf:
            return hf_gated_rms_norm(hidden_states, gate, weight, eps, group_size=group,
                                     norm_before_gate=self.norm_before_gate,
                                     activation=self.activation, hf_rounding=self.hf_rounding)
        d = hidden_states.shape[-1]
        group = 0 if group is None or group == d else group
        if gate is None:  # RMSNorm per group, then the weight
            if not self.hf_rounding:
                return hf_gated_rms_norm(hidden_states, None, weight, eps, group_size=group,
                                         hf_rounding=False)
            return weight * _grouped_rms_norm(hidden_states, group, eps)
        if weight.dtype == hidden_states.dtype or not self.hf_rounding:
            return gated_rms_norm(hidden_states, gate, weight, eps, group_size=group,
                                  norm_before_gate=self.norm_before_gate,
                                  activation=self.activation,
                                  round_before_weight=self.hf_rounding)
        # transformers' `weight * normalized.to(input_dtype)` promotes: keep its dtype rules
        if not self.norm_before_gate:
            return weight * gated_rms_norm(hidden_states, gate, None, eps, group_size=group,
                                           activation=self.activation, round_before_weight=True)
        y = weight * _grouped_rms_norm(hidden_states, group, eps)
        return (y * _ACTIVATIONS[self.activation](gate.float())).to(hidden_states.dtype)

    def extra_repr(self) -> str:
        opts = [f"group_size={self.group_size}"] if self.group_size is not None else []
        opts += ["norm_before_gate=True"] if self.norm_before_gate else []
        opts += [f"activation={self.activation!r}"] if self.activation != "silu" else []
        opts += ["hf_rounding=False"] if not self.hf_rounding else []
        opts += ["exact_hf=True"] if self.exact_hf else []
        return ", ".join([f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}"] + opts)


def _grouped_rms_norm(x: torch.Tensor, group: int, eps: float) -> torch.Tensor:
    """RMSNorm of x's last dim without a weight, a statistic per group of `group` columns (0:
    the row), rounded to x's dtype."""
    if not group:
        return rms_norm(x, x.shape[-1:], None, eps)
    return rms_norm(x.unflatten(-1, (-1, group)), (group,), None, eps).flatten(-2)


class MambaRMSNormGated(RMSNormGated):
    """transformers' MambaRMSNormGated (Mamba2; Bamba's, NemotronH's, Zamba2's and
    GraniteMoeHybrid's are the same): gate first, SiLU, per group of group_size, HF's
    roundings."""

    def __init__(self, hidden_size: int, group_size: int, eps: float = 1e-6, *,
                 exact_hf: bool = False) -> None:
        super().__init__(hidden_size, eps, group_size=group_size, exact_hf=exact_hf)


class Qwen3NextRMSNormGated(RMSNormGated):
    """transformers' Qwen3NextRMSNormGated (Qwen3.5's and OlmoHybrid's are the same): norm
    first, y = rms_norm(x) * weight * silu(gate), HF's roundings."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, *, exact_hf: bool = False,
                 **kwargs) -> None:
        super().__init__(hidden_size, eps, norm_before_gate=True, exact_hf=exact_hf)


def hf_gated_rms_norm(hidden_states: torch.Tensor, gate: Optional[torch.Tensor],
                      weight: Optional[torch.Tensor], eps: float, *,
                      group_size: Optional[int] = None, norm_before_gate: bool = False,
                      activation: str = "silu", hf_rounding: bool = True) -> torch.Tensor:
    """transformers' gated norms operation for operation (the reference exact_hf=True
    keeps): gate first, MambaRMSNormGated.forward; norm first, Qwen3NextRMSNormGated.forward
    (hf_rounding) or KimiLinearRMSNormGated.forward (not). weight None: the normalized
    value in the input dtype (no weight, no gate after it)."""
    input_dtype = hidden_states.dtype
    act = _ACTIVATIONS[activation]
    h = hidden_states.to(torch.float32)
    if gate is not None and not norm_before_gate:
        h = h * act(gate.to(torch.float32))
    *prefix, last = h.shape
    group = group_size or last
    hg = h.view(*prefix, last // group, group)
    hg = hg * torch.rsqrt(hg.pow(2).mean(-1, keepdim=True) + eps)
    h = hg.view(*prefix, last)
    if weight is None:
        return h.to(input_dtype)
    if not norm_before_gate:
        return weight * h.to(input_dtype) if hf_rounding else (weight.float() * h).to(input_dtype)
    h = weight * h.to(input_dtype) if hf_rounding else weight.to(torch.float32) * h
    if gate is not None:
        h = h * act(gate.to(torch.float32))
    return h.to(input_dtype)


# ---- patch(model) ------------------------------------------------------------------------

_OURS = (RMSNorm, LayerNorm, LlamaRMSNorm, GemmaRMSNorm, RMSNormGated)


def _hf_candidates(module: nn.Module, exact_hf: bool) -> list:
    """Ours in place of an HF-style RMSNorm (a class named *RMSNorm holding only a
    1-D weight): Gemma's form first when the class name says Gemma, else Llama's, then the
    other (Qwen3-Next's RMSNorm is Gemma's by its numerics); the check decides."""
    params = dict(module.named_parameters(recurse=False))
    weight = params.get("weight")
    if (set(params) != {"weight"} or weight.dim() != 1 or list(module.buffers())
            or list(module.children())):
        return []
    eps = [getattr(module, name, None) for name in ("variance_epsilon", "eps")]
    eps = [float(v) for v in eps if isinstance(v, numbers.Real) and not isinstance(v, bool)]
    if not eps:
        return []
    news = [GemmaRMSNorm(weight.shape[0], eps[0]),
            LlamaRMSNorm(weight.shape[0], eps[0], exact_hf=exact_hf)]
    if "gemma" not in type(module).__name__.lower():
        news.reverse()
    for new in news:
        new.weight = weight
    return news


def _gated_candidates(module: nn.Module, exact_hf: bool) -> list:
    """Ours in place of an HF-style gated RMSNorm (a class named *RMSNormGated holding only a
    1-D weight and an eps in variance_epsilon): Mamba2's form (gate first, SiLU) when it has
    an int group_size, the norm-first form with its activation ('silu' or 'sigmoid', as
    Qwen3-Next's and Kimi-Linear's) when it has one. Norm first comes in two roundings
    (transformers' Qwen3-Next and Kimi-Linear modules): both are offered, the check decides."""
    params = dict(module.named_parameters(recurse=False))
    weight = params.get("weight")
    eps = getattr(module, "variance_epsilon", None)
    if (set(params) != {"weight"} or weight.dim() != 1 or list(module.buffers())
            or list(module.children()) or not isinstance(eps, numbers.Real)
            or isinstance(eps, bool)):
        return []
    d, eps = weight.shape[0], float(eps)
    group, act = getattr(module, "group_size", None), getattr(module, "activation", None)
    if isinstance(group, numbers.Integral) and act is None and 0 < group <= d and d % group == 0:
        news = [MambaRMSNormGated(d, int(group), eps, exact_hf=exact_hf)]
    elif act in ("silu", "sigmoid") and group is None:
        news = [RMSNormGated(d, eps, norm_before_gate=True, activation=act, hf_rounding=hf,
                             exact_hf=exact_hf) for hf in (True, False)]
    else:
        return []
    for new in news:
        new.weight = weight
    return news


def _same_gated_numerics(old: nn.Module, new: RMSNormGated) -> bool:
    """As _same_numerics, with a gate: float32 within rounding, and in bfloat16 the
    reference of new's form (hf_gated_rms_norm) equal to old bit for bit, which tells the
    roundings apart."""
    weight = old.weight
    gen = torch.Generator().manual_seed(0x5eed)
    d = weight.shape[0]
    x, z = (torch.randn(3, d, generator=gen) for _ in range(2))
    saved = weight.detach().clone()
    try:
        with torch.no_grad():
            weight.copy_(torch.randn(weight.shape, generator=gen).to(weight.dtype))
            a, b = old(x, z), new(x, z)
            xb, zb = x.bfloat16(), z.bfloat16()
            c = old(xb, zb)
            e = hf_gated_rms_norm(xb, zb, weight, new.variance_epsilon, group_size=new.group_size,
                                  norm_before_gate=new.norm_before_gate,
                                  activation=new.activation, hf_rounding=new.hf_rounding)
    except Exception:  # another forward
        return False
    finally:
        with torch.no_grad():
            weight.copy_(saved)
    return (isinstance(a, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype
            and torch.allclose(a, b, rtol=1e-5, atol=1e-6) and isinstance(c, torch.Tensor)
            and c.dtype == e.dtype and torch.equal(c, e))


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
        if isinstance(module, (LlamaRMSNorm, RMSNormGated)):
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
    if type(module).__name__.endswith("RMSNormGated"):
        news = _gated_candidates(module, exact_hf)
        new = next((n for n in news if not verify or _same_gated_numerics(module, n)), None)
        if new is None:
            warnings.warn(
                f"rmsnorm.torch.patch: left {type(module).__module__}.{type(module).__name__} "
                "in place: its parameters or numerics are not those of a gated RMSNorm we know "
                "(Mamba2's, Qwen3-Next's or Kimi-Linear's)", stacklevel=3)
        return new
    if not type(module).__name__.endswith("RMSNorm"):
        return None
    news = _hf_candidates(module, exact_hf)
    new = next((n for n in news if not verify or _same_numerics(module, n)), None)
    if new is None:
        warnings.warn(
            f"rmsnorm.torch.patch: left {type(module).__module__}.{type(module).__name__} "
            "in place: its parameters or numerics are not those of Llama's or Gemma's RMSNorm",
            stacklevel=3,
        )
        return None
    return new


def patch(model: nn.Module, *, layer_norm: bool = False, verify: bool = True,
          exact_hf: bool = False, sandwich: bool = False, qk_rope: bool = False) -> nn.Module:
    """Replaces, in place, every RMSNorm-like module of `model` with ours: torch.nn.RMSNorm
    with rmsnorm.torch.RMSNorm; classes named *RMSNorm in the style of transformers (a 1-D
    `weight` and an eps in `variance_epsilon` or `eps`) with LlamaRMSNorm, or GemmaRMSNorm
    when the class name contains "Gemma"; classes named *RMSNormGated (a 1-D `weight`,
    `variance_epsilon`, and `group_size` or `activation`: Mamba2's, Bamba's, NemotronH's,
    Qwen3-Next's, ...) with MambaRMSNormGated or RMSNormGated of the same form; with
    layer_norm=True also torch.nn.LayerNorm with rmsnorm.torch.LayerNorm. The new modules
    hold the same Parameter objects (optimizers and tied weights are unaffected) and keep
    training/eval mode.

    verify: first run each HF-style module and its replacement on a random input and keep
    the original (with a warning) unless they agree. exact_hf: the LlamaRMSNorm and gated
    replacements keep HF's numerics bit for bit. sandwich: also give every Gemma 2/3 decoder
    layer (Gemma2DecoderLayer, Gemma3DecoderLayer) a forward that computes
    post_attention_layernorm, the residual add and pre_feedforward_layernorm in one call of
    sandwich_rms_norm (the rest of the layer as transformers' forward). qk_rope: also give
    every Qwen3 attention (Qwen3Attention, Qwen3MoeAttention) whose q_norm and k_norm became
    LlamaRMSNorm a forward that computes q_norm + k_norm + apply_rotary_pos_emb as two calls
    of qk_norm_rope (Q and K, read from q_proj's and k_proj's outputs; the table from the
    layer's cos and sin, cos_sin_table), computed in float32 and rounded once, or with
    exact_hf transformers' roundings (round_before_weight); the rest as transformers'
    forward. Returns the model, or the replacement when the model itself is such a module.
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
    if sandwich:
        for module in model.modules():
            _fuse_sandwich(module)
    if qk_rope:
        for module in model.modules():
            _fuse_qk_rope(module, exact_hf)
    return done.get(id(model), model)


# ---- Gemma 2/3 sandwich norms -------------------------------------------------------------

_SANDWICH_LAYERS = ("Gemma2DecoderLayer", "Gemma3DecoderLayer")


def _gemma_norm(module) -> bool:
    """A Gemma-style RMSNorm (ours, or transformers' Gemma*RMSNorm): (1 + weight), eps."""
    name = type(module).__name__
    weight = getattr(module, "weight", None)
    return ((isinstance(module, GemmaRMSNorm) or ("Gemma" in name and name.endswith("RMSNorm")))
            and isinstance(weight, torch.Tensor) and weight.dim() == 1
            and isinstance(getattr(module, "eps", None), numbers.Real))


def _fuse_sandwich(layer: nn.Module) -> None:
    """Gives a Gemma 2/3 decoder layer the forward _sandwich_forward (once)."""
    if type(layer).__name__ not in _SANDWICH_LAYERS or "forward" in layer.__dict__:
        return
    names = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
             "post_feedforward_layernorm", "self_attn", "mlp")
    if not all(isinstance(getattr(layer, n, None), nn.Module) for n in names):
        return
    post, pre = layer.post_attention_layernorm, layer.pre_feedforward_layernorm
    if not (_gemma_norm(post) and _gemma_norm(pre) and float(post.eps) == float(pre.eps)
            and post.weight.shape == pre.weight.shape):
        warnings.warn(f"rmsnorm.torch.patch: left {type(layer).__name__}'s sandwich norms "
                      "unfused: they are not two Gemma RMSNorms of one shape and eps", stacklevel=3)
        return
    params = list(inspect.signature(type(layer).forward).parameters)
    # the names of the arguments after hidden_states that may come by position
    layer._rmsnorm_arg_names = tuple(params[2:])
    layer.forward = types.MethodType(_sandwich_forward, layer)


def _sandwich_forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """Gemma2/3DecoderLayer.forward with the sub-layer's post-norm, the residual add and the
    next pre-norm in one op (sandwich_rms_norm) between attention and MLP; the arguments go
    on to self_attn by name, as transformers' forward passes them."""
    kwargs.update(zip(self._rmsnorm_arg_names, args))
    residual = hidden_states
    hidden_states, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **kwargs)
    post, pre = self.post_attention_layernorm, self.pre_feedforward_layernorm
    w_post, w_pre = _param(post, "weight"), _param(pre, "weight")
    hidden_states, residual = sandwich_rms_norm(hidden_states, residual, w_post.shape, w_post,
                                                w_pre, post.eps, offset=True)
    hidden_states = self.post_feedforward_layernorm(self.mlp(hidden_states))
    return residual + hidden_states


# ---- Qwen3 attention: QK-norm + RoPE ------------------------------------------------------

_QK_ROPE_ATTENTIONS = ("Qwen3Attention", "Qwen3MoeAttention")
# transformers' forward, whose steps _qk_rope_forward keeps
_QK_ROPE_ARGS = ("hidden_states", "position_embeddings", "attention_mask", "cache")
# by attention class: its module's (ALL_ATTENTION_FUNCTIONS, eager_attention_forward,
# apply_rotary_pos_emb)
_HF_ATTENTION: dict = {}


def _fuse_qk_rope(attn: nn.Module, exact_hf: bool) -> None:
    """Gives a Qwen3 attention the forward _qk_rope_forward (once; exact_hf updated)."""
    cls = type(attn)
    if cls.__name__ not in _QK_ROPE_ATTENTIONS:
        return
    if "forward" in attn.__dict__:
        attn._rmsnorm_qk_rope_exact = exact_hf
        return
    params = [p.name for p in inspect.signature(cls.forward).parameters.values()
              if p.kind == p.POSITIONAL_OR_KEYWORD]
    hf = sys.modules.get(cls.__module__)
    names = ("q_proj", "k_proj", "v_proj", "o_proj")
    why = None
    if tuple(params[1:]) != _QK_ROPE_ARGS or not all(
            hasattr(hf, n) for n in ("ALL_ATTENTION_FUNCTIONS", "eager_attention_forward",
                                     "apply_rotary_pos_emb")):
        why = "its forward is not the one this patch knows (transformers 5's)"
    elif not all(isinstance(getattr(attn, n, None), nn.Module) for n in names):
        why = "it lacks q_proj, k_proj, v_proj or o_proj"
    elif not (isinstance(attn.q_norm, LlamaRMSNorm) and isinstance(attn.k_norm, LlamaRMSNorm)):
        why = "its q_norm and k_norm were not recognised as Llama-style RMSNorms"
    if why:
        warnings.warn(f"rmsnorm.torch.patch: left {cls.__name__}'s QK-norm and RoPE unfused: "
                      f"{why}", stacklevel=3)
        return
    _HF_ATTENTION[cls] = (hf.ALL_ATTENTION_FUNCTIONS, hf.eager_attention_forward,
                          hf.apply_rotary_pos_emb)
    attn._rmsnorm_arg_names = tuple(params[2:])
    attn._rmsnorm_qk_rope_exact = exact_hf
    attn.forward = types.MethodType(_qk_rope_forward, attn)


def _qk_rope_forward(self, hidden_states: torch.Tensor, *args, **kwargs):
    """Qwen3Attention.forward with q_norm, k_norm and apply_rotary_pos_emb in two calls of
    qk_norm_rope, one for Q and one for K; the cache update, the attention function and
    o_proj as transformers' forward. A norm weight of another dtype than the projections
    (transformers' product then promotes) takes transformers' own steps."""
    kwargs.update(zip(self._rmsnorm_arg_names, args))
    cos, sin = kwargs.pop("position_embeddings")
    attention_mask = kwargs.pop("attention_mask", None)
    cache = kwargs.pop("cache", None)
    legacy = kwargs.pop("past_key_values", None)  # the name transformers still maps to cache
    cache = legacy if cache is None else cache
    functions, eager, apply_rotary_pos_emb = _HF_ATTENTION[type(self)]
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    q = self.q_proj(hidden_states).view(hidden_shape)
    k = self.k_proj(hidden_states).view(hidden_shape)
    v = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    q_norm, k_norm = self.q_norm, self.k_norm
    wq, wk = _param(q_norm, "weight"), _param(k_norm, "weight")
    if wq.dtype == q.dtype and wk.dtype == k.dtype:
        lead = q.shape[:-2]
        table = cos_sin_table(cos.expand(*lead, -1), sin.expand(*lead, -1))
        exact = self._rmsnorm_qk_rope_exact
        q = qk_norm_rope(q, wq, table, q_norm.variance_epsilon, round_before_weight=exact)
        k = qk_norm_rope(k, wk, table, k_norm.variance_epsilon, round_before_weight=exact)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    else:
        q, k = apply_rotary_pos_emb(q_norm(q).transpose(1, 2), k_norm(k).transpose(1, 2),
                                    cos, sin)
    if cache is not None:
        k, v = cache.update(k, v, self.layer_idx, kwargs=kwargs)
    attention_interface = functions.get_interface(self.config._attn_implementation, eager)
    attn_output, attn_weights = attention_interface(
        self, q, k, v, attention_mask, dropout=0.0 if not self.training else self.attention_dropout,
        scaling=self.scaling, sliding_window=self.sliding_window, **kwargs)
    attn_output = attn_output.reshape(*input_shape, -1).contiguous()
    return self.o_proj(attn_output), attn_weights
