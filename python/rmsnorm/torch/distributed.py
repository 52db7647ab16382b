"""rmsnorm.torch.distributed - RMSNorm over a hidden dimension sharded across the ranks of a
torch.distributed process group, differentiable (README.md, "Sharded hidden dimension").

Each rank of the group holds a column shard of the same rows: x_shard (*, width) is columns
[column_offset, column_offset + width) of rows of d_global columns, and weight and bias are
the shard's width elements. The compute steps are the ops rmsnorm::rms_norm_shard_stats,
_shard_forward, _shard_backward_dots and _shard_backward (librmsnorm's rmsnorm_shard_*);
between them one torch.distributed.all_reduce (SUM) of rows float64 values crosses the group
per forward and one per backward (rows x 8 bytes, whatever d_global). Any backend that sums
float64 tensors on the CPU carries them (gloo).

    import torch.distributed as dist
    from rmsnorm.torch.distributed import rms_norm
    y_shard = rms_norm(x_shard, g_shard)          # columns laid out in group rank order
    y_shard.sum().backward()                      # x_shard.grad, g_shard.grad: this shard's

Where the shard sits: with column_offset and d_global None, the shards lie in group rank
order (rank 0 the first columns) and one all_gather of a few int64 per rank finds the offset
and d_global on every call; give both (every rank its own) to skip that collective.

Checks (check=True, set_checks(True), or RMSNORM_DISTRIBUTED_CHECK=1): each forward and each
backward first all-gathers a 16-int64 record per rank, and every rank raises the same
exception when any rank's own arguments are invalid or the ranks disagree: rows (or the
leading shape), d_global, or shards not covering [0, d_global) exactly once: ValueError;
dtype or parameter dtypes: TypeError; eps, partial, offset, eps_outside, round_before_weight,
or which of weight/bias is given: ValueError. Nobody is left waiting in a collective. Without
checks, a rank whose arguments are wrong raises alone and the others wait in the all_reduce
until the group's timeout: use checks while developing (the tests do).

dweight and dbias are this rank's shard summed over this rank's rows. Where rows are also
split over ranks (data or sequence parallelism) their sum over those ranks is left to the
usual machinery (DDP, or an all_reduce of the gradients), as for any parameter.
"""

from __future__ import annotations

import math
import os
import struct
from typing import Optional

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from . import _ops  # torch.ops.rmsnorm, with the ops registered

__all__ = ["rms_norm", "set_checks", "checks_enabled"]

_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_checks: Optional[bool] = None  # None: the environment variable decides


def set_checks(on: Optional[bool]) -> None:
    """Turns the collective argument checks on or off for every later call (None: back to
    the environment variable RMSNORM_DISTRIBUTED_CHECK, "1" meaning on)."""
    global _checks
    _checks = None if on is None else bool(on)


def checks_enabled() -> bool:
    """Whether calls without check= make the collective argument checks."""
    if _checks is not None:
        return _checks
    return os.environ.get("RMSNORM_DISTRIBUTED_CHECK", "0") not in ("", "0")


# ---- the collective check ------------------------------------------------------------------

_RECORD = 16
# record fields
_ERR, _PHASE, _ROWS, _LEAD, _WIDTH, _DTYPE, _OFFSET, _DGLOBAL, _EPS, _PARTIAL, _FLAGS, \
    _WDTYPE, _BDTYPE = range(13)
_ERR_TYPE, _ERR_VALUE = 1, 2


def _code(dtype) -> int:
    return _FLOATS.index(dtype) if dtype in _FLOATS else -1


def _bits(v: float) -> int:
    return struct.unpack("<q", struct.pack("<d", v))[0]


def _local_error(x, weight, bias, eps, partial, column_offset, d_global):
    """This rank's own argument error, as an exception (None when there is none)."""
    try:
        for t, what in ((x, "x_shard"), (weight, "weight"), (bias, "bias")):
            if t is None and what != "x_shard":
                continue
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{what} must be a tensor, got {type(t).__name__}")
            if t.device.type != "cpu":
                raise TypeError(f"{what} is on device {t.device}; rmsnorm runs on CPU tensors")
            if t.dtype not in _FLOATS:
                raise TypeError(f"{what} has dtype {str(t.dtype).replace('torch.', '')}; "
                                "rmsnorm takes float32, float16, bfloat16 or float64")
        if x.dim() < 1:
            raise ValueError("x_shard must have at least one dim (the last: the shard's columns)")
        for t, what in ((weight, "weight"), (bias, "bias")):
            if t is not None and tuple(t.shape) != (x.shape[-1],):
                raise ValueError(f"{what} has shape {list(t.shape)}; expected the shard's width, "
                                 f"[{x.shape[-1]}]")
        if (column_offset is None) != (d_global is None):
            raise ValueError("give both column_offset and d_global, or neither")
        if d_global is not None and not (d_global >= 1 and 0 <= column_offset
                                         and column_offset + x.shape[-1] <= d_global):
            raise ValueError(f"the shard's columns [{column_offset}, "
                             f"{column_offset + x.shape[-1]}) are not inside a row of "
                             f"d_global = {d_global} columns")
        if eps is not None and not (math.isfinite(eps) and eps >= 0):
            raise ValueError(f"eps must be finite and >= 0, got {eps}")
        if not (0 < partial <= 1):
            raise ValueError(f"partial must be in (0, 1], got {partial}")
    except (TypeError, ValueError) as err:
        return err
    return None


def _record(phase, err, x, weight, bias, eps, partial, flags, column_offset, d_global):
    r = [0] * _RECORD
    r[_PHASE] = phase
    if err is not None:
        r[_ERR] = _ERR_TYPE if isinstance(err, TypeError) else _ERR_VALUE
        return r
    lead = tuple(x.shape[:-1])
    r[_ROWS] = math.prod(lead)
    r[_LEAD] = hash(lead) & ((1 << 62) - 1)  # ints hash the same in every process
    r[_WIDTH] = x.shape[-1]
    r[_DTYPE] = _code(x.dtype)
    r[_OFFSET] = -1 if column_offset is None else column_offset
    r[_DGLOBAL] = -1 if d_global is None else d_global
    r[_EPS] = -1 if eps is None else _bits(float(eps))  # -1 is a NaN's bits, never valid
    r[_PARTIAL] = _bits(float(partial))
    r[_FLAGS] = flags
    r[_WDTYPE] = -2 if weight is None else _code(weight.dtype)
    r[_BDTYPE] = -2 if bias is None else _code(bias.dtype)
    return r


def _gather(values, group):
    """Every rank's int64 values, as a list of lists in group rank order."""
    n = dist.get_world_size(group)
    mine = torch.tensor(values, dtype=torch.int64)
    out = [torch.empty_like(mine) for _ in range(n)]
    dist.all_gather(out, mine, group=group)
    return [t.tolist() for t in out]


def _verdict(table, phase):
    """(exception class, message) when the records disagree, else None; the same on every
    rank, since every rank holds the same table."""
    def differ(field):
        return len({r[field] for r in table}) > 1

    def show(field, fmt=str):
        return ", ".join(f"rank {i}: {fmt(r[field])}" for i, r in enumerate(table))

    if differ(_PHASE):
        return ValueError, ("the ranks are in different calls (" +
                            show(_PHASE, lambda p: "backward" if p else "forward") + ")")
    if differ(_ROWS) or differ(_LEAD):
        return ValueError, f"the ranks disagree on the rows (rows {show(_ROWS)})"
    if differ(_DTYPE):
        return TypeError, ("the ranks disagree on the dtype (" +
                           show(_DTYPE, lambda c: str(_FLOATS[c]).replace("torch.", "")) + ")")
    if differ(_WDTYPE) or differ(_BDTYPE):
        return TypeError, "the ranks disagree on the weight's or the bias's dtype (or presence)"
    for field, name in ((_EPS, "eps"), (_PARTIAL, "partial"),
                        (_FLAGS, "offset, eps_outside or round_before_weight")):
        if differ(field):
            return ValueError, f"the ranks disagree on {name}"
    given = {r[_OFFSET] >= 0 for r in table}
    if len(given) > 1:
        return ValueError, "some ranks give column_offset and d_global, others do not"
    if given == {True}:
        if differ(_DGLOBAL):
            return ValueError, f"the ranks disagree on d_global ({show(_DGLOBAL)})"
        d = table[0][_DGLOBAL]
        end = 0
        for off, w in sorted((r[_OFFSET], r[_WIDTH]) for r in table):
            if off != end:
                break
            end += w
        if end != d or sum(r[_WIDTH] for r in table) != d:
            return ValueError, ("the shards do not cover [0, d_global) exactly once (d_global = "
                                f"{d}; [offset, width) " + ", ".join(
                                    f"rank {i}: [{r[_OFFSET]}, {r[_WIDTH]})"
                                    for i, r in enumerate(table)) + ")")
    return None


def _check(phase, group, x, weight, bias, eps, partial, flags, column_offset, d_global):
    """The collective check: raises on every rank, or returns the gathered records."""
    err = _local_error(x, weight, bias, eps, partial, column_offset, d_global)
    table = _gather(_record(phase, err, x, weight, bias, eps, partial, flags, column_offset,
                            d_global), group)
    bad = [i for i, r in enumerate(table) if r[_ERR]]
    if bad:
        # every rank knows that some rank failed: one more collective, for the messages
        msgs = [None] * len(table)
        dist.all_gather_object(msgs, None if err is None else f"{type(err).__name__}: {err}",
                               group=group)
        if err is not None:
            raise type(err)(f"rmsnorm.torch.distributed.rms_norm: {err}")
        first = bad[0]
        cls = TypeError if table[first][_ERR] == _ERR_TYPE else ValueError
        raise cls(f"rmsnorm.torch.distributed.rms_norm: rank {first} of the group failed its "
                  f"argument checks ({msgs[first]})")
    v = _verdict(table, phase)
    if v is not None:
        raise v[0](f"rmsnorm.torch.distributed.rms_norm: {v[1]}")
    return table


def _placement(widths, rank):
    """(column_offset, d_global) of this rank when the shards lie in group rank order."""
    return sum(widths[:rank]), sum(widths)


# ---- the function ---------------------------------------------------------------------------


class _ShardRMSNorm(torch.autograd.Function):
    """forward: shard stats -> all_reduce -> shard forward (the summed stats are saved);
    backward: shard dots -> all_reduce -> shard backward."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps, offset, eps_outside, partial, rbw, column_offset,
                d_global, group, check):
        s = _ops.rms_norm_shard_stats(x, d_global, column_offset, partial=partial)
        dist.all_reduce(s, op=dist.ReduceOp.SUM, group=group)
        y = _ops.rms_norm_shard_forward(x, s, d_global, column_offset, weight, eps, bias=bias,
                                        offset=offset, eps_outside=eps_outside, partial=partial,
                                        round_before_weight=rbw)
        ctx.save_for_backward(x, weight, bias, s)
        ctx.args = (eps, offset, eps_outside, partial, rbw, column_offset, d_global, group, check)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, weight, bias, s = ctx.saved_tensors
        eps, offset, eps_outside, partial, rbw, col, d_global, group, check = ctx.args
        if check:
            _check(1, group, x, weight, bias, eps, partial, _flags(offset, eps_outside, rbw),
                   col, d_global)
        kw = dict(offset=offset, eps_outside=eps_outside, partial=partial)
        # every rank sums, whichever gradients it needs: the ranks must make the same calls
        t = _ops.rms_norm_shard_backward_dots(dy, x, s, d_global, col, weight, eps, **kw)
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
        mask = [ctx.needs_input_grad[0], weight is not None and ctx.needs_input_grad[1],
                bias is not None and ctx.needs_input_grad[2]]
        dx, dw, db = _ops.rms_norm_shard_backward(dy, x, s, t, d_global, col, weight, eps, mask,
                                                  bias=bias, **kw)
        return (dx, dw, db) + (None,) * 9


def _flags(offset, eps_outside, rbw):
    return int(bool(offset)) | int(bool(eps_outside)) << 1 | int(bool(rbw)) << 2


def rms_norm(x_shard: torch.Tensor, weight: Optional[torch.Tensor] = None,
             eps: Optional[float] = None, *, bias: Optional[torch.Tensor] = None,
             offset: bool = False, eps_outside: bool = False, partial: float = 1.0,
             round_before_weight: bool = False, group=None,
             column_offset: Optional[int] = None, d_global: Optional[int] = None,
             check: Optional[bool] = None) -> torch.Tensor:
    """RMSNorm of rows whose last dim is split over the ranks of `group` (None: the default
    group); returns this rank's columns of the result, differentiable in x_shard, weight and
    bias (first order). A collective: every rank of the group calls it, in the same order.

    x_shard: (*, width), columns [column_offset, column_offset + width) of rows of d_global
    columns (width 0 is allowed); weight, bias: (width,) or None. The keywords are those of
    rmsnorm.torch.rms_norm over the whole rows: eps (None: the dtype's default), offset
    (multiply by 1 + weight, Gemma), eps_outside, partial (pRMSNorm over the first
    ceil(partial * d_global) columns, wherever they lie), round_before_weight.
    column_offset, d_global: both None (the shards in group rank order, found with one
    all_gather of a few int64 per rank) or both given. check: make the collective argument
    checks (None: set_checks / RMSNORM_DISTRIBUTED_CHECK). Raises TypeError / ValueError as
    rmsnorm.torch.rms_norm does; with checks, on every rank (see the module's doc).
    """
    if check is None:
        check = checks_enabled()
    flags = _flags(offset, eps_outside, round_before_weight)
    if check:
        table = _check(0, group, x_shard, weight, bias, eps, partial, flags, column_offset,
                       d_global)
        if column_offset is None:
            column_offset, d_global = _placement([r[_WIDTH] for r in table],
                                                 dist.get_rank(group))
    elif column_offset is None or d_global is None:
        if (column_offset is None) != (d_global is None):
            raise ValueError("rmsnorm.torch.distributed.rms_norm: give both column_offset and "
                             "d_global, or neither")
        widths = [w for w, in _gather([x_shard.shape[-1] if x_shard.dim() else 0], group)]
        column_offset, d_global = _placement(widths, dist.get_rank(group))
    return _ShardRMSNorm.apply(x_shard, weight, bias, eps, offset, eps_outside, partial,
                               round_before_weight, column_offset, d_global, group, check)
