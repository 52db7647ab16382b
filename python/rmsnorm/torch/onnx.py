"""rmsnorm.torch.onnx - ONNX translations of the rmsnorm:: ops, so that models using them
(patch(model) included) export with torch.onnx.export, dynamo=False or True (docs/python.md,
"ONNX export").

Each op's graph is written once (the _build_* functions) against a small graph interface,
_Graph, which each exporter's builder implements: the TorchScript exporter's GraphContext
(dynamo=False) and onnxscript's tracer (dynamo=True). Nothing here imports torch.onnx or
onnxscript until an exporter is loaded: importing rmsnorm.torch installs an import hook that
registers the translations when torch.onnx (about 20 ms to import) or the dynamo exporter's
registry (onnxscript: about 0.4 s) is first imported, or at once when already imported.
"""

from __future__ import annotations

import importlib.abc
import inspect
import math
import sys
import warnings
from typing import Callable, Optional

import torch

__all__ = ["translation_table", "OPS", "MIN_OPSET", "ExportError"]

# the lowest opset translated: casts to and from bfloat16, Unsqueeze's axes as an input
MIN_OPSET = 13
# ai.onnx's RMSNormalization
_RMS_NORMALIZATION_OPSET = 23
# the library's default eps (rmsnorm_default_eps): torch.finfo of the compute type
_DEFAULT_EPS = {torch.float64: 2.0 ** -52}
_HALF = (torch.float16, torch.bfloat16)
_ONNX_DTYPE = {torch.float32: 1, torch.int64: 7, torch.float16: 10, torch.float64: 11,
               torch.bfloat16: 16}
_INT64_MAX = 2 ** 63 - 1


class ExportError(ValueError):
    """An rmsnorm op whose arguments have no ONNX translation here."""


def _refuse(op: str, why: str):
    raise ExportError(f"rmsnorm.torch.onnx: cannot export rmsnorm::{op}: {why}")


# ---- the graph interface and its two builders -----------------------------------------------


class _Graph:
    """What the builders need from an exporter: op(name, *inputs, **attributes), constants,
    the dtype and static sizes of the exporter's values, and the target opset."""

    opset: int

    def op(self, name: str, *inputs, **attrs):
        raise NotImplementedError

    def const(self, values, dtype: torch.dtype):
        raise NotImplementedError

    def dtype(self, v) -> torch.dtype:
        raise NotImplementedError

    def dim(self, v, axis: int) -> Optional[int]:
        """v's size along axis when static, else None."""
        raise NotImplementedError

    # helpers on top of op()

    def cast(self, v, frm: torch.dtype, to: torch.dtype):
        return v if frm == to else self.op("Cast", v, to=_ONNX_DTYPE[to])

    def ints(self, values):
        return self.const(list(values), torch.int64)

    def mean(self, v, axes):
        """ReduceMean over axes, keeping them (its axes an input from opset 18)."""
        if self.opset >= 18:
            return self.op("ReduceMean", v, self.ints(axes), keepdims=1)
        return self.op("ReduceMean", v, axes=list(axes), keepdims=1)

    def slice(self, v, start: int, end, axis: int = -1, step: int = 1):
        """v[..., start:end:step, ...] along axis; end an int or a 1-element int64 value."""
        end = self.ints([end]) if isinstance(end, int) else end
        return self.op("Slice", v, self.ints([start]), end, self.ints([axis]), self.ints([step]))

    def lead_shape(self, v, n: int):
        """The shape of v without its last n dims (int64, 1-D)."""
        return self.slice(self.op("Shape", v), 0, -n, 0)

    def reshape(self, v, lead, tail):
        """v reshaped to lead (a 1-D int64 value) followed by the sizes in tail."""
        return self.op("Reshape", v, self.op("Concat", lead, self.ints(tail), axis=0))


class _TorchScriptGraph(_Graph):
    """The TorchScript exporter's GraphContext (attributes get its type suffixes)."""

    def __init__(self, g) -> None:
        self.g, self.opset = g, g.opset

    def op(self, name, *inputs, **attrs):
        typed = {}
        for key, value in attrs.items():
            first = value[0] if isinstance(value, (list, tuple)) and value else value
            kind = ("t" if isinstance(first, torch.Tensor) else "f" if isinstance(first, float)
                    else "s" if isinstance(first, str) else "i")
            typed[f"{key}_{kind}"] = value
        return self.g.op(name, *inputs, **typed)

    def const(self, values, dtype):
        return self.g.op("Constant", value_t=torch.tensor(values, dtype=dtype))

    def dtype(self, v):
        dtype = v.type().dtype() if isinstance(v.type(), torch._C.TensorType) else None
        if dtype is None:
            raise ExportError(f"rmsnorm.torch.onnx: the dtype of {v.debugName()} is not known "
                              "to the TorchScript exporter")
        return dtype

    def dim(self, v, axis):
        try:
            sizes = v.type().varyingSizes()
            return sizes[axis] if sizes else None
        except (RuntimeError, IndexError):
            return None


class _ScriptGraph(_Graph):
    """The dynamo exporter's tracer: onnxscript's current evaluator and its opset."""

    def __init__(self) -> None:
        import onnx_ir as ir
        from onnxscript import evaluator

        self.ir = ir
        self._opset = getattr(evaluator.default(), "opset", None)
        if self._opset is None:
            raise ExportError("rmsnorm.torch.onnx: the translations run only inside "
                              "torch.onnx.export(..., dynamo=True)")
        self.opset = self._opset.version

    def op(self, name, *inputs, **attrs):
        attrs = {k: self.ir.tensor(v.numpy()) if isinstance(v, torch.Tensor) else v
                 for k, v in attrs.items()}
        return getattr(self._opset, name)(*inputs, **attrs)

    def const(self, values, dtype):
        array = torch.tensor(values, dtype=dtype).numpy()
        return self._opset.Constant(value=self.ir.tensor(array))

    def dtype(self, v):
        code = int(v.dtype) if v.dtype is not None else None
        for dtype, c in _ONNX_DTYPE.items():
            if c == code:
                return dtype
        raise ExportError(f"rmsnorm.torch.onnx: {v.name} has dtype {v.dtype}; the rmsnorm ops "
                          "take float32, float16, bfloat16 or float64")

    def dim(self, v, axis):
        if v.shape is None:
            return None
        try:
            size = v.shape[axis]
        except IndexError:
            return None
        return size if isinstance(size, int) else None


# ---- the ops' graphs --------------------------------------------------------------------------
# The library's formulas (include/rmsnorm.h, src/ref/): math in the compute type (float32,
# float64 for float64 data), rounded once to the data dtype, except where
# round_before_weight asks for transformers' roundings (RT: to the data dtype and back).


def _types(g: _Graph, op: str, x):
    dt = g.dtype(x)
    if dt not in _HALF + (torch.float32, torch.float64):
        _refuse(op, f"input has dtype {dt}; the rmsnorm ops take float32, float16, bfloat16 "
                    "or float64")
    if g.opset < MIN_OPSET:
        _refuse(op, f"opset {g.opset} is below {MIN_OPSET} (bfloat16 casts, axes as inputs)")
    return dt, torch.float64 if dt == torch.float64 else torch.float32


def _eps(eps, dt):
    return _DEFAULT_EPS.get(dt, 2.0 ** -23) if eps is None else float(eps)


def _round_trip(g, v, dt, ct):
    """RT(v): v rounded to dt and back to the compute type ct."""
    return g.cast(g.cast(v, ct, dt), dt, ct)


def _partial_count(op: str, partial: float, normalized_shape) -> Optional[int]:
    """pRMSNorm's k (rmsnorm_partial_count: the smallest k in [1, d] with k/d >= partial, k/d
    rounded to a double), or None for partial = 1."""
    if partial >= 1:
        return None
    if not all(isinstance(s, int) for s in normalized_shape):
        _refuse(op, "partial < 1 needs a static normalized_shape")
    d = math.prod(normalized_shape)
    k = max(1, math.ceil(partial * d) - 2)
    while k < d and k / d < partial:
        k += 1
    return k


def _gain(g, weight, offset: bool, ct):
    """The effective weight in the compute type: weight, 1 + weight (offset) or None (1)."""
    if weight is None:
        return None
    w = g.cast(weight, g.dtype(weight), ct)
    return g.op("Add", w, g.const([1.0], ct)) if offset else w


def _normalize(g, xf, ct, nd: int, eps: float, *, eps_outside=False, k=None, gain=None,
               stats=False):
    """(xf * r * gain, r): RMSNorm of xf (compute type) over its last nd dims, r = 1/sqrt(ms +
    eps) or 1/(sqrt(ms) + eps), ms the mean of x^2 over the first k elements of those dims
    (k None: all); r (*lead, 1, ..., 1) only with stats. RMSNormalization where the opset has
    it and it computes the same (float32, eps inside, every element)."""
    axes = list(range(-nd, 0))
    if (g.opset >= _RMS_NORMALIZATION_OPSET and ct == torch.float32 and not eps_outside
            and k is None and not stats):
        if gain is None:  # ones of the normalized shape
            tail = g.slice(g.op("Shape", xf), -nd, _INT64_MAX, 0)
            gain = g.op("ConstantOfShape", tail, value=torch.ones(1, dtype=ct))
        return g.op("RMSNormalization", xf, gain, axis=-nd, epsilon=eps), None
    if k is None:
        ms = g.mean(g.op("Mul", xf, xf), axes)
    else:  # the first k elements of the flattened normalized dims
        lead = g.lead_shape(xf, nd)
        flat = g.reshape(xf, lead, [-1]) if nd > 1 else xf
        part = g.slice(flat, 0, k)
        ms = g.mean(g.op("Mul", part, part), [-1])
        ms = g.reshape(ms, lead, [1] * nd) if nd > 1 else ms
    e = g.const(eps, ct)
    if eps_outside:
        r = g.op("Reciprocal", g.op("Add", g.op("Sqrt", ms), e))
    else:
        r = g.op("Reciprocal", g.op("Sqrt", g.op("Add", ms, e)))
    h = g.op("Mul", xf, r)
    return (g.op("Mul", h, gain) if gain is not None else h), r


def _finish(g, h, dt, ct, gain, bias, rounded: bool):
    """y = RT?(h) * gain + bias, rounded to dt: the affine step of rms_norm and layer_norm."""
    if rounded:
        h = _round_trip(g, h, dt, ct)
    if gain is not None:
        h = g.op("Mul", h, gain)
    if bias is not None:
        h = g.op("Add", h, g.cast(bias, g.dtype(bias), ct))
    return g.cast(h, ct, dt)


def _rms(g, op, x, dt, ct, normalized_shape, weight, eps, *, bias=None, offset=False,
         eps_outside=False, partial=1.0, round_before_weight=False, stats=False):
    """(y, rstd) of rms_norm for x of dtype dt."""
    nd = len(normalized_shape)
    k = _partial_count(op, partial, normalized_shape)
    rounded = round_before_weight and dt in _HALF
    gain = _gain(g, weight, offset, ct)
    h, r = _normalize(g, g.cast(x, dt, ct), ct, nd, _eps(eps, dt), eps_outside=eps_outside,
                      k=k, gain=None if rounded else gain, stats=stats)
    return _finish(g, h, dt, ct, gain if rounded else None, bias, rounded), r


def _build_rms_norm(g, input, normalized_shape, weight=None, eps=None, *, bias=None,
                    offset=False, eps_outside=False, partial=1.0, round_before_weight=False,
                    stats=False):
    """(y, rstd)."""
    dt, ct = _types(g, "rms_norm", input)
    return _rms(g, "rms_norm", input, dt, ct, normalized_shape, weight, eps, bias=bias,
                offset=offset, eps_outside=eps_outside, partial=partial,
                round_before_weight=round_before_weight, stats=stats)


def _build_layer_norm(g, input, normalized_shape, weight=None, bias=None, eps=1e-5, *,
                      offset=False, round_before_weight=False, stats=False):
    """(y, mean, rstd): mean and the biased variance, rstd = 1/sqrt(var + eps)."""
    dt, ct = _types(g, "layer_norm", input)
    axes = list(range(-len(normalized_shape), 0))
    xf = g.cast(input, dt, ct)
    mean = g.mean(xf, axes)
    xc = g.op("Sub", xf, mean)
    var = g.mean(g.op("Mul", xc, xc), axes)
    r = g.op("Reciprocal", g.op("Sqrt", g.op("Add", var, g.const(_eps(eps, dt), ct))))
    y = _finish(g, g.op("Mul", xc, r), dt, ct, _gain(g, weight, offset, ct), bias,
                round_before_weight and dt in _HALF)
    return y, mean, r


def _add_rounded(g, a, b, dt, ct):
    """a + b computed in the compute type and rounded to dt."""
    return g.cast(g.op("Add", g.cast(a, dt, ct), g.cast(b, dt, ct)), ct, dt)


def _build_fused_add_rms_norm(g, input, residual, normalized_shape, weight=None, eps=None, *,
                              bias=None, offset=False, eps_outside=False, partial=1.0):
    """(rms_norm(new_residual), new_residual), new_residual = residual + input rounded."""
    dt, ct = _types(g, "fused_add_rms_norm", input)
    new_residual = _add_rounded(g, residual, input, dt, ct)
    y, _ = _rms(g, "fused_add_rms_norm", new_residual, dt, ct, normalized_shape, weight, eps,
                bias=bias, offset=offset, eps_outside=eps_outside, partial=partial)
    return y, new_residual


def _build_sandwich_rms_norm(g, input, residual, normalized_shape, post_weight=None,
                             pre_weight=None, eps=None, *, offset=False, eps_outside=False,
                             partial=1.0):
    """(pre_norm(new_residual), new_residual), new_residual = residual + post_norm(input),
    each step rounded to the data dtype."""
    op = "sandwich_rms_norm"
    dt, ct = _types(g, op, input)
    opts = dict(offset=offset, eps_outside=eps_outside, partial=partial)
    post, _ = _rms(g, op, input, dt, ct, normalized_shape, post_weight, eps, **opts)
    new_residual = _add_rounded(g, residual, post, dt, ct)
    y, _ = _rms(g, op, new_residual, dt, ct, normalized_shape, pre_weight, eps, **opts)
    return y, new_residual


def _build_qk_norm(g, input, weight=None, eps=None, *, bias=None, offset=False,
                   eps_outside=False, partial=1.0):
    """(y,): RMSNorm over head_dim, the last dim."""
    dt, ct = _types(g, "qk_norm", input)
    y, _ = _rms(g, "qk_norm", input, dt, ct, [g.dim(input, -1)], weight, eps, bias=bias,
                offset=offset, eps_outside=eps_outside, partial=partial)
    return (y,)


def _build_gated_rms_norm(g, input, gate, weight=None, eps=None, *, group_size=0,
                          norm_before_gate=False, activation="silu", offset=False,
                          round_before_weight=False, stats=False):
    """(y, rstd). a = act(gate); gate first: y = rmsnorm(x a) w; norm first: y = rmsnorm(x)
    w a; the statistic per group of group_size columns; rstd (*, d / group_size)."""
    op = "gated_rms_norm"
    dt, ct = _types(g, op, input)
    if activation not in ("silu", "swish", "sigmoid"):
        _refuse(op, f"activation {activation!r} (only 'silu', 'swish' and 'sigmoid')")
    z = g.cast(gate, g.dtype(gate), ct)
    a = g.op("Sigmoid", z)
    a = a if activation == "sigmoid" else g.op("Mul", z, a)
    h = g.cast(input, dt, ct)
    h = h if norm_before_gate else g.op("Mul", h, a)
    lead = g.lead_shape(input, 1) if group_size or stats else None
    if group_size:  # (*, d) -> (*, d / group_size, group_size)
        h = g.reshape(h, lead, [-1, group_size])
    h, r = _normalize(g, h, ct, 1, _eps(eps, dt), stats=stats)
    if group_size:
        h = g.op("Reshape", h, g.op("Shape", input))
    rounded = round_before_weight and dt in _HALF
    if rounded:
        h = _round_trip(g, h, dt, ct)
    gain = _gain(g, weight, offset, ct)
    if gain is not None:
        h = g.op("Mul", h, gain)
    if norm_before_gate:
        h = g.op("Mul", _round_trip(g, h, dt, ct) if rounded else h, a)
    return g.cast(h, ct, dt), (g.reshape(r, lead, [-1]) if stats else None)


def _build_qk_norm_rope(g, input, weight, cos_sin, eps=None, *, positions=None, style="neox",
                        rotary_dim=0, offset=False, across_heads=False, round_before_weight=False,
                        round_before_rotation=False, float_rotation=False, stats=False):
    """(y, rstd): n = RMSNorm over head_dim (across_heads: over a token's heads) times the
    weight, then token t's heads rotated by row positions[t] (or t) of cos_sin (per row the
    cos of rotary_dim/2 frequencies, then their sin): NeoX pairs (i, i + rotary_dim/2), GPT-J
    pairs (2i, 2i + 1); columns from rotary_dim on pass. rstd (*, heads, 1), or (*, 1, 1)
    across heads. The roundings as the library's flags (include/rmsnorm.h): n rounded before
    the weight and after it (round_before_weight) or once (round_before_rotation), then each
    product of the rotation rounded, unless float_rotation."""
    op = "qk_norm_rope"
    dt, ct = _types(g, op, input)
    if style not in ("neox", "gptj"):
        _refuse(op, f"style {style!r} (only 'neox' and 'gptj')")
    head_dim = g.dim(input, -1)
    rot = rotary_dim or head_dim or g.dim(cos_sin, -1)
    if rot is None:
        _refuse(op, "rotary_dim 0 needs a static head_dim")
    half = rot // 2
    rounded = round_before_weight and dt in _HALF  # n = RT(RT(x r) w)
    once = round_before_rotation and not rounded and dt in _HALF  # n = RT(x r w)
    gain = _gain(g, weight, offset, ct)
    if gain is not None and across_heads:  # (heads * head_dim,) as (heads, head_dim)
        gain = g.op("Reshape", gain, g.slice(g.op("Shape", input), -2, _INT64_MAX, 0))
    n, r = _normalize(g, g.cast(input, dt, ct), ct, 2 if across_heads else 1, _eps(eps, dt),
                      gain=None if rounded else gain, stats=stats)
    if rounded:
        n = _round_trip(g, n, dt, ct)
        n = _round_trip(g, g.op("Mul", n, gain), dt, ct) if gain is not None else n
    elif once:
        n = _round_trip(g, n, dt, ct)
    rounded = (rounded or once) and not float_rotation  # each product of the rotation
    # the table's rows of the tokens, (*, 1, rot): one row per token over its heads
    table = g.cast(cos_sin, g.dtype(cos_sin), ct)
    lead = g.lead_shape(input, 2)
    if positions is None:
        tokens = g.op("ReduceProd", lead, keepdims=1)
        rows = g.slice(table, 0, tokens, 0)
    else:
        rows = g.op("Gather", table, g.op("Reshape", positions, g.ints([-1])), axis=0)
    rows = g.reshape(rows, lead, [1, rot])
    cos, sin = g.slice(rows, 0, half), g.slice(rows, half, rot)
    if style == "neox":
        p, q = g.slice(n, 0, half), g.slice(n, half, rot)
    else:
        p, q = g.slice(n, 0, rot, step=2), g.slice(n, 1, rot, step=2)

    def times(u, v):  # each product rounded with transformers' roundings
        uv = g.op("Mul", u, v)
        return _round_trip(g, uv, dt, ct) if rounded else uv

    yp = g.op("Sub", times(p, cos), times(q, sin))
    yq = g.op("Add", times(q, cos), times(p, sin))
    if style == "neox":
        parts = [yp, yq]
    else:  # interleave: (..., half, 2) -> (..., rot)
        last = g.ints([-1])
        pairs = g.op("Concat", g.op("Unsqueeze", yp, last), g.op("Unsqueeze", yq, last), axis=-1)
        parts = [g.reshape(pairs, g.lead_shape(input, 1), [rot])]
    if head_dim is None or rot < head_dim:
        parts.append(g.slice(n, rot, _INT64_MAX))
    y = g.op("Concat", *parts, axis=-1) if len(parts) > 1 else parts[0]
    return g.cast(y, ct, dt), r


# ---- the ops translated, and their bindings to the exporters ---------------------------------

# op name (namespace rmsnorm, overload default) -> (builder, outputs it gives, statistics)
_BUILDERS: dict[str, tuple] = {
    "rms_norm": (_build_rms_norm, 1, False),
    "rms_norm_forward": (_build_rms_norm, 2, True),
    "layer_norm": (_build_layer_norm, 1, False),
    "layer_norm_forward": (_build_layer_norm, 3, True),
    "fused_add_rms_norm": (_build_fused_add_rms_norm, 2, None),
    "sandwich_rms_norm": (_build_sandwich_rms_norm, 2, None),
    "qk_norm": (_build_qk_norm, 1, None),
    "qk_norm_rope": (_build_qk_norm_rope, 1, False),
    "qk_norm_rope_forward": (_build_qk_norm_rope, 2, True),
    "gated_rms_norm": (_build_gated_rms_norm, 1, False),
    "gated_rms_norm_forward": (_build_gated_rms_norm, 2, True),
}
# The ops with a translation (the forward ops of inference graphs); the others (in place,
# out=, backward, quantized, linear, sharded) have none, and the exporters name them.
OPS = tuple(_BUILDERS)


def _schema(name: str):
    return getattr(torch.ops.rmsnorm, name).default._schema


def _is_default(value, default) -> bool:
    return value is default or (isinstance(value, (bool, int, float, str, list))
                                and value == default)


def _build(name: str, g: _Graph, args, kwargs):
    """The outputs of rmsnorm::<name> on the arguments (positional, then by name) the
    exporter gives: bound to the schema's names with its defaults, and built. An argument the
    builder does not know (one the schema gained since) must have its default."""
    build, n, stats = _BUILDERS[name]
    known = inspect.signature(build).parameters
    bound = {}
    for i, a in enumerate(_schema(name).arguments):
        if i < len(args):
            value = args[i]
        elif a.name in kwargs:
            value = kwargs[a.name]
        elif a.has_default_value():
            continue
        else:
            raise TypeError(f"rmsnorm::{name}: missing argument {a.name!r}")
        if a.name in known:
            bound[a.name] = value
        elif not (a.has_default_value() and _is_default(value, a.default_value)):
            _refuse(name, f"{a.name}={value!r} has no ONNX translation")
    if stats is not None:
        bound["stats"] = stats
    outs = build(g, **bound)[:n]
    return outs[0] if n == 1 else tuple(outs)


def _dynamo_translation(name: str) -> Callable:
    """The onnxscript (trace-only) function of rmsnorm::<name>: called by the dynamo exporter
    with the FX node's arguments inside its tracer."""

    def translate(*args, **kwargs):
        return _build(name, _ScriptGraph(), args, kwargs)

    translate.__name__ = translate.__qualname__ = f"rmsnorm_{name}"
    return translate


def _torchscript_value(v, type_):
    """A TorchScript exporter's input of schema type type_ as a Python value (tensors stay
    values; a list of sizes that is not constant keeps its length, as None entries)."""
    from torch.onnx import symbolic_helper as sh

    if sh._is_none(v):
        return None
    if isinstance(type_, torch._C.OptionalType):
        type_ = type_.getElementType()
    if isinstance(type_, torch._C.TensorType):
        return v
    desc = {torch._C.FloatType: "f", torch._C.BoolType: "b", torch._C.IntType: "i",
            torch._C.SymIntType: "i", torch._C.StringType: "s"}.get(type(type_), "is")
    value = sh._maybe_get_const(v, desc)
    if not sh._is_value(value):
        return value
    if desc == "is":  # a list built at run time (traced sizes): only its length is used
        node = v.node()
        if node.kind() == "prim::ListConstruct":
            return [None] * len(list(node.inputs()))
        sizes = sh._get_tensor_sizes(v)
        if sizes and sizes[0] is not None:
            return [None] * sizes[0]
    raise ExportError(f"rmsnorm.torch.onnx: an argument of type {type_} is not a constant in "
                      "the traced graph")


def _torchscript_symbolic(name: str) -> Callable:
    """The TorchScript exporter's symbolic function of rmsnorm::<name> (its inputs: every
    argument of the schema, in order)."""
    arguments = _schema(name).arguments

    def symbolic(g, *inputs):
        if len(inputs) != len(arguments):  # another overload of the name (out=)
            _refuse(name, "only its functional form exports (not out= or in place)")
        args = [_torchscript_value(v, a.type) for a, v in zip(arguments, inputs)]
        return _build(name, _TorchScriptGraph(g), args, {})

    return symbolic


_TABLE: dict = {}


def translation_table() -> dict:
    """{torch.ops.rmsnorm.<op>.default: its ONNX translation} for every op in OPS: pass it as
    torch.onnx.export(..., dynamo=True, custom_translation_table=...) (merged with your own
    entries) where the automatic registration is not available. Needs onnxscript at export."""
    if not _TABLE:
        for name in OPS:
            _TABLE[getattr(torch.ops.rmsnorm, name).default] = _dynamo_translation(name)
    return dict(_TABLE)


# ---- registration, when an exporter is imported ---------------------------------------------

_REGISTERED: set = set()


def _warn_unregistered(exporter: str, err: Exception) -> None:
    hint = ("; pass custom_translation_table=rmsnorm.torch.onnx.translation_table() to "
            "torch.onnx.export" if exporter == "dynamo" else "")
    warnings.warn(f"rmsnorm.torch.onnx: could not register the ONNX translations with "
                  f"torch.onnx's {exporter} exporter ({type(err).__name__}: {err}){hint}",
                  RuntimeWarning, stacklevel=2)


def _register_torchscript(loaded: Optional[str] = None) -> None:
    """The symbolic functions, for every opset the TorchScript exporter targets (below
    MIN_OPSET they raise ExportError saying so)."""
    if "torchscript" in _REGISTERED:
        return
    _REGISTERED.add("torchscript")
    try:
        from torch.onnx import register_custom_op_symbolic

        for name in OPS:
            # from torch.onnx's lowest opset, 7: below MIN_OPSET ours says why it refuses
            register_custom_op_symbolic(f"rmsnorm::{name}", _torchscript_symbolic(name), 7)
    except Exception as err:  # never break torch.onnx's import
        _warn_unregistered("TorchScript", err)


_DYNAMO_MODULES = ("torch.onnx._internal.exporter._registration",
                   "torch.onnx._internal.exporter._torchlib._torchlib_registry")


def _register_dynamo(loaded: Optional[str] = None) -> None:
    """The translations, appended to the dynamo exporter's built-in table (torchlib's, which
    every export reads; torch has no public way for a library to add to it): a plain
    torch.onnx.export(..., dynamo=True) then finds them. The two modules import each other,
    in either order: this runs after each (loaded: its name) and acts once neither is still
    executing."""
    modules = {m: sys.modules.get(m) for m in _DYNAMO_MODULES}
    if "dynamo" in _REGISTERED or any(
            m is not None and name != loaded and getattr(m.__spec__, "_initializing", False)
            for name, m in modules.items()):
        return
    _REGISTERED.add("dynamo")
    registration, torchlib = modules.values()
    meta = getattr(registration, "OnnxDecompMeta", None)
    table = getattr(torchlib, "_registry", None)
    try:
        if meta is None or not isinstance(table, list):
            raise ImportError("this torch's exporter has no registry of the form known here")
        for target, fn in translation_table().items():
            table.append(meta(onnx_function=fn, fx_target=target, signature=None,
                              skip_signature_inference=True))
    except Exception as err:
        _warn_unregistered("dynamo", err)


class _AfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """A finder that lets the usual finders find the modules in `hooks`, then runs their
    hook right after the module has executed (the module keeps its own loader)."""

    def __init__(self, hooks: dict) -> None:
        self.hooks = hooks
        self.loading: dict = {}  # module name -> (its loader, its hook)

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        self.loading[fullname] = (spec.loader, self.hooks.pop(fullname))
        spec.loader = self
        if not self.hooks and self in sys.meta_path:
            sys.meta_path.remove(self)
        return spec

    def create_module(self, spec):
        return self.loading[spec.name][0].create_module(spec)

    def exec_module(self, module):
        loader, hook = self.loading.pop(module.__spec__.name)
        module.__loader__ = module.__spec__.loader = loader
        loader.exec_module(module)
        hook(module.__spec__.name)


def _install() -> None:
    """Registers with the exporters already imported, and hooks the imports of the others."""
    hooks = {"torch.onnx": _register_torchscript}
    hooks.update(dict.fromkeys(_DYNAMO_MODULES, _register_dynamo))
    for name in list(hooks):
        if name in sys.modules:
            hooks.pop(name)()
    if hooks:
        sys.meta_path.insert(0, _AfterImport(hooks))


_install()
