/* torch_ops.cpp - the rmsnorm:: torch ops, registered from the op table (ops.def): their
 * schemas, the CPU kernels (core.hpp's, over tensors; they also refuse tensors rmsnorm
 * cannot take: CUDA and other devices, sparse, quantized, with a TypeError naming the op)
 * and the autograd kernels. The fake (meta) kernels are in Python (rmsnorm/_torch_fake.py,
 * from the same table), used only when tracing.
 *
 * Autograd. A differentiable op records, when a gradient is needed, a Node whose apply
 * calls the op's backward op through the dispatcher (as torch's own generated kernels do,
 * so functorch transforms work too), and gives its outputs their tangents when an argument
 * carries one. A backward op is itself differentiable: called with grad mode on and an
 * input that requires grad (create_graph=True, as in gradient penalties and gradgradcheck)
 * or carries a tangent, it computes the library's backward formula with aten ops, which
 * autograd differentiates again, so gradients of any order exist; otherwise it runs the
 * library's backward. The ops that write in place (out=, inplace=True) take no part in
 * autograd; their ADInplaceOrView kernels bump the written tensors' version counters in
 * every mode (inference mode included), as torch's own in-place ops do. */
#include <torch/library.h>
#if __has_include(<torch/headeronly/version.h>)
#include <torch/headeronly/version.h>
#elif __has_include(<torch/version.h>)
#include <torch/version.h>
#endif

#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <memory>
#include <mutex>
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
using OptDouble = std::optional<double>;
using Tensor3 = std::tuple<Tensor, Tensor, Tensor>;

namespace {

using rncore::Dims;

/* ---- tensors as core.hpp sees them ---------------------------------------------------- */

/* torch's dtypes by rmsnorm_dtype code */
constexpr at::ScalarType kTypes[] = {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble};

int code_of(at::ScalarType t) {
  auto at = std::find(std::begin(kTypes), std::end(kTypes), t);
  return at == std::end(kTypes) ? -1 : static_cast<int>(at - std::begin(kTypes));
}

/* torch's names: float32, bfloat16, complex64, int64, ... */
std::string torch_dtype_name(at::ScalarType t) {
  static const std::pair<at::ScalarType, const char *> others[] = {
      {at::kComplexFloat, "complex64"}, {at::kComplexDouble, "complex128"},
      {at::kComplexHalf, "complex32"}, {at::kLong, "int64"}, {at::kInt, "int32"},
      {at::kShort, "int16"}, {at::kChar, "int8"}, {at::kByte, "uint8"}, {at::kBool, "bool"}};
  if (code_of(t) >= 0) return rncore::dtype_name(code_of(t));
  for (const auto &[type, name] : others)
    if (type == t) return name;
  return c10::toString(t);
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

/* E8M0 scales: torch's float8_e8m0fnu (torch >= 2.7), else their bytes as uint8. */
#if defined(TORCH_VERSION_MAJOR) && \
    (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 7))
constexpr at::ScalarType kE8M0 = at::kFloat8_e8m0fnu;
#else
constexpr at::ScalarType kE8M0 = at::kByte;
#endif

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
  Tensor contiguous(const Tensor &t) { return cast(t, code_of(t.scalar_type())); }
  Tensor cast(const Tensor &t, int code) { return empty(shape(t), code).copy_(t); }
  Tensor empty(Dims s, int code) { return new_tensor(s, kTypes[code]); }
  Tensor full(Dims s, int code, double v) { return empty(s, code).fill_(v); }
  Tensor empty_quant(Dims s, int store) {
    return new_tensor(s, store == rncore::ST_INT8   ? at::kChar
                         : store == rncore::ST_E4M3 ? at::kFloat8_e4m3fn
                         : store == rncore::ST_U8   ? at::kByte
                                                    : kE8M0);
  }
  Tensor scalar_f32(float v) {
    Tensor t = at::empty({}, at::TensorOptions().dtype(at::kFloat));
    *t.data_ptr<float>() = v;
    return t;
  }
  void writable(const Tensor &, const char *) {}  // tensors are written where they are
  Tensor index(const Tensor &t, const char *what) {
    if (!at::isIntegralType(t.scalar_type(), /*includeBool=*/false))
      rncore::type_error(rncore::message("index_dtype", {{"what", what}, {"dtype", dtype_name(t)}}));
    return t.scalar_type() == at::kLong && t.is_contiguous() ? t : t.to(at::kLong).contiguous();
  }
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
 * core.hpp's kernels (ops.def's kernel column), reading the op's arguments by their schema
 * names, so that no kernel restates an argument list. */

/* An op's arguments on the dispatcher's stack, by name: the A of core.hpp's kernels, and
 * what the autograd kernels read. */
class Args {
 public:
  using B = TorchBackend;
  Args(const c10::OperatorHandle &op, torch::jit::Stack *s, const char *name)
      : schema_(op.schema()), args_(schema_.arguments()), s_(*s),
        base_(s->size() - args_.size()), name_(name) {}
  const char *op() const { return name_; }
  B &backend() { return b_; }
  bool has(std::string_view n) const { return find(n) != nullptr; }
  /* a tensor argument as the kernels read it (take); undefined for None or absent */
  Tensor in(const char *n, bool = false) const {
    Tensor t = raw(n);
    return t.defined() ? take(op(), t, n) : t;
  }
  /* an argument written in place (out=, the in-place ops' inputs), taken as it is */
  Tensor target(const char *n) const {
    Tensor t = raw(n);
    return t.defined() ? take_out(op(), t, n) : t;
  }
  Tensor raw(const char *n) const {  // as given (the autograd kernels' view)
    const c10::IValue *v = find(n);
    return !v || v->isNone() ? Tensor() : v->toTensor();
  }
  bool inplace() const {
    for (const c10::Argument &a : args_)
      if (a.alias_info() && a.alias_info()->isWrite()) return true;
    return false;
  }
  bool want_stats() const {
    for (const c10::Argument &r : schema_.returns())
      if (r.name() == "rstd") return true;
    return false;
  }
  bool flag(const char *n) const {
    const c10::IValue *v = find(n);
    return v && v->toBool();
  }
  std::optional<double> real(const char *n) const {
    const c10::IValue *v = find(n);
    return v ? v->toOptional<double>() : std::nullopt;
  }
  OptDouble eps() const { return real("eps"); }
  double partial() const { return real("partial").value_or(1.0); }
  int64_t integer(const char *n) const { return find(n)->toInt(); }
  std::string text(const char *n) const { return find(n)->toStringRef(); }
  int64_t k() const {  // the normalized dims (QK-norm: the last)
    const c10::IValue *v = find("normalized_shape");
    return v ? static_cast<int64_t>(v->toSymIntVector().size()) : 1;
  }
  Dims norm() {
    norm_.clear();
    for (const c10::SymInt &d : find("normalized_shape")->toSymIntVector())
      norm_.push_back(d.guard_int(__FILE__, __LINE__));
    return Dims(norm_);
  }
  bool mask(std::size_t k) const {
    const c10::IValue *v = find("output_mask");
    return !v || v->toBoolList().get(k);
  }
  /* Replaces the arguments with the outputs the op returns. */
  void ret(std::initializer_list<Tensor> outs) {
    s_.erase(s_.begin() + static_cast<std::ptrdiff_t>(base_), s_.end());
    std::size_t n = std::min(outs.size(), schema_.returns().size());
    s_.insert(s_.end(), outs.begin(), outs.begin() + static_cast<std::ptrdiff_t>(n));
  }

 private:
  const c10::IValue *find(std::string_view n) const {  // the argument named n, or null
    for (std::size_t i = 0; i < args_.size(); i++)
      if (args_[i].name() == n) return &s_[base_ + i];
    return nullptr;
  }
  const c10::FunctionSchema &schema_;
  const std::vector<c10::Argument> &args_;
  torch::jit::Stack &s_;
  std::size_t base_;
  const char *name_;
  B b_;
  std::vector<int64_t> norm_;
};

/* "name.overload" of a schema "name.overload(...) -> ...". */
std::string name_of(const char *schema) {
  std::string s(schema);
  return s.substr(0, s.find('('));
}

/* The CPU kernel of one op: core.hpp's, core errors turned into torch's exceptions. */
struct CpuKernel final : c10::OperatorKernel {
  CpuKernel(void (*k)(Args &), const char *schema) : kernel(k), name(name_of(schema)) {}
  void operator()(const c10::OperatorHandle &op, c10::DispatchKeySet, torch::jit::Stack *s) {
    Args a(op, s, name.c_str());
    guarded(a.op(), [&] { kernel(a); });
  }
  void (*kernel)(Args &);
  std::string name;
};

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

bool grad_needed(const std::vector<Tensor> &ts) {
  return c10::GradMode::is_enabled() && std::any_of(ts.begin(), ts.end(), [](const Tensor &t) {
           return t.defined() && t.requires_grad();
         });
}

using Guard = at::AutoDispatchBelowADInplaceOrView;
using torch::autograd::Node;
using torch::autograd::SavedVariable;

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

/* Refuses tensors on different devices (a meta weight among CPU tensors), as torch's own
 * ops and the fake kernels do, for the paths that reach neither: the backward ops'
 * compositions in aten ops, which could leave an argument unread. */
void same_device(const c10::OperatorHandle &op, const torch::jit::Stack &s) {
  const auto &args = op.schema().arguments();
  const Tensor *first = nullptr;
  std::size_t at = 0;
  for (std::size_t i = 0, base = s.size() - args.size(); i < args.size(); i++) {
    if (!s[base + i].isTensor()) continue;
    const Tensor &t = s[base + i].toTensor();
    if (!first) {
      first = &t, at = i;
    } else if (t.device() != first->device()) {
      std::string dev = t.device().str(), ref = first->device().str();
      TORCH_CHECK(false, op_name(op), ": ", rncore::message("same_device", {
          {"device", dev}, {"what", args[i].name()}, {"ref_device", ref},
          {"ref", args[at].name()}}));
    }
  }
}

/* ---- autograd: forward-mode tangents of the differentiable ops (ops.def's DIFF rows) ---- */

using Outs = std::vector<Tensor>;

void norm_jvp(const Args &a, const Outs &o, rncore::Norm kind) {
  Tensor x = a.raw("input"), w = a.raw("weight"), b = a.raw("bias");
  if (any_tangent({&x, &w, &b}))
    norm_tangent(o[0], kind, x, tangent(x), a.k(), w, b, a.eps(), a.flag("offset"),
                 a.flag("eps_outside"), a.partial());
}

void rms_norm_jvp(const Args &a, const Outs &o) { norm_jvp(a, o, rncore::RMS); }
void layer_norm_jvp(const Args &a, const Outs &o) { norm_jvp(a, o, rncore::LAYER); }
void qk_norm_jvp(const Args &a, const Outs &o) { norm_jvp(a, o, rncore::RMS); }

/* Residual add + RMSNorm: h = input + residual has the tangent th = t_input + t_residual, and
 * the norm's input is h. */
void fused_add_rms_norm_jvp(const Args &a, const Outs &o) {
  Tensor x = a.raw("input"), r = a.raw("residual"), w = a.raw("weight"), b = a.raw("bias");
  if (!any_tangent({&x, &r, &w, &b})) return;
  Tensor ti = tangent(x), tr = tangent(r), h = o[1];
  Tensor th = ti.defined() && tr.defined() ? ti + tr : ti.defined() ? ti : tr;
  if (th.defined()) th = th.to(h.scalar_type());
  norm_tangent(o[0], rncore::RMS, h, th, a.k(), w, b, a.eps(), a.flag("offset"),
               a.flag("eps_outside"), a.partial());
  if (th.defined()) h._set_fw_grad(th, 0, false);
}

/* Residual add + RMSNorm into a quantized format: only new_residual = input + residual has a
 * tangent, t_input + t_residual. */
void fused_add_rms_norm_quant_jvp(const Args &a, const Outs &o) {
  Tensor x = a.raw("input"), r = a.raw("residual");
  if (!any_tangent({&x, &r})) return;
  Tensor ti = tangent(x), tr = tangent(r);
  Tensor th = ti.defined() && tr.defined() ? ti + tr : ti.defined() ? ti : tr;
  set_tangent(o[2], th.to(o[2].scalar_type()));
}

/* RMSNorm + linear: z = (xhat * G) W + bias, G = g (or 1 + g). Its tangent is
 * dz = dY W + Y tW + tbias with Y = xhat * G and dY = dxhat * G + xhat * tg. */
void rms_norm_linear_jvp(const Args &a, const Outs &o) {
  Tensor input = a.raw("input"), w = a.raw("weight_matrix"), g = a.raw("norm_weight");
  Tensor b = a.raw("bias"), z = o[0];
  if (!any_tangent({&input, &w, &g, &b})) return;
  bool offset = a.flag("offset");
  Tensor xp = primal(input), wp = primal(w), gp = primal(g);
  at::ScalarType t = opmath(xp);
  auto [xhat, dxhat] = xhat_tangent(rncore::RMS, xp, tangent(input), 1, eps_value(a.eps(), xp),
                                    a.flag("eps_outside"), a.partial());
  Tensor Y = gp.defined() ? xhat * (offset ? gp.to(t) + 1 : gp.to(t)) : xhat;  // (rows, d)
  Tensor dY = affine_tangent(xhat, dxhat, gp, tangent(g), Tensor(), offset);
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

/* ---- gated RMSNorm and sandwich norms in aten ops ------------------------------------------
 * Gated RMSNorm of a row x (d elements) with gate z, a = act(z), over groups of g columns:
 *   gate first: v = x a,  y = vhat W        norm first: v = x,  y = vhat W a
 * with vhat = v r, r = (mean over v's group of v^2 + eps)^(-1/2), W = w (or 1 + w, or 1).
 * act: silu a = z s (s = sigmoid(z)), a' = s (1 + z (1 - s)); sigmoid a = s, a' = s (1 - s).
 * Backward (upstream dy), per group, with gv the gradient reaching vhat (dy W, times a when
 * norm first): dv = r (gv - vhat mean(gv vhat)) (RMSNorm's dx), then
 *   gate first: dx = dv a,  dz = dv x a';   norm first: dx = dv,  dz = dy vhat W a'
 *   dW = sum over rows of dy vhat (times a when norm first).
 * Forward mode, for tangents tx, tz, tw (ta = a' tz; tv = tx a + x ta gate first, tx norm
 * first; s = mean over the group of v tv, so dr = -r^3 s):
 *   dvhat = tv r + v dr,   dy = dvhat W P + vhat tW P + vhat W tP,  P = a (norm first) or 1.
 * Rounding is taken as the identity, as in the library's backward. */

/* The rows of a gated norm in the compute type, x's shape kept (leading dims may be
 * symbolic); r has shape (*, groups, 1). */
struct GatedRows {
  Tensor x, z, a, da;  // a = act(z), da = act'(z)
  Tensor v, r, vhat;
  int64_t groups = 1, group = 0;
  bool norm_first = false;
};

GatedRows gated_rows(const Args &p, const Tensor &x, const Tensor &z) {
  GatedRows n;
  at::ScalarType t = opmath(x);
  int64_t d = x.size(-1), gs = p.integer("group_size");
  n.group = gs ? gs : d;
  n.groups = n.group ? d / n.group : 1;
  n.norm_first = p.flag("norm_before_gate");
  n.x = x.to(t);
  n.z = z.to(t);
  Tensor s = n.z.sigmoid();
  if (p.text("activation") == "sigmoid") {
    n.a = s;
    n.da = s * (1 - s);
  } else {
    n.a = n.z * s;
    n.da = s * (1 + n.z * (1 - s));
  }
  n.v = n.norm_first ? n.x : n.x * n.a;
  Tensor vg = n.v.unflatten(-1, {n.groups, n.group});
  n.r = (vg.square().mean(-1, true) + eps_value(p.eps(), x)).rsqrt();
  n.vhat = (vg * n.r).flatten(-2);
  return n;
}

/* W as the rows multiply by it: w, 1 + w, or undefined for none. */
Tensor gain(const Tensor &w, at::ScalarType t, bool offset) {
  if (!w.defined()) return w;
  return offset ? w.to(t) + 1 : w.to(t);
}

Tensor times(const Tensor &v, const Tensor &f) { return f.defined() ? v * f : v; }

/* RMSNorm's dx per group: r (g - vhat mean(g vhat)), for the gradient g reaching vhat. */
Tensor group_dx(const GatedRows &n, const Tensor &g) {
  Tensor gg = g.unflatten(-1, {n.groups, n.group}), vh = n.vhat.unflatten(-1, {n.groups, n.group});
  return (n.r * (gg - vh * (gg * vh).mean(-1, true))).flatten(-2);
}

void gated_rms_norm_jvp(const Args &a, const Outs &o) {
  Tensor x = a.raw("input"), z = a.raw("gate"), w = a.raw("weight");
  if (!any_tangent({&x, &z, &w})) return;
  Tensor xp = primal(x), zp = primal(z), wp = primal(w);
  at::ScalarType t = opmath(xp);
  GatedRows n = gated_rows(a, xp, zp);
  Tensor tx = has_tangent(x) ? tangent(x).to(t) : Tensor();
  Tensor ta = has_tangent(z) ? tangent(z).to(t) * n.da : Tensor();
  Tensor W = gain(wp, t, a.flag("offset")), P = n.norm_first ? n.a : Tensor();
  Tensor dy;
  auto add = [&](Tensor v) { dy = dy.defined() ? dy + v : v; };
  Tensor tv;  // the tangent of v
  if (n.norm_first) tv = tx;
  else if (tx.defined()) tv = ta.defined() ? tx * n.a + n.x * ta : tx * n.a;
  else if (ta.defined()) tv = n.x * ta;
  if (tv.defined()) {
    Tensor vg = n.v.unflatten(-1, {n.groups, n.group}), tg = tv.unflatten(-1, {n.groups, n.group});
    Tensor dr = -n.r.pow(3) * (vg * tg).mean(-1, true);
    add(times(times((tg * n.r + vg * dr).flatten(-2), W), P));
  }
  if (has_tangent(w)) add(times(n.vhat * tangent(w).to(t), P));
  if (n.norm_first && ta.defined()) add(times(n.vhat, W) * ta);
  set_tangent(o[0], dy);
}

/* Sandwich: h' = h + post(a), x' = pre(h'). The tangent of h' is th + the post norm's
 * tangent at a; x' has the pre norm's tangent at h' for it. */
void sandwich_rms_norm_jvp(const Args &a, const Outs &o) {
  Tensor u = a.raw("input"), h = a.raw("residual"), wpost = a.raw("post_weight");
  Tensor wpre = a.raw("pre_weight");
  if (!any_tangent({&u, &h, &wpost, &wpre})) return;
  bool offset = a.flag("offset"), eps_outside = a.flag("eps_outside");
  Tensor hn = o[1], up = primal(u);
  double eps = eps_value(a.eps(), up);
  Tensor th;
  if (has_tangent(u) || has_tangent(wpost)) {
    auto [uhat, duhat] = xhat_tangent(rncore::RMS, up, tangent(u), a.k(), eps, eps_outside,
                                      a.partial());
    th = affine_tangent(uhat, duhat, primal(wpost), tangent(wpost), Tensor(), offset);
    th = th.defined() ? th.reshape_symint(hn.sym_sizes()) : th;
  }
  if (has_tangent(h)) th = th.defined() ? th + tangent(h).to(th.scalar_type()) : tangent(h);
  if (th.defined()) th = th.to(hn.scalar_type());
  norm_tangent(o[0], rncore::RMS, hn, th, a.k(), wpre, Tensor(), a.eps(), offset, eps_outside,
               a.partial());
  if (th.defined()) hn._set_fw_grad(th, 0, false);
}

/* ---- QK-norm + RoPE in aten ops ------------------------------------------------------------
 * Row (t, h) of head_dim D: n = xhat W (RMSNorm with its gain; across heads, the RMSNorm of
 * the token's heads * D values with a gain of as many), y = R_t n, where R_t rotates
 * each pair (a, b) of the first rotary_dim columns by the angle of token t's table row
 * (c, s its cos and sin) and passes the rest:
 *   y_a = a c - b s,   y_b = b c + a s.
 * R_t does not depend on x and is orthogonal, so the backward is RMSNorm's with
 * dn = R_t^T dy (the rotation by -angle) for dy, and dW = sum over rows of dn xhat; the
 * forward-mode tangent is R_t dn, dn the norm's tangent. The table is a constant. Rounding
 * is taken as the identity, as in the library's backward. */

/* x (*, heads, D) as (tokens, heads, D). */
Tensor token_rows(const Tensor &x) {
  return x.dim() == 2 ? x.unsqueeze(0) : x.flatten(0, x.dim() - 3);
}

/* The rotation of the rows of v (tokens, heads, D): each token's cos and sin as
 * (tokens, 1, rotary_dim/2), in v's compute type. */
struct Rotation {
  Tensor cos, sin;
  int64_t rot = 0, half = 0;
  bool gptj = false;
};

Rotation rotation_of(const Args &a, const Tensor &v) {
  Rotation r;
  int64_t d = v.size(-1), rot = a.integer("rotary_dim");
  r.rot = rot ? rot : d;
  r.half = r.rot / 2;
  r.gptj = a.text("style") == "gptj";
  Tensor table = primal(a.raw("cos_sin")), pos = a.raw("positions");
  if (pos.defined()) {  // broadcast over the leading dims (x's but its last two), as the op
    c10::SymIntArrayRef xs = a.raw("input").sym_sizes();
    if (pos.sym_numel() != v.sym_size(0)) pos = pos.expand_symint(xs.slice(0, xs.size() - 2));
  }
  // index_select takes int32/int64 indices only; the op takes any integer dtype
  Tensor cs = pos.defined() ? table.index_select(0, pos.reshape(-1).to(at::kLong))
                            : table.narrow_symint(0, 0, v.sym_size(0));
  cs = cs.to(opmath(v)).unsqueeze(1);
  r.cos = cs.narrow(-1, 0, r.half);
  r.sin = cs.narrow(-1, r.half, r.half);
  return r;
}

/* R_t v, or R_t^T v (`transpose`), for v (tokens, heads, D). */
Tensor rotate(const Rotation &r, const Tensor &v, bool transpose) {
  Tensor s = transpose ? -r.sin : r.sin, a, b;
  if (r.gptj) {
    Tensor pairs = v.narrow(-1, 0, r.rot).unflatten(-1, {r.half, 2});
    a = pairs.select(-1, 0);
    b = pairs.select(-1, 1);
  } else {
    a = v.narrow(-1, 0, r.half);
    b = v.narrow(-1, r.half, r.half);
  }
  Tensor ya = a * r.cos - b * s, yb = b * r.cos + a * s;
  Tensor y = r.gptj ? at::stack({ya, yb}, -1).flatten(-2) : at::cat({ya, yb}, -1);
  int64_t d = v.size(-1);
  return r.rot == d ? y : at::cat({y, v.narrow(-1, r.rot, d - r.rot)}, -1);
}

/* The norm's dims: head_dim, or across heads (one statistic per token) heads and head_dim. */
int64_t rope_norm_dims(const Args &a) { return a.flag("across_heads") ? 2 : 1; }

void qk_norm_rope_jvp(const Args &a, const Outs &o) {
  Tensor x = a.raw("input"), w = a.raw("weight");
  if (!any_tangent({&x, &w})) return;
  Tensor xp = primal(x);
  auto [xhat, dxhat] = xhat_tangent(rncore::RMS, xp, tangent(x), rope_norm_dims(a),
                                    eps_value(a.eps(), xp), false, 1.0);
  Tensor dn = affine_tangent(xhat, dxhat, primal(w), tangent(w), Tensor(), a.flag("offset"));
  Tensor rows = token_rows(dn.reshape_symint(xp.sym_sizes()));
  set_tangent(o[0], rotate(rotation_of(a, rows), rows, false));
}

/* ---- autograd: reverse mode of the differentiable ops --------------------------------------
 * Each records a Node of its own, as torch's generated kernels do (not a
 * torch::autograd::Function, which functorch transforms refuse). Its next edges are the op's
 * tensor arguments in schema order (an absent weight or bias keeps an empty slot); its apply
 * calls rmsnorm::<kernel>_backward through the dispatcher, each argument of that op taken by
 * name: grad_* (its leading ones) from the gradients of the op's outputs, output_mask from
 * the edges that need a gradient, the others from the op's saved arguments and outputs. */

/* Where an argument of the backward op comes from: the gradient of the op's output i
 * (None where optional and no gradient came, else zeros), the output mask, the op's
 * argument i (a tensor one saved as a SavedVariable) or the op's output i (saved). */
struct Source {
  enum Kind { GRAD, MASK, ARG, OUT } kind;
  std::size_t i = 0;
  bool tensor = false;  // ARG: a tensor; GRAD: optional
};

struct DiffKernel;

struct OpNode final : Node {
  const DiffKernel *k = nullptr;
  std::vector<c10::IValue> values;   // by backward argument: the op's non-tensor arguments
  std::vector<SavedVariable> saved;  // by backward argument: saved tensors
  std::string name() const override;
  torch::autograd::variable_list apply(torch::autograd::variable_list &&grads) override;
  void release_variables() override {
    for (SavedVariable &v : saved) v.reset_data();
  }
};

/* A differentiable op's Autograd kernel. When autograd has no work (eager inference, the
 * common case) the op runs below autograd on the caller's stack as it is. Otherwise it runs
 * through the op that also returns the statistics the backward takes (rms_norm_forward for
 * rms_norm), records the Node and gives the outputs their tangents (Jvp). */
struct DiffKernel final : c10::OperatorKernel {
  using Jvp = void (*)(const Args &, const Outs &);
  DiffKernel(const char *schema, const char *kernel_, Jvp jvp_)
      : name(name_of(schema)), kernel(kernel_), jvp(jvp_) {}
  void operator()(const c10::OperatorHandle &op, c10::DispatchKeySet, torch::jit::Stack *s);
  void resolve(const c10::OperatorHandle &op);

  std::string name, kernel;
  Jvp jvp;
  std::once_flag once;
  std::optional<c10::OperatorHandle> record, bwd;
  std::vector<long> edge_of;  // by argument of the op: its edge, -1 for a non-tensor
  std::size_t ngrad = 0;      // the leading grad_* arguments of bwd: the differentiable outputs
  std::vector<std::size_t> grad_out;  // by grad_* argument: the output it is the gradient of
  std::vector<Source> src;    // by argument of bwd
  std::vector<std::vector<std::size_t>> edges;  // by output of bwd: the edges it is the gradient of
  std::vector<std::size_t> constants;  // the tensor arguments no output of bwd is the gradient of
};

template <class V>
long index_of(const V &list, std::string_view name) {
  for (std::size_t i = 0; i < list.size(); i++)
    if (list[i].name() == name) return static_cast<long>(i);
  return -1;
}

bool optional(const c10::Argument &a) {
  return a.real_type()->kind() == c10::TypeKind::OptionalType;
}

void DiffKernel::resolve(const c10::OperatorHandle &op) {
  auto &d = c10::Dispatcher::singleton();
  bwd = d.findSchemaOrThrow(("rmsnorm::" + kernel + "_backward").c_str(), "");
  auto with_stats = d.findSchema({"rmsnorm::" + name + "_forward", ""});
  record = op.schema().returns().size() == 1 && with_stats ? *with_stats : op;
  const auto &args = op.schema().arguments();
  long ne = 0;
  for (const c10::Argument &a : args) {
    auto t = optional(a) ? a.real_type()->expectRef<c10::OptionalType>().getElementType()
                         : a.real_type();
    edge_of.push_back(t->kind() == c10::TypeKind::TensorType ? ne++ : -1);
  }
  for (const c10::Argument &a : bwd->schema().arguments()) {
    const std::string &n = a.name();
    long i = index_of(args, n), o = index_of(record->schema().returns(), n);
    if (ngrad == src.size() && n.rfind("grad_", 0) == 0) {
      // grad_<an output's name> is that output's (the others have none); else the output at
      // its position
      long named = index_of(record->schema().returns(), n.substr(5));
      grad_out.push_back(named >= 0 ? std::size_t(named) : ngrad);
      src.push_back({Source::GRAD, ngrad++, optional(a)});
    }
    else if (n == "output_mask") src.push_back({Source::MASK});
    else if (i >= 0) src.push_back({Source::ARG, std::size_t(i), edge_of[std::size_t(i)] >= 0});
    else if (o >= 0) src.push_back({Source::OUT, std::size_t(o)});
    else TORCH_INTERNAL_ASSERT(false, "rmsnorm::", kernel, "_backward: no source for ", n);
  }
  // grad_<argument>: that argument's edge; grad: the edges no other output names
  std::vector<bool> named(static_cast<std::size_t>(ne));
  for (const c10::Argument &r : bwd->schema().returns()) {
    long i = r.name().rfind("grad_", 0) == 0 ? index_of(args, r.name().substr(5)) : -1;
    edges.emplace_back();
    if (i >= 0) edges.back().push_back(std::size_t(edge_of[std::size_t(i)]));
    if (i >= 0) named[std::size_t(edge_of[std::size_t(i)])] = true;
  }
  bool grad_rest = false;
  for (std::size_t r = 0; r < edges.size(); r++)
    for (std::size_t e = 0; bwd->schema().returns()[r].name() == "grad" && e < named.size(); e++)
      if (!named[e]) edges[r].push_back(e), grad_rest = true;
  for (std::size_t i = 0; i < args.size() && !grad_rest; i++)
    if (edge_of[i] >= 0 && !named[std::size_t(edge_of[i])]) constants.push_back(i);
}

void DiffKernel::operator()(const c10::OperatorHandle &op, c10::DispatchKeySet,
                            torch::jit::Stack *s) {
  if (!autograd_needed(op, *s)) {
    Guard guard;
    op.callBoxed(s);
    return;
  }
  std::call_once(once, [&] { resolve(op); });
  const auto n = std::ptrdiff_t(op.schema().arguments().size());
  const auto m = std::ptrdiff_t(record->schema().returns().size());
  torch::jit::Stack args(s->end() - n, s->end());
  for (std::size_t i : constants) {  // (qk_norm_rope's cos_sin): refused rather than ignored
    const c10::IValue &v = args[i];
    bool needs = v.isTensor() && ((c10::GradMode::is_enabled() && v.toTensor().requires_grad()) ||
                                  has_tangent(v.toTensor()));
    TORCH_CHECK_VALUE(!needs, "rmsnorm::", name, ": no gradient flows to ",
                      op.schema().arguments()[i].name(), ", which the op takes as a constant; "
                      "pass it detached (.detach()) and without a forward-mode tangent");
  }
  auto tensor = [&](std::size_t i) { return args[i].isTensor() ? args[i].toTensor() : Tensor(); };
  std::vector<Tensor> ins;  // the tensor arguments: the node's next edges
  torch::autograd::edge_list next;
  for (std::size_t i = 0; i < args.size(); i++)
    if (edge_of[i] >= 0) ins.push_back(tensor(i));
  for (const Tensor &t : ins)
    next.push_back(t.defined() ? torch::autograd::impl::gradient_edge(t) : torch::autograd::Edge());
  Ptr<OpNode> node = grad_needed(ins) ? make_node<OpNode>(std::move(next)) : Ptr<OpNode>();
  {
    Guard guard;
    record->callBoxed(s);
  }
  Outs outs;  // then only those the op itself returns stay on the stack
  for (auto it = s->end() - m; it != s->end(); ++it) outs.push_back(it->toTensor());
  s->erase(s->end() - (m - std::ptrdiff_t(op.schema().returns().size())), s->end());
  if (node) {
    std::vector<Tensor> diff;
    for (std::size_t o : grad_out) diff.push_back(outs[o]);
    torch::autograd::set_history(diff, node);
  }
  jvp(Args(op, &args, name.c_str()), outs);
  if (!node) return;
  // after the tangents, so that an output is saved with its own (forward over reverse)
  node->k = this;
  node->values.resize(src.size());
  node->saved.resize(src.size());
  for (std::size_t j = 0; j < src.size(); j++) {
    const Source &f = src[j];
    if (f.kind == Source::ARG && !f.tensor) node->values[j] = args[f.i];
    else if (f.kind == Source::ARG) node->saved[j] = SavedVariable(tensor(f.i), false);
    else if (f.kind == Source::OUT) node->saved[j] = SavedVariable(outs[f.i], true);
  }
}

/* "RmsNormBackward" for the kernel rms_norm. */
std::string OpNode::name() const {
  std::string out;
  for (std::size_t i = 0; i < k->kernel.size(); i++)
    if (k->kernel[i] != '_')
      out += i == 0 || k->kernel[i - 1] == '_' ? char(std::toupper(k->kernel[i])) : k->kernel[i];
  return out + "Backward";
}

torch::autograd::variable_list OpNode::apply(torch::autograd::variable_list &&grads) {
  torch::autograd::variable_list out(num_outputs());
  if (std::none_of(grads.begin(), grads.end(), [](const Tensor &g) { return g.defined(); }))
    return out;
  torch::jit::Stack st;
  for (std::size_t j = 0; j < k->src.size(); j++) {
    const Source &f = k->src[j];
    if (f.kind == Source::GRAD && grads[f.i].defined()) {
      st.emplace_back(grads[f.i]);
    } else if (f.kind == Source::GRAD) {
      st.push_back(f.tensor ? c10::IValue() : c10::IValue(input_metadata(f.i).zeros_like()));
    } else if (f.kind == Source::MASK) {
      c10::List<bool> mask;
      for (const auto &es : k->edges)
        mask.push_back(std::any_of(es.begin(), es.end(), [&](std::size_t e) {
          return task_should_compute_output(e);
        }));
      st.emplace_back(std::move(mask));
    } else if (f.kind == Source::ARG && !f.tensor) {
      st.push_back(values[j]);
    } else {
      Tensor t = saved[j].unpack(getptr());
      st.push_back(t.defined() ? c10::IValue(t) : c10::IValue());
    }
  }
  k->bwd->callBoxed(st);
  for (std::size_t r = 0; r < k->edges.size(); r++) {
    bool given = false;  // one gradient for several edges: the same values, not one tensor
    for (std::size_t e : k->edges[r])
      if (st[r].isTensor() && task_should_compute_output(e))
        out[e] = std::exchange(given, true) ? st[r].toTensor().clone() : st[r].toTensor();
  }
  return out;
}

/* A backward op's Autograd kernel: the op below autograd (the library's backward) when
 * autograd has no work; else (create_graph=True, forward-over-reverse) its formula in aten
 * ops, the op's composite, which autograd records and can differentiate again. */
struct BackwardKernel final : c10::OperatorKernel {
  BackwardKernel(void (*k)(Args &), const char *schema) : composite(k), name(name_of(schema)) {}
  void operator()(const c10::OperatorHandle &op, c10::DispatchKeySet, torch::jit::Stack *s) {
    if (!autograd_needed(op, *s)) {
      Guard guard;
      return op.callBoxed(s);
    }
    same_device(op, *s);
    Args a(op, s, name.c_str());
    composite(a);
  }
  void (*composite)(Args &);
  std::string name;
};

/* The composite backward of a norm over x's last k dims (QK-norm: its last), plus the
 * gradient that passes the residual add by (fused add). */
void norm_composite(Args &a, rncore::Norm kind, const char *x_name) {
  Tensor x = a.raw(x_name), r = a.raw("grad_residual");
  auto [dx, dw, db] = backward_composite(
      kind, a.raw("grad_output"), x, a.k(), a.raw("weight"), a.raw("bias"), eps_value(a.eps(), x),
      a.flag("offset"), a.flag("eps_outside"), a.partial(), {a.mask(0), a.mask(1), a.mask(2)});
  a.ret({dx.defined() && r.defined() ? dx + r : dx, dw, db});
}

void rms_norm_backward_composite(Args &a) { norm_composite(a, rncore::RMS, "input"); }
void layer_norm_backward_composite(Args &a) { norm_composite(a, rncore::LAYER, "input"); }
void qk_norm_backward_composite(Args &a) { norm_composite(a, rncore::RMS, "input"); }
void fused_add_rms_norm_backward_composite(Args &a) {
  norm_composite(a, rncore::RMS, "new_residual");
}

/* new_residual's gradient, for input and residual alike. */
void fused_add_rms_norm_quant_backward_composite(Args &a) {
  a.ret({a.raw("grad_new_residual") * 1, Tensor(), Tensor()});
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

/* The gated norm's gradients (formulas above GatedRows), each only when asked for. */
void gated_rms_norm_backward_composite(Args &a) {
  Tensor dy = a.raw("grad_output"), x = a.raw("input"), z = a.raw("gate"), w = a.raw("weight");
  at::ScalarType t = opmath(x);
  GatedRows n = gated_rows(a, x, z);
  Tensor g = dy.to(t), W = gain(w, t, a.flag("offset"));
  Tensor P = n.norm_first ? n.a : Tensor();
  Tensor dx, dz, dw;
  if (a.mask(0) || (a.mask(1) && !n.norm_first)) {
    Tensor dv = group_dx(n, times(times(g, W), P));
    if (a.mask(0)) dx = (n.norm_first ? dv : dv * n.a).to(x.scalar_type());
    if (a.mask(1) && !n.norm_first) dz = (dv * n.x * n.da).to(z.scalar_type());
  }
  if (a.mask(1) && n.norm_first) dz = (times(g * n.vhat, W) * n.da).to(z.scalar_type());
  if (a.mask(2) && w.defined())
    dw = times(g * n.vhat, P).reshape({-1, x.size(-1)}).sum(0).to(w.scalar_type());
  a.ret({dx, dz, dw});
}

/* Sandwich: dt = dres + pre_norm's dx at h' (the residual's gradient), da = post_norm's dx
 * at a from dt; the weights' gradients from the same two backwards. */
void sandwich_rms_norm_backward_composite(Args &a) {
  Tensor u = a.raw("input"), hn = a.raw("new_residual"), dres = a.raw("grad_new_residual");
  bool offset = a.flag("offset"), eps_outside = a.flag("eps_outside");
  double eps = eps_value(a.eps(), hn);
  bool want_dt = a.mask(0) || a.mask(1) || a.mask(2);
  auto [dx, dwpre, no_bias] = backward_composite(
      rncore::RMS, a.raw("grad_output"), hn, a.k(), a.raw("pre_weight"), Tensor(), eps, offset,
      eps_outside, a.partial(), {want_dt, a.mask(3), false});
  Tensor dt = dx.defined() && dres.defined() ? dx + dres : dx;
  Tensor da, dwpost;
  if (a.mask(0) || a.mask(2))
    std::tie(da, dwpost, std::ignore) = backward_composite(
        rncore::RMS, dt, u, a.k(), a.raw("post_weight"), Tensor(), eps, offset, eps_outside,
        a.partial(), {a.mask(0), a.mask(2), false});
  a.ret({da, a.mask(1) ? dt : Tensor(), dwpost, dwpre});
}

/* QK-norm + RoPE: the norm's gradients for dn = R^T dy (formulas above Rotation). */
void qk_norm_rope_backward_composite(Args &a) {
  Tensor x = a.raw("input"), w = a.raw("weight");
  Tensor dy = token_rows(a.raw("grad_output").to(opmath(x)));
  Tensor dn = rotate(rotation_of(a, dy), dy, true).reshape_symint(x.sym_sizes());
  auto [dx, dw, no_bias] = backward_composite(
      rncore::RMS, dn, x, rope_norm_dims(a), w, Tensor(), eps_value(a.eps(), x),
      a.flag("offset"), false, 1.0, {a.mask(0), a.mask(1), false});
  if (dw.defined()) dw = dw.reshape_symint(w.sym_sizes());  // across heads: (heads * D,)
  a.ret({dx, dw});
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
    if (args[i].alias_info() && args[i].alias_info()->isWrite() && !(*s)[base + i].isNone())
      written.push_back((*s)[base + i].toTensor());  // (an optional one may be absent)
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

/* The CPU kernels, also for tensors of other devices, sparse and quantized ones: their first
 * step (take) refuses those with a TypeError naming the op. */
void cpu_kernels(torch::Library &m) {
#define RN_OP(id, kind, kernel, schema)                          \
  m.impl(name_of(schema).c_str(), torch::CppFunction::makeFromBoxedFunctor( \
      std::make_unique<CpuKernel>(&rncore::kernels::kernel<Args>, schema)));
#define RN_FN(...)
#include "ops.def"
#undef RN_OP
}

}  // namespace
}  // namespace rnops

/* ---- registration (the rows of ops.def) --------------------------------------------------- */

#define RN_AUTOGRAD_DIFF(id, kernel, schema) \
  torch::CppFunction::makeFromBoxedFunctor(  \
      std::make_unique<rnops::DiffKernel>(schema, #kernel, &rnops::kernel##_jvp))
#define RN_AUTOGRAD_BACKWARD(id, kernel, schema) \
  torch::CppFunction::makeFromBoxedFunctor(      \
      std::make_unique<rnops::BackwardKernel>(&rnops::id##_composite, schema))
#define RN_AUTOGRAD_INPLACE(id, kernel, schema) \
  torch::CppFunction::makeFromBoxedFunction<&rnops::inplace_autograd>()
#define RN_AUTOGRAD_NOGRAD(id, kernel, schema) \
  torch::CppFunction::makeFromBoxedFunction<&rnops::nograd>()

TORCH_LIBRARY(rmsnorm, m) {
  // The fake kernels and this library's Python side live there (imported when an op is
  // first traced).
  m.set_python_module("rmsnorm._torch_fake");
#define RN_OP(id, kind, kernel, schema) m.def(schema);
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
#define RN_OP(id, kind, kernel, schema) \
  m.impl(rnops::name_of(schema).c_str(), RN_AUTOGRAD_##kind(id, kernel, schema));
#include "ops.def"
#undef RN_OP
}

TORCH_LIBRARY_IMPL(rmsnorm, ADInplaceOrView, m) {  // the INPLACE rows
#define RN_OP(id, kind, kernel, schema)                                  \
  if (std::string_view(#kind) == "INPLACE")                              \
    m.impl(rnops::name_of(schema).c_str(),                               \
           torch::CppFunction::makeFromBoxedFunction<&rnops::inplace_or_view>());
#include "ops.def"
#undef RN_OP
}
