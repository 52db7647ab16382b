"""rmsnorm.torch.modules - the drop-in modules: RMSNorm and LayerNorm for torch.nn's, and
for transformers' norms LlamaRMSNorm, GemmaRMSNorm, Olmo2RMSNorm and the gated RMSNormGated
(MambaRMSNormGated, Qwen3NextRMSNormGated), with the hf_* functions that compute as
transformers' modules do, operation for operation (their exact_hf=True path and patch()'s
reference). Each module takes what the module it replaces takes (mixed dtypes included) and
gives its output dtype; every module compiles with torch.jit.script."""

from __future__ import annotations

import numbers
from typing import Optional, Sequence, Union

import torch
from torch import nn

from .functions import gated_rms_norm, layer_norm, rms_norm

__all__ = ["RMSNorm", "LayerNorm", "LlamaRMSNorm", "GemmaRMSNorm", "Olmo2RMSNorm",
           "RMSNormGated", "MambaRMSNormGated", "Qwen3NextRMSNormGated", "hf_rms_norm",
           "hf_gemma_rms_norm", "hf_olmo2_rms_norm", "hf_gated_rms_norm"]

_Shape = Union[int, Sequence[int], torch.Size]


def _param(module: nn.Module, name: str) -> Optional[torch.Tensor]:
    """module.<name> for the modules' eager forward: one dict read for a registered
    parameter (not Module.__getattr__), else the attribute (a parametrization,
    functional_call). TorchScript takes self.<name> instead."""
    p = module._parameters
    return p[name] if name in p else getattr(module, name)


def _rms(x: torch.Tensor, weight: Optional[torch.Tensor], eps: Optional[float],
         offset: bool = False, round_before_weight: bool = False) -> torch.Tensor:
    """rms_norm over x's last dim: the compiled eager entry, or torch.ops when scripted."""
    if torch.jit.is_scripting():
        return torch.ops.rmsnorm.rms_norm(x, [x.shape[-1]], weight, eps, offset=offset,
                                          round_before_weight=round_before_weight)
    else:
        return rms_norm(x, x.shape[-1:], weight, eps, offset=offset,
                        round_before_weight=round_before_weight)


# ---- torch.nn's norms ------------------------------------------------------------------


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
    keyword, bias), parameter names, state_dict keys and numerics (a weight of another
    dtype than the input is read in float32; the output has the input's dtype)."""

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


# ---- transformers' norms --------------------------------------------------------------
# Three orders of the same arithmetic, named after the model that introduced each:
#   Llama:  weight * (x r).to(dtype)          round, then the weight (promoting)
#   Gemma:  (x r (1 + weight.float())).to(dtype)   one rounding, weight read in float32
#   OLMo 2: (weight * x r).to(dtype)          one rounding (the product promoted)
# with x r computed in float32. Each module's exact_hf=True runs its hf_* function: torch's
# own ops in transformers' order, so transformers' bits (at torch's speed).


def hf_rms_norm(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm.forward, operation for operation."""
    input_dtype = hidden_states.dtype
    h = hidden_states.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(input_dtype)


def hf_gemma_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' GemmaRMSNorm.forward (Gemma 1-3, Qwen3-Next), operation for operation."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * (1.0 + weight.float())).type_as(x)


def hf_olmo2_rms_norm(hidden_states: torch.Tensor, weight: torch.Tensor,
                      eps: float) -> torch.Tensor:
    """transformers' Olmo2RMSNorm.forward, operation for operation."""
    input_dtype = hidden_states.dtype
    h = hidden_states.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return (weight * h).to(input_dtype)


class _HFNorm(nn.Module):
    """What the modules for transformers' norms share: a weight of hidden_size (started at
    `_start`: ones, zeros for Gemma's 1 + w), its eps in `_eps_name` (transformers' name for
    it), and exact_hf."""

    _start = 1.0
    _eps_name = "variance_epsilon"

    def __init__(self, hidden_size: int, eps: float, exact_hf: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((hidden_size,), self._start))
        setattr(self, self._eps_name, eps)
        self.exact_hf = exact_hf

    def reset_parameters(self) -> None:
        nn.init.constant_(self.weight, self._start)

    def _weight(self) -> torch.Tensor:
        if torch.jit.is_scripting():
            return self.weight
        else:
            return _param(self, "weight")

    def extra_repr(self) -> str:
        hf = ", exact_hf=True" if self.exact_hf else ""
        return f"{tuple(self.weight.shape)}, eps={getattr(self, self._eps_name)}{hf}"


class LlamaRMSNorm(_HFNorm):
    """transformers' LlamaRMSNorm (also Mistral's, Qwen2/3's, OLMoE's, ...): weight starts
    at ones, attribute variance_epsilon. Numerics: normalize in float32, round to the input
    dtype, then multiply by the weight (HF's order; round_before_weight); a weight of
    another dtype than the input gives its promoted dtype, as HF.

    In float16/bfloat16 the result can differ from HF's where HF's float32 row statistic
    differs from ours in its last bits (docs/python.md, "HF numerics"). exact_hf=True
    computes as HF does, with torch's own ops: the same bits as transformers' module."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, *, exact_hf: bool = False) -> None:
        super().__init__(hidden_size, eps, exact_hf)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        weight = self._weight()
        if self.exact_hf:
            return hf_rms_norm(hidden_states, weight, self.variance_epsilon)
        if weight.dtype == hidden_states.dtype:
            return _rms(hidden_states, weight, self.variance_epsilon, round_before_weight=True)
        # HF's `weight * normalized.to(input_dtype)` promotes: keep its dtype rules.
        return weight * _rms(hidden_states, None, self.variance_epsilon)


class GemmaRMSNorm(_HFNorm):
    """transformers' GemmaRMSNorm (Gemma 1-3; Qwen3-Next's RMSNorm is the same): weight
    starts at zeros, attribute eps; y = x * rstd * (1 + weight) computed in float32 (the
    weight read in float32 whatever its dtype) and rounded once to the input dtype
    (offset=True). exact_hf=True: hf_gemma_rms_norm, transformers' bits."""

    _start = 0.0
    _eps_name = "eps"

    def __init__(self, dim: int, eps: float = 1e-6, *, exact_hf: bool = False) -> None:
        super().__init__(dim, eps, exact_hf)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self._weight()
        if self.exact_hf:
            return hf_gemma_rms_norm(x, weight, self.eps)
        return _rms(x, weight, self.eps, offset=True)


class Olmo2RMSNorm(_HFNorm):
    """transformers' Olmo2RMSNorm (NemotronH's computes the same): weight starts at ones,
    attribute variance_epsilon; y = (weight * x * rstd) computed in float32 and rounded once
    to the input dtype (unlike Llama's, which rounds before the weight). exact_hf=True:
    hf_olmo2_rms_norm."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, *, exact_hf: bool = False) -> None:
        super().__init__(hidden_size, eps, exact_hf)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        weight = self._weight()
        # (a float64 weight promotes transformers' product to float64: its steps)
        wide = weight.dtype == torch.float64 and hidden_states.dtype != torch.float64
        if self.exact_hf or wide:
            return hf_olmo2_rms_norm(hidden_states, weight, self.variance_epsilon)
        return _rms(hidden_states, weight, self.variance_epsilon)


# ---- gated norms ------------------------------------------------------------------------


def _act(z: torch.Tensor, activation: str) -> torch.Tensor:
    return torch.sigmoid(z) if activation == "sigmoid" else torch.nn.functional.silu(z)


def _gated(x: torch.Tensor, gate: torch.Tensor, weight: Optional[torch.Tensor], eps: float,
           group: int, norm_first: bool, activation: str, round_before_weight: bool):
    """gated_rms_norm: the compiled eager entry, or torch.ops when scripted."""
    if torch.jit.is_scripting():
        return torch.ops.rmsnorm.gated_rms_norm(
            x, gate, weight, eps, group_size=group, norm_before_gate=norm_first,
            activation=activation, round_before_weight=round_before_weight)
    else:
        return gated_rms_norm(x, gate, weight, eps, group_size=group,
                              norm_before_gate=norm_first, activation=activation,
                              round_before_weight=round_before_weight)


def _grouped_rms_norm(x: torch.Tensor, group: int, eps: float) -> torch.Tensor:
    """RMSNorm of x's last dim without a weight, a statistic per group of `group` columns (0:
    the row), rounded to x's dtype."""
    if group == 0:
        return _rms(x, None, eps)
    return _rms(x.unflatten(-1, (-1, group)), None, eps).flatten(-2)


def hf_gated_rms_norm(hidden_states: torch.Tensor, gate: Optional[torch.Tensor],
                      weight: Optional[torch.Tensor], eps: float,
                      group_size: Optional[int] = None, norm_before_gate: bool = False,
                      activation: str = "silu", hf_rounding: bool = True) -> torch.Tensor:
    """transformers' gated norms operation for operation: gate first,
    MambaRMSNormGated.forward; norm first, Qwen3NextRMSNormGated.forward (hf_rounding) or
    KimiLinearRMSNormGated.forward (not). weight None: the normalized value in the input
    dtype (no weight, no gate after it)."""
    input_dtype = hidden_states.dtype
    h = hidden_states.to(torch.float32)
    if gate is not None and not norm_before_gate:
        h = h * _act(gate.to(torch.float32), activation)
    last = h.shape[-1]
    group = last if group_size is None or group_size == 0 else group_size
    hg = h.unflatten(-1, (last // group, group))
    hg = hg * torch.rsqrt(hg.pow(2).mean(-1, keepdim=True) + eps)
    h = hg.flatten(-2)
    if weight is None:
        return h.to(input_dtype)
    if not norm_before_gate:
        return weight * h.to(input_dtype) if hf_rounding else (weight.float() * h).to(input_dtype)
    h = weight * h.to(input_dtype) if hf_rounding else weight.to(torch.float32) * h
    if gate is not None:
        h = h * _act(gate.to(torch.float32), activation)
    return h.to(input_dtype)


def _gated_forward(x: torch.Tensor, gate: Optional[torch.Tensor], weight: torch.Tensor,
                   eps: float, group_size: Optional[int], norm_first: bool, activation: str,
                   hf_rounding: bool) -> torch.Tensor:
    """RMSNormGated.forward's arithmetic (not exact_hf), for any dtypes of x, gate and
    weight, with transformers' promotions and output dtype."""
    d = x.shape[-1]
    group = 0 if group_size is None or group_size == d else group_size
    if gate is None:  # RMSNorm per group, then the weight
        if not hf_rounding:
            return hf_gated_rms_norm(x, None, weight, eps, group, hf_rounding=False)
        return weight * _grouped_rms_norm(x, group, eps)
    if norm_first and hf_rounding and (weight.dtype != x.dtype or gate.dtype != x.dtype):
        # transformers' steps: weight * normalized.to(input_dtype) (promoting), then the gate
        # read in float32
        y = weight * _grouped_rms_norm(x, group, eps)
        return (y * _act(gate.float(), activation)).to(x.dtype)
    if gate.dtype != x.dtype:
        # transformers reads both in float32; the wider of the two dtypes holds both exactly
        up = torch.promote_types(x.dtype, gate.dtype)
        if hf_rounding:  # gate first: round the normalized value, then the weight
            return weight * _gated(x.to(up), gate.to(up), None, eps, group, False, activation,
                                   True).to(x.dtype)
        return _gated(x.to(up), gate.to(up), weight, eps, group, norm_first, activation,
                      False).to(x.dtype)
    if weight.dtype == x.dtype or not hf_rounding:
        return _gated(x, gate, weight, eps, group, norm_first, activation, hf_rounding)
    # gate first: transformers' `weight * normalized.to(input_dtype)` promotes
    return weight * _gated(x, gate, None, eps, group, False, activation, True)


class RMSNormGated(nn.Module):
    """Gated RMSNorm (rmsnorm::gated_rms_norm) with transformers' attribute names: weight
    (ones), variance_epsilon, group_size (None: the whole row), norm_before_gate and
    activation ('silu' or 'sigmoid'). forward(hidden_states, gate=None):

    gate first (norm_before_gate=False, Mamba2's): y = rms_norm(x * act(gate)) * weight, the
    statistic per group of group_size columns; norm first (Qwen3-Next's): y = rms_norm(x) *
    weight * act(gate). gate None: no gate. hf_rounding=True rounds as transformers' modules
    do in float16/bfloat16 (MambaRMSNormGated, Qwen3NextRMSNormGated: the normalized value
    to the input dtype before the weight, ...); False computes in float32 and rounds once
    (KimiLinearRMSNormGated's strict float32). As transformers', it takes a gate and a weight
    of any float dtype (a wider gate is read exactly, in its dtype) and gives the output
    dtype transformers gives (the promoted one where HF multiplies by the weight last).
    exact_hf=True computes as transformers does with torch's own ops (hf_gated_rms_norm):
    the same bits, at their speed."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, *, group_size: Optional[int] = None,
                 norm_before_gate: bool = False, activation: str = "silu",
                 hf_rounding: bool = True, exact_hf: bool = False) -> None:
        super().__init__()
        if activation not in ("silu", "swish", "sigmoid"):
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
        if torch.jit.is_scripting():
            weight = self.weight
        else:
            weight = _param(self, "weight")
        if self.exact_hf:
            return hf_gated_rms_norm(hidden_states, gate, weight, self.variance_epsilon,
                                     self.group_size, self.norm_before_gate, self.activation,
                                     self.hf_rounding)
        return _gated_forward(hidden_states, gate, weight, self.variance_epsilon, self.group_size,
                              self.norm_before_gate, self.activation, self.hf_rounding)

    def extra_repr(self) -> str:
        opts = [f"group_size={self.group_size}"] if self.group_size is not None else []
        opts += ["norm_before_gate=True"] if self.norm_before_gate else []
        opts += [f"activation={self.activation!r}"] if self.activation != "silu" else []
        opts += ["hf_rounding=False"] if not self.hf_rounding else []
        opts += ["exact_hf=True"] if self.exact_hf else []
        return ", ".join([f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}"] + opts)


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

for _name in __all__:  # their public home (repr, pickle, docs)
    globals()[_name].__module__ = "rmsnorm.torch"
