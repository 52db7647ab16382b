/* torch_ops.h - the C++ signatures of the rmsnorm:: torch ops (their schemas
 * are in torch_ops.cpp) and typed dispatcher handles for calling them from
 * C++: the autograd kernels and the fast Python entry points call the ops
 * through the dispatcher, so autograd, tracing, modes and subclasses see them
 * as any other op. */
#ifndef RMSNORM_PY_TORCH_OPS_H
#define RMSNORM_PY_TORCH_OPS_H

#include <array>
#include <optional>
#include <tuple>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/SymIntArrayRef.h>

namespace rnops {

using at::Tensor;
using OptTensor = std::optional<Tensor>;
using OptDouble = std::optional<double>;
using Tensor2 = std::tuple<Tensor, Tensor>;
using Tensor3 = std::tuple<Tensor, Tensor, Tensor>;
using Tensor4 = std::tuple<Tensor, Tensor, Tensor, Tensor>;

// (input, normalized_shape, weight, eps, *, bias, offset, eps_outside, partial, round_before_weight)
#define RN_RMS_ARGS const Tensor &, c10::SymIntArrayRef, const OptTensor &, OptDouble, \
                    const OptTensor &, bool, bool, double, bool
using RmsNormSig = Tensor(RN_RMS_ARGS);
using RmsNormOutSig = void(RN_RMS_ARGS, const Tensor &);
using RmsNormForwardSig = Tensor2(RN_RMS_ARGS);
// (grad_output, input, normalized_shape, weight, rstd, eps, output_mask, *, bias, offset,
//  eps_outside, partial)
using RmsNormBackwardSig = Tensor3(const Tensor &, const Tensor &, c10::SymIntArrayRef,
                                   const OptTensor &, const OptTensor &, OptDouble,
                                   std::array<bool, 3>, const OptTensor &, bool, bool, double);

// (input, normalized_shape, weight, bias, eps, *, offset, round_before_weight)
#define RN_LN_ARGS const Tensor &, c10::SymIntArrayRef, const OptTensor &, const OptTensor &, \
                   OptDouble, bool, bool
using LayerNormSig = Tensor(RN_LN_ARGS);
using LayerNormOutSig = void(RN_LN_ARGS, const Tensor &);
using LayerNormForwardSig = Tensor3(RN_LN_ARGS);
// (grad_output, input, normalized_shape, weight, bias, mean, rstd, eps, output_mask, *, offset)
using LayerNormBackwardSig = Tensor3(const Tensor &, const Tensor &, c10::SymIntArrayRef,
                                     const OptTensor &, const OptTensor &, const OptTensor &,
                                     const OptTensor &, OptDouble, std::array<bool, 3>, bool);

// (input, residual, normalized_shape, weight, eps, *, bias, offset, eps_outside, partial)
#define RN_ADD_ARGS const Tensor &, const Tensor &, c10::SymIntArrayRef, const OptTensor &, \
                    OptDouble, const OptTensor &, bool, bool, double
using FusedAddSig = Tensor2(RN_ADD_ARGS);
using FusedAddInplaceSig = void(RN_ADD_ARGS);
// (grad_output, grad_residual, new_residual, normalized_shape, weight, eps, output_mask, *,
//  bias, offset, eps_outside, partial)
using FusedAddBackwardSig = Tensor3(const Tensor &, const OptTensor &, const Tensor &,
                                    c10::SymIntArrayRef, const OptTensor &, OptDouble,
                                    std::array<bool, 3>, const OptTensor &, bool, bool, double);

// (input, weight, eps, *, bias, offset, eps_outside, partial)
#define RN_QK_ARGS const Tensor &, const OptTensor &, OptDouble, const OptTensor &, bool, bool, double
using QkNormSig = Tensor(RN_QK_ARGS);
using QkNormInplaceSig = void(RN_QK_ARGS);
// (grad_output, input, weight, eps, output_mask, *, bias, offset, eps_outside, partial)
using QkNormBackwardSig = Tensor3(const Tensor &, const Tensor &, const OptTensor &, OptDouble,
                                  std::array<bool, 3>, const OptTensor &, bool, bool, double);

// (input, normalized_shape, weight, eps, *, bias, scale, offset, eps_outside, partial)
using QuantSig = Tensor2(const Tensor &, c10::SymIntArrayRef, const OptTensor &, OptDouble,
                         const OptTensor &, OptDouble, bool, bool, double);

// (input, weight_matrix, norm_weight, eps, bias, offset, *, eps_outside, partial)
using LinearSig = Tensor(const Tensor &, const Tensor &, const OptTensor &, OptDouble,
                         const OptTensor &, bool, bool, double);
// (grad_output, input, weight_matrix, norm_weight, eps, bias, offset, output_mask, *,
//  eps_outside, partial)
using LinearBackwardSig = Tensor4(const Tensor &, const Tensor &, const Tensor &, const OptTensor &,
                                  OptDouble, const OptTensor &, bool, std::array<bool, 4>, bool,
                                  double);

// The steps of RMSNorm over a column shard (rmsnorm.torch.distributed sums their per-row
// results over the ranks in between).
// (input, d_global, column_offset, *, partial)
using ShardStatsSig = Tensor(const Tensor &, int64_t, int64_t, double);
// (input, stats, d_global, column_offset, weight, eps, *, bias, offset, eps_outside, partial,
//  round_before_weight)
using ShardForwardSig = Tensor(const Tensor &, const Tensor &, int64_t, int64_t, const OptTensor &,
                               OptDouble, const OptTensor &, bool, bool, double, bool);
// (grad_output, input, stats, d_global, column_offset, weight, eps, *, offset, eps_outside,
//  partial)
using ShardDotsSig = Tensor(const Tensor &, const Tensor &, const Tensor &, int64_t, int64_t,
                            const OptTensor &, OptDouble, bool, bool, double);
// (grad_output, input, stats, dots, d_global, column_offset, weight, eps, output_mask, *, bias,
//  offset, eps_outside, partial)
using ShardBackwardSig = Tensor3(const Tensor &, const Tensor &, const Tensor &, const Tensor &,
                                 int64_t, int64_t, const OptTensor &, OptDouble,
                                 std::array<bool, 3>, const OptTensor &, bool, bool, double);

/* A typed handle of rmsnorm::name.overload, looked up once. */
template <class Sig>
const c10::TypedOperatorHandle<Sig> &op(const char *name, const char *overload = "") {
  // one static per (Sig, call site) is enough: each call site names one op
  return *new c10::TypedOperatorHandle<Sig>(
      c10::Dispatcher::singleton().findSchemaOrThrow(name, overload).typed<Sig>());
}

#define RN_OP(var, Sig, name, overload) \
  static const c10::TypedOperatorHandle<Sig> &var = ::rnops::op<Sig>(name, overload)

}  // namespace rnops

#endif
