"""rmsnorm.torch - the library for CPU torch tensors: rms_norm and layer_norm as
autograd Functions whose backward is the C backward, drop-in modules (RMSNorm,
LayerNorm, and HF-compatible LlamaRMSNorm and GemmaRMSNorm), and patch(model),
which swaps a model's RMSNorm layers for these in place. The fused operations of a
transformer block: fused_add_rms_norm and rms_norm_linear (autograd Functions whose
backward is the C backward), rms_norm_int8 and rms_norm_fp8 (no gradient).

Threads: every call runs on up to torch.get_num_threads() threads (so
torch.set_num_threads and OMP_NUM_THREADS apply); results do not depend on it.
"""

from __future__ import annotations

import numbers
import warnings
from typing import Any, Optional, Sequence, Union

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from . import _capi, _core

__all__ = [
    "rms_norm",
    "layer_norm",
    "RMSNormFunction",
    "LayerNormFunction",
    "RMSNorm",
    "LayerNorm",
    "LlamaRMSNorm",
    "GemmaRMSNorm",
    "patch",
    "fused_add_rms_norm",
    "rms_norm_linear",
    "rms_norm_int8",
    "rms_norm_fp8",
    "FusedAddRMSNormFunction",
    "RMSNormLinearFunction",
]

_DTYPES = {_capi.F32: torch.float32, _capi.F16: torch.float16, _capi.BF16: torch.bfloat16,
           _capi.F64: torch.float64}
_CODES = {dt: code for code, dt in _DTYPES.items()}


class TorchBackend(_core.Backend):
    def coerce(self, a: Any, what: str) -> torch.Tensor:
        if not isinstance(a, torch.Tensor):
            raise TypeError(f"{what} must be a torch.Tensor, got {type(a).__name__}")
        if not a.is_cpu:
            raise TypeError(
                f"{what} is on device {a.device}; rmsnorm.torch runs on CPU tensors only "
                "(move it with .cpu(), or keep torch's own norm on that device)"
            )
        if a.layout is not torch.strided:
            raise TypeError(f"{what} has layout {a.layout}; rmsnorm.torch takes dense tensors")
        if a.is_neg():  # a lazily negated view: make the values real
            a = a.resolve_neg()
        return a

    def dtype_code(self, a: torch.Tensor) -> Optional[int]:
        return _CODES.get(a.dtype)

    def dtype_name(self, a: torch.Tensor) -> str:
        return str(a.dtype).replace("torch.", "")

    def shape(self, a: torch.Tensor) -> tuple:
        return a.shape  # a torch.Size: a tuple

    def is_contiguous(self, a: torch.Tensor) -> bool:
        return a.is_contiguous()

    def strides(self, a: torch.Tensor) -> tuple:
        return a.stride()

    def contiguous(self, a: torch.Tensor) -> torch.Tensor:
        return a.contiguous()

    def ptr(self, a: torch.Tensor) -> int:
        return a.data_ptr()

    def empty(self, shape: tuple, code: int) -> torch.Tensor:
        out = torch.empty(shape, dtype=_DTYPES[code])
        _capi.advise_huge_pages(out.data_ptr(), out.numel() * out.element_size())
        return out

    def full(self, shape: tuple, code: int, value: float) -> torch.Tensor:
        return torch.full(shape, value, dtype=_DTYPES[code])

    def cast(self, a: torch.Tensor, code: int) -> torch.Tensor:
        return a.to(_DTYPES[code])

    def copy(self, a: torch.Tensor) -> torch.Tensor:
        return a.detach().clone(memory_format=torch.contiguous_format)

    def empty_quant(self, shape: tuple, qtype: int) -> torch.Tensor:
        dtype = torch.int8 if qtype == _capi.Q_INT8 else torch.float8_e4m3fn
        return torch.empty(shape, dtype=dtype)

    def prepare_out(self, a: torch.Tensor) -> torch.Tensor:
        # Written behind autograd's back: bump its version counter, so a graph
        # that saved this tensor notices, as after any in-place op.
        if _increment_version is not None:
            _increment_version(a)
        return a


TORCH = TorchBackend()
_increment_version = getattr(torch.autograd.graph, "increment_version", None)  # torch >= 2.5

_Shape = Union[int, Sequence[int], torch.Size]


def _needs_autograd(*tensors) -> bool:
    return torch.is_grad_enabled() and any(
        getattr(t, "requires_grad", False) for t in tensors)


# ---- autograd Functions --------------------------------------------------------


def _function_forward(kind, ctx, input, weight, bias, normalized_shape, eps, partial, flags):
    """The C forward, keeping for the C backward the input as passed to the
    library (a contiguous copy when the input had no row-strided view) and the
    statistics: rstd, and mean for LayerNorm."""
    out = _core.forward(TORCH, kind, input, normalized_shape, weight, bias, eps, partial, flags,
                        kind == _core.LAYER, True, torch.get_num_threads())
    ctx.args = (normalized_shape, eps, partial, flags)
    ctx.save_for_backward(out.x.array, weight, bias, out.mean, out.rstd)
    return out.y


def _function_backward(kind, ctx, grad_output):
    x, weight, bias, mean, rstd = ctx.saved_tensors
    normalized_shape, eps, partial, flags = ctx.args
    # The backward treats the forward's rounding before the weight as the identity.
    flags &= ~_capi.FLAG_ROUND_BEFORE_WEIGHT
    dx, dw, db = _core.backward(TORCH, kind, grad_output, x, normalized_shape, weight, bias,
                                mean, rstd, eps, partial, flags, ctx.needs_input_grad[1],
                                ctx.needs_input_grad[2], torch.get_num_threads())
    return (dx if ctx.needs_input_grad[0] else None), dw, db, None, None, None, None


class RMSNormFunction(torch.autograd.Function):
    """RMSNorm as an autograd Function whose backward is the C backward:
    apply(input, weight, bias, normalized_shape, eps, partial, flags), flags
    being RMSNORM_FLAG_* bits. Gradients of gradients are not available."""

    @staticmethod
    def forward(ctx, input, weight, bias, normalized_shape, eps, partial, flags):
        return _function_forward(_core.RMS, ctx, input, weight, bias, normalized_shape, eps,
                                 partial, flags)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output):
        return _function_backward(_core.RMS, ctx, grad_output)


class LayerNormFunction(torch.autograd.Function):
    """LayerNorm as an autograd Function whose backward is the C backward:
    apply(input, weight, bias, normalized_shape, eps, 1.0, flags)."""

    @staticmethod
    def forward(ctx, input, weight, bias, normalized_shape, eps, partial, flags):
        return _function_forward(_core.LAYER, ctx, input, weight, bias, normalized_shape, eps,
                                 partial, flags)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output):
        return _function_backward(_core.LAYER, ctx, grad_output)


def _apply(kind, fn, input, weight, bias, normalized_shape, eps, partial, flags, out):
    if _needs_autograd(input, weight, bias):
        if out is not None:
            raise ValueError(f"{kind}(): out= does not take part in autograd; call it under "
                             "torch.no_grad() or with tensors that do not require grad")
        return fn.apply(input, weight, bias, _core.normalized(normalized_shape)[0], eps,
                        partial, flags)
    # No graph to record: skip the autograd machinery and the saved statistics.
    return _core.forward(TORCH, kind, input, normalized_shape, weight, bias, eps, partial,
                         flags, False, False, torch.get_num_threads(), out).y


def rms_norm(input: torch.Tensor, normalized_shape: _Shape, weight: Optional[torch.Tensor] = None,
             eps: Optional[float] = None, *, bias: Optional[torch.Tensor] = None,
             offset: bool = False, eps_outside: bool = False, partial: float = 1.0,
             round_before_weight: bool = False,
             out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """torch.nn.functional.rms_norm on the C library, differentiable in input,
    weight and bias. The keywords are those of rmsnorm.rms_norm (numpy); out=
    (the input itself for in place) only without autograd."""
    return _apply(_core.RMS, RMSNormFunction, input, weight, bias, normalized_shape, eps, partial,
                  _core.make_flags(offset, eps_outside, round_before_weight), out)


def layer_norm(input: torch.Tensor, normalized_shape: _Shape,
               weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
               eps: Optional[float] = 1e-5, *, offset: bool = False,
               round_before_weight: bool = False,
               out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """torch.nn.functional.layer_norm on the C library, differentiable in input,
    weight and bias; out= as for rms_norm."""
    return _apply(_core.LAYER, LayerNormFunction, input, weight, bias, normalized_shape, eps, 1.0,
                  _core.make_flags(offset, False, round_before_weight), out)


# ---- fused operations of a transformer block -----------------------------------


class FusedAddRMSNormFunction(torch.autograd.Function):
    """Residual add + RMSNorm (rmsnorm_add_forward/backward) as an autograd Function:
    apply(input, residual, weight, bias, normalized_shape, eps, partial, flags) ->
    (output, new_residual). The backward gives both input and residual the gradient
    dres + RMSNorm backward(dy) at new_residual. Gradients of gradients are not
    available."""

    @staticmethod
    def forward(ctx, input, residual, weight, bias, normalized_shape, eps, partial, flags):
        r = _core.add_forward(TORCH, input, residual, normalized_shape, weight, bias, eps,
                              partial, flags, True, torch.get_num_threads())
        ctx.args = (normalized_shape, eps, partial, flags)
        ctx.save_for_backward(r.h, weight, bias, r.rstd)
        ctx.set_materialize_grads(False)  # an unused new_residual: dres NULL, not zeros
        return r.y, r.h

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output, grad_residual):
        h, weight, bias, rstd = ctx.saved_tensors
        normalized_shape, eps, partial, flags = ctx.args
        if grad_output is None:
            grad_output = torch.zeros_like(h)
        dh, dw, db = _core.add_backward(TORCH, grad_output, grad_residual, h, normalized_shape,
                                        weight, bias, rstd, eps, partial, flags,
                                        ctx.needs_input_grad[2], ctx.needs_input_grad[3],
                                        torch.get_num_threads())
        di = dh if ctx.needs_input_grad[0] else None
        # one tensor for both would let autograd accumulate into one grad through the other
        dr = (dh.clone() if di is not None else dh) if ctx.needs_input_grad[1] else None
        return di, dr, dw, db, None, None, None, None


def fused_add_rms_norm(input: torch.Tensor, residual: torch.Tensor, normalized_shape: _Shape,
                       weight: Optional[torch.Tensor] = None, eps: Optional[float] = None, *,
                       bias: Optional[torch.Tensor] = None, offset: bool = False,
                       eps_outside: bool = False, partial: float = 1.0,
                       inplace: bool = False):
    """(output, new_residual) = (rms_norm(residual + input, ...), residual + input) in
    one pass (rmsnorm.fused_add_rms_norm for tensors), differentiable in input,
    residual, weight and bias. inplace=True (vLLM's semantics: new_residual written
    into residual, output into input) only without autograd."""
    flags = _core.make_flags(offset, eps_outside, False)
    if _needs_autograd(input, residual, weight, bias):
        if inplace:
            raise ValueError("fused_add_rms_norm(): inplace=True does not take part in "
                             "autograd; call it under torch.no_grad() or with tensors that do "
                             "not require grad")
        return FusedAddRMSNormFunction.apply(input, residual, weight, bias,
                                             _core.normalized(normalized_shape)[0], eps, partial,
                                             flags)
    r = _core.add_forward(TORCH, input, residual, normalized_shape, weight, bias, eps, partial,
                          flags, False, torch.get_num_threads(), inplace)
    return r.y, r.h


class RMSNormLinearFunction(torch.autograd.Function):
    """RMSNorm + linear with the gain folded (rmsnorm_fold_weight,
    rmsnorm_linear_forward/backward) as an autograd Function:
    apply(input, weight_matrix, norm_weight, bias, eps, partial, flags) -> Z, with
    gradients for input, weight_matrix, norm_weight and bias matching autograd of
    rms_norm(input) @ weight_matrix + bias."""

    @staticmethod
    def forward(ctx, input, weight_matrix, norm_weight, bias, eps, partial, flags):
        a = _core.linear_args(TORCH, input, weight_matrix, norm_weight, bias)
        wf = _core.fold(TORCH, a, eps, partial, flags)
        z, _ = _core.linear_forward(TORCH, a, wf, eps, partial, flags, torch.get_num_threads())
        ctx.args = (eps, partial, flags)
        ctx.save_for_backward(input, weight_matrix, norm_weight, bias, wf)
        return z

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output):
        input, weight_matrix, norm_weight, bias, wf = ctx.saved_tensors
        eps, partial, flags = ctx.args
        a = _core.linear_args(TORCH, input, weight_matrix, norm_weight, bias)
        need = ctx.needs_input_grad
        dx, dg, dw, db = _core.linear_backward(TORCH, a, wf, grad_output, eps, partial, flags,
                                               need[0], need[2], need[1], need[3],
                                               torch.get_num_threads())
        return dx, dw, dg, db, None, None, None


def rms_norm_linear(input: torch.Tensor, weight_matrix: torch.Tensor,
                    norm_weight: Optional[torch.Tensor] = None, eps: Optional[float] = None,
                    bias: Optional[torch.Tensor] = None, offset: bool = False, *,
                    eps_outside: bool = False, partial: float = 1.0) -> torch.Tensor:
    """rms_norm(input, (d,), norm_weight, eps) @ weight_matrix + bias with the gain
    folded into the matrix (rmsnorm.rms_norm_linear for tensors), differentiable in
    input, weight_matrix (d, n), norm_weight and bias."""
    flags = _core.make_flags(offset, eps_outside, False)
    if _needs_autograd(input, weight_matrix, norm_weight, bias):
        return RMSNormLinearFunction.apply(input, weight_matrix, norm_weight, bias, eps, partial,
                                           flags)
    a = _core.linear_args(TORCH, input, weight_matrix, norm_weight, bias)
    wf = _core.fold(TORCH, a, eps, partial, flags)
    return _core.linear_forward(TORCH, a, wf, eps, partial, flags, torch.get_num_threads())[0]


def _quant(qtype, input, normalized_shape, weight, eps, bias, scale, offset, eps_outside,
           partial):
    with torch.no_grad():
        return _core.forward_quant(TORCH, qtype, input, normalized_shape, weight, bias, eps,
                                   partial, _core.make_flags(offset, eps_outside, False), scale,
                                   torch.get_num_threads())


def rms_norm_int8(input: torch.Tensor, normalized_shape: _Shape,
                  weight: Optional[torch.Tensor] = None, eps: Optional[float] = None, *,
                  bias: Optional[torch.Tensor] = None, scale: Optional[float] = None,
                  offset: bool = False, eps_outside: bool = False, partial: float = 1.0):
    """(q, scale): RMSNorm to int8 with a per-row (scale=None) or static scale, as
    rmsnorm.rms_norm_int8; q is a torch.int8 tensor. Not differentiable."""
    return _quant(_capi.Q_INT8, input, normalized_shape, weight, eps, bias, scale, offset,
                  eps_outside, partial)


def rms_norm_fp8(input: torch.Tensor, normalized_shape: _Shape,
                 weight: Optional[torch.Tensor] = None, eps: Optional[float] = None, *,
                 bias: Optional[torch.Tensor] = None, scale: Optional[float] = None,
                 offset: bool = False, eps_outside: bool = False, partial: float = 1.0):
    """(q, scale): RMSNorm to fp8 E4M3 (torch.float8_e4m3fn) with a per-row or static
    scale, as rmsnorm.rms_norm_fp8. Not differentiable."""
    return _quant(_capi.Q_FP8_E4M3, input, normalized_shape, weight, eps, bias, scale, offset,
                  eps_outside, partial)


# ---- modules ---------------------------------------------------------------------


def _shape_tuple(normalized_shape: _Shape) -> tuple:
    if isinstance(normalized_shape, numbers.Integral):
        normalized_shape = (normalized_shape,)
    return tuple(normalized_shape)


class _AffineNorm(nn.Module):
    """What RMSNorm and LayerNorm share with torch's modules: normalized_shape,
    eps, the optional weight (ones) and bias (zeros), registered in torch's order."""

    __constants__ = ["normalized_shape", "eps", "elementwise_affine"]

    def _init_affine(self, normalized_shape: _Shape, eps: Optional[float],
                     elementwise_affine: bool, bias: bool, device, dtype) -> None:
        factory = {"device": device, "dtype": dtype}
        self.normalized_shape = _shape_tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(self.normalized_shape, **factory))
        else:
            self.register_parameter("weight", None)
        if elementwise_affine and bias:
            self.bias = nn.Parameter(torch.empty(self.normalized_shape, **factory))
        else:
            self.register_parameter("bias", None)
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
        super().__init__()
        self._init_affine(normalized_shape, eps, elementwise_affine, bias, device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.normalized_shape, self.weight, self.eps, bias=self.bias)

class LayerNorm(_AffineNorm):
    """torch.nn.LayerNorm on the C library: the same constructor, parameter names,
    state_dict keys and numerics."""

    def __init__(self, normalized_shape: _Shape, eps: float = 1e-5,
                 elementwise_affine: bool = True, bias: bool = True, device=None,
                 dtype=None) -> None:
        super().__init__()
        self._init_affine(normalized_shape, eps, elementwise_affine, bias, device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

class LlamaRMSNorm(nn.Module):
    """transformers' LlamaRMSNorm (also Mistral's, Qwen2's, ...): weight starts at
    ones, attribute variance_epsilon. Numerics as HF: normalize in float32, round to
    the input dtype, then multiply by the weight (RMSNORM_FLAG_ROUND_BEFORE_WEIGHT);
    a weight of another dtype than the input gives its promoted dtype, as HF."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        d = self.weight.shape[-1]
        if self.weight.dtype == hidden_states.dtype:
            return rms_norm(hidden_states, (d,), self.weight, self.variance_epsilon,
                            round_before_weight=True)
        # HF's `weight * normalized.to(input_dtype)` promotes: keep its dtype rules.
        return self.weight * rms_norm(hidden_states, (d,), None, self.variance_epsilon)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}"


class GemmaRMSNorm(nn.Module):
    """transformers' GemmaRMSNorm (Gemma 1-3): weight starts at zeros, attribute
    eps; y = x * rstd * (1 + weight) computed in float32 and rounded once to the
    input dtype (RMSNORM_FLAG_WEIGHT_OFFSET)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, (self.weight.shape[-1],), self.weight, self.eps, offset=True)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}"


# ---- patch(model) -----------------------------------------------------------------

_OURS = (RMSNorm, LayerNorm, LlamaRMSNorm, GemmaRMSNorm)


def _hf_eps(module: nn.Module) -> Optional[float]:
    for name in ("variance_epsilon", "eps"):
        value = getattr(module, name, None)
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            return float(value)
    return None


def _hf_candidate(module: nn.Module) -> Optional[nn.Module]:
    """Ours in place of an HF-style RMSNorm (a class named *RMSNorm holding only a
    1-D weight), Gemma's form when the class name says Gemma, else Llama's."""
    params = dict(module.named_parameters(recurse=False))
    weight = params.get("weight")
    if set(params) != {"weight"} or weight.dim() != 1 or list(module.buffers()) or list(module.children()):
        return None
    eps = _hf_eps(module)
    if eps is None:
        return None
    cls = GemmaRMSNorm if "gemma" in type(module).__name__.lower() else LlamaRMSNorm
    new = cls(weight.shape[0], eps)
    new.weight = weight
    return new


def _same_numerics(old: nn.Module, new: nn.Module) -> bool:
    """Runs both modules on one random float32 input, with a random weight put in
    for the check (so a weight that happens to be all ones or zeros cannot hide a
    difference), and compares. The global RNG is not touched."""
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


def _replacement(module: nn.Module, layer_norm: bool, verify: bool) -> Optional[nn.Module]:
    if isinstance(module, _OURS):
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
    new = _hf_candidate(module)
    if new is None or (verify and not _same_numerics(module, new)):
        warnings.warn(
            f"rmsnorm.torch.patch: left {type(module).__module__}.{type(module).__name__} "
            "in place: its parameters or numerics are not those of Llama's or Gemma's RMSNorm",
            stacklevel=3,
        )
        return None
    return new


def patch(model: nn.Module, *, layer_norm: bool = False, verify: bool = True) -> nn.Module:
    """Replaces, in place, every RMSNorm-like module of `model` with ours:
    torch.nn.RMSNorm with rmsnorm.torch.RMSNorm; classes named *RMSNorm in the
    style of transformers (a 1-D `weight` and an eps in `variance_epsilon` or
    `eps`) with LlamaRMSNorm, or GemmaRMSNorm when the class name contains
    "Gemma"; with layer_norm=True also torch.nn.LayerNorm with
    rmsnorm.torch.LayerNorm. The new modules hold the same Parameter objects
    (optimizers and tied weights are unaffected) and keep training/eval mode.

    verify: first run each HF-style module and its replacement on a random input
    and keep the original (with a warning) unless they agree. Returns the model,
    or the replacement when the model itself is such a module.
    """
    done = {}
    for module in list(model.modules()):
        if id(module) in done:
            continue
        new = _replacement(module, layer_norm, verify)
        if new is not None:
            new.train(module.training)
            done[id(module)] = new
    for module in list(model.modules()):
        for name, child in list(module._modules.items()):
            if child is not None and id(child) in done:
                module._modules[name] = done[id(child)]
    return done.get(id(model), model)
