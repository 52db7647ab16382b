"""rmsnorm.torch.distributed - RMSNorm over a hidden dimension sharded across the ranks of a
torch.distributed process group, differentiable (README.md, "Sharded hidden dimension").

Each rank of the group holds a column shard of the same rows: x_shard (*, width) is columns
[column_offset, column_offset + width) of rows of d_global columns, and weight and bias are
the shard's width elements. The compute steps are the ops rmsnorm::rms_norm_shard_stats,
_shard_forward, _shard_backward_dots and _shard_backward (librmsnorm's rmsnorm_shard_*);
between them the sums over the group cross it in one torch.distributed.all_reduce (SUM) of
float64 per forward and one per backward, which also carries the ranks' agreement (below):
16 values per rank and the first 4096 rows' sums (zeros past rows); more rows follow in a
second all_reduce.
Any backend that sums float64 tensors on the CPU carries them (gloo).

    import torch.distributed as dist
    from rmsnorm.torch.distributed import rms_norm
    y_shard = rms_norm(x_shard, g_shard)          # columns laid out in group rank order
    y_shard.sum().backward()                      # x_shard.grad, g_shard.grad: this shard's

Where the shard sits: with column_offset and d_global None, the shards lie in group rank
order (rank 0 the first columns), found from the widths the first all_reduce carries; the
statistics then take a second all_reduce. Give both (every rank its own) and they ride on
the first.

The ranks agree, always: the first all_reduce of a forward and of a backward is the same on
every rank whatever its arguments, and carries every rank's record of its call (its own
argument error, if any; the rows and leading shape, width, placement, dtypes, eps (None
taken as the dtype's default, 0 and -0 alike), partial and flags), each in its own slots of
the sum, so every rank holds every record exactly and raises the same exception when any
rank's own arguments are invalid (that rank its own, the others naming it and quoting its
message) or the ranks disagree: rows (or the leading shape), d_global, or shards not
covering [0, d_global) exactly once: ValueError; dtype or parameter dtypes: TypeError;
eps, partial, offset, eps_outside, round_before_weight, which of weight/bias is given, or
column_offset given on some ranks only: ValueError; a forward meeting a backward:
ValueError. Nobody is left waiting in a collective. check=, set_checks() and
RMSNORM_DISTRIBUTED_CHECK are kept for compatibility: the checks they turned on are now
always made.

dweight and dbias are this rank's shard summed over this rank's rows. Where rows are also
split over ranks (data or sequence parallelism) their sum over those ranks is left to the
usual machinery (DDP, or an all_reduce of the gradients), as for any parameter.
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
# False in bench/mpi/bench_torch_agreement.py's measurement only: the sums without the agreement
_AGREE = True


def set_checks(on: Optional[bool]) -> None:
    """Kept for compatibility: the collective argument checks are always made. Sets what
    checks_enabled() returns (None: back to the environment variable
    RMSNORM_DISTRIBUTED_CHECK)."""
    global _checks
    _checks = None if on is None else bool(on)


def checks_enabled() -> bool:
    """Kept for compatibility (the checks are always made): the set_checks() /
    RMSNORM_DISTRIBUTED_CHECK setting."""
    if _checks is not None:
        return _checks
    return os.environ.get("RMSNORM_DISTRIBUTED_CHECK", "0") not in ("", "0")


# ---- the agreement ------------------------------------------------------------------------

# A rank's record: floats, each exact in float64 (integers below 2^53), in the rank's own
# slots of the first all_reduce's sum, so that every rank holds every record.
_RECORD = 16
_ERR, _PHASE, _ROWS, _LEAD, _LEAD2, _WIDTH, _DTYPE, _OFFSET, _DGLOBAL, _EPS, _PARTIAL, \
    _FLAGS, _WDTYPE, _BDTYPE = range(14)
_ERR_TYPE, _ERR_VALUE, _ERR_OTHER = 1, 2, 3
# rows' sums the first all_reduce carries: gloo's all_reduce took about as long for 4 to 8224
# float64 (0.52-0.67 ms on 2 ranks of the 2-vCPU VM) as a second all_reduce costs
_HEAD_ROWS = 4096


def _code(dtype) -> int:
    return _FLOATS.index(dtype) if dtype in _FLOATS else -1


def _eps_value(eps, x):
    """eps as the ops use it: None is the dtype's default (torch's: float32's epsilon,
    float64's for float64 data), and -0.0 is 0.0; anything else is left for the checks."""
    if eps is None:
        if isinstance(x, torch.Tensor) and x.dtype in _FLOATS:
            return torch.finfo(torch.float64 if x.dtype == torch.float64 else
                               torch.float32).eps
        return None
    if isinstance(eps, (int, float)) and not isinstance(eps, bool):
        return 0.0 if eps == 0 else float(eps)
    return eps


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
        if not (math.isfinite(eps) and eps >= 0):
            raise ValueError(f"eps must be finite and >= 0, got {eps}")
        if not (0 < partial <= 1):
            raise ValueError(f"partial must be in (0, 1], got {partial}")
    except (TypeError, ValueError) as err:
        return err
    return None


def _err_kind(err) -> int:
    if err is None:
        return 0
    return _ERR_TYPE if isinstance(err, TypeError) else \
        _ERR_VALUE if isinstance(err, ValueError) else _ERR_OTHER


def _record(phase, err, x, weight, bias, eps, partial, flags, column_offset, d_global):
    r = [0.0] * _RECORD
    r[_PHASE] = phase
    if err is not None:
        r[_ERR] = _err_kind(err)
        return r
    lead = tuple(x.shape[:-1])
    h = hash(lead) & ((1 << 62) - 1)  # ints hash the same in every process
    r[_ROWS] = math.prod(lead)
    r[_LEAD], r[_LEAD2] = h >> 31, h & ((1 << 31) - 1)
    r[_WIDTH] = x.shape[-1]
    r[_DTYPE] = _code(x.dtype)
    r[_OFFSET] = -1 if column_offset is None else column_offset
    r[_DGLOBAL] = -1 if d_global is None else d_global
    r[_EPS] = eps
    r[_PARTIAL] = float(partial)
    r[_FLAGS] = flags
    r[_WDTYPE] = -2 if weight is None else _code(weight.dtype)
    r[_BDTYPE] = -2 if bias is None else _code(bias.dtype)
    return r


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
        return TypeError, ("the ranks disagree on the dtype (" +
                           show(_DTYPE, lambda c: str(_FLOATS[int(c)]).replace("torch.", "")) +
                           ")")
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
        d = int(table[0][_DGLOBAL])
        end = 0
        for off, w in sorted((int(r[_OFFSET]), int(r[_WIDTH])) for r in table if r[_WIDTH]):
            if off != end:
                break
            end += w
        if end != d or sum(int(r[_WIDTH]) for r in table) != d:
            return ValueError, ("the shards do not cover [0, d_global) exactly once (d_global = "
                                f"{d}; [offset, width) " + ", ".join(
                                    f"rank {i}: [{int(r[_OFFSET])}, {int(r[_WIDTH])})"
                                    for i, r in enumerate(table)) + ")")
    return None


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
    if first[_OFFSET] < 0:
        return True
    end = 0
    for off, w in sorted((r[_OFFSET], r[_WIDTH]) for r in table if r[_WIDTH]):
        if off != end:
            return False
        end += w
    return end == first[_DGLOBAL]


_CLASSES = {_ERR_TYPE: TypeError, _ERR_VALUE: ValueError, _ERR_OTHER: RuntimeError}


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
    if not _AGREE:  # the measurement's baseline: the sums alone
        if column_offset is None:
            widths = [torch.zeros(1, dtype=torch.int64) for _ in range(n)]
            dist.all_gather(widths, torch.tensor([x.shape[-1]]), group=group)
            widths = [int(w) for w in widths]
            column_offset, d_global = sum(widths[:me]), sum(widths)
        s = local_sums(column_offset, d_global)
        dist.all_reduce(s, op=dist.ReduceOp.SUM, group=group)
        return column_offset, d_global, s
    err = _local_error(x, weight, bias, eps, partial, column_offset, d_global)
    placed = column_offset is not None
    s = None
    if err is None and placed:
        s, err = _local(local_sums, column_offset, d_global)
    head = torch.zeros(n * _RECORD + _HEAD_ROWS, dtype=torch.float64)
    h = head.numpy()  # the same memory, written without torch's per-op cost
    h[me * _RECORD:(me + 1) * _RECORD] = _record(phase, err, x, weight, bias, eps, partial,
                                                 flags, column_offset, d_global)
    at = n * _RECORD  # the rows' sums in the head
    flat = None if s is None else s.numpy().reshape(-1)  # the op's new, contiguous tensor
    if flat is not None:
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
        out = torch.from_numpy(h[at:at + min(flat.size, _HEAD_ROWS)])
        if flat.size > _HEAD_ROWS:
            rest = torch.from_numpy(flat[_HEAD_ROWS:].copy())
            dist.all_reduce(rest, op=dist.ReduceOp.SUM, group=group)
            out = torch.cat([out, rest])
        return column_offset, d_global, out.view(s.shape)
    # no rank placed its shard: rank order; each rank's statuses travel with its sums
    widths = [int(r[_WIDTH]) for r in table]
    column_offset, d_global = sum(widths[:me]), sum(widths)
    s, err = _local(local_sums, column_offset, d_global)
    rows = int(table[0][_ROWS])
    buf = torch.zeros(n + rows, dtype=torch.float64)
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
    stats are saved); backward: shard dots -> all_reduce (with the agreement) -> shard
    backward."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps, offset, eps_outside, partial, rbw, column_offset,
                d_global, group):
        flags = _flags(offset, eps_outside, rbw)
        col, d_global, s = _agreed_sums(
            0, group, x, weight, bias, eps, partial, flags, column_offset, d_global,
            lambda c, d: _ops.rms_norm_shard_stats(x, d, c, partial=partial))
        y = _ops.rms_norm_shard_forward(x, s, d_global, col, weight, eps, bias=bias,
                                        offset=offset, eps_outside=eps_outside, partial=partial,
                                        round_before_weight=rbw)
        ctx.save_for_backward(x, weight, bias, s)
        ctx.args = (eps, offset, eps_outside, partial, rbw, col, d_global, group)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, weight, bias, s = ctx.saved_tensors
        eps, offset, eps_outside, partial, rbw, col, d_global, group = ctx.args
        kw = dict(offset=offset, eps_outside=eps_outside, partial=partial)
        # every rank sums, whichever gradients it needs: the ranks must make the same calls
        _, _, t = _agreed_sums(
            1, group, x, weight, bias, eps, partial, _flags(offset, eps_outside, rbw), col,
            d_global,
            lambda c, d: _ops.rms_norm_shard_backward_dots(dy, x, s, d, c, weight, eps, **kw))
        mask = [ctx.needs_input_grad[0], weight is not None and ctx.needs_input_grad[1],
                bias is not None and ctx.needs_input_grad[2]]
        dx, dw, db = _ops.rms_norm_shard_backward(dy, x, s, t, d_global, col, weight, eps, mask,
                                                  bias=bias, **kw)
        return (dx, dw, db) + (None,) * 8


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
    column_offset, d_global: both None (the shards in group rank order) or both given.
    check: kept for compatibility (the collective argument checks are always made). Raises
    TypeError / ValueError as rmsnorm.torch.rms_norm does, on every rank when any rank's
    arguments are wrong or the ranks disagree (see the module's doc).
    """
    del check  # the checks are always made
    return _ShardRMSNorm.apply(x_shard, weight, bias, _eps_value(eps, x_shard), offset,
                               eps_outside, partial, round_before_weight, column_offset,
                               d_global, group)
