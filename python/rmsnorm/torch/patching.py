"""rmsnorm.torch.patching - patch(model): a model's norms swapped in place for rmsnorm.torch's
modules (each checked against the module it replaces, in the dtypes the model runs in), and
on request transformers' decoder layers and attentions given forwards that fuse their steps
(Gemma 2/3's sandwich norms; QK-norm + RoPE of the attentions in _QK_ROPE)."""

from __future__ import annotations

import copy
import inspect
import numbers
import sys
import types
import warnings
from typing import Callable, NamedTuple, Optional

import torch
from torch import nn

from .functions import cos_sin_table, qk_norm_rope, qk_norm_rope_cache, sandwich_rms_norm
from .modules import (GemmaRMSNorm, LayerNorm, LlamaRMSNorm, MambaRMSNormGated, Olmo2RMSNorm,
                      RMSNorm, RMSNormGated, _param, hf_gated_rms_norm, hf_gemma_rms_norm,
                      hf_olmo2_rms_norm, hf_rms_norm)

__all__ = ["patch"]

_OURS = (RMSNorm, LayerNorm, LlamaRMSNorm, GemmaRMSNorm, Olmo2RMSNorm, RMSNormGated)
_EXACT = (LlamaRMSNorm, GemmaRMSNorm, Olmo2RMSNorm, RMSNormGated)  # those with exact_hf

# ---- which of ours replaces a transformers norm ------------------------------------------


def _hf_reference(new: nn.Module) -> Callable:
    """new's arithmetic as transformers writes it (in bfloat16 it tells the forms apart)."""
    if isinstance(new, GemmaRMSNorm):
        return lambda x, w: hf_gemma_rms_norm(x, w, new.eps)
    if isinstance(new, Olmo2RMSNorm):
        return lambda x, w: hf_olmo2_rms_norm(x, w, new.variance_epsilon)
    if isinstance(new, LlamaRMSNorm):
        return lambda x, w: hf_rms_norm(x, w, new.variance_epsilon)
    return lambda x, w, z: hf_gated_rms_norm(x, z, w, new.variance_epsilon, new.group_size,
                                             new.norm_before_gate, new.activation,
                                             new.hf_rounding)


def _hf_candidates(module: nn.Module, exact_hf: bool) -> list:
    """Ours in place of an HF-style RMSNorm (a class named *RMSNorm holding only a 1-D
    weight): the three orders of transformers' norms, the one the class name suggests first
    (Gemma's for Gemma and Qwen3-Next, OLMo 2's for OLMo 2, else Llama's); the check decides."""
    params = dict(module.named_parameters(recurse=False))
    weight = params.get("weight")
    if (set(params) != {"weight"} or weight.dim() != 1 or list(module.buffers())
            or list(module.children())):
        return []
    eps = [getattr(module, name, None) for name in ("variance_epsilon", "eps")]
    eps = [float(v) for v in eps if isinstance(v, numbers.Real) and not isinstance(v, bool)]
    if not eps:
        return []
    d, name = weight.shape[0], type(module).__name__.lower()
    news = [LlamaRMSNorm(d, eps[0], exact_hf=exact_hf), GemmaRMSNorm(d, eps[0], exact_hf=exact_hf),
            Olmo2RMSNorm(d, eps[0], exact_hf=exact_hf)]
    first = 1 if "gemma" in name or "qwen3next" in name else 2 if "olmo2" in name else 0
    news.insert(0, news.pop(first))
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


def _close(a, b, dtype) -> bool:
    """Same shape and dtype, and values within a few roundings of dtype (fp32 noise for
    float32 and wider)."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
            and a.dtype == b.dtype):
        return False
    rtol = 1e-5 if dtype in (torch.float32, torch.float64) else 4 * torch.finfo(dtype).eps
    return torch.allclose(a.double(), b.double(), rtol=rtol, atol=1e-6, equal_nan=True)


def _same_numerics(old: nn.Module, new: nn.Module, gated: bool) -> bool:
    """Runs copies of old and new, which share a random weight (all ones or zeros could hide
    a difference), on random CPU inputs in the dtypes the model may pass: float32 input with
    the weight in its own dtype, and the weight's low precision (bfloat16 for a float32
    weight: autocast's) as input, where transformers' bits must equal those of new's order
    of operations written as transformers writes it (which tells the roundings apart) and
    new must agree within a few roundings. A gated norm also runs with its gate in the other
    of the two dtypes (transformers takes both in float32, whatever their dtypes). The
    copies leave the model's weights as they are, and work for a model on the meta device."""
    gen = torch.Generator().manual_seed(0x5eed)
    try:
        old = copy.deepcopy(old).to_empty(device="cpu")
        new = copy.deepcopy(new)
        weight = old.weight
        with torch.no_grad():
            weight.copy_(torch.randn(weight.shape, generator=gen).to(weight.dtype))
        new.weight = weight
    except Exception:  # a module that does not copy
        return False
    x, z = (torch.randn(3, weight.shape[0], generator=gen) for _ in range(2))
    low = weight.dtype if weight.dtype in (torch.float16, torch.bfloat16) else torch.bfloat16
    xl, zl = x.to(low), z.to(low)
    ref = _hf_reference(new)
    args = ((x, z), (xl, zl), (x, zl), (xl, z)) if gated else ((x,), (xl,))
    try:
        with torch.no_grad():
            olds = [old(*a) for a in args]
            news = [new(*a) for a in args]
            exact = ref(xl, weight, zl) if gated else ref(xl, weight)
    except Exception:  # another forward (more inputs, another shape)
        return False
    return (all(_close(a, b, a.dtype if isinstance(a, torch.Tensor) else low)
                for a, b in zip(olds, news))
            and isinstance(olds[1], torch.Tensor) and exact.dtype == olds[1].dtype
            and torch.equal(exact, olds[1]))


def _replacement(module: nn.Module, layer_norm: bool, verify: bool,
                 exact_hf: bool) -> Optional[nn.Module]:
    if isinstance(module, _OURS):
        if isinstance(module, _EXACT):
            module.exact_hf = exact_hf
        return None
    for p in module.parameters(recurse=False):
        if p.device.type not in ("cpu", "meta"):
            raise TypeError(
                f"rmsnorm.torch.patch: {type(module).__name__} has parameters on {p.device}; "
                "rmsnorm.torch runs on CPU tensors only (patch the model on the CPU, or on "
                "the meta device before materializing it on the CPU)")
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
    name = type(module).__name__
    gated = name.endswith("RMSNormGated")
    if not gated and not name.endswith("RMSNorm"):
        return None
    news = _gated_candidates(module, exact_hf) if gated else _hf_candidates(module, exact_hf)
    new = next((n for n in news if not verify or _same_numerics(module, n, gated)), None)
    if new is None:
        forms = ("a gated RMSNorm we know (Mamba2's, Qwen3-Next's or Kimi-Linear's)" if gated
                 else "Llama's, Gemma's or OLMo 2's RMSNorm")
        warnings.warn(f"rmsnorm.torch.patch: left {type(module).__module__}.{name} in place: its "
                      f"parameters or numerics are not those of {forms}", stacklevel=3)
    return new


def patch(model: nn.Module, *, layer_norm: bool = False, verify: bool = True,
          exact_hf: bool = False, sandwich: bool = False, qk_rope: bool = False) -> nn.Module:
    """Replaces, in place, every RMSNorm-like module of `model` with ours: torch.nn.RMSNorm
    with rmsnorm.torch.RMSNorm; classes named *RMSNorm in the style of transformers (a 1-D
    `weight` and an eps in `variance_epsilon` or `eps`) with LlamaRMSNorm, GemmaRMSNorm or
    Olmo2RMSNorm, whichever computes as the class does; classes named *RMSNormGated (a 1-D
    `weight`, `variance_epsilon`, and `group_size` or `activation`: Mamba2's, Bamba's,
    NemotronH's, Qwen3-Next's, Kimi-Linear's, ...) with MambaRMSNormGated or RMSNormGated of
    the same form; with layer_norm=True also torch.nn.LayerNorm with rmsnorm.torch.LayerNorm.
    The new modules hold the same Parameter objects (optimizers and tied weights are
    unaffected) and keep training/eval mode. The model is on the CPU, or on the meta device
    (patched before its weights are materialized and loaded).

    verify: first run copies of each HF-style module and of its candidates with a random
    weight on random inputs, in float32 and in the weight's low precision (bfloat16 for
    float32 weights, as under autocast), and keep the original (with a warning) unless one
    agrees. exact_hf: the replacements keep
    HF's numerics bit for bit (torch's own ops in HF's order), and the fused attentions
    HF's roundings. sandwich: also give every Gemma 2/3 decoder layer (Gemma2DecoderLayer,
    Gemma3DecoderLayer) a forward that computes post_attention_layernorm, the residual add
    and pre_feedforward_layernorm in one call of sandwich_rms_norm. qk_rope: also give every
    attention of _QK_ROPE (Qwen3, Qwen3-MoE, Qwen3-Next's full attention, Gemma 3, OLMo 2,
    OLMoE) whose q_norm and k_norm became ours a forward that computes q_norm + k_norm +
    apply_rotary_pos_emb as two calls of qk_norm_rope (Q and K, read from the projections'
    outputs; the table from the layer's cos and sin), computed in float32 and rounded once,
    or with exact_hf transformers' roundings; the rest as transformers' forward. The fused
    forwards take transformers' own steps for inputs whose dtypes transformers promotes
    (autocast). Returns the model, or the replacement when the model itself is such a module.
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
    on to self_attn by name, as transformers' forward passes them. An attention output of
    another dtype than the residual stream (autocast) takes transformers' steps, whose add
    promotes."""
    kwargs.update(zip(self._rmsnorm_arg_names, args))
    residual = hidden_states
    hidden_states, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **kwargs)
    post, pre = self.post_attention_layernorm, self.pre_feedforward_layernorm
    if (hidden_states.dtype != residual.dtype or _not_fast(post) or _not_fast(pre)):
        residual = residual + post(hidden_states)
        hidden_states = pre(residual)
    else:
        w_post, w_pre = _param(post, "weight"), _param(pre, "weight")
        hidden_states, residual = sandwich_rms_norm(hidden_states, residual, w_post.shape, w_post,
                                                    w_pre, post.eps, offset=True)
    hidden_states = self.post_feedforward_layernorm(self.mlp(hidden_states))
    return residual + hidden_states


def _not_fast(norm: nn.Module) -> bool:
    """Whether a sandwich norm is not ours in its fast form (exact_hf, or transformers')."""
    return not isinstance(norm, GemmaRMSNorm) or norm.exact_hf


# ---- QK-norm + RoPE -----------------------------------------------------------------------


class _QKFamily(NamedTuple):
    """How a transformers attention computes Q and K before its attention function."""
    norm: type            # our module its q_norm and k_norm must be (their order of rounding)
    across_heads: bool    # q_norm over the whole projection (OLMo 2, OLMoE), not each head
    gated_q: bool = False  # q_proj gives each head's query and its output gate (Qwen3-Next)
    window: bool = False   # passes sliding_window to the attention function
    float_rotation: bool = False  # rotates in float32 whatever the dtype, then rounds (OLMo 2)


_QK_ROPE = {
    "Qwen3Attention": _QKFamily(LlamaRMSNorm, False, window=True),
    "Qwen3MoeAttention": _QKFamily(LlamaRMSNorm, False, window=True),
    "Qwen3NextAttention": _QKFamily(GemmaRMSNorm, False, gated_q=True),
    "Gemma3Attention": _QKFamily(GemmaRMSNorm, False, window=True),
    "Olmo2Attention": _QKFamily(Olmo2RMSNorm, True, float_rotation=True),
    "OlmoeAttention": _QKFamily(LlamaRMSNorm, True),
}
# transformers' forward, whose steps _qk_rope_forward keeps
_QK_ROPE_ARGS = ("hidden_states", "position_embeddings", "attention_mask", "cache")
# by attention class: its module's (ALL_ATTENTION_FUNCTIONS, eager_attention_forward,
# apply_rotary_pos_emb)
_HF_ATTENTION: dict = {}


def _fuse_qk_rope(attn: nn.Module, exact_hf: bool) -> None:
    """Gives an attention of _QK_ROPE the forward _qk_rope_forward (once; exact_hf updated)."""
    cls = type(attn)
    family = _QK_ROPE.get(cls.__name__)
    if family is None:
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
    elif not (type(getattr(attn, "q_norm", None)) is family.norm
              and type(getattr(attn, "k_norm", None)) is family.norm):
        why = f"its q_norm and k_norm were not recognised as {family.norm.__name__}s"
    elif getattr(getattr(attn, "config", None), "clip_qkv", None) is not None:
        why = "it clips Q and K between the norm and the rotation (config.clip_qkv)"
    if why:
        warnings.warn(f"rmsnorm.torch.patch: left {cls.__name__}'s QK-norm and RoPE unfused: "
                      f"{why}", stacklevel=3)
        return
    _HF_ATTENTION[cls] = (hf.ALL_ATTENTION_FUNCTIONS, hf.eager_attention_forward,
                          hf.apply_rotary_pos_emb)
    attn._rmsnorm_arg_names = tuple(params[2:])
    attn._rmsnorm_qk_rope_exact = exact_hf
    attn._rmsnorm_qk_family = family
    attn.forward = types.MethodType(_qk_rope_forward, attn)


def _norm_args(norm: nn.Module, x: torch.Tensor, exact: bool, float_rotation: bool) -> Optional[dict]:
    """qk_norm_rope's arguments for one of ours, or None where transformers' steps promote
    (a Llama-style weight of another dtype; a float64 weight of OLMo 2's on narrower data)."""
    w = _param(norm, "weight")
    if isinstance(norm, LlamaRMSNorm):
        if w.dtype != x.dtype:
            return None
        return dict(weight=w, eps=norm.variance_epsilon, round_before_weight=exact)
    if isinstance(norm, Olmo2RMSNorm) and w.dtype == torch.float64 != x.dtype:
        return None
    args = (dict(weight=w, eps=norm.eps, offset=True) if isinstance(norm, GemmaRMSNorm)
            else dict(weight=w, eps=norm.variance_epsilon))
    if exact:  # transformers rounds n once, then rotates in the dtype (or in float32)
        args["round_before_rotation"] = True
        args["float_rotation"] = float_rotation
    return args


def _qk_rope_forward(self, hidden_states: torch.Tensor, *args, **kwargs):
    """transformers' forward of the attention (_QK_ROPE) with q_norm, k_norm and
    apply_rotary_pos_emb in two calls of qk_norm_rope, one for Q and one for K; the cache
    update, the attention function, the output gate and o_proj as transformers' forward.
    Inputs whose dtypes transformers' steps promote (a norm weight of another dtype, cos and
    sin of another dtype than the projections under autocast) take those steps."""
    kwargs.update(zip(self._rmsnorm_arg_names, args))
    cos, sin = kwargs.pop("position_embeddings")
    attention_mask = kwargs.pop("attention_mask", None)
    cache = kwargs.pop("cache", None)
    legacy = kwargs.pop("past_key_values", None)  # the name transformers still maps to cache
    cache = legacy if cache is None else cache
    family: _QKFamily = self._rmsnorm_qk_family
    functions, eager, apply_rotary_pos_emb = _HF_ATTENTION[type(self)]
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    gate = None
    if family.gated_q:
        q, gate = torch.chunk(
            self.q_proj(hidden_states).view(*input_shape, -1, self.head_dim * 2), 2, dim=-1)
        gate = gate.reshape(*input_shape, -1)
    else:
        q = self.q_proj(hidden_states).view(hidden_shape)
    k = self.k_proj(hidden_states).view(hidden_shape)
    v = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    # transformers' steps where fusing would not give its numerics: with exact_hf in float32
    # and float64 (HF's bits need HF's r to the last bit, its order of summation; in
    # float16/bfloat16 the rounding flags give HF's roundings, r's last bit almost always
    # rounded away), and where its dtypes promote: it rotates in the projections' dtype with
    # cos and sin of it, or (OLMo 2) in float32 with float32 cos and sin; other mixes
    # (autocast) promote.
    exact, fr = self._rmsnorm_qk_rope_exact, family.float_rotation
    if exact and q.dtype in (torch.float32, torch.float64):
        qa = ka = None
    elif q.dtype == k.dtype and (cos.dtype == q.dtype or (fr and cos.dtype == torch.float32)):
        qa = _norm_args(self.q_norm, q, exact, fr)
        ka = _norm_args(self.k_norm, k, exact, fr) if qa is not None else None
    else:
        qa = ka = None
    written = False  # K and V already in the cache
    if ka is not None:
        lead = q.shape[:-2]
        table = cos_sin_table(cos.expand(*lead, -1), sin.expand(*lead, -1))
        rot = table.shape[-1] if table.shape[-1] != self.head_dim else 0
        if family.across_heads:
            qa["across_heads"] = ka["across_heads"] = True
        q = qk_norm_rope(q, cos_sin=table, rotary_dim=rot, **qa).transpose(1, 2)
        layer = _static_layer(cache, self.layer_idx)
        if layer is not None:
            written = True
            k, v = _write_static(layer, k, v, table, rot, ka)
        else:
            k = qk_norm_rope(k, cos_sin=table, rotary_dim=rot, **ka).transpose(1, 2)
    elif family.across_heads:  # transformers' steps
        q = self.q_norm(q.flatten(-2)).view(hidden_shape).transpose(1, 2)
        k = self.k_norm(k.flatten(-2)).view(hidden_shape).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
    else:
        q, k = apply_rotary_pos_emb(self.q_norm(q).transpose(1, 2),
                                    self.k_norm(k).transpose(1, 2), cos, sin)
    if cache is not None and not written:
        k, v = cache.update(k, v, self.layer_idx, kwargs=kwargs)
    attention_interface = functions.get_interface(self.config._attn_implementation, eager)
    if family.window:
        kwargs["sliding_window"] = self.sliding_window
    attn_output, attn_weights = attention_interface(
        self, q, k, v, attention_mask, dropout=0.0 if not self.training else self.attention_dropout,
        scaling=self.scaling, **kwargs)
    attn_output = attn_output.reshape(*input_shape, -1).contiguous()
    if gate is not None:
        attn_output = attn_output * torch.sigmoid(gate)
    return self.o_proj(attn_output), attn_weights


def _static_layer(cache, layer_idx):
    """The layer of transformers' StaticCache (full attention, not offloaded, its class
    exactly StaticLayer) where qk_norm_rope_cache can write K and V, or None."""
    cache_utils = sys.modules.get("transformers.cache_utils")
    if cache is None or cache_utils is None or getattr(cache, "offloading", False):
        return None
    layers = getattr(cache, "layers", None)
    if not isinstance(layers, list) or not isinstance(layer_idx, int) or layer_idx >= len(layers):
        return None
    layer = layers[layer_idx]
    return layer if type(layer) is getattr(cache_utils, "StaticLayer", None) else None


def _write_static(layer, k, v, table, rot: int, args: dict):
    """StaticLayer.update with K normalized and rotated on its way into the cache: K (batch,
    seq, kv_heads, head_dim) from k_proj, V (batch, kv_heads, seq, head_dim); the cache's
    tensors (batch, kv_heads, max_len, head_dim) take the sequence at its next positions,
    one qk_norm_rope_cache call per batch row (a row's slots are its positions). Returns the
    whole cache, as update does."""
    if not layer.is_initialized:
        layer.lazy_initialization(v, v)  # (K and V have one shape and dtype here)
    batch, seq = k.shape[0], k.shape[1]
    slots = torch.arange(seq, device=k.device) + layer.cumulative_length
    layer.cumulative_length.add_(seq)
    vs = v.transpose(1, 2)
    for b in range(batch):
        qk_norm_rope_cache(k[b], cos_sin=table[b * seq:(b + 1) * seq], rotary_dim=rot,
                           k_cache=layer.keys[b].transpose(0, 1), slots=slots, v=vs[b],
                           v_cache=layer.values[b].transpose(0, 1), **args)
    return layer.keys, layer.values
