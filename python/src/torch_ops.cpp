/* torch_ops.cpp - the rmsnorm:: torch ops: their schemas (TORCH_LIBRARY), the
 * CPU kernels (core.hpp over tensors), the kernels that refuse tensors rmsnorm
 * cannot take (CUDA and other devices, sparse, quantized: TypeError naming the
 * op), and the autograd kernels. The fake (meta) kernels are in Python
 * (rmsnorm/_torch_fake.py), used only when tracing.
 *
 * Autograd. Each differentiable op has an Autograd kernel: it runs the CPU
 * kernel below autograd and, when a gradient is needed, records a Node whose
 * apply calls the op's backward op through the dispatcher (as torch's own
 * generated kernels do, so functorch transforms work too); when an argument
 * carries a forward-mode tangent, it gives the output the op's JVP. A backward
 * op is itself differentiable: when it is called with grad mode on and an
 * input that requires grad (create_graph=True, as in gradient penalties and
 * gradgradcheck) or carries a tangent, it computes the library's backward
 * formula with aten ops, which autograd differentiates again, so gradients of
 * any order exist; otherwise it runs the library's backward.
 *
 * The ops that write in place (out=, inplace=True) take no part in autograd;
 * their ADInplaceOrView kernels bump the written tensors' version counters in
 * every mode (inference mode included), as torch's own in-place ops do. */
#include <torch/library.h>

#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/autograd/variable.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "core.hpp"
#include "runtime.h"
#include "torch_ops.h"

namespace rnops {
namespace {

using rncore::Dims;

/* ---- tensors as core.hpp sees them ---------------------------------------------------- */

int code_of(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return RMSNORM_F32;
    case at::kHalf: return RMSNORM_F16;
    case at::kBFloat16: return RMSNORM_BF16;
    case at::kDouble: return RMSNORM_F64;
    default: return -1;
  }
}

at::ScalarType scalar_type_of(int code) {
  switch (code) {
    case RMSNORM_F32: return at::kFloat;
    case RMSNORM_F16: return at::kHalf;
    case RMSNORM_BF16: return at::kBFloat16;
    default: return at::kDouble;
  }
}

/* torch's names: float32, bfloat16, complex64, int64, ... */
std::string torch_dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kComplexFloat: return "complex64";
    case at::kComplexDouble: return "complex128";
    case at::kComplexHalf: return "complex32";
    case at::kLong: return "int64";
    case at::kInt: return "int32";
    case at::kShort: return "int16";
    case at::kChar: return "int8";
    case at::kByte: return "uint8";
    case at::kBool: return "bool";
    default: return c10::toString(t);
  }
}

/* Large outputs come from the shared cache of warm blocks (runtime.h). */
struct CacheAllocator final : c10::Allocator {
  static void free_block(void *ctx) { rnpy::block_free(static_cast<rnpy::Block *>(ctx)); }
  c10::DataPtr allocate(std::size_t n) override {
    if (n < rnpy::kCacheMinBytes) return c10::GetCPUAllocator()->allocate(n);
    rnpy::Block *b = rnpy::block_alloc(n);
    TORCH_CHECK_WITH(OutOfMemoryError, b != nullptr, "rmsnorm: cannot allocate ", n,
                     " bytes for an output");
    return {rnpy::block_data(b), b, &free_block, c10::Device(c10::DeviceType::CPU)};
  }
  void copy_data(void *dest, const void *src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

CacheAllocator g_allocator;

Tensor new_tensor(Dims shape, at::ScalarType t) {
  std::size_t nbytes = static_cast<std::size_t>(rncore::prod(shape)) * c10::elementSize(t);
  at::IntArrayRef sizes(shape.data(), shape.size());
  if (nbytes < rnpy::kCacheMinBytes) return Tensor(at::detail::empty_cpu(sizes, t));
  return Tensor(at::detail::empty_generic(sizes, &g_allocator,
                                          c10::DispatchKeySet(c10::DispatchKey::CPU), t,
                                          std::nullopt));
}

struct NoUnlock {};

struct TorchBackend {
  using Array = Tensor;
  static bool defined(const Tensor &t) { return t.defined(); }
  static int dtype(const Tensor &t) { return code_of(t.scalar_type()); }
  static std::string dtype_name(const Tensor &t) { return torch_dtype_name(t.scalar_type()); }
  static Dims shape(const Tensor &t) { return Dims(t.sizes().data(), t.sizes().size()); }
  static bool is_contiguous(const Tensor &t) { return t.is_contiguous(); }
  bool strides(const Tensor &t, Dims *out) {
    *out = Dims(t.strides().data(), t.strides().size());
    return true;
  }
  static void *ptr(const Tensor &t) { return t.data_ptr(); }
  Tensor contiguous(const Tensor &t) {
    Tensor c = new_tensor(shape(t), t.scalar_type());
    c.copy_(t);
    return c;
  }
  Tensor cast(const Tensor &t, int code) {
    Tensor c = new_tensor(shape(t), scalar_type_of(code));
    c.copy_(t);
    return c;
  }
  Tensor empty(Dims s, int code) { return new_tensor(s, scalar_type_of(code)); }
  Tensor full(Dims s, int code, double v) {
    Tensor t = empty(s, code);
    t.fill_(v);
    return t;
  }
  Tensor empty_quant(Dims s, int qtype) {
    return new_tensor(s, qtype == RMSNORM_Q_INT8 ? at::kChar : at::kFloat8_e4m3fn);
  }
  Tensor scalar_f32(float v) {
    Tensor t = at::empty({}, at::TensorOptions().dtype(at::kFloat));
    *t.data_ptr<float>() = v;
    return t;
  }
  void writable(const Tensor &, const char *) {}  // tensors are written where they are
  rmsnorm_context *context() {
    rmsnorm_context *ctx = nullptr;
    rncore::check(rnpy::thread_context(at::get_num_threads(), &ctx), "rmsnorm_context_create");
    return ctx;
  }
  NoUnlock unlocked(std::size_t) { return {}; }
};

using B = TorchBackend;

/* ---- errors ----------------------------------------------------------------------------- */

[[noreturn]] void raise(const char *op, const rncore::Error &e) {
  std::string msg = std::string("rmsnorm::") + op + ": " + e.message;
  TORCH_CHECK_TYPE(e.kind != rncore::Kind::Type, msg);
  TORCH_CHECK_WITH(OutOfMemoryError, e.kind != rncore::Kind::Memory, msg);
  TORCH_CHECK_NOT_IMPLEMENTED(e.kind != rncore::Kind::NotAvailable, msg);
  TORCH_CHECK_VALUE(false, msg);
  throw std::logic_error(msg);  // not reached
}

/* Runs a kernel body, turning core errors into torch's exceptions. */
template <class F>
auto guarded(const char *op, F &&f) -> decltype(f()) {
  try {
    return f();
  } catch (const rncore::Error &e) {
    raise(op, e);
  }
}

const char *layout_name(at::Layout l) {
  switch (l) {
    case at::kSparse: return "torch.sparse_coo";
    case at::kSparseCsr: return "torch.sparse_csr";
    case at::kSparseCsc: return "torch.sparse_csc";
    case at::kSparseBsr: return "torch.sparse_bsr";
    case at::kSparseBsc: return "torch.sparse_bsc";
    case at::kMkldnn: return "torch._mkldnn";
    case at::kJagged: return "torch.jagged";
    default: return "not strided";
  }
}

/* A tensor the kernels can read: on the CPU, dense, not quantized (the dtype
 * is checked by core.hpp). A lazily negated view is made real. */
Tensor take(const char *op, const Tensor &t, const char *what) {
  TORCH_CHECK_TYPE(t.device().is_cpu(), "rmsnorm::", op, ": ", what, " is on device ", t.device(),
                   "; rmsnorm runs on CPU tensors only (move it with .cpu(), or use torch's own "
                   "norm on that device)");
  TORCH_CHECK_TYPE(t.layout() == at::kStrided, "rmsnorm::", op, ": ", what, " has layout ",
                   layout_name(t.layout()), "; rmsnorm takes dense (strided) tensors");
  TORCH_CHECK_TYPE(!t.is_quantized(), "rmsnorm::", op, ": ", what, " is a quantized tensor (",
                   torch_dtype_name(t.scalar_type()),
                   "); rmsnorm takes float32, float16, bfloat16 or float64");
  return t.is_neg() ? t.resolve_neg() : t;
}

Tensor take(const char *op, const OptTensor &t, const char *what) {
  return t && t->defined() ? take(op, *t, what) : Tensor();
}

/* An output written in place (out=, in-place ops): taken as it is. */
Tensor take_out(const char *op, const Tensor &t, const char *what) {
  TORCH_CHECK_VALUE(!t.is_neg() && !t.is_conj(), "rmsnorm::", op, ": ", what,
                    " is a lazily negated or conjugated view; rmsnorm cannot write it in place");
  return take(op, t, what);
}

std::vector<int64_t> concrete(c10::SymIntArrayRef s) {
  std::vector<int64_t> v;
  v.reserve(s.size());
  for (const c10::SymInt &i : s) v.push_back(i.guard_int(__FILE__, __LINE__));
  return v;
}

rncore::Options options(OptDouble eps, double partial, bool offset, bool eps_outside,
                        bool round_before_weight) {
  rncore::Options o;
  o.eps = eps;
  o.partial = partial;
  o.flags = rncore::flags_of(offset, eps_outside, round_before_weight);
  return o;
}

Tensor opt(const Tensor &t, bool keep = true) { return keep ? t : Tensor(); }

/* ---- CPU kernels ------------------------------------------------------------------------- */

Tensor rms_norm_cpu(const Tensor &input, c10::SymIntArrayRef ns, const OptTensor &weight,
                    OptDouble eps, const OptTensor &bias, bool offset, bool eps_outside,
                    double partial, bool rbw) {
  return guarded("rms_norm", [&] {
    B b;
    auto norm = concrete(ns);
    return rncore::forward(b, rncore::RMS, take("rms_norm", input, "input"), norm,
                           take("rms_norm", weight, "weight"), take("rms_norm", bias, "bias"),
                           options(eps, partial, offset, eps_outside, rbw), false, false)
        .y;
  });
}

void rms_norm_out_cpu(const Tensor &input, c10::SymIntArrayRef ns, const OptTensor &weight,
                      OptDouble eps, const OptTensor &bias, bool offset, bool eps_outside,
                      double partial, bool rbw, const Tensor &out) {
  guarded("rms_norm.out", [&] {
    B b;
    auto norm = concrete(ns);
    Tensor o = take_out("rms_norm.out", out, "out");
    rncore::forward(b, rncore::RMS, take("rms_norm.out", input, "input"), norm,
                    take("rms_norm.out", weight, "weight"), take("rms_norm.out", bias, "bias"),
                    options(eps, partial, offset, eps_outside, rbw), false, false, &o);
  });
}

Tensor2 rms_norm_forward_cpu(const Tensor &input, c10::SymIntArrayRef ns, const OptTensor &weight,
                             OptDouble eps, const OptTensor &bias, bool offset, bool eps_outside,
                             double partial, bool rbw) {
  return guarded("rms_norm_forward", [&] {
    B b;
    auto norm = concrete(ns);
    const char *op = "rms_norm_forward";
    auto r = rncore::forward(b, rncore::RMS, take(op, input, "input"), norm,
                             take(op, weight, "weight"), take(op, bias, "bias"),
                             options(eps, partial, offset, eps_outside, rbw), false, true);
    return Tensor2(r.y, r.rstd);
  });
}

Tensor3 rms_norm_backward_cpu(const Tensor &dy, const Tensor &input, c10::SymIntArrayRef ns,
                              const OptTensor &weight, const OptTensor &rstd, OptDouble eps,
                              std::array<bool, 3> mask, const OptTensor &bias, bool offset,
                              bool eps_outside, double partial) {
  const char *op = "rms_norm_backward";
  return guarded(op, [&] {
    B b;
    auto norm = concrete(ns);
    auto g = rncore::backward(b, rncore::RMS, take(op, dy, "grad_output"), take(op, input, "input"),
                              norm, take(op, weight, "weight"), take(op, bias, "bias"), Tensor(),
                              take(op, rstd, "rstd"), options(eps, partial, offset, eps_outside, false),
                              mask[1], mask[2]);
    return Tensor3(opt(g.dx, mask[0]), g.dweight, g.dbias);
  });
}

Tensor layer_norm_cpu(const Tensor &input, c10::SymIntArrayRef ns, const OptTensor &weight,
                      const OptTensor &bias, OptDouble eps, bool offset, bool rbw) {
  const char *op = "layer_norm";
  return guarded(op, [&] {
    B b;
    auto norm = concrete(ns);
    return rncore::forward(b, rncore::LAYER, take(op, input, "input"), norm, take(op, weight, "weight"),
                           take(op, bias, "bias"), options(eps, 1.0, offset, false, rbw), false, false)
        .y;
  });
}

void layer_norm_out_cpu(const Tensor &input, c10::SymIntArrayRef ns, const OptTensor &weight,
                        const OptTensor &bias, OptDouble eps, bool offset, bool rbw,
                        const Tensor &out) {
  const char *op = "layer_norm.out";
  guarded(op, [&] {
    B b;
    auto norm = concrete(ns);
    Tensor o = take_out(op, out, "out");
    rncore::forward(b, rncore::LAYER, take(op, input, "input"), norm, take(op, weight, "weight"),
                    take(op, bias, "bias"), options(eps, 1.0, offset, false, rbw), false, false, &o);
  });
}

Tensor3 layer_norm_forward_cpu(const Tensor &input, c10::SymIntArrayRef ns, const OptTensor &weight,
                               const OptTensor &bias, OptDouble eps, bool offset, bool rbw) {
  const char *op = "layer_norm_forward";
  return guarded(op, [&] {
    B b;
    auto norm = concrete(ns);
    auto r = rncore::forward(b, rncore::LAYER, take(op, input, "input"), norm,
                             take(op, weight, "weight"), take(op, bias, "bias"),
                             options(eps, 1.0, offset, false, rbw), true, true);
    return Tensor3(r.y, r.mean, r.rstd);
  });
}

Tensor3 layer_norm_backward_cpu(const Tensor &dy, const Tensor &input, c10::SymIntArrayRef ns,
                                const OptTensor &weight, const OptTensor &bias, const OptTensor &mean,
                                const OptTensor &rstd, OptDouble eps, std::array<bool, 3> mask,
                                bool offset) {
  const char *op = "layer_norm_backward";
  return guarded(op, [&] {
    B b;
    auto norm = concrete(ns);
    auto g = rncore::backward(b, rncore::LAYER, take(op, dy, "grad_output"), take(op, input, "input"),
                              norm, take(op, weight, "weight"), take(op, bias, "bias"),
                              take(op, mean, "mean"), take(op, rstd, "rstd"),
                              options(eps, 1.0, offset, false, false), mask[1], mask[2]);
    return Tensor3(opt(g.dx, mask[0]), g.dweight, g.dbias);
  });
}

Tensor2 fused_add_cpu(const Tensor &input, const Tensor &residual, c10::SymIntArrayRef ns,
                      const OptTensor &weight, OptDouble eps, const OptTensor &bias, bool offset,
                      bool eps_outside, double partial) {
  const char *op = "fused_add_rms_norm";
  return guarded(op, [&] {
    B b;
    auto norm = concrete(ns);
    auto r = rncore::add_forward(b, take(op, input, "input"), take(op, residual, "residual"), norm,
                                 take(op, weight, "weight"), take(op, bias, "bias"),
                                 options(eps, partial, offset, eps_outside, false), false, false);
    return Tensor2(r.y, r.h);
  });
}

void fused_add_inplace_cpu(const Tensor &input, const Tensor &residual, c10::SymIntArrayRef ns,
                           const OptTensor &weight, OptDouble eps, const OptTensor &bias,
                           bool offset, bool eps_outside, double partial) {
  const char *op = "fused_add_rms_norm_inplace";
  guarded(op, [&] {
    B b;
    auto norm = concrete(ns);
    rncore::add_forward(b, take_out(op, input, "input"), take_out(op, residual, "residual"), norm,
                        take(op, weight, "weight"), take(op, bias, "bias"),
                        options(eps, partial, offset, eps_outside, false), false, true);
  });
}

Tensor3 fused_add_backward_cpu(const Tensor &dy, const OptTensor &dres, const Tensor &h,
                               c10::SymIntArrayRef ns, const OptTensor &weight, OptDouble eps,
                               std::array<bool, 3> mask, const OptTensor &bias, bool offset,
                               bool eps_outside, double partial) {
  const char *op = "fused_add_rms_norm_backward";
  return guarded(op, [&] {
    B b;
    auto norm = concrete(ns);
    auto g = rncore::add_backward(b, take(op, dy, "grad_output"), take(op, dres, "grad_residual"),
                                  take(op, h, "new_residual"), norm, take(op, weight, "weight"),
                                  take(op, bias, "bias"), Tensor(),
                                  options(eps, partial, offset, eps_outside, false), mask[1], mask[2]);
    return Tensor3(opt(g.dx, mask[0]), g.dweight, g.dbias);
  });
}

Tensor qk_norm_cpu(const Tensor &input, const OptTensor &weight, OptDouble eps,
                   const OptTensor &bias, bool offset, bool eps_outside, double partial) {
  const char *op = "qk_norm";
  return guarded(op, [&] {
    B b;
    return rncore::qk_forward(b, take(op, input, "input"), take(op, weight, "weight"),
                              take(op, bias, "bias"), options(eps, partial, offset, eps_outside, false),
                              false, false)
        .y;
  });
}

void qk_norm_inplace_cpu(const Tensor &input, const OptTensor &weight, OptDouble eps,
                         const OptTensor &bias, bool offset, bool eps_outside, double partial) {
  const char *op = "qk_norm_inplace";
  guarded(op, [&] {
    B b;
    rncore::qk_forward(b, take_out(op, input, "input"), take(op, weight, "weight"),
                       take(op, bias, "bias"), options(eps, partial, offset, eps_outside, false),
                       false, true);
  });
}

Tensor3 qk_norm_backward_cpu(const Tensor &dy, const Tensor &input, const OptTensor &weight,
                             OptDouble eps, std::array<bool, 3> mask, const OptTensor &bias,
                             bool offset, bool eps_outside, double partial) {
  const char *op = "qk_norm_backward";
  return guarded(op, [&] {
    B b;
    auto g = rncore::qk_backward(b, take(op, dy, "grad_output"), take(op, input, "input"),
                                 take(op, weight, "weight"), take(op, bias, "bias"), Tensor(),
                                 options(eps, partial, offset, eps_outside, false), mask[1], mask[2]);
    return Tensor3(opt(g.dx, mask[0]), g.dweight, g.dbias);
  });
}

template <rmsnorm_qtype Q>
Tensor2 quant_cpu(const Tensor &input, c10::SymIntArrayRef ns, const OptTensor &weight,
                  OptDouble eps, const OptTensor &bias, OptDouble scale, bool offset,
                  bool eps_outside, double partial) {
  const char *op = Q == RMSNORM_Q_INT8 ? "rms_norm_int8" : "rms_norm_fp8";
  return guarded(op, [&] {
    B b;
    auto norm = concrete(ns);
    auto r = rncore::forward_quant(b, Q, take(op, input, "input"), norm, take(op, weight, "weight"),
                                   take(op, bias, "bias"),
                                   options(eps, partial, offset, eps_outside, false), scale);
    return Tensor2(r.q, r.scale);
  });
}

Tensor linear_cpu(const Tensor &input, const Tensor &w, const OptTensor &g, OptDouble eps,
                  const OptTensor &bias, bool offset, bool eps_outside, double partial) {
  const char *op = "rms_norm_linear";
  return guarded(op, [&] {
    B b;
    auto o = options(eps, partial, offset, eps_outside, false);
    auto a = rncore::linear_args(b, take(op, input, "input"), take(op, w, "weight_matrix"),
                                 take(op, g, "norm_weight"), take(op, bias, "bias"));
    Tensor wf = rncore::fold(b, a, o);
    return rncore::linear_forward(b, a, wf, o, false).first;
  });
}

Tensor4 linear_backward_cpu(const Tensor &dz, const Tensor &input, const Tensor &w,
                            const OptTensor &g, OptDouble eps, const OptTensor &bias, bool offset,
                            std::array<bool, 4> mask, bool eps_outside, double partial) {
  const char *op = "rms_norm_linear_backward";
  return guarded(op, [&] {
    B b;
    auto o = options(eps, partial, offset, eps_outside, false);
    auto a = rncore::linear_args(b, take(op, input, "input"), take(op, w, "weight_matrix"),
                                 take(op, g, "norm_weight"), take(op, bias, "bias"));
    Tensor wf = rncore::fold(b, a, o);
    auto gr = rncore::linear_backward(b, a, wf, take(op, dz, "grad_output"), o, mask[2], mask[1],
                                      mask[3]);
    return Tensor4(opt(gr.dx, mask[0]), gr.dw, gr.dg, gr.db);
  });
}

/* The shard steps (core.hpp, "sharded hidden dimension"). */

Tensor shard_stats_cpu(const Tensor &input, int64_t d_global, int64_t col, double partial) {
  const char *op = "rms_norm_shard_stats";
  return guarded(op, [&] {
    B b;
    return rncore::shard_stats(b, take(op, input, "input"), d_global, col,
                               options(std::nullopt, partial, false, false, false));
  });
}

Tensor shard_forward_cpu(const Tensor &input, const Tensor &stats, int64_t d_global, int64_t col,
                         const OptTensor &weight, OptDouble eps, const OptTensor &bias,
                         bool offset, bool eps_outside, double partial, bool rbw) {
  const char *op = "rms_norm_shard_forward";
  return guarded(op, [&] {
    B b;
    return rncore::shard_forward(b, take(op, input, "input"), take(op, stats, "stats"), d_global,
                                 col, take(op, weight, "weight"), take(op, bias, "bias"),
                                 options(eps, partial, offset, eps_outside, rbw));
  });
}

Tensor shard_dots_cpu(const Tensor &dy, const Tensor &input, const Tensor &stats, int64_t d_global,
                      int64_t col, const OptTensor &weight, OptDouble eps, bool offset,
                      bool eps_outside, double partial) {
  const char *op = "rms_norm_shard_backward_dots";
  return guarded(op, [&] {
    B b;
    return rncore::shard_backward_dots(b, take(op, dy, "grad_output"), take(op, input, "input"),
                                       take(op, stats, "stats"), d_global, col,
                                       take(op, weight, "weight"),
                                       options(eps, partial, offset, eps_outside, false));
  });
}

Tensor3 shard_backward_cpu(const Tensor &dy, const Tensor &input, const Tensor &stats,
                           const Tensor &dots, int64_t d_global, int64_t col,
                           const OptTensor &weight, OptDouble eps, std::array<bool, 3> mask,
                           const OptTensor &bias, bool offset, bool eps_outside, double partial) {
  const char *op = "rms_norm_shard_backward";
  return guarded(op, [&] {
    B b;
    auto g = rncore::shard_backward(b, take(op, dy, "grad_output"), take(op, input, "input"),
                                    take(op, stats, "stats"), take(op, dots, "dots"), d_global,
                                    col, take(op, weight, "weight"), take(op, bias, "bias"),
                                    options(eps, partial, offset, eps_outside, false), mask[1],
                                    mask[2]);
    return Tensor3(opt(g.dx, mask[0]), g.dweight, g.dbias);
  });
}

/* ---- the backward, composed of aten ops (for gradients of gradients) ------------------- */

/* k = ceil(partial * d) within [1, d], as the library computes it (rmsnorm.h). */
/* The library's own k (exact in decimal, clamped to [1, d]); the forward
 * and backward ops have validated partial and d already. */
int64_t partial_k(double partial, int64_t d) {
  size_t k = static_cast<size_t>(d);
  rmsnorm_partial_count(partial, static_cast<size_t>(d), &k);
  return static_cast<int64_t>(k);
}

double eps_value(OptDouble eps, const Tensor &x) {
  if (eps) return *eps;
  double e = 0;
  rmsnorm_default_eps(static_cast<rmsnorm_dtype>(std::max(0, code_of(x.scalar_type()))), &e);
  return e;
}

at::ScalarType opmath(const Tensor &x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

/* A norm's rows as aten ops in float32 (float64 for float64 data): x viewed as
 * (*, d), r (the rstd, (*, 1)) and xhat = (x - mean) r, mean 0 for RMSNorm; r is
 * computed from x, so a graph through it sees its dependence on x. */
struct NormRows {
  Tensor rows, r, rho, xhat;  // rho = sqrt(mean(x^2)): eps outside only
  Tensor c;                   // LayerNorm: rows - their mean
  int64_t d = 0, k = 0;       // k: the statistic's elements (pRMSNorm)
};

NormRows norm_rows(rncore::Norm kind, const Tensor &x, int64_t nk, double eps, bool eps_outside,
                   double partial) {
  NormRows n;
  n.rows = x.to(opmath(x)).flatten(x.dim() - nk);
  n.d = n.k = n.rows.size(-1);
  if (kind == rncore::LAYER) {
    n.c = n.rows - n.rows.mean(-1, true);
    n.r = (n.c.square().mean(-1, true) + eps).rsqrt();
    n.xhat = n.c * n.r;
    return n;
  }
  n.k = partial_k(partial, n.d);
  Tensor ms = (n.k == n.d ? n.rows : n.rows.narrow(-1, 0, n.k)).square().mean(-1, true);
  if (eps_outside) {
    n.rho = ms.sqrt();
    n.r = (n.rho + eps).reciprocal();
  } else {
    n.r = (ms + eps).rsqrt();
  }
  n.xhat = n.rows * n.r;
  return n;
}

/* (dx, dweight, dbias) of the norm of x over its last k dims for upstream dy,
 * with aten ops, so that autograd records them and can differentiate the
 * gradients again. The formulas are the library's (src/ref/norm_ref.inc). */
Tensor3 backward_composite(rncore::Norm kind, const Tensor &dy, const Tensor &x, int64_t k,
                           const Tensor &w, const Tensor &b, double eps, bool offset,
                           bool eps_outside, double partial, std::array<bool, 3> mask) {
  at::ScalarType t = opmath(x);
  NormRows n = norm_rows(kind, x, k, eps, eps_outside, partial);
  Tensor g = dy.to(t).flatten(x.dim() - k);  // (*, d)
  Tensor gy = w.defined() ? g * (offset ? w.to(t) + 1 : w.to(t)).flatten() : g;
  Tensor dx, dw, db;
  if (mask[0]) {
    if (kind == rncore::LAYER) {
      dx = n.r * (gy - gy.mean(-1, true) - n.xhat * (gy * n.xhat).mean(-1, true));
    } else {  // c from B = sum gy xhat; only the statistic's k elements take the xhat c term
      Tensor B = (gy * n.xhat).sum(-1, true);
      auto kd = static_cast<double>(n.k);
      Tensor c = eps_outside ? at::where(n.rho > 0, B / (kd * n.rho * n.r), at::zeros_like(B))
                             : B / kd;
      Tensor xs = n.k < n.d ? n.xhat * (at::arange(n.d, n.rows.options()) < n.k).to(t) : n.xhat;
      dx = n.r * (gy - xs * c);
    }
    dx = dx.reshape_symint(x.sym_sizes()).to(x.scalar_type());
  }
  auto norm_shape = x.sym_sizes().slice(static_cast<std::size_t>(x.dim() - k));
  if (mask[1] && w.defined())
    dw = (g * n.xhat).reshape({-1, n.d}).sum(0).reshape_symint(norm_shape).to(w.scalar_type());
  if (mask[2] && b.defined())
    db = g.reshape({-1, n.d}).sum(0).reshape_symint(norm_shape).to(b.scalar_type());
  return Tensor3(dx, dw, db);
}

bool grad_needed(c10::ArrayRef<const Tensor *> ts) {
  if (!c10::GradMode::is_enabled()) return false;
  for (const Tensor *t : ts)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

Tensor value(const OptTensor &t) { return t ? *t : Tensor(); }
OptTensor opt_of(const Tensor &t) { return t.defined() ? OptTensor(t) : std::nullopt; }

/* ---- autograd: forward ops ---------------------------------------------------------------- */

using Guard = at::AutoDispatchBelowADInplaceOrView;
using torch::autograd::Node;
using torch::autograd::SavedVariable;

/* Reverse mode. Each differentiable op records a Node of its own, as torch's generated
 * kernels do (not a torch::autograd::Function, which functorch transforms refuse): its
 * next edges are the op's tensor arguments in schema order (an absent weight or bias keeps
 * an empty slot), and its apply calls the op's backward op through the dispatcher. */
/* Nodes are held by std::shared_ptr up to some torch 2.x and by c10::intrusive_ptr after. */
using NodePtr = decltype(torch::autograd::Edge::function);
constexpr bool kSharedNodes = std::is_same_v<NodePtr, std::shared_ptr<Node>>;
template <class N>
using Ptr = std::conditional_t<kSharedNodes, std::shared_ptr<N>, c10::intrusive_ptr<N>>;

template <class N>
Ptr<N> make_node(torch::autograd::edge_list edges) {
  Ptr<N> n;
  if constexpr (kSharedNodes)
    n = std::make_shared<N>();
  else
    n = c10::make_intrusive<N>();
  n->set_next_edges(std::move(edges));
  return n;
}

/* A node of type N when grad mode is on and one of the op's tensor arguments (all of them,
 * in schema order, absent ones undefined) requires grad; else none. */
template <class N, class... T>
Ptr<N> node_if_needed(const T &...ts) {
  if (!grad_needed({&ts...})) return Ptr<N>();
  return make_node<N>(torch::autograd::collect_next_edges(ts...));
}

/* What every norm Node keeps besides tensors: the number of normalized dims and the
 * keyword options. */
struct NormNode : Node {
  int64_t k = 0;
  OptDouble eps;
  bool offset = false, eps_outside = false;
  double partial = 1.0;
  SavedVariable s[5];  // the saved tensors, by the op's own order

  void options(std::size_t k_, OptDouble eps_, bool offset_, bool eps_outside_ = false,
               double partial_ = 1.0) {
    k = static_cast<int64_t>(k_);
    eps = eps_;
    offset = offset_;
    eps_outside = eps_outside_;
    partial = partial_;
  }
  /* inputs are saved as inputs, outputs (mean, rstd, new_residual) as outputs */
  void save(std::initializer_list<std::pair<Tensor, bool>> ts) {
    int i = 0;
    for (const auto &[t, is_output] : ts) s[i++] = SavedVariable(t, is_output);
  }
  Tensor get(int i) { return s[i].unpack(getptr()); }
  void release_variables() override {
    for (SavedVariable &v : s) v.reset_data();
  }
  bool needs(std::size_t edge) const { return task_should_compute_output(edge); }
  /* the normalized_shape of t: its last k dims */
  c10::SymIntArrayRef ns(const Tensor &t) const {
    return t.sym_sizes().slice(static_cast<std::size_t>(t.dim() - k));
  }
};

/* Forward mode (torch.autograd.forward_ad, torch.func.jvp/jacfwd). When an argument carries a
 * tangent (at level 0, as torch's generated kernels read it; functorch maps its levels onto
 * it), the output's tangent is the op's JVP, computed with aten ops from the primal values so
 * that it is differentiable in turn.
 *
 * RMSNorm of a row x of d elements, its statistic over the first k:
 *   m = (1/k) sum_{j<k} x_j^2,  r = (m + eps)^(-1/2)   (eps outside: r = 1/(sqrt(m) + eps)),
 *   xhat = x r,  y = xhat * W + b  with W = w (or 1 + w).
 * For tangents t, tw, tb of x, w, b, with s = mean_{j<k}(x_j t_j) (so dm = 2 s):
 *   dr = -r^3 s   (eps outside: dr = -r^2 s / sqrt(m), taken as 0 where m = 0, as the
 *                  backward does),
 *   dxhat = t r + x dr,   dy = dxhat * W + xhat * tw + tb.
 * LayerNorm: c = x - mean(x), v = mean(c^2), r = (v + eps)^(-1/2), xhat = c r; then
 *   dc = t - mean(t), dr = -r^3 mean(c dc), dxhat = dc r + c dr, and dy as above.
 * Rounding (to the storage dtype, and before the weight) is taken as the identity, as in
 * the backward. */
bool has_tangent(const Tensor &t) { return t.defined() && t._fw_grad(0).defined(); }

bool any_tangent(c10::ArrayRef<const Tensor *> ts) {
  for (const Tensor *t : ts)
    if (has_tangent(*t)) return true;
  return false;
}

Tensor primal(const Tensor &t) { return has_tangent(t) ? t._fw_primal(0) : t; }
Tensor tangent(const Tensor &t) { return has_tangent(t) ? Tensor(t._fw_grad(0)) : Tensor(); }

/* dxhat of the rows of x (viewed as (*, d) over its last nk dims) for the tangent tx, and
 * xhat itself; both in x's compute type. */
std::pair<Tensor, Tensor> xhat_tangent(rncore::Norm kind, const Tensor &x, const Tensor &tx,
                                       int64_t nk, double eps, bool eps_outside, double partial) {
  NormRows n = norm_rows(kind, x, nk, eps, eps_outside, partial);
  if (!tx.defined()) return {n.xhat, Tensor()};
  Tensor t = tx.to(opmath(x)).reshape_symint(n.rows.sym_sizes());
  if (kind == rncore::LAYER) {
    Tensor dc = t - t.mean(-1, true);
    Tensor dr = -n.r.pow(3) * (n.c * dc).mean(-1, true);
    return {n.xhat, dc * n.r + n.c * dr};
  }
  auto head = [&](const Tensor &v) { return n.k == n.d ? v : v.narrow(-1, 0, n.k); };
  Tensor s = (head(n.rows) * head(t)).mean(-1, true);
  Tensor dr;
  if (eps_outside) {
    Tensor pos = n.rho > 0;
    dr = at::where(pos, -n.r.square() * s / at::where(pos, n.rho, at::ones_like(n.rho)),
                   at::zeros_like(s));
  } else {
    dr = -n.r.pow(3) * s;
  }
  return {n.xhat, t * n.r + n.rows * dr};
}

/* dy = dxhat * W + xhat * tw + tb over rows, or undefined when every term is zero. */
Tensor affine_tangent(const Tensor &xhat, const Tensor &dxhat, const Tensor &w, const Tensor &tw,
                      const Tensor &tb, bool offset) {
  at::ScalarType t = xhat.scalar_type();
  Tensor dy;
  auto add = [&](Tensor v) { dy = dy.defined() ? dy + v : v; };
  if (dxhat.defined()) add(w.defined() ? dxhat * (offset ? w.to(t) + 1 : w.to(t)).reshape(-1) : dxhat);
  if (tw.defined()) add(xhat * tw.to(t).reshape(-1));
  if (tb.defined()) add(tb.to(t).reshape(-1).expand_as(xhat));
  return dy;
}

/* Gives y the tangent dy (rows of y's compute type), in y's shape and dtype. */
void set_tangent(const Tensor &y, const Tensor &dy) {
  if (!dy.defined()) return;
  y._set_fw_grad(dy.reshape_symint(y.sym_sizes()).to(y.scalar_type()), 0, false);
}

/* y's tangent for the norm of x over its last nk dims (input, weight, bias as given). */
void norm_tangent(const Tensor &y, rncore::Norm kind, const Tensor &x, const Tensor &tx,
                  int64_t nk, const Tensor &w, const Tensor &b, OptDouble eps, bool offset,
                  bool eps_outside, double partial) {
  Tensor xp = primal(x), wp = primal(w);
  auto [xhat, dxhat] = xhat_tangent(kind, xp, tx, nk, eps_value(eps, xp), eps_outside, partial);
  set_tangent(y, affine_tangent(xhat, dxhat, wp, tangent(w), tangent(b), offset));
}

/* RMSNorm: (y, rstd) with its Node when a gradient is needed and its tangent when an
 * argument has one; `with_rstd` picks the op that also returns rstd. */
struct RmsNormNode : NormNode {  // saved: input, weight, bias, rstd
  std::string name() const override { return "RmsNormBackward"; }
  torch::autograd::variable_list apply(torch::autograd::variable_list &&grads) override {
    if (!grads[0].defined()) return {Tensor(), Tensor(), Tensor()};
    RN_OP(bwd, RmsNormBackwardSig, "rmsnorm::rms_norm_backward", "");
    Tensor x = get(0);
    // the backward treats rounding before the weight as the identity
    auto [dx, dw, db] = bwd.call(grads[0], x, ns(x), opt_of(get(1)), opt_of(get(3)), eps,
                                 {needs(0), needs(1), needs(2)}, opt_of(get(2)), offset,
                                 eps_outside, partial);
    return {dx, dw, db};
  }
};

Tensor2 rms_norm_ad(const Tensor &input, c10::SymIntArrayRef ns, const OptTensor &weight,
                    OptDouble eps, const OptTensor &bias, bool offset, bool eps_outside,
                    double partial, bool rbw, bool with_rstd) {
  Tensor w = value(weight), b = value(bias), y, rstd;
  auto node = node_if_needed<RmsNormNode>(input, w, b);
  {
    Guard guard;
    if (node || with_rstd) {
      RN_OP(fwd, RmsNormForwardSig, "rmsnorm::rms_norm_forward", "");
      std::tie(y, rstd) = fwd.call(input, ns, weight, eps, bias, offset, eps_outside, partial, rbw);
    } else {
      RN_OP(fwd, RmsNormSig, "rmsnorm::rms_norm", "");
      y = fwd.call(input, ns, weight, eps, bias, offset, eps_outside, partial, rbw);
    }
  }
  if (node) {
    torch::autograd::set_history(y, node);
    node->save({{input, false}, {w, false}, {b, false}, {rstd, true}});
    node->options(ns.size(), eps, offset, eps_outside, partial);
  }
  if (any_tangent({&input, &w, &b}))
    norm_tangent(y, rncore::RMS, input, tangent(input), static_cast<int64_t>(ns.size()), w, b, eps,
                 offset, eps_outside, partial);
  return Tensor2(y, rstd);
}

Tensor rms_norm_autograd(const Tensor &input, c10::SymIntArrayRef ns, const OptTensor &weight,
                         OptDouble eps, const OptTensor &bias, bool offset, bool eps_outside,
                         double partial, bool rbw) {
  return std::get<0>(
      rms_norm_ad(input, ns, weight, eps, bias, offset, eps_outside, partial, rbw, false));
}

Tensor2 rms_norm_forward_autograd(const Tensor &input, c10::SymIntArrayRef ns,
                                  const OptTensor &weight, OptDouble eps, const OptTensor &bias,
                                  bool offset, bool eps_outside, double partial, bool rbw) {
  return rms_norm_ad(input, ns, weight, eps, bias, offset, eps_outside, partial, rbw, true);
}

/* LayerNorm: (y, mean, rstd); mean and rstd have no gradient. */
struct LayerNormNode : NormNode {  // saved: input, weight, bias, mean, rstd
  std::string name() const override { return "LayerNormBackward"; }
  torch::autograd::variable_list apply(torch::autograd::variable_list &&grads) override {
    if (!grads[0].defined()) return {Tensor(), Tensor(), Tensor()};
    RN_OP(bwd, LayerNormBackwardSig, "rmsnorm::layer_norm_backward", "");
    Tensor x = get(0);
    auto [dx, dw, db] = bwd.call(grads[0], x, ns(x), opt_of(get(1)), opt_of(get(2)),
                                 opt_of(get(3)), opt_of(get(4)), eps,
                                 {needs(0), needs(1), needs(2)}, offset);
    return {dx, dw, db};
  }
};

Tensor3 layer_norm_ad(const Tensor &input, c10::SymIntArrayRef ns, const OptTensor &weight,
                      const OptTensor &bias, OptDouble eps, bool offset, bool rbw,
                      bool with_stats) {
  Tensor w = value(weight), b = value(bias), y, mean, rstd;
  auto node = node_if_needed<LayerNormNode>(input, w, b);
  {
    Guard guard;
    if (node || with_stats) {
      RN_OP(fwd, LayerNormForwardSig, "rmsnorm::layer_norm_forward", "");
      std::tie(y, mean, rstd) = fwd.call(input, ns, weight, bias, eps, offset, rbw);
    } else {
      RN_OP(fwd, LayerNormSig, "rmsnorm::layer_norm", "");
      y = fwd.call(input, ns, weight, bias, eps, offset, rbw);
    }
  }
  if (node) {
    torch::autograd::set_history(y, node);
    node->save({{input, false}, {w, false}, {b, false}, {mean, true}, {rstd, true}});
    node->options(ns.size(), eps, offset);
  }
  if (any_tangent({&input, &w, &b}))
    norm_tangent(y, rncore::LAYER, input, tangent(input), static_cast<int64_t>(ns.size()), w, b,
                 eps, offset, false, 1.0);
  return Tensor3(y, mean, rstd);
}

Tensor layer_norm_autograd(const Tensor &input, c10::SymIntArrayRef ns, const OptTensor &weight,
                           const OptTensor &bias, OptDouble eps, bool offset, bool rbw) {
  return std::get<0>(layer_norm_ad(input, ns, weight, bias, eps, offset, rbw, false));
}

Tensor3 layer_norm_forward_autograd(const Tensor &input, c10::SymIntArrayRef ns,
                                    const OptTensor &weight, const OptTensor &bias, OptDouble eps,
                                    bool offset, bool rbw) {
  return layer_norm_ad(input, ns, weight, bias, eps, offset, rbw, true);
}

/* Residual add + RMSNorm: (y, new_residual h = input + residual). Both input and residual
 * get the gradient dres + the norm's backward at h; an unused output passes none. */
struct FusedAddNode : NormNode {  // saved: h (an output), weight, bias
  std::string name() const override { return "FusedAddRmsNormBackward"; }
  torch::autograd::variable_list apply(torch::autograd::variable_list &&grads) override {
    if (!grads[0].defined() && !grads[1].defined()) return {Tensor(), Tensor(), Tensor(), Tensor()};
    RN_OP(bwd, FusedAddBackwardSig, "rmsnorm::fused_add_rms_norm_backward", "");
    Tensor h = get(0);
    bool need_x = needs(0) || needs(1);
    Tensor dy = grads[0].defined() ? grads[0] : at::zeros_like(h);
    auto [dh, dw, db] = bwd.call(dy, opt_of(grads[1]), h, ns(h), opt_of(get(1)), eps,
                                 {need_x, needs(2), needs(3)}, opt_of(get(2)), offset, eps_outside,
                                 partial);
    // one gradient, given to both: the same values, not one tensor
    Tensor du = needs(0) && needs(1) ? dh.clone() : dh;
    return {needs(0) ? du : Tensor(), needs(1) ? dh : Tensor(), dw, db};
  }
};

Tensor2 fused_add_autograd(const Tensor &input, const Tensor &residual, c10::SymIntArrayRef ns,
                           const OptTensor &weight, OptDouble eps, const OptTensor &bias,
                           bool offset, bool eps_outside, double partial) {
  Tensor w = value(weight), b = value(bias), y, h;
  auto node = node_if_needed<FusedAddNode>(input, residual, w, b);
  {
    RN_OP(fwd, FusedAddSig, "rmsnorm::fused_add_rms_norm", "");
    Guard guard;
    std::tie(y, h) = fwd.call(input, residual, ns, weight, eps, bias, offset, eps_outside, partial);
  }
  if (node) torch::autograd::set_history({y, h}, node);  // y is the node's input 0, h its 1
  if (any_tangent({&input, &residual, &w, &b})) {
    // th = t_input + t_residual: h's tangent, and the norm's input tangent
    Tensor ti = tangent(input), tr = tangent(residual);
    Tensor th = ti.defined() && tr.defined() ? ti + tr : ti.defined() ? ti : tr;
    if (th.defined()) th = th.to(h.scalar_type());
    norm_tangent(y, rncore::RMS, h, th, static_cast<int64_t>(ns.size()), w, b, eps, offset,
                 eps_outside, partial);
    if (th.defined()) h._set_fw_grad(th, 0, false);
  }
  if (node) {  // h saved with its tangent, for forward-over-reverse
    node->save({{h, true}, {w, false}, {b, false}});
    node->options(ns.size(), eps, offset, eps_outside, partial);
  }
  return Tensor2(y, h);
}

/* QK-norm: y = the RMSNorm of every head (input's last dim). */
struct QkNormNode : NormNode {  // saved: input, weight, bias
  std::string name() const override { return "QkNormBackward"; }
  torch::autograd::variable_list apply(torch::autograd::variable_list &&grads) override {
    if (!grads[0].defined()) return {Tensor(), Tensor(), Tensor()};
    RN_OP(bwd, QkNormBackwardSig, "rmsnorm::qk_norm_backward", "");
    auto [dx, dw, db] = bwd.call(grads[0], get(0), opt_of(get(1)), eps,
                                 {needs(0), needs(1), needs(2)}, opt_of(get(2)), offset,
                                 eps_outside, partial);
    return {dx, dw, db};
  }
};

Tensor qk_norm_autograd(const Tensor &input, const OptTensor &weight, OptDouble eps,
                        const OptTensor &bias, bool offset, bool eps_outside, double partial) {
  Tensor w = value(weight), b = value(bias), y;
  auto node = node_if_needed<QkNormNode>(input, w, b);
  {
    RN_OP(fwd, QkNormSig, "rmsnorm::qk_norm", "");
    Guard guard;
    y = fwd.call(input, weight, eps, bias, offset, eps_outside, partial);
  }
  if (node) {
    torch::autograd::set_history(y, node);
    node->save({{input, false}, {w, false}, {b, false}});
    node->options(1, eps, offset, eps_outside, partial);
  }
  if (any_tangent({&input, &w, &b}))
    norm_tangent(y, rncore::RMS, input, tangent(input), 1, w, b, eps, offset, eps_outside, partial);
  return y;
}

/* RMSNorm + linear: z = (xhat * G) W + bias, G = g (or 1 + g). Its tangent is
 * dz = dY W + Y tW + tbias with Y = xhat * G and dY = dxhat * G + xhat * tg. */
struct LinearNode : NormNode {  // saved: input, weight_matrix, norm_weight, bias
  std::string name() const override { return "RmsNormLinearBackward"; }
  torch::autograd::variable_list apply(torch::autograd::variable_list &&grads) override {
    if (!grads[0].defined()) return {Tensor(), Tensor(), Tensor(), Tensor()};
    RN_OP(bwd, LinearBackwardSig, "rmsnorm::rms_norm_linear_backward", "");
    auto [dx, dw, dg, db] = bwd.call(grads[0], get(0), get(1), opt_of(get(2)), eps,
                                     opt_of(get(3)), offset,
                                     {needs(0), needs(1), needs(2), needs(3)}, eps_outside,
                                     partial);
    return {dx, dw, dg, db};
  }
};

Tensor linear_autograd(const Tensor &input, const Tensor &w, const OptTensor &g, OptDouble eps,
                       const OptTensor &bias, bool offset, bool eps_outside, double partial) {
  Tensor gg = value(g), b = value(bias), z;
  auto node = node_if_needed<LinearNode>(input, w, gg, b);
  {
    RN_OP(fwd, LinearSig, "rmsnorm::rms_norm_linear", "");
    Guard guard;
    z = fwd.call(input, w, g, eps, bias, offset, eps_outside, partial);
  }
  if (node) {
    torch::autograd::set_history(z, node);
    node->save({{input, false}, {w, false}, {gg, false}, {b, false}});
    node->options(1, eps, offset, eps_outside, partial);
  }
  if (any_tangent({&input, &w, &gg, &b})) {
    Tensor xp = primal(input), wp = primal(w), gp = primal(gg);
    at::ScalarType t = opmath(xp);
    auto [xhat, dxhat] = xhat_tangent(rncore::RMS, xp, tangent(input), 1, eps_value(eps, xp),
                                      eps_outside, partial);
    Tensor Y = gp.defined() ? xhat * (offset ? gp.to(t) + 1 : gp.to(t)) : xhat;  // (rows, d)
    Tensor dY = affine_tangent(xhat, dxhat, gp, tangent(gg), Tensor(), offset);
    Tensor dz;
    auto add = [&](Tensor v) { dz = dz.defined() ? dz + v : v; };
    if (dY.defined()) add(at::matmul(dY, wp.to(t)));
    if (has_tangent(w)) add(at::matmul(Y, tangent(w).to(t)));
    if (has_tangent(b)) {
      Tensor tb = tangent(b).to(t);
      dz = dz.defined() ? dz + tb : tb.expand_symint(z.sym_sizes());
    }
    set_tangent(z, dz);
  }
  return z;
}

/* ---- autograd: backward ops (differentiable through the aten composition) ------------- */

Tensor3 rms_norm_backward_autograd(const Tensor &dy, const Tensor &input, c10::SymIntArrayRef ns,
                                   const OptTensor &weight, const OptTensor &rstd, OptDouble eps,
                                   std::array<bool, 3> mask, const OptTensor &bias, bool offset,
                                   bool eps_outside, double partial) {
  Tensor w = value(weight), b = value(bias);
  if (!grad_needed({&dy, &input, &w, &b}) && !any_tangent({&dy, &input, &w, &b})) {
    RN_OP(bwd, RmsNormBackwardSig, "rmsnorm::rms_norm_backward", "");
    Guard guard;
    return bwd.call(dy, input, ns, weight, rstd, eps, mask, bias, offset, eps_outside, partial);
  }
  return backward_composite(rncore::RMS, dy, input, static_cast<int64_t>(ns.size()), w, b,
                            eps_value(eps, input), offset, eps_outside, partial, mask);
}

Tensor3 layer_norm_backward_autograd(const Tensor &dy, const Tensor &input, c10::SymIntArrayRef ns,
                                     const OptTensor &weight, const OptTensor &bias,
                                     const OptTensor &mean, const OptTensor &rstd, OptDouble eps,
                                     std::array<bool, 3> mask, bool offset) {
  Tensor w = value(weight), b = value(bias);
  if (!grad_needed({&dy, &input, &w, &b}) && !any_tangent({&dy, &input, &w, &b})) {
    RN_OP(bwd, LayerNormBackwardSig, "rmsnorm::layer_norm_backward", "");
    Guard guard;
    return bwd.call(dy, input, ns, weight, bias, mean, rstd, eps, mask, offset);
  }
  return backward_composite(rncore::LAYER, dy, input, static_cast<int64_t>(ns.size()), w, b,
                            eps_value(eps, input), offset, false, 1.0, mask);
}

Tensor3 fused_add_backward_autograd(const Tensor &dy, const OptTensor &dres, const Tensor &h,
                                    c10::SymIntArrayRef ns, const OptTensor &weight, OptDouble eps,
                                    std::array<bool, 3> mask, const OptTensor &bias, bool offset,
                                    bool eps_outside, double partial) {
  Tensor w = value(weight), b = value(bias), r = value(dres);
  if (!grad_needed({&dy, &r, &h, &w, &b}) && !any_tangent({&dy, &r, &h, &w, &b})) {
    RN_OP(bwd, FusedAddBackwardSig, "rmsnorm::fused_add_rms_norm_backward", "");
    Guard guard;
    return bwd.call(dy, dres, h, ns, weight, eps, mask, bias, offset, eps_outside, partial);
  }
  auto [dx, dw, db] = backward_composite(rncore::RMS, dy, h, static_cast<int64_t>(ns.size()), w, b,
                                         eps_value(eps, h), offset, eps_outside, partial, mask);
  if (dx.defined() && r.defined()) dx = dx + r;
  return Tensor3(dx, dw, db);
}

Tensor3 qk_norm_backward_autograd(const Tensor &dy, const Tensor &input, const OptTensor &weight,
                                  OptDouble eps, std::array<bool, 3> mask, const OptTensor &bias,
                                  bool offset, bool eps_outside, double partial) {
  Tensor w = value(weight), b = value(bias);
  if (!grad_needed({&dy, &input, &w, &b}) && !any_tangent({&dy, &input, &w, &b})) {
    RN_OP(bwd, QkNormBackwardSig, "rmsnorm::qk_norm_backward", "");
    Guard guard;
    return bwd.call(dy, input, weight, eps, mask, bias, offset, eps_outside, partial);
  }
  return backward_composite(rncore::RMS, dy, input, 1, w, b, eps_value(eps, input), offset,
                            eps_outside, partial, mask);
}

/* Z = (xhat * w) W + bias: dY = dZ W^T is the norm's upstream gradient,
 * dW = Y^T dZ with Y = xhat * w, dbias = the sum of dZ over rows. */
Tensor4 linear_backward_autograd(const Tensor &dz, const Tensor &input, const Tensor &w,
                                 const OptTensor &g, OptDouble eps, const OptTensor &bias,
                                 bool offset, std::array<bool, 4> mask, bool eps_outside,
                                 double partial) {
  Tensor gg = value(g), b = value(bias);
  if (!grad_needed({&dz, &input, &w, &gg, &b}) && !any_tangent({&dz, &input, &w, &gg, &b})) {
    RN_OP(bwd, LinearBackwardSig, "rmsnorm::rms_norm_linear_backward", "");
    Guard guard;
    return bwd.call(dz, input, w, g, eps, bias, offset, mask, eps_outside, partial);
  }
  at::ScalarType t = opmath(input);
  double e = eps_value(eps, input);
  Tensor dzt = dz.to(t).reshape({-1, w.size(1)});  // (rows, n)
  Tensor dY = at::matmul(dzt, w.to(t).t()).reshape_symint(input.sym_sizes());
  auto [dx, dg, unused] = backward_composite(rncore::RMS, dY, input, 1, gg, Tensor(), e, offset,
                                             eps_outside, partial, {mask[0], mask[2], false});
  Tensor dW, db;
  if (mask[1]) {
    NormRows n = norm_rows(rncore::RMS, input, 1, e, eps_outside, partial);
    Tensor Y = n.xhat.reshape({-1, n.d});
    if (gg.defined()) Y = Y * (offset ? gg.to(t) + 1 : gg.to(t));
    dW = at::matmul(Y.t(), dzt).to(w.scalar_type());
  }
  if (mask[3] && b.defined()) db = dzt.sum(0).to(b.scalar_type());
  return Tensor4(dx, dW, dg, db);
}

/* ---- autograd: the ops that write in place ---------------------------------------------- */

/* They take no part in autograd, in reverse or forward mode: refused when a gradient would
 * be needed or an argument carries a tangent. */
void refuse_autograd(const std::string &op, c10::ArrayRef<const Tensor *> ts) {
  TORCH_CHECK_VALUE(!grad_needed(ts) && !any_tangent(ts), op,
                    ": writing in place (out=, inplace=True) does not take part in autograd; call "
                    "it under torch.no_grad() or with tensors that do not require grad (nor carry "
                    "forward-mode tangents)");
}

template <class T>
void collect(std::vector<const Tensor *> &, const T &) {}
void collect(std::vector<const Tensor *> &v, const Tensor &t) { v.push_back(&t); }
void collect(std::vector<const Tensor *> &v, const OptTensor &t) {
  if (t && t->defined()) v.push_back(&*t);
}

/* An op `name.overload` that writes its arguments at positions `Written`: its Autograd
 * kernel refuses autograd and goes on below it; its ADInplaceOrView kernel (reached in every
 * mode, also inside inference mode for tensors made outside it) refuses, as torch does, to
 * write an inference tensor outside inference mode, then writes and bumps the written
 * tensors' version counters, so a backward that saved one of them raises instead of using
 * the new values. */
template <class Sig, const char *Name, const char *Overload, std::size_t... Written>
struct InPlace;
template <class... A, const char *Name, const char *Overload, std::size_t... Written>
struct InPlace<void(A...), Name, Overload, Written...> {
  static std::string op() { return *Overload ? std::string(Name) + "." + Overload : Name; }

  static void autograd(A... a) {
    std::vector<const Tensor *> ts;
    (collect(ts, a), ...);
    refuse_autograd(op(), ts);
    RN_OP(fn, void(A...), Name, Overload);
    at::AutoDispatchBelowAutograd guard;
    fn.call(a...);
  }

  static void inplace_or_view(A... a) {
    auto args = std::forward_as_tuple(a...);
    bool inference_write = (std::get<Written>(args).is_inference() || ...);
    TORCH_CHECK(!inference_write || c10::InferenceMode::is_enabled(), op(),
                ": cannot write an inference tensor (made under torch.inference_mode()) outside "
                "inference mode; clone it first, as for torch's own in-place ops");
    {
      RN_OP(fn, void(A...), Name, Overload);
      Guard guard;
      fn.call(a...);
    }
    (torch::autograd::impl::bump_version(std::get<Written>(args)), ...);
  }
};

constexpr char kRmsNorm[] = "rmsnorm::rms_norm";
constexpr char kLayerNorm[] = "rmsnorm::layer_norm";
constexpr char kFusedAddInplace[] = "rmsnorm::fused_add_rms_norm_inplace";
constexpr char kQkNormInplace[] = "rmsnorm::qk_norm_inplace";
constexpr char kOut[] = "out";
constexpr char kNoOverload[] = "";

using RmsNormOut = InPlace<RmsNormOutSig, kRmsNorm, kOut, 9>;
using LayerNormOut = InPlace<LayerNormOutSig, kLayerNorm, kOut, 7>;
using FusedAddInplace = InPlace<FusedAddInplaceSig, kFusedAddInplace, kNoOverload, 0, 1>;
using QkNormInplace = InPlace<QkNormInplaceSig, kQkNormInplace, kNoOverload, 0>;

/* ---- autograd: ops without a gradient ------------------------------------------------------- */

/* Ops without a gradient: the kernel below autograd, recording nothing. The 8-bit outputs
 * have none; the shard steps record none themselves (rmsnorm.torch.distributed's
 * autograd.Function differentiates the whole, with the sums over the ranks between them). */
template <class Sig>
struct NoGrad;
template <class R, class... A>
struct NoGrad<R(A...)> {
  template <const char *name>
  static R kernel(A... a) {
    RN_OP(fn, R(A...), name, "");
    Guard guard;
    return fn.call(a...);
  }
};

constexpr char kInt8[] = "rmsnorm::rms_norm_int8";
constexpr char kFp8[] = "rmsnorm::rms_norm_fp8";
constexpr char kShardStats[] = "rmsnorm::rms_norm_shard_stats";
constexpr char kShardForward[] = "rmsnorm::rms_norm_shard_forward";
constexpr char kShardDots[] = "rmsnorm::rms_norm_shard_backward_dots";
constexpr char kShardBackward[] = "rmsnorm::rms_norm_shard_backward";

}  // namespace
}  // namespace rnops

/* ---- registration ------------------------------------------------------------------------- */

#define RMS_KW "*, Tensor? bias=None, bool offset=False, bool eps_outside=False, float partial=1.0"

TORCH_LIBRARY(rmsnorm, m) {
  // The fake kernels and this library's Python side live there (imported when an op is
  // first traced).
  m.set_python_module("rmsnorm._torch_fake");
  m.def("rms_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, float? eps=None, "
        RMS_KW ", bool round_before_weight=False) -> Tensor");
  m.def("rms_norm.out(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, "
        "float? eps=None, " RMS_KW ", bool round_before_weight=False, Tensor(a!) out) -> ()");
  m.def("rms_norm_forward(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, "
        "float? eps=None, " RMS_KW ", bool round_before_weight=False) -> (Tensor output, "
        "Tensor rstd)");
  m.def("rms_norm_backward(Tensor grad_output, Tensor input, SymInt[] normalized_shape, "
        "Tensor? weight, Tensor? rstd, float? eps, bool[3] output_mask, " RMS_KW
        ") -> (Tensor grad_input, Tensor grad_weight, Tensor grad_bias)");
  m.def("layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, "
        "Tensor? bias=None, float? eps=1e-05, *, bool offset=False, "
        "bool round_before_weight=False) -> Tensor");
  m.def("layer_norm.out(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, "
        "Tensor? bias=None, float? eps=1e-05, *, bool offset=False, "
        "bool round_before_weight=False, Tensor(a!) out) -> ()");
  m.def("layer_norm_forward(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, "
        "Tensor? bias=None, float? eps=1e-05, *, bool offset=False, "
        "bool round_before_weight=False) -> (Tensor output, Tensor mean, Tensor rstd)");
  m.def("layer_norm_backward(Tensor grad_output, Tensor input, SymInt[] normalized_shape, "
        "Tensor? weight, Tensor? bias, Tensor? mean, Tensor? rstd, float? eps, "
        "bool[3] output_mask, *, bool offset=False) -> (Tensor grad_input, Tensor grad_weight, "
        "Tensor grad_bias)");
  m.def("fused_add_rms_norm(Tensor input, Tensor residual, SymInt[] normalized_shape, "
        "Tensor? weight=None, float? eps=None, " RMS_KW
        ") -> (Tensor output, Tensor new_residual)");
  m.def("fused_add_rms_norm_inplace(Tensor(a!) input, Tensor(b!) residual, "
        "SymInt[] normalized_shape, Tensor? weight=None, float? eps=None, " RMS_KW ") -> ()");
  m.def("fused_add_rms_norm_backward(Tensor grad_output, Tensor? grad_residual, "
        "Tensor new_residual, SymInt[] normalized_shape, Tensor? weight, float? eps, "
        "bool[3] output_mask, " RMS_KW ") -> (Tensor grad, Tensor grad_weight, Tensor grad_bias)");
  m.def("qk_norm(Tensor input, Tensor? weight=None, float? eps=None, " RMS_KW ") -> Tensor");
  m.def("qk_norm_inplace(Tensor(a!) input, Tensor? weight=None, float? eps=None, " RMS_KW
        ") -> ()");
  m.def("qk_norm_backward(Tensor grad_output, Tensor input, Tensor? weight, float? eps, "
        "bool[3] output_mask, " RMS_KW ") -> (Tensor grad_input, Tensor grad_weight, "
        "Tensor grad_bias)");
  m.def("rms_norm_int8(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, "
        "float? eps=None, *, Tensor? bias=None, float? scale=None, bool offset=False, "
        "bool eps_outside=False, float partial=1.0) -> (Tensor q, Tensor scale)");
  m.def("rms_norm_fp8(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, "
        "float? eps=None, *, Tensor? bias=None, float? scale=None, bool offset=False, "
        "bool eps_outside=False, float partial=1.0) -> (Tensor q, Tensor scale)");
  m.def("rms_norm_linear(Tensor input, Tensor weight_matrix, Tensor? norm_weight=None, "
        "float? eps=None, Tensor? bias=None, bool offset=False, *, bool eps_outside=False, "
        "float partial=1.0) -> Tensor");
  m.def("rms_norm_linear_backward(Tensor grad_output, Tensor input, Tensor weight_matrix, "
        "Tensor? norm_weight, float? eps, Tensor? bias, bool offset, bool[4] output_mask, *, "
        "bool eps_outside=False, float partial=1.0) -> (Tensor grad_input, "
        "Tensor grad_weight_matrix, Tensor grad_norm_weight, Tensor grad_bias)");
  m.def("rms_norm_shard_stats(Tensor input, int d_global, int column_offset, *, "
        "float partial=1.0) -> Tensor");
  m.def("rms_norm_shard_forward(Tensor input, Tensor stats, int d_global, int column_offset, "
        "Tensor? weight=None, float? eps=None, " RMS_KW ", bool round_before_weight=False) -> "
        "Tensor");
  m.def("rms_norm_shard_backward_dots(Tensor grad_output, Tensor input, Tensor stats, "
        "int d_global, int column_offset, Tensor? weight, float? eps, *, bool offset=False, "
        "bool eps_outside=False, float partial=1.0) -> Tensor");
  m.def("rms_norm_shard_backward(Tensor grad_output, Tensor input, Tensor stats, Tensor dots, "
        "int d_global, int column_offset, Tensor? weight, float? eps, bool[3] output_mask, "
        RMS_KW ") -> (Tensor grad_input, Tensor grad_weight, Tensor grad_bias)");
}

#define RN_KERNELS(m)                                                              \
  m.impl("rms_norm", rnops::rms_norm_cpu);                                         \
  m.impl("rms_norm.out", rnops::rms_norm_out_cpu);                                 \
  m.impl("rms_norm_forward", rnops::rms_norm_forward_cpu);                         \
  m.impl("rms_norm_backward", rnops::rms_norm_backward_cpu);                       \
  m.impl("layer_norm", rnops::layer_norm_cpu);                                     \
  m.impl("layer_norm.out", rnops::layer_norm_out_cpu);                             \
  m.impl("layer_norm_forward", rnops::layer_norm_forward_cpu);                     \
  m.impl("layer_norm_backward", rnops::layer_norm_backward_cpu);                   \
  m.impl("fused_add_rms_norm", rnops::fused_add_cpu);                              \
  m.impl("fused_add_rms_norm_inplace", rnops::fused_add_inplace_cpu);              \
  m.impl("fused_add_rms_norm_backward", rnops::fused_add_backward_cpu);            \
  m.impl("qk_norm", rnops::qk_norm_cpu);                                           \
  m.impl("qk_norm_inplace", rnops::qk_norm_inplace_cpu);                           \
  m.impl("qk_norm_backward", rnops::qk_norm_backward_cpu);                         \
  m.impl("rms_norm_int8", rnops::quant_cpu<RMSNORM_Q_INT8>);                       \
  m.impl("rms_norm_fp8", rnops::quant_cpu<RMSNORM_Q_FP8_E4M3>);                    \
  m.impl("rms_norm_linear", rnops::linear_cpu);                                    \
  m.impl("rms_norm_linear_backward", rnops::linear_backward_cpu);                  \
  m.impl("rms_norm_shard_stats", rnops::shard_stats_cpu);                          \
  m.impl("rms_norm_shard_forward", rnops::shard_forward_cpu);                      \
  m.impl("rms_norm_shard_backward_dots", rnops::shard_dots_cpu);                   \
  m.impl("rms_norm_shard_backward", rnops::shard_backward_cpu)

TORCH_LIBRARY_IMPL(rmsnorm, CPU, m) { RN_KERNELS(m); }

// Tensors of other devices, sparse and quantized tensors dispatch to these keys: the same
// kernels, whose first step (take) refuses them with a TypeError naming the op.
TORCH_LIBRARY_IMPL(rmsnorm, CUDA, m) { RN_KERNELS(m); }
TORCH_LIBRARY_IMPL(rmsnorm, XPU, m) { RN_KERNELS(m); }
TORCH_LIBRARY_IMPL(rmsnorm, MPS, m) { RN_KERNELS(m); }
TORCH_LIBRARY_IMPL(rmsnorm, PrivateUse1, m) { RN_KERNELS(m); }
TORCH_LIBRARY_IMPL(rmsnorm, SparseCPU, m) { RN_KERNELS(m); }
TORCH_LIBRARY_IMPL(rmsnorm, SparseCUDA, m) { RN_KERNELS(m); }
TORCH_LIBRARY_IMPL(rmsnorm, SparseCsrCPU, m) { RN_KERNELS(m); }
TORCH_LIBRARY_IMPL(rmsnorm, SparseCsrCUDA, m) { RN_KERNELS(m); }
TORCH_LIBRARY_IMPL(rmsnorm, QuantizedCPU, m) { RN_KERNELS(m); }
TORCH_LIBRARY_IMPL(rmsnorm, QuantizedCUDA, m) { RN_KERNELS(m); }
TORCH_LIBRARY_IMPL(rmsnorm, MkldnnCPU, m) { RN_KERNELS(m); }

TORCH_LIBRARY_IMPL(rmsnorm, Autograd, m) {
  m.impl("rms_norm", rnops::rms_norm_autograd);
  m.impl("rms_norm.out", rnops::RmsNormOut::autograd);
  m.impl("rms_norm_forward", rnops::rms_norm_forward_autograd);
  m.impl("rms_norm_backward", rnops::rms_norm_backward_autograd);
  m.impl("layer_norm", rnops::layer_norm_autograd);
  m.impl("layer_norm.out", rnops::LayerNormOut::autograd);
  m.impl("layer_norm_forward", rnops::layer_norm_forward_autograd);
  m.impl("layer_norm_backward", rnops::layer_norm_backward_autograd);
  m.impl("fused_add_rms_norm", rnops::fused_add_autograd);
  m.impl("fused_add_rms_norm_inplace", rnops::FusedAddInplace::autograd);
  m.impl("fused_add_rms_norm_backward", rnops::fused_add_backward_autograd);
  m.impl("qk_norm", rnops::qk_norm_autograd);
  m.impl("qk_norm_inplace", rnops::QkNormInplace::autograd);
  m.impl("qk_norm_backward", rnops::qk_norm_backward_autograd);
  m.impl("rms_norm_int8", rnops::NoGrad<rnops::QuantSig>::kernel<rnops::kInt8>);
  m.impl("rms_norm_fp8", rnops::NoGrad<rnops::QuantSig>::kernel<rnops::kFp8>);
  m.impl("rms_norm_linear", rnops::linear_autograd);
  m.impl("rms_norm_linear_backward", rnops::linear_backward_autograd);
  m.impl("rms_norm_shard_stats", rnops::NoGrad<rnops::ShardStatsSig>::kernel<rnops::kShardStats>);
  m.impl("rms_norm_shard_forward",
         rnops::NoGrad<rnops::ShardForwardSig>::kernel<rnops::kShardForward>);
  m.impl("rms_norm_shard_backward_dots",
         rnops::NoGrad<rnops::ShardDotsSig>::kernel<rnops::kShardDots>);
  m.impl("rms_norm_shard_backward",
         rnops::NoGrad<rnops::ShardBackwardSig>::kernel<rnops::kShardBackward>);
}

TORCH_LIBRARY_IMPL(rmsnorm, ADInplaceOrView, m) {
  m.impl("rms_norm.out", rnops::RmsNormOut::inplace_or_view);
  m.impl("layer_norm.out", rnops::LayerNormOut::inplace_or_view);
  m.impl("fused_add_rms_norm_inplace", rnops::FusedAddInplace::inplace_or_view);
  m.impl("qk_norm_inplace", rnops::QkNormInplace::inplace_or_view);
}
