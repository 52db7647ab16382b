/* torch_ops.cpp - the rmsnorm:: torch ops, registered from the op table (ops.def):
 * their schemas, the CPU kernels (core.hpp over tensors; they also refuse tensors
 * rmsnorm cannot take: CUDA and other devices, sparse, quantized, with a TypeError
 * naming the op) and the autograd kernels. The fake (meta) kernels are in Python
 * (rmsnorm/_torch_fake.py, from the same table), used only when tracing.
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
#include <ATen/core/dispatch/Dispatcher.h>
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
#include <string_view>
#include <tuple>
#include <utility>
#include <type_traits>
#include <vector>

#include "core.hpp"
#include "runtime.h"

namespace rnops {

using at::Tensor;
using OptTensor = std::optional<Tensor>;
using OptDouble = std::optional<double>;
using Tensor2 = std::tuple<Tensor, Tensor>;
using Tensor3 = std::tuple<Tensor, Tensor, Tensor>;
using Tensor4 = std::tuple<Tensor, Tensor, Tensor, Tensor>;

/* rmsnorm::<op> called through the dispatcher (so autograd, tracing, modes and subclasses
 * see it), its arguments boxed in schema order: its outputs. */
struct BoxedOp {
  c10::OperatorHandle handle;
  template <class... A>
  torch::jit::Stack call(A &&...a) const {
    torch::jit::Stack s{c10::IValue(std::forward<A>(a))...};
    handle.callBoxed(s);
    return s;
  }
};

#define RN_HANDLE(var, name) \
  static const BoxedOp var{c10::Dispatcher::singleton().findSchemaOrThrow(name, "")}

/* The first N outputs as tensors. */
template <std::size_t N>
auto tensors(const torch::jit::Stack &s) {
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    return std::make_tuple(s[I].toTensor()...);
  }(std::make_index_sequence<N>());
}

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
  TORCH_CHECK_TYPE(t.device().is_cpu(), "rmsnorm::", op, ": ",
                   rncore::message("device", {{"what", what}, {"device", t.device().str()}}));
  TORCH_CHECK_TYPE(t.layout() == at::kStrided, "rmsnorm::", op, ": ", what, " has layout ",
                   layout_name(t.layout()), "; rmsnorm takes dense (strided) tensors");
  TORCH_CHECK_TYPE(!t.is_quantized(), "rmsnorm::", op, ": ", what, " is a quantized tensor (",
                   torch_dtype_name(t.scalar_type()),
                   "); rmsnorm takes float32, float16, bfloat16 or float64");
  return t.is_neg() ? t.resolve_neg() : t;
}

/* An output written in place (out=, in-place ops): taken as it is. */
Tensor take_out(const char *op, const Tensor &t, const char *what) {
  TORCH_CHECK_VALUE(!t.is_neg() && !t.is_conj(), "rmsnorm::", op, ": ", what,
                    " is a lazily negated or conjugated view; rmsnorm cannot write it in place");
  return take(op, t, what);
}

std::string op_name(const c10::OperatorHandle &op) {
  const auto &n = op.operator_name();
  return n.overload_name.empty() ? n.name : n.name + "." + n.overload_name;
}

/* ---- CPU kernels ---------------------------------------------------------------------------
 * Boxed: each reads its op's arguments by their schema names (ops.def), so no kernel
 * restates an argument list. */

/* An op's arguments on the dispatcher's stack, by name. */
class Args {
 public:
  Args(const c10::OperatorHandle &op, torch::jit::Stack *s, const char *name)
      : args_(op.schema().arguments()), s_(*s), base_(s->size() - args_.size()), name_(name) {}
  const char *op() const { return name_; }
  bool has(std::string_view n) const { return find(n) != nullptr; }
  const c10::IValue &operator[](std::string_view n) const {
    const c10::IValue *v = find(n);
    TORCH_INTERNAL_ASSERT(v, name_, " has no argument ", n);
    return *v;
  }
  /* A tensor argument as the kernels read it (take), undefined for None. */
  Tensor t(const char *n) const {
    const c10::IValue &v = (*this)[n];
    return v.isNone() ? Tensor() : take(op(), v.toTensor(), n);
  }
  Tensor out(const char *n) const { return take_out(op(), (*this)[n].toTensor(), n); }
  Tensor raw(const char *n) const {  // as given (the autograd kernels' view)
    const c10::IValue &v = (*this)[n];
    return v.isNone() ? Tensor() : v.toTensor();
  }
  bool flag(const char *n) const {
    const c10::IValue *v = find(n);
    return v && v->toBool();
  }
  OptDouble eps() const {
    const c10::IValue *v = find("eps");
    return v ? v->toOptional<double>() : std::nullopt;
  }
  double partial() const {
    const c10::IValue *v = find("partial");
    return v ? v->toDouble() : 1.0;
  }
  int64_t k() const {  // the normalized dims
    return static_cast<int64_t>((*this)["normalized_shape"].toSymIntVector().size());
  }
  int64_t i(const char *n) const { return (*this)[n].toInt(); }
  bool mask(std::size_t k) const { return (*this)["output_mask"].toBoolList().get(k); }
  std::vector<int64_t> norm() const {
    std::vector<int64_t> v;
    for (const c10::SymInt &d : (*this)["normalized_shape"].toSymIntVector())
      v.push_back(d.guard_int(__FILE__, __LINE__));
    return v;
  }
  /* eps, partial and the flags, those the op has. */
  rncore::Options options() const {
    rncore::Options o;
    o.eps = eps();
    o.partial = partial();
    o.flags = rncore::flags_of(flag("offset"), flag("eps_outside"), flag("round_before_weight"));
    return o;
  }
  /* Replaces the arguments with the outputs. */
  void ret(std::initializer_list<Tensor> outs) {
    s_.erase(s_.begin() + static_cast<std::ptrdiff_t>(base_), s_.end());
    for (const Tensor &t : outs) s_.emplace_back(t);
  }

 private:
  const c10::IValue *find(std::string_view n) const {  // the argument named n, or null
    for (std::size_t i = 0; i < args_.size(); i++)
      if (args_[i].name() == n) return &s_[base_ + i];
    return nullptr;
  }
  const std::vector<c10::Argument> &args_;
  torch::jit::Stack &s_;
  std::size_t base_;
  const char *name_;
};

/* The op's name less "rmsnorm::", for messages: made once per kernel K (each serves one op),
 * not on every call. */
template <auto K>
const char *short_name(const c10::OperatorHandle &op) {
  static const std::string name = op_name(op).substr(std::string("rmsnorm::").size());
  return name.c_str();
}

template <void (*K)(Args &)>
void boxed(const c10::OperatorHandle &op, torch::jit::Stack *s) {
  Args a(op, s, short_name<K>(op));
  guarded(a.op(), [&] { K(a); });
}

Tensor opt(const Tensor &t, bool keep) { return keep ? t : Tensor(); }

/* RMSNorm and LayerNorm: y (new, or into out=), and the statistics when asked for. */
void norm(Args &a, rncore::Norm kind, bool stats) {
  B b;
  Tensor out = a.has("out") ? a.out("out") : Tensor();
  auto r = rncore::forward(b, kind, a.t("input"), a.norm(), a.t("weight"), a.t("bias"),
                           a.options(), stats && kind == rncore::LAYER, stats,
                           out.defined() ? &out : nullptr);
  if (out.defined()) a.ret({});
  else if (!stats) a.ret({r.y});
  else if (kind == rncore::RMS) a.ret({r.y, r.rstd});
  else a.ret({r.y, r.mean, r.rstd});
}

void norm_backward(Args &a, rncore::Norm kind) {
  B b;
  auto g = rncore::backward(b, kind, a.t("grad_output"), a.t("input"), a.norm(), a.t("weight"),
                            a.t("bias"), a.has("mean") ? a.t("mean") : Tensor(), a.t("rstd"),
                            a.options(), a.mask(1), a.mask(2));
  a.ret({opt(g.dx, a.mask(0)), g.dweight, g.dbias});
}

void rms_norm_cpu(Args &a) { norm(a, rncore::RMS, false); }
void rms_norm_out_cpu(Args &a) { norm(a, rncore::RMS, false); }
void rms_norm_forward_cpu(Args &a) { norm(a, rncore::RMS, true); }
void rms_norm_backward_cpu(Args &a) { norm_backward(a, rncore::RMS); }
void layer_norm_cpu(Args &a) { norm(a, rncore::LAYER, false); }
void layer_norm_out_cpu(Args &a) { norm(a, rncore::LAYER, false); }
void layer_norm_forward_cpu(Args &a) { norm(a, rncore::LAYER, true); }
void layer_norm_backward_cpu(Args &a) { norm_backward(a, rncore::LAYER); }

void fused_add(Args &a, bool inplace) {
  B b;
  auto r = rncore::add_forward(b, inplace ? a.out("input") : a.t("input"),
                               inplace ? a.out("residual") : a.t("residual"), a.norm(),
                               a.t("weight"), a.t("bias"), a.options(), false, inplace);
  if (inplace) a.ret({});
  else a.ret({r.y, r.h});
}

void fused_add_rms_norm_cpu(Args &a) { fused_add(a, false); }
void fused_add_rms_norm_inplace_cpu(Args &a) { fused_add(a, true); }

void fused_add_rms_norm_backward_cpu(Args &a) {
  B b;
  auto g = rncore::add_backward(b, a.t("grad_output"), a.t("grad_residual"), a.t("new_residual"),
                                a.norm(), a.t("weight"), a.t("bias"), Tensor(), a.options(),
                                a.mask(1), a.mask(2));
  a.ret({opt(g.dx, a.mask(0)), g.dweight, g.dbias});
}

void qk(Args &a, bool inplace) {
  B b;
  auto r = rncore::qk_forward(b, inplace ? a.out("input") : a.t("input"), a.t("weight"),
                              a.t("bias"), a.options(), false, inplace);
  if (inplace) a.ret({});
  else a.ret({r.y});
}

void qk_norm_cpu(Args &a) { qk(a, false); }
void qk_norm_inplace_cpu(Args &a) { qk(a, true); }

void qk_norm_backward_cpu(Args &a) {
  B b;
  auto g = rncore::qk_backward(b, a.t("grad_output"), a.t("input"), a.t("weight"), a.t("bias"),
                               Tensor(), a.options(), a.mask(1), a.mask(2));
  a.ret({opt(g.dx, a.mask(0)), g.dweight, g.dbias});
}

void quant(Args &a, rmsnorm_qtype q) {
  B b;
  auto r = rncore::forward_quant(b, q, a.t("input"), a.norm(), a.t("weight"), a.t("bias"),
                                 a.options(), a["scale"].toOptional<double>());
  a.ret({r.q, r.scale});
}

void rms_norm_int8_cpu(Args &a) { quant(a, RMSNORM_Q_INT8); }
void rms_norm_fp8_cpu(Args &a) { quant(a, RMSNORM_Q_FP8_E4M3); }

rncore::Linear<B> linear(B &b, const Args &a) {
  return rncore::linear_args(b, a.t("input"), a.t("weight_matrix"), a.t("norm_weight"),
                             a.t("bias"));
}

void rms_norm_linear_cpu(Args &a) {
  B b;
  auto o = a.options();
  auto l = linear(b, a);
  a.ret({rncore::linear_forward(b, l, rncore::fold(b, l, o), o, false).first});
}

void rms_norm_linear_backward_cpu(Args &a) {
  B b;
  auto o = a.options();
  auto l = linear(b, a);
  auto g = rncore::linear_backward(b, l, rncore::fold(b, l, o), a.t("grad_output"), o, a.mask(2),
                                   a.mask(1), a.mask(3));
  a.ret({opt(g.dx, a.mask(0)), g.dw, g.dg, g.db});
}

/* The shard steps (core.hpp, "sharded hidden dimension"). */

void rms_norm_shard_stats_cpu(Args &a) {
  B b;
  a.ret({rncore::shard_stats(b, a.t("input"), a.i("d_global"), a.i("column_offset"), a.options())});
}

void rms_norm_shard_forward_cpu(Args &a) {
  B b;
  a.ret({rncore::shard_forward(b, a.t("input"), a.t("stats"), a.i("d_global"),
                               a.i("column_offset"), a.t("weight"), a.t("bias"), a.options())});
}

void rms_norm_shard_backward_dots_cpu(Args &a) {
  B b;
  a.ret({rncore::shard_backward_dots(b, a.t("grad_output"), a.t("input"), a.t("stats"),
                                     a.i("d_global"), a.i("column_offset"), a.t("weight"),
                                     a.options())});
}

void rms_norm_shard_backward_cpu(Args &a) {
  B b;
  auto g = rncore::shard_backward(b, a.t("grad_output"), a.t("input"), a.t("stats"), a.t("dots"),
                                  a.i("d_global"), a.i("column_offset"), a.t("weight"),
                                  a.t("bias"), a.options(), a.mask(1), a.mask(2));
  a.ret({opt(g.dx, a.mask(0)), g.dweight, g.dbias});
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
  std::array<bool, 3> mask3() const { return {needs(0), needs(1), needs(2)}; }
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
  if (dxhat.defined())
    add(w.defined() ? dxhat * (offset ? w.to(t) + 1 : w.to(t)).reshape(-1) : dxhat);
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
    RN_HANDLE(bwd, "rmsnorm::rms_norm_backward");
    Tensor x = get(0);
    // the backward treats rounding before the weight as the identity
    auto [dx, dw, db] = tensors<3>(bwd.call(grads[0], x, ns(x), opt_of(get(1)), opt_of(get(3)), eps,
                                            mask3(), opt_of(get(2)), offset, eps_outside, partial));
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
      RN_HANDLE(fwd, "rmsnorm::rms_norm_forward");
      std::tie(y, rstd) =
          tensors<2>(fwd.call(input, ns, weight, eps, bias, offset, eps_outside, partial, rbw));
    } else {
      RN_HANDLE(fwd, "rmsnorm::rms_norm");
      y = fwd.call(input, ns, weight, eps, bias, offset, eps_outside, partial, rbw)[0].toTensor();
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
    RN_HANDLE(bwd, "rmsnorm::layer_norm_backward");
    Tensor x = get(0);
    auto [dx, dw, db] = tensors<3>(bwd.call(grads[0], x, ns(x), opt_of(get(1)), opt_of(get(2)),
                                            opt_of(get(3)), opt_of(get(4)), eps, mask3(), offset));
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
      RN_HANDLE(fwd, "rmsnorm::layer_norm_forward");
      std::tie(y, mean, rstd) = tensors<3>(fwd.call(input, ns, weight, bias, eps, offset, rbw));
    } else {
      RN_HANDLE(fwd, "rmsnorm::layer_norm");
      y = fwd.call(input, ns, weight, bias, eps, offset, rbw)[0].toTensor();
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
    RN_HANDLE(bwd, "rmsnorm::fused_add_rms_norm_backward");
    Tensor h = get(0);
    bool need_x = needs(0) || needs(1);
    Tensor dy = grads[0].defined() ? grads[0] : at::zeros_like(h);
    auto [dh, dw, db] = tensors<3>(bwd.call(dy, opt_of(grads[1]), h, ns(h), opt_of(get(1)), eps,
                                            std::array<bool, 3>{need_x, needs(2), needs(3)},
                                            opt_of(get(2)), offset, eps_outside, partial));
    // one gradient, given to both: the same values, not one tensor
    Tensor du = needs(0) && needs(1) ? dh.clone() : dh;
    return {needs(0) ? du : Tensor(), needs(1) ? dh : Tensor(), dw, db};
  }
};

Tensor2 fused_add_rms_norm_autograd(const Tensor &input, const Tensor &residual,
    c10::SymIntArrayRef ns, const OptTensor &weight, OptDouble eps, const OptTensor &bias,
    bool offset, bool eps_outside, double partial) {
  Tensor w = value(weight), b = value(bias), y, h;
  auto node = node_if_needed<FusedAddNode>(input, residual, w, b);
  {
    RN_HANDLE(fwd, "rmsnorm::fused_add_rms_norm");
    Guard guard;
    std::tie(y, h) = tensors<2>(
        fwd.call(input, residual, ns, weight, eps, bias, offset, eps_outside, partial));
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
    RN_HANDLE(bwd, "rmsnorm::qk_norm_backward");
    auto [dx, dw, db] = tensors<3>(bwd.call(grads[0], get(0), opt_of(get(1)), eps, mask3(),
                                            opt_of(get(2)), offset, eps_outside, partial));
    return {dx, dw, db};
  }
};

Tensor qk_norm_autograd(const Tensor &input, const OptTensor &weight, OptDouble eps,
                        const OptTensor &bias, bool offset, bool eps_outside, double partial) {
  Tensor w = value(weight), b = value(bias), y;
  auto node = node_if_needed<QkNormNode>(input, w, b);
  {
    RN_HANDLE(fwd, "rmsnorm::qk_norm");
    Guard guard;
    y = fwd.call(input, weight, eps, bias, offset, eps_outside, partial)[0].toTensor();
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
    RN_HANDLE(bwd, "rmsnorm::rms_norm_linear_backward");
    auto [dx, dw, dg, db] = tensors<4>(bwd.call(
        grads[0], get(0), get(1), opt_of(get(2)), eps, opt_of(get(3)), offset,
        std::array<bool, 4>{needs(0), needs(1), needs(2), needs(3)}, eps_outside, partial));
    return {dx, dw, dg, db};
  }
};

Tensor rms_norm_linear_autograd(const Tensor &input, const Tensor &w, const OptTensor &g,
    OptDouble eps, const OptTensor &bias, bool offset, bool eps_outside, double partial) {
  Tensor gg = value(g), b = value(bias), z;
  auto node = node_if_needed<LinearNode>(input, w, gg, b);
  {
    RN_HANDLE(fwd, "rmsnorm::rms_norm_linear");
    Guard guard;
    z = fwd.call(input, w, g, eps, bias, offset, eps_outside, partial)[0].toTensor();
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

/* Whether autograd has work in an op's call: a tensor argument (the statistics a backward op
 * takes aside) needs a gradient or carries a forward-mode tangent. Read on the dispatcher's
 * stack, before any argument is unboxed. */
bool autograd_needed(const c10::OperatorHandle &op, const torch::jit::Stack &s) {
  const auto &args = op.schema().arguments();
  bool grad = c10::GradMode::is_enabled();
  for (std::size_t i = 0, base = s.size() - args.size(); i < args.size(); i++) {
    if (!s[base + i].isTensor() || args[i].name() == "rstd" || args[i].name() == "mean") continue;
    const Tensor &t = s[base + i].toTensor();
    if (t.defined() && ((grad && t.requires_grad()) || has_tangent(t))) return true;
  }
  return false;
}

/* A differentiable op's Autograd kernel: when autograd has no work (eager inference, the
 * common case), the op below autograd on the caller's stack as it is; else F, the op's typed
 * kernel that records the Node and the tangent. */
template <auto F>
void diff_autograd(const c10::OperatorHandle &op, torch::jit::Stack *s) {
  if (!autograd_needed(op, *s)) {
    Guard guard;
    op.callBoxed(s);
    return;
  }
  static const auto typed = c10::KernelFunction::makeFromUnboxedFunction(TORCH_FN(F));
  typed.callBoxed(op, c10::DispatchKeySet(), s);
}

/* A backward op's Autograd kernel: the op below autograd (the library's backward) when
 * autograd has no work; else (create_graph=True, forward-over-reverse) its formula in aten
 * ops, K, which autograd records and can differentiate again. */
template <void (*K)(Args &)>
void backward_autograd(const c10::OperatorHandle &op, torch::jit::Stack *s) {
  if (!autograd_needed(op, *s)) {
    Guard guard;
    op.callBoxed(s);
    return;
  }
  Args a(op, s, short_name<K>(op));
  K(a);
}

/* The composite backward of a norm over the input's last k dims (rms, layer, qk). */
Tensor3 norm_composite(const Args &a, rncore::Norm kind, const Tensor &x, int64_t k) {
  return backward_composite(kind, a.raw("grad_output"), x, k, a.raw("weight"), a.raw("bias"),
                            eps_value(a.eps(), x), a.flag("offset"), a.flag("eps_outside"),
                            a.partial(), {a.mask(0), a.mask(1), a.mask(2)});
}

void rms_norm_backward_composite(Args &a) {
  auto [dx, dw, db] = norm_composite(a, rncore::RMS, a.raw("input"), a.k());
  a.ret({dx, dw, db});
}

void layer_norm_backward_composite(Args &a) {
  auto [dx, dw, db] = norm_composite(a, rncore::LAYER, a.raw("input"), a.k());
  a.ret({dx, dw, db});
}

void qk_norm_backward_composite(Args &a) {
  auto [dx, dw, db] = norm_composite(a, rncore::RMS, a.raw("input"), 1);
  a.ret({dx, dw, db});
}

void fused_add_rms_norm_backward_composite(Args &a) {
  auto [dx, dw, db] = norm_composite(a, rncore::RMS, a.raw("new_residual"), a.k());
  Tensor r = a.raw("grad_residual");
  if (dx.defined() && r.defined()) dx = dx + r;
  a.ret({dx, dw, db});
}

/* Z = (xhat * w) W + bias: dY = dZ W^T is the norm's upstream gradient,
 * dW = Y^T dZ with Y = xhat * w, dbias = the sum of dZ over rows. */
void rms_norm_linear_backward_composite(Args &a) {
  Tensor input = a.raw("input"), w = a.raw("weight_matrix"), gg = a.raw("norm_weight");
  Tensor b = a.raw("bias");
  bool offset = a.flag("offset"), eps_outside = a.flag("eps_outside");
  at::ScalarType t = opmath(input);
  double e = eps_value(a.eps(), input);
  Tensor dzt = a.raw("grad_output").to(t).reshape({-1, w.size(1)});  // (rows, n)
  Tensor dY = at::matmul(dzt, w.to(t).t()).reshape_symint(input.sym_sizes());
  auto [dx, dg, unused] = backward_composite(rncore::RMS, dY, input, 1, gg, Tensor(), e, offset,
                                             eps_outside, a.partial(),
                                             {a.mask(0), a.mask(2), false});
  Tensor dW, db;
  if (a.mask(1)) {
    NormRows n = norm_rows(rncore::RMS, input, 1, e, eps_outside, a.partial());
    Tensor Y = n.xhat.reshape({-1, n.d});
    if (gg.defined()) Y = Y * (offset ? gg.to(t) + 1 : gg.to(t));
    dW = at::matmul(Y.t(), dzt).to(w.scalar_type());
  }
  if (a.mask(3) && b.defined()) db = dzt.sum(0).to(b.scalar_type());
  a.ret({dx, dW, dg, db});
}

/* ---- autograd: the ops that write in place, and ops without a gradient -------------------- */

/* Boxed kernels, one for every op of a kind (ops.def): they read the op's schema.
 * The ops that write in place (out=, inplace=True) take no part in autograd, in reverse or
 * forward mode: refused when a gradient would be needed or an argument carries a tangent. */
void inplace_autograd(const c10::OperatorHandle &op, torch::jit::Stack *s) {
  TORCH_CHECK_VALUE(!autograd_needed(op, *s), op_name(op),
                    ": writing in place (out=, inplace=True) does not take part in autograd; call "
                    "it under torch.no_grad() or with tensors that do not require grad (nor carry "
                    "forward-mode tangents)");
  at::AutoDispatchBelowAutograd guard;
  op.callBoxed(s);
}

/* Reached in every mode (also inside inference mode for tensors made outside it): refuses,
 * as torch does, to write an inference tensor outside inference mode, then writes and bumps
 * the written tensors' version counters, so a backward that saved one of them raises
 * instead of using the new values. */
void inplace_or_view(const c10::OperatorHandle &op, torch::jit::Stack *s) {
  const auto &args = op.schema().arguments();
  std::vector<Tensor> written;  // the (a!) arguments
  for (std::size_t i = 0, base = s->size() - args.size(); i < args.size(); i++)
    if (args[i].alias_info() && args[i].alias_info()->isWrite())
      written.push_back((*s)[base + i].toTensor());
  for (const Tensor &t : written)
    TORCH_CHECK(!t.is_inference() || c10::InferenceMode::is_enabled(), op_name(op),
                ": cannot write an inference tensor (made under torch.inference_mode()) outside "
                "inference mode; clone it first, as for torch's own in-place ops");
  {
    Guard guard;
    op.callBoxed(s);
  }
  for (const Tensor &t : written) torch::autograd::impl::bump_version(t);
}

/* Ops without a gradient: the kernel below autograd, recording nothing. */
void nograd(const c10::OperatorHandle &op, torch::jit::Stack *s) {
  Guard guard;
  op.callBoxed(s);
}

/* "name.overload" of a schema "name.overload(...) -> ...". */
std::string name_of(const char *schema) {
  std::string s(schema);
  return s.substr(0, s.find('('));
}

/* The CPU kernels, also for tensors of other devices, sparse and quantized ones: their first
 * step (take) refuses those with a TypeError naming the op. */
void cpu_kernels(torch::Library &m) {
#define RN_OP(id, kind, schema) \
  m.impl(name_of(schema).c_str(), torch::CppFunction::makeFromBoxedFunction<&boxed<&id##_cpu>>());
#define RN_FN(...)
#include "ops.def"
#undef RN_OP
}

}  // namespace
}  // namespace rnops

/* ---- registration (the rows of ops.def) --------------------------------------------------- */

#define RN_AUTOGRAD_DIFF(id) \
  torch::CppFunction::makeFromBoxedFunction<&rnops::diff_autograd<&rnops::id##_autograd>>()
#define RN_AUTOGRAD_BACKWARD(id) \
  torch::CppFunction::makeFromBoxedFunction<&rnops::backward_autograd<&rnops::id##_composite>>()
#define RN_AUTOGRAD_INPLACE(id) \
  torch::CppFunction::makeFromBoxedFunction<&rnops::inplace_autograd>()
#define RN_AUTOGRAD_NOGRAD(id) torch::CppFunction::makeFromBoxedFunction<&rnops::nograd>()

TORCH_LIBRARY(rmsnorm, m) {
  // The fake kernels and this library's Python side live there (imported when an op is
  // first traced).
  m.set_python_module("rmsnorm._torch_fake");
#define RN_OP(id, kind, schema) m.def(schema);
#include "ops.def"
#undef RN_OP
}

#define RN_CPU_KERNELS(key) \
  TORCH_LIBRARY_IMPL(rmsnorm, key, m) { rnops::cpu_kernels(m); }
RN_CPU_KERNELS(CPU) RN_CPU_KERNELS(CUDA) RN_CPU_KERNELS(XPU) RN_CPU_KERNELS(MPS)
RN_CPU_KERNELS(PrivateUse1) RN_CPU_KERNELS(SparseCPU) RN_CPU_KERNELS(SparseCUDA)
RN_CPU_KERNELS(SparseCsrCPU) RN_CPU_KERNELS(SparseCsrCUDA) RN_CPU_KERNELS(QuantizedCPU)
RN_CPU_KERNELS(QuantizedCUDA) RN_CPU_KERNELS(MkldnnCPU)

TORCH_LIBRARY_IMPL(rmsnorm, Autograd, m) {
#define RN_OP(id, kind, schema) m.impl(rnops::name_of(schema).c_str(), RN_AUTOGRAD_##kind(id));
#include "ops.def"
#undef RN_OP
}

TORCH_LIBRARY_IMPL(rmsnorm, ADInplaceOrView, m) {
#define RN_OP_INPLACE(schema) \
  m.impl(rnops::name_of(schema).c_str(),     \
         torch::CppFunction::makeFromBoxedFunction<&rnops::inplace_or_view>());
#define RN_OP_DIFF(schema)
#define RN_OP_BACKWARD(schema)
#define RN_OP_NOGRAD(schema)
#define RN_OP(id, kind, schema) RN_OP_##kind(schema)
#include "ops.def"
#undef RN_OP
}
