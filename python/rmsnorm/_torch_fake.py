"""_torch_fake.py - the fake (meta) kernels of the rmsnorm:: torch ops, one per row of the op
table (rmsnorm/_ops.py), made from its schema: the shapes, dtypes and strides of the
outputs, for FakeTensor tracing (torch.compile, torch.export) and for tensors on the meta
device. They check what can be checked without data (devices, dtypes, shapes) with the
real kernels' messages (core.hpp's, through rmsnorm._torch.messages()); symbolic sizes
stay symbolic. Imported by rmsnorm.torch."""

from __future__ import annotations

import sys

import torch

from . import _ops, _quant

_C = sys.modules["rmsnorm._torch"]
FLOATS = tuple(getattr(torch, name) for name in _C.dtypes())  # by rmsnorm_dtype code
_MSG = _C.messages()
_INDEX_ARGS = ("positions", "slots")  # tensors of integers (rope's positions, cache slots)


def _text(op: str, key: str, **fields) -> str:
    return f"rmsnorm::{op}: " + _MSG[key].format(**fields)


def _check(op: str, cond, key: str, **fields):
    torch._check_value(cond, lambda: _text(op, key, **fields))


def _same(a, shape) -> bool:
    return a.dim() == len(shape) and all(x == y for x, y in zip(a.shape, shape))


def _checks(op: str, a: dict, x, what: str):
    """The shape checks of the op's family (its arguments say which)."""
    shapes = {"weight": x.shape[-1:], "bias": x.shape[-1:]}
    if "normalized_shape" in a:
        ns = a["normalized_shape"]
        _check(op, len(ns) >= 1, "empty_norm")
        k = len(ns)
        _check(op, x.dim() >= k and all(p == q for p, q in zip(x.shape[x.dim() - k:], ns)),
               "input_shape", norm=list(ns), what=what, dims=", ".join(map(str, ns)),
               shape=list(x.shape))
        shapes = {"weight": ns, "bias": ns, "post_weight": ns, "pre_weight": ns}
    elif "gate" in a:  # gated: over the last dim, in groups
        _check(op, x.dim() >= 1, "linear_rank")
        z = a["gate"]
        _check(op, _same(z, x.shape), "same_shape", what="gate", shape=list(z.shape), ref=what,
               ref_shape=list(x.shape))
        torch._check_type(z.dtype == x.dtype, lambda: _text(
            op, "same_dtype", what="gate", dtype=str(z.dtype)[6:], ref=what,
            ref_dtype=str(x.dtype)[6:]))
        act, group = a["activation"], a["group_size"]
        _check(op, act in ("silu", "swish", "sigmoid"), "gate_activation", activation=repr(act))
        _check(op, group >= 0 and (group == 0 or x.shape[-1] % group == 0), "gate_group",
               d=x.shape[-1], group=group)
        shapes = {"weight": x.shape[-1:]}
    elif "weight_matrix" in a:
        w = a["weight_matrix"]
        _check(op, x.dim() >= 1, "linear_rank")
        _check(op, w.dim() == 2 and w.shape[0] == x.shape[-1], "linear_matrix",
               shape=list(w.shape), d=x.shape[-1])
        shapes = {"norm_weight": x.shape[-1:], "bias": w.shape[1:]}
    elif "d_global" in a:
        d, col = a["d_global"], a["column_offset"]
        _check(op, x.dim() >= 1, "shard_rank")
        _check(op, d >= 1 and 0 <= col and col + x.shape[-1] <= d, "shard_columns", begin=col,
               end=col + x.shape[-1], d_global=d)
        for name in ("stats", "dots"):
            if name in a:
                torch._check_type(a[name].dtype == torch.float64, lambda: _text(
                    op, "row_sums", what=name, dtype=str(a[name].dtype)[6:]))
    else:  # (*, heads, head_dim)
        _check(op, x.dim() >= 2, "heads", what=what, shape=list(x.shape))
        if "cos_sin" in a:
            _rope_checks(op, a, x)
            if a.get("across_heads"):  # one statistic per token over its heads
                shapes = {"weight": (x.shape[-2] * x.shape[-1],)}
        if "k_cache" in a:
            _cache_checks(op, a, x)
    for name, shape in shapes.items():
        if (p := a.get(name)) is not None:
            _check(op, _same(p, shape), "param_shape", what=name, shape=list(p.shape),
                   norm=list(shape))
    if (out := a.get("out")) is not None:
        _check(op, _same(out, x.shape), "same_shape", what="out", shape=list(out.shape),
               ref=what, ref_shape=list(x.shape))
        torch._check_type(out.dtype == x.dtype, lambda: _text(
            op, "same_dtype", what="out", dtype=str(out.dtype)[6:], ref=what,
            ref_dtype=str(x.dtype)[6:]))


def _rope_checks(op: str, a: dict, x):
    """The rotation's arguments of QK-norm + RoPE (core.hpp's rope_of)."""
    style, rot, cs, pos = a["style"], a["rotary_dim"], a["cos_sin"], a.get("positions")
    _check(op, style in ("neox", "gptj"), "rope_style", style=repr(style))
    d = x.shape[-1]
    _check(op, rot >= 0 and rot % 2 == 0 and rot <= d, "rope_dim", head_dim=d, rotary_dim=rot)
    rd = rot or d
    _check(op, cs.dim() == 2 and cs.shape[-1] == rd, "rope_table", shape=list(cs.shape),
           rotary_dim=rd)
    tokens = 1
    for n in x.shape[:-2]:
        tokens = tokens * n
    if pos is not None:
        _check(op, pos.numel() == tokens or _broadcasts(pos.shape, x.shape[:-2]),
               "rope_positions", n=pos.numel(), shape=list(pos.shape), tokens=tokens)
    else:
        _check(op, cs.shape[0] >= tokens, "rope_rows", n=cs.shape[0], tokens=tokens)


def _cache_checks(op: str, a: dict, x):
    """qk_norm_rope_cache's caches (core.hpp's cache_of): (*slots, heads, head_dim) of x's
    dtype, v like x and v_cache like k_cache, one slot per token."""
    for name, ref in (("k_cache", x), ("v_cache", x)):
        c = a.get(name)
        if c is None:
            continue
        _check(op, c.dim() >= 2 and _same(c[(0,) * (c.dim() - 2)], x.shape[-2:]), "heads",
               what=name, shape=list(c.shape))
        torch._check_type(c.dtype == ref.dtype, lambda: _text(
            op, "same_dtype", what=name, dtype=str(c.dtype)[6:], ref="input",
            ref_dtype=str(ref.dtype)[6:]))
    v, vc = a.get("v"), a.get("v_cache")
    torch._check_value((v is None) == (vc is None), lambda: f"rmsnorm::{op}: v and v_cache "
                       "come together (the V heads to copy and where to)")
    if v is not None:
        _check(op, _same(v, x.shape), "same_shape", what="v", shape=list(v.shape), ref="input",
               ref_shape=list(x.shape))
    tokens = 1
    for n in x.shape[:-2]:
        tokens = tokens * n
    torch._check_value(a["slots"].numel() == tokens, lambda: f"rmsnorm::{op}: slots has "
                       f"{a['slots'].numel()} values; expected one per token, {tokens}")


def _broadcasts(shape, lead) -> bool:
    """Whether positions of `shape` broadcast to the leading dims (core.hpp's
    spread_positions)."""
    return len(shape) <= len(lead) and all(
        p == q or p == 1 for p, q in zip(reversed(shape), reversed(lead)))


def _stats(x, k, dtype=None):
    """(*leading, 1, ..., 1), float32 (float64 for float64 data)."""
    dtype = dtype or (torch.float64 if x.dtype == torch.float64 else torch.float32)
    return x.new_empty(tuple(x.shape[: x.dim() - k]) + (1,) * k, dtype=dtype)


def _quant_outputs(op: str, a: dict, x, k: int) -> dict:
    """codes and scales of the quantized formats (core.hpp's qlayout and quantized)."""
    fmt, group, pow2, scale = a["format"], a["group"], a["pow2_scale"], a["scale"]
    torch._check_value(fmt in _quant.FORMATS, lambda: f"rmsnorm::{op}: " + _quant.format_error(fmt))
    block, nbytes = _quant.FORMATS[fmt]
    ok = group >= 0 and group % 32 == 0 and (scale is None or not (group or pow2))
    _check(op, ok and (not block or not (group or pow2 or scale is not None)), "qoptions",
           format=fmt, group=group, pow2=pow2, scale=repr(float(scale)) if scale is not None
           else None)
    ns, d = a["normalized_shape"], 1
    for n in ns:
        d = d * n
    blk = block or group or 1
    _check(op, (d > 0) & (d % blk == 0), "qsize", format=fmt, block=blk, norm=list(ns), d=d,
           unit="its block" if block else "the group" if group else "any length")
    lead = tuple(x.shape[: x.dim() - k])
    if nbytes:
        codes = x.new_empty(lead + (d // block * nbytes,), dtype=torch.uint8)
    else:
        codes = x.new_empty(x.shape, dtype=torch.int8 if fmt == "int8" else torch.float8_e4m3fn)
    if scale is not None:
        scales = x.new_empty((), dtype=torch.float32)
    elif fmt == "mxfp8":
        scales = x.new_empty(lead + (d // 32,), dtype=getattr(torch, "float8_e8m0fnu", torch.uint8))
    else:
        scales = x.new_empty(lead + ((d // group if group else 1) if not block else 0,),
                             dtype=torch.float32)
    return {"codes": codes, "scales": scales}


def _output(op: _ops.Op, a: dict, x, name: str, i: int):
    """Output i of the op (its schema's name for it: name), a new contiguous tensor."""
    k = len(a["normalized_shape"]) if "normalized_shape" in a else 1
    mask = a.get("output_mask")
    if mask is not None and not mask[i]:
        return None
    if name.startswith("grad_") and name != "grad_input" and name[5:] in a:  # a parameter's
        p = a.get(name[5:])
        return None if p is None else p.new_empty(p.shape)
    if name in ("grad_weight", "grad_bias"):  # a backward that takes no parameter gives it none
        return None
    if name == "rstd" and "gate" in a:  # one per group
        group = a["group_size"]
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        return x.new_empty(tuple(x.shape[:-1]) + (x.shape[-1] // group if group else 1,),
                           dtype=dtype)
    if name in ("rstd", "mean"):
        return _stats(x, 2 if a.get("across_heads") else k)
    if name == "scale":
        if a["scale"] is None:
            return _stats(x, k, torch.float32)
        return x.new_empty((), dtype=torch.float32)
    if name in ("codes", "scales"):
        return _quant_outputs(op.name, a, x, k)[name]
    if name == "q":
        return x.new_empty(x.shape, dtype=torch.int8 if "int8" in op.id else torch.float8_e4m3fn)
    if "shard_stats" in op.id or "shard_backward_dots" in op.id:
        return x.new_empty(x.shape[:-1], dtype=torch.float64)
    if "weight_matrix" in a and mask is None:
        return x.new_empty(tuple(x.shape[:-1]) + (a["weight_matrix"].shape[1],))
    return x.new_empty(x.shape)


def _register(op: _ops.Op) -> None:
    schema = torch._C.parse_schema("rmsnorm::" + op.schema)
    args = schema.arguments
    defaults = {arg.name: arg.default_value for arg in args if arg.has_default_value()}
    returns = [r.name for r in schema.returns]

    def fake(*pos, **kw):
        a = {**defaults, **dict(zip((arg.name for arg in args), pos)), **kw}
        first = None  # the first tensor argument: the others must be on its device
        for arg in args:  # in the schema's order
            t = a.get(arg.name)
            if isinstance(t, torch.Tensor) and t.device.type not in ("cpu", "meta"):
                raise TypeError(_text(op.name, "device", what=arg.name, device=t.device))
            if isinstance(t, torch.Tensor) and first is None:
                first = arg.name
            elif isinstance(t, torch.Tensor) and t.device != a[first].device:
                # a meta tensor among CPU ones (an unmaterialized weight) has no data to read
                raise RuntimeError(_text(op.name, "same_device", device=t.device, what=arg.name,
                                         ref_device=a[first].device, ref=first))
            if isinstance(t, torch.Tensor) and arg.name in _INDEX_ARGS:
                if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
                    raise TypeError(_text(op.name, "index_dtype", what=arg.name,
                                          dtype=str(t.dtype)[6:]))
            elif isinstance(t, torch.Tensor) and t.dtype not in FLOATS:
                raise TypeError(_text(op.name, "dtype", what=arg.name, dtype=str(t.dtype)[6:]))
        what = next(n for n in ("new_residual", "input", "grad_new_residual") if n in a)
        x = a[what]
        _checks(op.name, a, x, what)
        outs = tuple(_output(op, a, x, name, i) for i, name in enumerate(returns))
        return outs[0] if len(outs) == 1 else (outs or None)

    fake.__name__ = f"_{op.id}"
    torch.library.register_fake("rmsnorm::" + op.name)(fake)


for _op in _ops.OPS:
    _register(_op)
