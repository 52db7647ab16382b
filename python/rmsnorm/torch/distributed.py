"""rmsnorm.torch.distributed - RMSNorm over a hidden dimension sharded across the ranks of a
torch.distributed process group, differentiable (docs/sharding.md, "In PyTorch").

The steps are the ops rmsnorm::rms_norm_shard_stats, _shard_forward, _shard_backward_dots
and _shard_backward; between them the per-row sums cross the group in one float64
all_reduce (SUM) per forward and one per backward (gloo, or any backend that sums float64
CPU tensors), which also carries every rank's record of its call: every rank raises the
same exception when any rank's arguments are wrong or the ranks disagree, none is left
waiting in a collective.

    from rmsnorm.torch.distributed import rms_norm
    y_shard = rms_norm(x_shard, g_shard)          # columns laid out in group rank order
    y_shard.sum().backward()                      # x_shard.grad, g_shard.grad: this shard's
"""

from __future__ import annotations

import math
import os
from typing import Optional

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from .._torch_fake import FLOATS as _FLOATS  # by rmsnorm_dtype code
from . import _ops  # torch.ops.rmsnorm, with the ops registered

__all__ = ["rms_norm", "set_checks", "checks_enabled"]

_checks: Optional[bool] = None  # None: the environment variable decides
# False in bench/mpi/bench_torch_agreement.py's measurement only: the sums without the
# agreement, for shards given
_AGREE = True


def set_checks(on: Optional[bool]) -> None:
    """Kept for compatibility (the checks are always made): sets what checks_enabled()
    returns (None: the environment variable RMSNORM_DISTRIBUTED_CHECK decides again)."""
    global _checks
    _checks = None if on is None else bool(on)


def checks_enabled() -> bool:
    """Kept for compatibility: the set_checks() / RMSNORM_DISTRIBUTED_CHECK setting."""
    env = os.environ.get("RMSNORM_DISTRIBUTED_CHECK", "0") not in ("", "0")
    return env if _checks is None else _checks


# ---- the agreement ------------------------------------------------------------------------

# A rank's record: floats, each exact in float64 (integers below 2^53), in the rank's own
# slots of the first all_reduce's sum, so that every rank holds every record.
_RECORD = 16
_ERR, _PHASE, _ROWS, _LEAD, _LEAD2, _WIDTH, _DTYPE, _OFFSET, _DGLOBAL, _EPS, _PARTIAL, \
    _FLAGS, _WDTYPE, _BDTYPE = range(14)
_ERR_TYPE, _ERR_VALUE, _ERR_OTHER = 1, 2, 3
_CLASSES = {_ERR_TYPE: TypeError, _ERR_VALUE: ValueError, _ERR_OTHER: RuntimeError}
# rows' sums the first all_reduce carries (gloo's all_reduce costs about the same for 4 as for
# 8224 float64: bench/RESULTS.md)
_HEAD_ROWS = 4096


def _code(dtype) -> int:
    return _FLOATS.index(dtype) if dtype in _FLOATS else -1


def _eps_value(eps, x):
    """eps as the ops use it: None is the dtype's default (torch's: float32's epsilon,
    float64's for float64 data), and -0.0 is 0.0; anything else is left for the checks."""
    if eps is None:
        if isinstance(x, torch.Tensor) and x.dtype in _FLOATS:
            return torch.finfo(torch.float64 if x.dtype == torch.float64 else torch.float32).eps
        return None
    if isinstance(eps, (int, float)) and not isinstance(eps, bool):
        return 0.0 if eps == 0 else float(eps)
    return eps


def _local_error(x, weight, bias, eps, partial, column_offset, d_global):
    """This rank's own argument error, as an exception (None when there is none). Given
    columns are the op's to check: local_sums runs before the collective."""
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
        if not (math.isfinite(eps) and eps >= 0):
            raise ValueError(f"eps must be finite and >= 0, got {eps}")
        if not (0 < partial <= 1):
            raise ValueError(f"partial must be in (0, 1], got {partial}")
    except (TypeError, ValueError) as err:
        return err
    return None


def _err_kind(err) -> int:
    return 0 if err is None else _ERR_TYPE if isinstance(err, TypeError) else \
        _ERR_VALUE if isinstance(err, ValueError) else _ERR_OTHER


def _record(phase, err, x, weight, bias, eps, partial, flags, column_offset, d_global):
    r = [0.0] * _RECORD
    r[_ERR], r[_PHASE] = _err_kind(err), phase
    if err is None:
        lead = tuple(x.shape[:-1])
        h = hash(lead) & ((1 << 62) - 1)  # ints hash the same in every process
        r[_ROWS], r[_LEAD], r[_LEAD2] = math.prod(lead), h >> 31, h & ((1 << 31) - 1)
        r[_WIDTH], r[_DTYPE] = x.shape[-1], _code(x.dtype)
        r[_OFFSET] = -1 if column_offset is None else column_offset
        r[_DGLOBAL] = -1 if d_global is None else d_global
        r[_EPS], r[_PARTIAL], r[_FLAGS] = eps, float(partial), flags
        r[_WDTYPE] = -2 if weight is None else _code(weight.dtype)
        r[_BDTYPE] = -2 if bias is None else _code(bias.dtype)
    return r


def _covers(table) -> bool:
    """Whether the shards [offset, offset + width) cover [0, d_global) exactly once."""
    end = 0
    for off, w in sorted((r[_OFFSET], r[_WIDTH]) for r in table if r[_WIDTH]):
        if off != end:
            return False
        end += w
    return end == table[0][_DGLOBAL]


def _agree_fast(table):
    """Whether the records agree, as _verdict finds them, in the few list comparisons of the
    usual case (False leaves the errors and the messages to _verdict)."""
    first = table[0]
    if first[_ERR]:
        return False
    for r in table[1:]:
        if r[:_WIDTH] != first[:_WIDTH] or r[_DTYPE] != first[_DTYPE] or \
                r[_DGLOBAL:] != first[_DGLOBAL:] or (r[_OFFSET] < 0) != (first[_OFFSET] < 0):
            return False
    return first[_OFFSET] < 0 or _covers(table)


def _verdict(table):
    """(exception class, message) when the records disagree, else None; the same on every
    rank, since every rank holds the same table."""
    def differ(*fields):
        return any(len({r[f] for r in table}) > 1 for f in fields)

    def show(field, fmt=lambda v: str(int(v))):
        return ", ".join(f"rank {i}: {fmt(r[field])}" for i, r in enumerate(table))

    if differ(_PHASE):
        return ValueError, ("the ranks are in different calls (" +
                            show(_PHASE, lambda p: "backward" if p else "forward") + ")")
    if differ(_ROWS, _LEAD, _LEAD2):
        return ValueError, f"the ranks disagree on the rows (rows {show(_ROWS)})"
    if differ(_DTYPE):
        names = show(_DTYPE, lambda c: str(_FLOATS[int(c)]).replace("torch.", ""))
        return TypeError, f"the ranks disagree on the dtype ({names})"
    if differ(_WDTYPE, _BDTYPE):
        return TypeError, "the ranks disagree on the weight's or the bias's dtype (or presence)"
    for field, name, fmt in ((_EPS, "eps", repr), (_PARTIAL, "partial", repr),
                             (_FLAGS, "offset, eps_outside or round_before_weight", None)):
        if differ(field):
            return ValueError, (f"the ranks disagree on {name}" +
                                (f" ({show(field, fmt)})" if fmt else ""))
    given = {r[_OFFSET] >= 0 for r in table}
    if len(given) > 1:
        return ValueError, "some ranks give column_offset and d_global, others do not"
    if given == {True}:
        if differ(_DGLOBAL):
            return ValueError, f"the ranks disagree on d_global ({show(_DGLOBAL)})"
        if not _covers(table):
            return ValueError, ("the shards do not cover [0, d_global) exactly once (d_global = "
                                f"{int(table[0][_DGLOBAL])}; [offset, width) " + ", ".join(
                                    f"rank {i}: [{int(r[_OFFSET])}, {int(r[_WIDTH])})"
                                    for i, r in enumerate(table)) + ")")
    return None


def _raise_failed(kinds, err, group):
    """Some ranks failed (kinds: each rank's _ERR, the same list on every rank): one more
    collective for their messages, then every rank raises."""
    msgs = [None] * len(kinds)
    dist.all_gather_object(msgs, None if err is None else f"{type(err).__name__}: {err}",
                           group=group)
    if err is not None:
        if isinstance(err, (TypeError, ValueError)):
            raise type(err)(f"rmsnorm.torch.distributed.rms_norm: {err}")
        raise err
    first = next(i for i, k in enumerate(kinds) if k)
    raise _CLASSES[int(kinds[first])](
        f"rmsnorm.torch.distributed.rms_norm: rank {first} of the group failed its argument "
        f"checks ({msgs[first]})")


def _local(fn, *args):
    """fn(*args), or None and the exception it raised."""
    try:
        return fn(*args), None
    except Exception as err:  # noqa: BLE001  (agreed on by every rank, then raised)
        return None, err


def _agreed_sums(phase, group, x, weight, bias, eps, partial, flags, column_offset, d_global,
                 local_sums):
    """The call's collectives: the agreement with the first rows' sums, then the other rows.
    local_sums(column_offset, d_global): this rank's per-row partial sums (float64, x's
    leading shape). Raises on every rank alike, else returns (column_offset, d_global, the
    sums over the group)."""
    n, me = dist.get_world_size(group), dist.get_rank(group)
    if not _AGREE and column_offset is not None:  # the measurement's baseline: the sums alone
        s = local_sums(column_offset, d_global)
        dist.all_reduce(s, op=dist.ReduceOp.SUM, group=group)
        return column_offset, d_global, s
    err = _local_error(x, weight, bias, eps, partial, column_offset, d_global)
    placed = column_offset is not None
    s, err = _local(local_sums, column_offset, d_global) if err is None and placed else (None, err)
    head = torch.zeros(n * _RECORD + _HEAD_ROWS, dtype=torch.float64)
    h = head.numpy()  # the same memory, written without torch's per-op cost
    h[me * _RECORD:(me + 1) * _RECORD] = _record(phase, err, x, weight, bias, eps, partial,
                                                 flags, column_offset, d_global)
    at = n * _RECORD  # the rows' sums in the head
    if s is not None:
        flat = s.numpy().reshape(-1)  # the op's new, contiguous tensor
        k = min(flat.size, _HEAD_ROWS)
        h[at:at + k] = flat[:k]
    dist.all_reduce(head, op=dist.ReduceOp.SUM, group=group)
    table = h[:at].reshape(n, _RECORD).tolist()
    if not _agree_fast(table):
        kinds = [r[_ERR] for r in table]
        if any(kinds):
            _raise_failed(kinds, err, group)
        v = _verdict(table)
        if v is not None:
            raise v[0](f"rmsnorm.torch.distributed.rms_norm: {v[1]}")
    if placed:  # every rank (agreed): the other rows
        out = torch.from_numpy(h[at:at + k])
        if flat.size > _HEAD_ROWS:
            rest = torch.from_numpy(flat[_HEAD_ROWS:].copy())
            dist.all_reduce(rest, op=dist.ReduceOp.SUM, group=group)
            out = torch.cat([out, rest])
        return column_offset, d_global, out.view(s.shape)
    # no rank placed its shard: rank order; each rank's statuses travel with its sums
    widths = [int(r[_WIDTH]) for r in table]
    column_offset, d_global = sum(widths[:me]), sum(widths)
    s, err = _local(local_sums, column_offset, d_global)
    buf = torch.zeros(n + int(table[0][_ROWS]), dtype=torch.float64)
    buf[me] = _err_kind(err)
    if s is not None:
        buf[n:] = s.reshape(-1)
    dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=group)
    kinds = buf[:n].tolist()
    if any(kinds):
        _raise_failed(kinds, err, group)
    return column_offset, d_global, buf[n:].reshape(s.shape)


# ---- the function ---------------------------------------------------------------------------


class _ShardRMSNorm(torch.autograd.Function):
    """forward: shard stats -> all_reduce (with the agreement) -> shard forward (the summed
    stats saved); backward: shard dots -> all_reduce (with the agreement) -> shard backward."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps, offset, eps_outside, partial, rbw, column_offset,
                d_global, group):
        flags = int(bool(offset)) | int(bool(eps_outside)) << 1 | int(bool(rbw)) << 2
        col, d_global, s = _agreed_sums(
            0, group, x, weight, bias, eps, partial, flags, column_offset, d_global,
            lambda c, d: _ops.rms_norm_shard_stats(x, d, c, partial=partial))
        kw = dict(offset=offset, eps_outside=eps_outside, partial=partial)
        ctx.save_for_backward(x, weight, bias, s)
        ctx.args = (eps, kw, flags, col, d_global, group)
        return _ops.rms_norm_shard_forward(x, s, d_global, col, weight, eps, bias=bias,
                                           round_before_weight=rbw, **kw)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, weight, bias, s = ctx.saved_tensors
        eps, kw, flags, col, d_global, group = ctx.args
        # every rank sums, whichever gradients it needs: the ranks must make the same calls
        _, _, t = _agreed_sums(
            1, group, x, weight, bias, eps, kw["partial"], flags, col, d_global,
            lambda c, d: _ops.rms_norm_shard_backward_dots(dy, x, s, d, c, weight, eps, **kw))
        mask = list(ctx.needs_input_grad[:3])  # False for a weight or bias that is None
        dx, dw, db = _ops.rms_norm_shard_backward(dy, x, s, t, d_global, col, weight, eps, mask,
                                                  bias=bias, **kw)
        return (dx, dw, db) + (None,) * 8


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
    column_offset, d_global: both None (the shards in group rank order; a second all_reduce)
    or both given. check: kept for compatibility (the checks are always made). Raises
    TypeError / ValueError on every rank when any rank's arguments are wrong or the ranks
    disagree (docs/sharding.md). dweight, dbias: this shard's, summed over this rank's rows.
    """
    del check  # the checks are always made
    return _ShardRMSNorm.apply(x_shard, weight, bias, _eps_value(eps, x_shard), offset,
                               eps_outside, partial, round_before_weight, column_offset,
                               d_global, group)
