"""_torch_fake.py - the fake (meta) kernels of the rmsnorm:: torch ops: the
shapes, dtypes and strides of their outputs, for FakeTensor tracing
(torch.compile, torch.export) and for tensors on the meta device. They check
what can be checked without data (dtypes, shapes), with the messages of the
real kernels; symbolic sizes stay symbolic. Imported by rmsnorm.torch."""

from __future__ import annotations


import torch

_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_fake = torch.library.register_fake


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


def _take(op: str, t, what: str):
    if t is None:
        return None
    if t.device.type not in ("cpu", "meta"):
        raise TypeError(f"rmsnorm::{op}: {what} is on device {t.device}; rmsnorm runs on CPU "
                        "tensors only (move it with .cpu(), or use torch's own norm on that "
                        "device)")
    if t.dtype not in _FLOATS:
        raise TypeError(f"rmsnorm::{op}: {what} has dtype {_dtype_name(t)}; rmsnorm takes "
                        "float32, float16, bfloat16 or float64")
    return t


def _check_input(op: str, x, normalized_shape, what: str = "input"):
    k = len(normalized_shape)
    torch._check(k >= 1, lambda: f"rmsnorm::{op}: Expected normalized_shape to be at least "
                 "1-dimensional, i.e., containing at least one element, but got "
                 "normalized_shape = []")
    torch._check_value(
        x.dim() >= k and all(a == b for a, b in zip(x.shape[x.dim() - k:], normalized_shape)),
        lambda: f"rmsnorm::{op}: Given normalized_shape={list(normalized_shape)}, expected "
                f"{what} with shape [*, {', '.join(map(str, normalized_shape))}], but got {what} "
                f"of size {list(x.shape)}")


def _check_param(op: str, p, name: str, shape):
    if p is None:
        return
    _take(op, p, name)
    torch._check_value(
        p.dim() == len(shape) and all(a == b for a, b in zip(p.shape, shape)),
        lambda: f"rmsnorm::{op}: Expected {name} to be of same shape as normalized_shape, but "
                f"got {name} of shape {list(p.shape)} and normalized_shape = {list(shape)}")


def _norm_args(op, x, normalized_shape, weight, bias):
    _take(op, x, "input")
    _check_input(op, x, normalized_shape)
    _check_param(op, weight, "weight", normalized_shape)
    _check_param(op, bias, "bias", normalized_shape)


def _empty(x, shape=None, dtype=None):
    """A new contiguous tensor (the real kernels' outputs are contiguous)."""
    return x.new_empty(x.shape if shape is None else shape, dtype=dtype or x.dtype)


def _stats(x, k):
    """(*leading, 1, ..., 1), float32 (float64 for float64 data)."""
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    return x.new_empty(tuple(x.shape[: x.dim() - k]) + (1,) * k, dtype=dtype)


def _param_grad(p, want):
    return p.new_empty(p.shape) if (want and p is not None) else None


# ---- RMSNorm and LayerNorm ------------------------------------------------------------


@_fake("rmsnorm::rms_norm")
def _rms_norm(input, normalized_shape, weight=None, eps=None, *, bias=None, offset=False,
              eps_outside=False, partial=1.0, round_before_weight=False):
    _norm_args("rms_norm", input, normalized_shape, weight, bias)
    return _empty(input)


@_fake("rmsnorm::rms_norm.out")
def _rms_norm_out(input, normalized_shape, weight=None, eps=None, *, bias=None, offset=False,
                  eps_outside=False, partial=1.0, round_before_weight=False, out):
    _norm_args("rms_norm.out", input, normalized_shape, weight, bias)
    _take("rms_norm.out", out, "out")
    torch._check_value(out.shape == input.shape and out.dtype == input.dtype,
                       lambda: "rmsnorm::rms_norm.out: out must have the input's shape and dtype")


@_fake("rmsnorm::rms_norm_forward")
def _rms_norm_forward(input, normalized_shape, weight=None, eps=None, *, bias=None, offset=False,
                      eps_outside=False, partial=1.0, round_before_weight=False):
    _norm_args("rms_norm_forward", input, normalized_shape, weight, bias)
    return _empty(input), _stats(input, len(normalized_shape))


@_fake("rmsnorm::rms_norm_backward")
def _rms_norm_backward(grad_output, input, normalized_shape, weight, rstd, eps, output_mask, *,
                       bias=None, offset=False, eps_outside=False, partial=1.0):
    _norm_args("rms_norm_backward", input, normalized_shape, weight, bias)
    _take("rms_norm_backward", grad_output, "grad_output")
    return (_empty(input) if output_mask[0] else None, _param_grad(weight, output_mask[1]),
            _param_grad(bias, output_mask[2]))


@_fake("rmsnorm::layer_norm")
def _layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5, *, offset=False,
                round_before_weight=False):
    _norm_args("layer_norm", input, normalized_shape, weight, bias)
    return _empty(input)


@_fake("rmsnorm::layer_norm.out")
def _layer_norm_out(input, normalized_shape, weight=None, bias=None, eps=1e-5, *, offset=False,
                    round_before_weight=False, out):
    _norm_args("layer_norm.out", input, normalized_shape, weight, bias)
    _take("layer_norm.out", out, "out")
    torch._check_value(out.shape == input.shape and out.dtype == input.dtype,
                       lambda: "rmsnorm::layer_norm.out: out must have the input's shape and dtype")


@_fake("rmsnorm::layer_norm_forward")
def _layer_norm_forward(input, normalized_shape, weight=None, bias=None, eps=1e-5, *,
                        offset=False, round_before_weight=False):
    _norm_args("layer_norm_forward", input, normalized_shape, weight, bias)
    k = len(normalized_shape)
    return _empty(input), _stats(input, k), _stats(input, k)


@_fake("rmsnorm::layer_norm_backward")
def _layer_norm_backward(grad_output, input, normalized_shape, weight, bias, mean, rstd, eps,
                         output_mask, *, offset=False):
    _norm_args("layer_norm_backward", input, normalized_shape, weight, bias)
    _take("layer_norm_backward", grad_output, "grad_output")
    return (_empty(input) if output_mask[0] else None, _param_grad(weight, output_mask[1]),
            _param_grad(bias, output_mask[2]))


# ---- fused operations -------------------------------------------------------------------


@_fake("rmsnorm::fused_add_rms_norm")
def _fused_add(input, residual, normalized_shape, weight=None, eps=None, *, bias=None,
               offset=False, eps_outside=False, partial=1.0):
    _norm_args("fused_add_rms_norm", input, normalized_shape, weight, bias)
    _take("fused_add_rms_norm", residual, "residual")
    return _empty(input), _empty(input)


@_fake("rmsnorm::fused_add_rms_norm_inplace")
def _fused_add_inplace(input, residual, normalized_shape, weight=None, eps=None, *, bias=None,
                       offset=False, eps_outside=False, partial=1.0):
    _norm_args("fused_add_rms_norm_inplace", input, normalized_shape, weight, bias)
    _take("fused_add_rms_norm_inplace", residual, "residual")


@_fake("rmsnorm::fused_add_rms_norm_backward")
def _fused_add_backward(grad_output, grad_residual, new_residual, normalized_shape, weight, eps,
                        output_mask, *, bias=None, offset=False, eps_outside=False, partial=1.0):
    _norm_args("fused_add_rms_norm_backward", new_residual, normalized_shape, weight, bias)
    return (_empty(new_residual) if output_mask[0] else None, _param_grad(weight, output_mask[1]),
            _param_grad(bias, output_mask[2]))


def _qk_args(op, input, weight, bias):
    _take(op, input, "input")
    torch._check_value(input.dim() >= 2, lambda: f"rmsnorm::{op}: input must have shape "
                       f"(*, heads, head_dim), got {list(input.shape)}")
    _check_param(op, weight, "weight", input.shape[-1:])
    _check_param(op, bias, "bias", input.shape[-1:])


@_fake("rmsnorm::qk_norm")
def _qk_norm(input, weight=None, eps=None, *, bias=None, offset=False, eps_outside=False,
             partial=1.0):
    _qk_args("qk_norm", input, weight, bias)
    return _empty(input)


@_fake("rmsnorm::qk_norm_inplace")
def _qk_norm_inplace(input, weight=None, eps=None, *, bias=None, offset=False, eps_outside=False,
                     partial=1.0):
    _qk_args("qk_norm_inplace", input, weight, bias)


@_fake("rmsnorm::qk_norm_backward")
def _qk_norm_backward(grad_output, input, weight, eps, output_mask, *, bias=None, offset=False,
                      eps_outside=False, partial=1.0):
    _qk_args("qk_norm_backward", input, weight, bias)
    return (_empty(input) if output_mask[0] else None, _param_grad(weight, output_mask[1]),
            _param_grad(bias, output_mask[2]))


def _quant(op, dtype, input, normalized_shape, weight, bias, scale):
    _norm_args(op, input, normalized_shape, weight, bias)
    q = _empty(input, dtype=dtype)
    if scale is None:
        return q, _stats(input.float(), len(normalized_shape))
    return q, input.new_empty((), dtype=torch.float32)


@_fake("rmsnorm::rms_norm_int8")
def _int8(input, normalized_shape, weight=None, eps=None, *, bias=None, scale=None, offset=False,
          eps_outside=False, partial=1.0):
    return _quant("rms_norm_int8", torch.int8, input, normalized_shape, weight, bias, scale)


@_fake("rmsnorm::rms_norm_fp8")
def _fp8(input, normalized_shape, weight=None, eps=None, *, bias=None, scale=None, offset=False,
         eps_outside=False, partial=1.0):
    return _quant("rms_norm_fp8", torch.float8_e4m3fn, input, normalized_shape, weight, bias,
                  scale)


def _linear_args(op, input, weight_matrix, norm_weight, bias):
    _take(op, input, "input")
    _take(op, weight_matrix, "weight_matrix")
    torch._check_value(input.dim() >= 1, lambda: f"rmsnorm::{op}: input must have at least one "
                       "dimension (the normalized one)")
    torch._check_value(weight_matrix.dim() == 2 and weight_matrix.shape[0] == input.shape[-1],
                       lambda: f"rmsnorm::{op}: weight_matrix has shape "
                       f"{list(weight_matrix.shape)}; expected (d, n) with d = "
                       f"{input.shape[-1]}, the input's last dim")
    _check_param(op, norm_weight, "norm_weight", input.shape[-1:])
    _check_param(op, bias, "bias", weight_matrix.shape[1:])


@_fake("rmsnorm::rms_norm_linear")
def _linear(input, weight_matrix, norm_weight=None, eps=None, bias=None, offset=False, *,
            eps_outside=False, partial=1.0):
    _linear_args("rms_norm_linear", input, weight_matrix, norm_weight, bias)
    return _empty(input, tuple(input.shape[:-1]) + (weight_matrix.shape[1],))


@_fake("rmsnorm::rms_norm_linear_backward")
def _linear_backward(grad_output, input, weight_matrix, norm_weight, eps, bias, offset,
                     output_mask, *, eps_outside=False, partial=1.0):
    _linear_args("rms_norm_linear_backward", input, weight_matrix, norm_weight, bias)
    return (_empty(input) if output_mask[0] else None, _param_grad(weight_matrix, output_mask[1]),
            _param_grad(norm_weight, output_mask[2]), _param_grad(bias, output_mask[3]))


# ---- the steps of RMSNorm over a column shard (rmsnorm.torch.distributed) ----------------


def _shard_args(op, x, d_global, column_offset, weight=None, bias=None, grad_output=None):
    _take(op, x, "input")
    torch._check_value(x.dim() >= 1, lambda: f"rmsnorm::{op}: input must have at least one dim "
                       "(the last: the shard's columns)")
    width = x.shape[-1]
    torch._check_value(d_global >= 1 and 0 <= column_offset and column_offset + width <= d_global,
                       lambda: f"rmsnorm::{op}: the shard's columns [{column_offset}, "
                               f"{column_offset + width}) are not inside a row of d_global = "
                               f"{d_global} columns")
    _check_param(op, weight, "weight", (width,))
    _check_param(op, bias, "bias", (width,))
    if grad_output is not None:
        _take(op, grad_output, "grad_output")


def _row_sums(op, s, name):
    torch._check_type(s.dtype == torch.float64, lambda: f"rmsnorm::{op}: {name} has dtype "
                      f"{_dtype_name(s)}; per-row sums are float64 (as rms_norm_shard_stats "
                      "returns them)")


def _sums(x):
    return x.new_empty(x.shape[:-1], dtype=torch.float64)


@_fake("rmsnorm::rms_norm_shard_stats")
def _shard_stats(input, d_global, column_offset, *, partial=1.0):
    _shard_args("rms_norm_shard_stats", input, d_global, column_offset)
    return _sums(input)


@_fake("rmsnorm::rms_norm_shard_forward")
def _shard_forward(input, stats, d_global, column_offset, weight=None, eps=None, *, bias=None,
                   offset=False, eps_outside=False, partial=1.0, round_before_weight=False):
    op = "rms_norm_shard_forward"
    _shard_args(op, input, d_global, column_offset, weight, bias)
    _row_sums(op, stats, "stats")
    return _empty(input)


@_fake("rmsnorm::rms_norm_shard_backward_dots")
def _shard_backward_dots(grad_output, input, stats, d_global, column_offset, weight, eps, *,
                         offset=False, eps_outside=False, partial=1.0):
    op = "rms_norm_shard_backward_dots"
    _shard_args(op, input, d_global, column_offset, weight, grad_output=grad_output)
    _row_sums(op, stats, "stats")
    return _sums(input)


@_fake("rmsnorm::rms_norm_shard_backward")
def _shard_backward(grad_output, input, stats, dots, d_global, column_offset, weight, eps,
                    output_mask, *, bias=None, offset=False, eps_outside=False, partial=1.0):
    op = "rms_norm_shard_backward"
    _shard_args(op, input, d_global, column_offset, weight, bias, grad_output)
    _row_sums(op, stats, "stats")
    _row_sums(op, dots, "dots")
    return (_empty(input) if output_mask[0] else None, _param_grad(weight, output_mask[1]),
            _param_grad(bias, output_mask[2]))
