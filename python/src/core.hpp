/* core.hpp - every operation of the Python package written once, for numpy
 * arrays (numpy_module.cpp) and torch tensors (torch_ops.cpp) alike: argument
 * checks with their messages, viewing an array as `rows x d` at a row stride
 * (or copying it when no such view exists), parameter dtypes, output
 * allocation, and the call into librmsnorm.
 *
 * A front end supplies a backend B (a class with these members):
 *   using Array;                  an owning handle; a default one is "none"
 *   static bool defined(const Array&);
 *   static int dtype(const Array&);         rmsnorm_dtype, or -1 for others
 *   static std::string dtype_name(const Array&);
 *   static Dims shape(const Array&);
 *   static bool is_contiguous(const Array&); C-contiguous
 *   bool strides(const Array&, Dims*);     in elements; false: not whole ones
 *   static void *ptr(const Array&);
 *   Array contiguous(const Array&);         a C-contiguous copy (or itself)
 *   Array cast(const Array&, int dtype);    a new contiguous array
 *   Array empty(Dims, int dtype);           new, contiguous
 *   Array full(Dims, int dtype, double);
 *   Array empty_quant(Dims, int qtype);     int8 or float8_e4m3fn
 *   Array scalar_f32(float);                a 0-d float32 array
 *   void writable(const Array&, const char *what);  refuse an output that
 *                                           cannot be written where it is
 *   rmsnorm_context *context();             the calling thread's context
 *   Unlock unlocked(std::size_t elements);  a guard held around library
 *                                           calls (the GIL for numpy)
 * Errors are thrown as rncore::Error; each front end turns them into its own
 * exceptions. Nothing is written before every check has passed. */
#ifndef RMSNORM_PY_CORE_HPP
#define RMSNORM_PY_CORE_HPP

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <rmsnorm.h>

namespace rncore {

using Dims = std::span<const int64_t>;
using Shape = std::vector<int64_t>;

/* ---- errors --------------------------------------------------------------- */

enum class Kind { Value, Type, Memory, NotAvailable };

struct Error {
  Kind kind;
  std::string message;
  int status;  // the rmsnorm_status, or -1 for a check made here
};

[[noreturn]] inline void fail(Kind kind, std::string message) {
  throw Error{kind, std::move(message), -1};
}
[[noreturn]] inline void value_error(std::string m) { fail(Kind::Value, std::move(m)); }
[[noreturn]] inline void type_error(std::string m) { fail(Kind::Type, std::move(m)); }

/* Throws for a status other than RMSNORM_OK: "fn: message (NAME)". */
inline void check(rmsnorm_status st, const char *fn) {
  if (st == RMSNORM_OK) return;
  Kind kind = st == RMSNORM_ERROR_BAD_DTYPE ? Kind::Type
              : st == RMSNORM_ERROR_OUT_OF_MEMORY ? Kind::Memory
              : st == RMSNORM_ERROR_NOT_AVAILABLE ? Kind::NotAvailable
                                                   : Kind::Value;
  throw Error{kind, std::string(fn) + ": " + rmsnorm_status_message(st) + " (" +
                        rmsnorm_status_name(st) + ")",
              static_cast<int>(st)};
}

/* ---- messages ------------------------------------------------------------------
 * The checks' messages that the fake kernels (rmsnorm/_torch_fake.py, through
 * rmsnorm._torch.messages()) make too: str.format templates, filled by message(). */
inline constexpr std::pair<const char *, const char *> kMessages[] = {
    {"device", "{what} is on device {device}; rmsnorm runs on CPU tensors only (move it with "
               ".cpu(), or use torch's own norm on that device)"},
    {"dtype", "{what} has dtype {dtype}; rmsnorm takes float32, float16, bfloat16 or float64"},
    {"empty_norm", "Expected normalized_shape to be at least 1-dimensional, i.e., containing at "
                   "least one element, but got normalized_shape = []"},
    {"input_shape", "Given normalized_shape={norm}, expected {what} with shape [*, {dims}], but "
                    "got {what} of size {shape}"},
    {"param_shape", "Expected {what} to be of same shape as normalized_shape, but got {what} of "
                    "shape {shape} and normalized_shape = {norm}"},
    {"same_shape", "{what} has shape {shape}; expected {ref}'s, {ref_shape}"},
    {"same_dtype", "{what} has dtype {dtype}; expected {ref}'s, {ref_dtype}"},
    {"heads", "{what} must have shape (*, heads, head_dim), got {shape}"},
    {"linear_rank", "input must have at least one dimension (the normalized one)"},
    {"linear_matrix", "weight_matrix has shape {shape}; expected (d, n) with d = {d}, the "
                      "input's last dim"},
    {"shard_rank", "input must have at least one dim (the last: the shard's columns)"},
    {"shard_columns", "the shard's columns [{begin}, {end}) are not inside a row of d_global = "
                      "{d_global} columns"},
    {"row_sums", "{what} has dtype {dtype}; per-row sums are float64 (as rms_norm_shard_stats "
                 "returns them)"},
};

/* The message `key` with its {name} fields replaced. */
inline std::string message(std::string_view key,
                           std::initializer_list<std::pair<std::string_view, std::string>> fields) {
  std::string s;
  for (const auto &[k, text] : kMessages)
    if (key == k) s = text;
  for (const auto &[name, value] : fields) {
    std::string field = "{" + std::string(name) + "}";
    for (auto at = s.find(field); at != std::string::npos; at = s.find(field, at + value.size()))
      s.replace(at, field.size(), value);
  }
  return s;
}

/* ---- small helpers ----------------------------------------------------------- */

/* The data dtypes' names, by rmsnorm_dtype code (numpy's and torch's names alike). */
inline constexpr const char *kDtypeNames[] = {"float32", "float16", "bfloat16", "float64"};

inline const char *dtype_name(int dt) { return dt >= 0 && dt < 4 ? kDtypeNames[dt] : "unknown"; }

inline int64_t prod(Dims d) {
  int64_t p = 1;
  for (int64_t v : d) p *= v;
  return p;
}

inline std::string list(Dims d) {
  std::string s = "[";
  for (std::size_t i = 0; i < d.size(); i++) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

/* mean and rstd are float for fp32/fp16/bf16 data, double for fp64. */
inline int stats_dtype(int dt) { return dt == RMSNORM_F64 ? RMSNORM_F64 : RMSNORM_F32; }
/* The type of rmsnorm_linear_*'s matrices. */
inline int compute_dtype(int dt) { return stats_dtype(dt); }

enum Norm { RMS, LAYER };

/* The keyword options of the norms, as RMSNORM_FLAG_* bits. */
inline unsigned flags_of(bool offset, bool eps_outside, bool round_before_weight) {
  unsigned f = 0;
  if (offset) f |= RMSNORM_FLAG_WEIGHT_OFFSET;
  if (eps_outside) f |= RMSNORM_FLAG_EPS_OUTSIDE;
  if (round_before_weight) f |= RMSNORM_FLAG_ROUND_BEFORE_WEIGHT;
  return f;
}

struct Options {
  std::optional<double> eps;  // none: the library's default for the dtype
  double partial = 1.0;
  unsigned flags = 0;
};

inline rmsnorm_config config(int dt, int param_dtype, const Options &o) {
  rmsnorm_config cfg;
  check(rmsnorm_config_init(&cfg, static_cast<rmsnorm_dtype>(dt)), "rmsnorm_config_init");
  cfg.param_dtype = static_cast<rmsnorm_dtype>(param_dtype);
  if (o.eps) cfg.eps = *o.eps;
  cfg.partial = o.partial;
  cfg.flags = o.flags;
  return cfg;
}

/* The leading n dims as (count, stride): one stride when every dim of size
 * > 1 continues the one after it (stride x size); none otherwise. A count of
 * 0 or 1 has the stride `fallback`. */
inline std::optional<std::pair<int64_t, int64_t>> collapse(Dims shape, Dims strides, std::size_t n,
                                                          int64_t fallback) {
  int64_t count = prod(shape.first(n));
  if (count <= 1) return std::pair{count, fallback};
  int64_t ld = 0, expect = 0;
  bool first = true;
  for (std::size_t i = n; i-- > 0;) {
    if (shape[i] == 1) continue;
    if (first) {
      ld = strides[i];
      expect = strides[i] * shape[i];
      first = false;
    } else if (strides[i] != expect) {
      return std::nullopt;
    } else {
      expect *= shape[i];
    }
  }
  return std::pair{count, ld};
}

/* (rows, ld) when the last k dims are one contiguous block of d elements and
 * the leading dims collapse to rows ld >= d elements apart; none when the
 * array must be copied first (broadcast, reversed, transposed, inner strides). */
inline std::optional<std::pair<int64_t, int64_t>> row_layout(Dims shape, Dims strides, std::size_t k) {
  std::size_t n = shape.size() - k;
  int64_t d = prod(shape.subspan(n));
  int64_t rows = prod(shape.first(n));
  if (rows == 0 || d == 0) return std::pair{rows, d};
  int64_t expect = 1;
  for (std::size_t i = shape.size(); i-- > n;) {
    if (shape[i] != 1 && strides[i] != expect) return std::nullopt;
    expect *= shape[i];
  }
  auto lead = collapse(shape, strides, n, d);
  if (!lead || lead->second < d) return std::nullopt;
  return lead;
}

/* An array seen as rows x d, row i at ptr + i*ld elements. */
template <class B>
struct Rows {
  typename B::Array array;  // whose memory ptr is in: the input, or a copy
  int64_t rows = 0, d = 0, ld = 0;
  void *ptr = nullptr;
};

/* a as rows x d: itself when it has a row-strided view, else a copy. */
template <class B>
Rows<B> as_rows(B &b, const typename B::Array &a, std::size_t k) {
  Dims shape = B::shape(a);
  int64_t d = prod(shape.subspan(shape.size() - k));
  if (!B::is_contiguous(a)) {
    Dims st;
    if (b.strides(a, &st)) {
      if (auto lay = row_layout(shape, st, k)) return {a, lay->first, d, lay->second, B::ptr(a)};
    }
    auto c = b.contiguous(a);
    return {c, prod(shape.first(shape.size() - k)), d, d, B::ptr(c)};
  }
  return {a, prod(shape.first(shape.size() - k)), d, d, B::ptr(a)};
}

/* The row stride of an array the library writes in place (out=, inplace):
 * it must have a row-strided view, and be writable where it is. */
template <class B>
int64_t writable_rows(B &b, const typename B::Array &a, std::size_t k, const char *what) {
  b.writable(a, what);
  Dims shape = B::shape(a);
  int64_t d = prod(shape.subspan(shape.size() - k));
  if (B::is_contiguous(a)) return d;
  Dims st;
  if (b.strides(a, &st)) {
    if (auto lay = row_layout(shape, st, k)) return lay->second;
  }
  value_error(std::string(what) +
              " must hold the normalized dims contiguously and its rows at one stride (a "
              "contiguous array, or a row slice of one) to be written in place");
}

/* Runs the library call f(ctx) on the calling thread's context with the backend's guard held
 * (the GIL released for numpy, for `elements` elements), then checks its status. */
template <class B, class F>
void run(B &b, std::size_t elements, const char *fn, F &&f) {
  rmsnorm_context *ctx = b.context();
  rmsnorm_status st;
  {
    [[maybe_unused]] auto unlocked = b.unlocked(elements);
    st = f(ctx);
  }
  check(st, fn);
}

/* ---- argument checks ---------------------------------------------------------- */

inline void check_normalized(Dims norm) {
  if (norm.empty()) value_error(message("empty_norm", {}));
  for (int64_t v : norm)
    if (v < 0) value_error("normalized_shape must not be negative, got " + list(norm));
}

template <class B>
int data_dtype(const typename B::Array &a, const char *what) {
  int dt = B::dtype(a);
  if (dt < 0)
    type_error(message("dtype", {{"what", what}, {"dtype", B::dtype_name(a)}}));
  return dt;
}

inline void check_input(Dims shape, Dims norm, const char *what) {
  std::size_t k = norm.size();
  bool ok = shape.size() >= k;
  for (std::size_t i = 0; ok && i < k; i++) ok = shape[shape.size() - k + i] == norm[i];
  if (!ok) {
    std::string star = list(norm);
    value_error(message("input_shape", {{"norm", star}, {"what", what},
                                        {"dims", star.substr(1, star.size() - 2)},
                                        {"shape", list(shape)}}));
  }
}

/* a has ref's shape and dtype dt. */
template <class B>
void check_same(const typename B::Array &a, Dims shape, int dt, const char *what,
                const char *ref_what) {
  Dims s = B::shape(a);
  if (!std::equal(s.begin(), s.end(), shape.begin(), shape.end()))
    value_error(message("same_shape", {{"what", what}, {"shape", list(s)}, {"ref", ref_what},
                                       {"ref_shape", list(shape)}}));
  if (data_dtype<B>(a, what) != dt)
    type_error(message("same_dtype", {{"what", what}, {"dtype", B::dtype_name(a)},
                                      {"ref", ref_what}, {"ref_dtype", dtype_name(dt)}}));
}

/* The weight and bias as the library takes them: shape normalized_shape,
 * contiguous, and one parameter dtype for both, the data's or float32 (other
 * float dtypes are converted to float32, exactly for float16/bfloat16). */
template <class B>
struct Params {
  typename B::Array weight, bias;
  int param_dtype = -1;
  int weight_dtype = -1, bias_dtype = -1;  // the caller's, to give gradients back in
};

template <class B>
int param_code(const typename B::Array &p, const char *name, Dims norm) {
  int code = data_dtype<B>(p, name);
  Dims s = B::shape(p);
  if (!std::equal(s.begin(), s.end(), norm.begin(), norm.end()))
    value_error(message("param_shape", {{"what", name}, {"shape", list(s)}, {"norm", list(norm)}}));
  return code;
}

template <class B>
Params<B> params(B &b, int dt, Dims norm, const typename B::Array &weight,
                 const typename B::Array &bias, const char *weight_name = "weight",
                 std::optional<Dims> bias_shape = std::nullopt) {
  Params<B> p;
  if (B::defined(weight)) p.weight_dtype = param_code<B>(weight, weight_name, norm);
  if (B::defined(bias)) p.bias_dtype = param_code<B>(bias, "bias", bias_shape.value_or(norm));
  p.param_dtype = (p.weight_dtype < 0 || p.weight_dtype == dt) && (p.bias_dtype < 0 || p.bias_dtype == dt)
                      ? dt
                      : RMSNORM_F32;
  auto prep = [&](const typename B::Array &a, int code) -> typename B::Array {
    if (!B::defined(a)) return a;
    if (code != p.param_dtype) return b.cast(a, p.param_dtype);
    return B::is_contiguous(a) ? a : b.contiguous(a);
  };
  p.weight = prep(weight, p.weight_dtype);
  p.bias = prep(bias, p.bias_dtype);
  return p;
}

template <class B>
void *ptr_or_null(const typename B::Array &a) {
  return B::defined(a) ? B::ptr(a) : nullptr;
}

/* shape[:-k] + (1,) * k: the shape of per-row statistics. */
inline Shape stats_shape(Dims shape, std::size_t k) {
  Shape s(shape.begin(), shape.end() - static_cast<std::ptrdiff_t>(k));
  s.insert(s.end(), k, 1);
  return s;
}

inline void check_flags(Norm kind, unsigned flags) {
  if (kind == LAYER && (flags & RMSNORM_FLAG_EPS_OUTSIDE))
    value_error("eps_outside applies to rms_norm only");
}

/* x (named what) of a norm over normalized_shape, checked in the order of the messages:
 * normalized_shape, x's dtype and shape, the arrays of x's shape and dtype (`same`: array
 * and name; absent ones skipped), the parameters, the flags. */
template <class B>
struct NormIn {
  int dt;
  Dims shape;
  Params<B> p;
};

template <class B, class Array = typename B::Array>
NormIn<B> norm_in(B &b, Norm kind, const Array &x, const char *what, Dims norm,
                  const Array &weight, const Array &bias, const Options &o,
                  std::initializer_list<std::pair<const Array *, const char *>> same = {}) {
  check_normalized(norm);
  int dt = data_dtype<B>(x, what);
  Dims shape = B::shape(x);
  check_input(shape, norm, what);
  for (const auto &[a, name] : same)
    if (B::defined(*a)) check_same<B>(*a, shape, dt, name, what);
  Params<B> p = params(b, dt, norm, weight, bias);
  check_flags(kind, o.flags);
  return {dt, shape, std::move(p)};
}

/* ---- forward ----------------------------------------------------------------- */

template <class B>
struct Forward {
  typename B::Array y, mean, rstd;  // mean/rstd: shape (*leading, 1, ..., 1), when asked for
  Rows<B> x;                        // the input as passed to the library
};

/* y = norm(x) into a new contiguous array, or into *out (its rows at one
 * stride; out may be x itself). */
template <class B>
Forward<B> forward(B &b, Norm kind, const typename B::Array &x, Dims norm,
                   const typename B::Array &weight, const typename B::Array &bias,
                   const Options &o, bool want_mean, bool want_rstd,
                   const typename B::Array *out = nullptr) {
  auto [dt, shape, p] = norm_in(b, kind, x, "input", norm, weight, bias, o);
  std::size_t k = norm.size();
  if (kind == LAYER && (want_mean || want_rstd)) want_mean = want_rstd = true;  // both or none
  int64_t ldy = prod(norm);
  if (out) {
    check_same<B>(*out, shape, dt, "out", "input");
    ldy = writable_rows(b, *out, k, "out");
  }
  Forward<B> r;
  r.x = as_rows(b, x, k);
  Shape sshape = stats_shape(shape, k);
  int sdt = stats_dtype(dt);
  if (r.x.d == 0) {  // nothing to normalize: torch gives mean 0 and rstd NaN
    r.y = out ? *out : b.empty(shape, dt);
    if (want_mean) r.mean = b.full(sshape, sdt, 0.0);
    if (want_rstd) r.rstd = b.full(sshape, sdt, NAN);
    return r;
  }
  r.y = out ? *out : b.empty(shape, dt);
  if (want_mean) r.mean = b.empty(sshape, sdt);
  if (want_rstd) r.rstd = b.empty(sshape, sdt);
  rmsnorm_config cfg = config(dt, p.param_dtype, o);
  run(b, static_cast<std::size_t>(r.x.rows * r.x.d),
      kind == RMS ? "rmsnorm_forward" : "rmsnorm_layernorm_forward", [&](rmsnorm_context *ctx) {
    if (kind == RMS)
      return rmsnorm_forward(ctx, &cfg, r.x.rows, r.x.d, r.x.ptr, r.x.ld, ptr_or_null<B>(p.weight),
                             ptr_or_null<B>(p.bias), B::ptr(r.y), ldy, ptr_or_null<B>(r.rstd));
    else
      return rmsnorm_layernorm_forward(ctx, &cfg, r.x.rows, r.x.d, r.x.ptr, r.x.ld,
                                       ptr_or_null<B>(p.weight), ptr_or_null<B>(p.bias), B::ptr(r.y),
                                       ldy, ptr_or_null<B>(r.mean), ptr_or_null<B>(r.rstd));
  });
  return r;
}

/* ---- backward ------------------------------------------------------------------ */

template <class B>
struct Grads {
  typename B::Array dx, dweight, dbias;
};

/* A saved mean or rstd as the library takes it: rows contiguous values. */
template <class B>
typename B::Array stat_arg(B &b, const typename B::Array &s, const char *name, int dt, int64_t rows) {
  if (!B::defined(s)) return s;
  int want = stats_dtype(dt);
  if (B::dtype(s) != want)
    type_error(std::string(name) + " has dtype " + B::dtype_name(s) + "; it must be " +
               dtype_name(want) + " for " + dtype_name(dt) + " data (as the forward returns it)");
  if (prod(B::shape(s)) != rows)
    value_error(std::string(name) + " has " + std::to_string(prod(B::shape(s))) + " values (shape " +
                list(B::shape(s)) + "); expected one per row, " + std::to_string(rows));
  return B::is_contiguous(s) ? s : b.contiguous(s);
}

/* Parameter gradients in the caller's dtypes. */
template <class B>
void give_back(B &b, Grads<B> &g, const Params<B> &p) {
  if (B::defined(g.dweight) && p.weight_dtype != p.param_dtype) g.dweight = b.cast(g.dweight, p.weight_dtype);
  if (B::defined(g.dbias) && p.bias_dtype != p.param_dtype) g.dbias = b.cast(g.dbias, p.bias_dtype);
}

/* g's dx and the wanted parameter gradients, new; those start at 0 when there are no rows
 * (the library writes nothing then). false when d == 0: nothing to compute, g is the
 * result (zero parameter gradients in the caller's dtypes). */
template <class B>
bool start_grads(B &b, Grads<B> *g, const Params<B> &p, Dims shape, int dt, Dims norm, int64_t rows,
                 int64_t d, bool want_dweight, bool want_dbias) {
  g->dx = b.empty(shape, dt);
  auto grad = [&](bool want, int code) {
    if (!want) return typename B::Array();
    return d && rows ? b.empty(norm, code) : b.full(norm, code, 0.0);
  };
  g->dweight = grad(want_dweight, d ? p.param_dtype : p.weight_dtype);
  g->dbias = grad(want_dbias, d ? p.param_dtype : p.bias_dtype);
  return d != 0;
}

/* (dx, dweight, dbias); dweight/dbias only when wanted and their parameter is
 * given (bias only tells the dtype and shape of dbias). */
template <class B>
Grads<B> backward(B &b, Norm kind, const typename B::Array &dy, const typename B::Array &x, Dims norm,
                  const typename B::Array &weight, const typename B::Array &bias,
                  const typename B::Array &mean, const typename B::Array &rstd, const Options &o,
                  bool want_dweight, bool want_dbias) {
  auto [dt, shape, p] = norm_in(b, kind, x, "input", norm, weight, bias, o, {{&dy, "grad_output"}});
  want_dweight = want_dweight && B::defined(p.weight);
  want_dbias = want_dbias && B::defined(p.bias);
  std::size_t k = norm.size();
  Rows<B> xr = as_rows(b, x, k), dyr = as_rows(b, dy, k);
  int64_t rows = xr.rows, d = xr.d;
  Grads<B> g;
  if (!start_grads(b, &g, p, shape, dt, norm, rows, d, want_dweight, want_dbias)) return g;
  auto r = stat_arg(b, rstd, "rstd", dt, rows);
  typename B::Array m;
  if (kind == LAYER) {
    m = stat_arg(b, mean, "mean", dt, rows);
    if (B::defined(m) != B::defined(r))
      value_error("layer_norm_backward takes both mean and rstd, or neither");
  }
  rmsnorm_config cfg = config(dt, p.param_dtype, o);
  run(b, static_cast<std::size_t>(rows * d),
      kind == RMS ? "rmsnorm_backward" : "rmsnorm_layernorm_backward", [&](rmsnorm_context *ctx) {
    if (kind == RMS)
      return rmsnorm_backward(ctx, &cfg, rows, d, xr.ptr, xr.ld, dyr.ptr, dyr.ld, ptr_or_null<B>(p.weight),
                              ptr_or_null<B>(r), B::ptr(g.dx), d, ptr_or_null<B>(g.dweight),
                              ptr_or_null<B>(g.dbias));
    else
      return rmsnorm_layernorm_backward(ctx, &cfg, rows, d, xr.ptr, xr.ld, dyr.ptr, dyr.ld,
                                        ptr_or_null<B>(p.weight), ptr_or_null<B>(m), ptr_or_null<B>(r),
                                        B::ptr(g.dx), d, ptr_or_null<B>(g.dweight),
                                        ptr_or_null<B>(g.dbias));
  });
  give_back(b, g, p);
  return g;
}

/* ---- sharded hidden dimension (rmsnorm_shard_*) ------------------------------------------
 * x holds columns [offset, offset + width) of rows of d_global columns: its last dim is the
 * shard's width, its leading dims the rows. Per-row sums (stats, dots) are float64 arrays of
 * x's leading shape; weight and bias hold the shard's width elements. */

template <class B>
struct Shard {
  Rows<B> x;
  int dt = -1;
  Shape lead;   // x's leading dims: the shape of the per-row sums
  Shape shape;  // {width}: the shape of weight, bias and their gradients
  std::size_t rows = 0, d_global = 0, offset = 0, width = 0, ldx = 0;
};

template <class B>
Shard<B> shard_of(B &b, const typename B::Array &x, int64_t d_global, int64_t offset) {
  Shard<B> s;
  s.dt = data_dtype<B>(x, "input");
  Dims shape = B::shape(x);
  if (shape.empty()) value_error(message("shard_rank", {}));
  int64_t width = shape.back();
  if (d_global < 1 || offset < 0 || offset > d_global - width)
    value_error(message("shard_columns", {{"begin", std::to_string(offset)},
                                          {"end", std::to_string(offset + width)},
                                          {"d_global", std::to_string(d_global)}}));
  s.lead.assign(shape.begin(), shape.end() - 1);
  s.shape = {width};
  s.x = as_rows(b, x, 1);
  s.rows = static_cast<std::size_t>(s.x.rows);
  s.d_global = static_cast<std::size_t>(d_global);
  s.offset = static_cast<std::size_t>(offset);
  s.width = static_cast<std::size_t>(width);
  s.ldx = static_cast<std::size_t>(s.x.ld);
  return s;
}

/* A per-row sum as the library takes it: rows contiguous doubles. */
template <class B>
typename B::Array row_sums_arg(B &b, const typename B::Array &s, const char *name, std::size_t rows) {
  if (B::dtype(s) != RMSNORM_F64)
    type_error(message("row_sums", {{"what", name}, {"dtype", B::dtype_name(s)}}));
  if (prod(B::shape(s)) != static_cast<int64_t>(rows))
    value_error(std::string(name) + " has " + std::to_string(prod(B::shape(s))) +
                " values (shape " + list(B::shape(s)) + "); expected one per row, " +
                std::to_string(rows));
  return B::is_contiguous(s) ? s : b.contiguous(s);
}

template <class B>
double *f64(const typename B::Array &a) { return static_cast<double *>(B::ptr(a)); }

/* Each row's partial sum of squares over the shard's columns below k. */
template <class B>
typename B::Array shard_stats(B &b, const typename B::Array &x, int64_t d_global, int64_t offset,
                              const Options &o) {
  Shard<B> s = shard_of(b, x, d_global, offset);
  auto out = b.empty(s.lead, RMSNORM_F64);
  rmsnorm_config cfg = config(s.dt, s.dt, o);
  run(b, s.rows * s.width, "rmsnorm_shard_stats", [&](rmsnorm_context *ctx) {
    return rmsnorm_shard_stats(ctx, &cfg, s.rows, s.d_global, s.offset, s.width, s.x.ptr, s.ldx,
                               f64<B>(out));
  });
  return out;
}

/* y of the shard's columns from the summed statistics. */
template <class B>
typename B::Array shard_forward(B &b, const typename B::Array &x, const typename B::Array &stats,
                                int64_t d_global, int64_t offset, const typename B::Array &weight,
                                const typename B::Array &bias, const Options &o) {
  Shard<B> s = shard_of(b, x, d_global, offset);
  Params<B> p = params(b, s.dt, s.shape, weight, bias);
  auto st = row_sums_arg(b, stats, "stats", s.rows);
  auto y = b.empty(B::shape(x), s.dt);
  rmsnorm_config cfg = config(s.dt, p.param_dtype, o);
  run(b, s.rows * s.width, "rmsnorm_shard_forward", [&](rmsnorm_context *ctx) {
    return rmsnorm_shard_forward(ctx, &cfg, s.rows, s.d_global, s.offset, s.width, s.x.ptr, s.ldx,
                                 ptr_or_null<B>(p.weight), ptr_or_null<B>(p.bias), f64<B>(st),
                                 B::ptr(y), s.width, nullptr);
  });
  return y;
}

/* Each row's partial of the backward's dot product, sum of gy_j xhat_j over the shard. */
template <class B>
typename B::Array shard_backward_dots(B &b, const typename B::Array &dy, const typename B::Array &x,
                                      const typename B::Array &stats, int64_t d_global,
                                      int64_t offset, const typename B::Array &weight,
                                      const Options &o) {
  Shard<B> s = shard_of(b, x, d_global, offset);
  check_same<B>(dy, B::shape(x), s.dt, "grad_output", "input");
  Params<B> p = params(b, s.dt, s.shape, weight, typename B::Array());
  auto st = row_sums_arg(b, stats, "stats", s.rows);
  Rows<B> dyr = as_rows(b, dy, 1);
  auto out = b.empty(s.lead, RMSNORM_F64);
  rmsnorm_config cfg = config(s.dt, p.param_dtype, o);
  run(b, s.rows * s.width, "rmsnorm_shard_backward_dots", [&](rmsnorm_context *ctx) {
    return rmsnorm_shard_backward_dots(ctx, &cfg, s.rows, s.d_global, s.offset, s.width, s.x.ptr,
                                       s.ldx, dyr.ptr, static_cast<std::size_t>(dyr.ld),
                                       ptr_or_null<B>(p.weight), f64<B>(st), f64<B>(out));
  });
  return out;
}

/* dx of the shard's columns from the summed statistics and dots; dweight and dbias
 * (summed over this call's rows) when wanted and their parameter is given. */
template <class B>
Grads<B> shard_backward(B &b, const typename B::Array &dy, const typename B::Array &x,
                        const typename B::Array &stats, const typename B::Array &dots,
                        int64_t d_global, int64_t offset, const typename B::Array &weight,
                        const typename B::Array &bias, const Options &o, bool want_dweight,
                        bool want_dbias) {
  Shard<B> s = shard_of(b, x, d_global, offset);
  check_same<B>(dy, B::shape(x), s.dt, "grad_output", "input");
  Params<B> p = params(b, s.dt, s.shape, weight, bias);
  auto st = row_sums_arg(b, stats, "stats", s.rows);
  auto dsum = row_sums_arg(b, dots, "dots", s.rows);
  Rows<B> dyr = as_rows(b, dy, 1);
  // rows == 0: the library writes nothing, so the parameter gradients start at 0
  auto param_grad = [&](bool want) {
    if (!want) return typename B::Array();
    return s.rows ? b.empty(s.shape, p.param_dtype) : b.full(s.shape, p.param_dtype, 0.0);
  };
  Grads<B> g;
  g.dx = b.empty(B::shape(x), s.dt);
  g.dweight = param_grad(want_dweight && B::defined(p.weight));
  g.dbias = param_grad(want_dbias && B::defined(p.bias));
  rmsnorm_config cfg = config(s.dt, p.param_dtype, o);
  run(b, s.rows * s.width, "rmsnorm_shard_backward", [&](rmsnorm_context *ctx) {
    return rmsnorm_shard_backward(ctx, &cfg, s.rows, s.d_global, s.offset, s.width, s.x.ptr, s.ldx,
                                  dyr.ptr, static_cast<std::size_t>(dyr.ld),
                                  ptr_or_null<B>(p.weight), f64<B>(st), f64<B>(dsum), B::ptr(g.dx),
                                  s.width, ptr_or_null<B>(g.dweight), ptr_or_null<B>(g.dbias));
  });
  give_back(b, g, p);
  return g;
}

/* ---- residual add + RMSNorm ------------------------------------------------------ */

template <class B>
struct AddForward {
  typename B::Array y, h, rstd;  // h: h' = h + u (the residual updated in place, or new)
};

/* h' = h + u (rounded to the data dtype) and y = RMSNorm(h') in one pass
 * (rmsnorm_add_forward). u is the sub-layer output ("input"), h the residual.
 * inplace: h' is written into h and y into u (both writable, rows at one
 * stride); otherwise h is copied first and y is new. */
template <class B>
AddForward<B> add_forward(B &b, const typename B::Array &u, const typename B::Array &h, Dims norm,
                          const typename B::Array &weight, const typename B::Array &bias,
                          const Options &o, bool want_rstd, bool inplace) {
  auto [dt, shape, p] = norm_in(b, RMS, u, "input", norm, weight, bias, o, {{&h, "residual"}});
  std::size_t k = norm.size();
  int64_t d = prod(norm), rows = prod(shape.first(shape.size() - k));
  AddForward<B> r;
  Rows<B> hr, ur;
  int64_t ldy;
  if (inplace) {
    hr = {h, rows, d, writable_rows(b, h, k, "residual"), B::ptr(h)};
    ldy = writable_rows(b, u, k, "input");
    ur = {u, rows, d, ldy, B::ptr(u)};
    r.y = u;
  } else {
    auto hc = b.cast(h, dt);  // a new contiguous copy: the library updates it
    hr = {hc, rows, d, d, B::ptr(hc)};
    ur = as_rows(b, u, k);
    r.y = b.empty(shape, dt);
    ldy = d;
  }
  r.h = hr.array;
  Shape sshape = stats_shape(shape, k);
  if (d == 0) {
    if (want_rstd) r.rstd = b.full(sshape, stats_dtype(dt), NAN);
    return r;
  }
  if (want_rstd) r.rstd = b.empty(sshape, stats_dtype(dt));
  rmsnorm_config cfg = config(dt, p.param_dtype, o);
  run(b, static_cast<std::size_t>(rows * d), "rmsnorm_add_forward", [&](rmsnorm_context *ctx) {
    return rmsnorm_add_forward(ctx, &cfg, rows, d, hr.ptr, hr.ld, ur.ptr, ur.ld, ptr_or_null<B>(p.weight),
                               ptr_or_null<B>(p.bias), B::ptr(r.y), ldy, ptr_or_null<B>(r.rstd));
  });
  return r;
}

/* (dh, dweight, dbias) of add_forward: dh = dres + the norm's backward at h'
 * (new_residual), the gradient of both input and residual; dres none is 0. */
template <class B>
Grads<B> add_backward(B &b, const typename B::Array &dy, const typename B::Array &dres,
                      const typename B::Array &h, Dims norm, const typename B::Array &weight,
                      const typename B::Array &bias, const typename B::Array &rstd, const Options &o,
                      bool want_dweight, bool want_dbias) {
  auto [dt, shape, p] = norm_in(b, RMS, h, "new_residual", norm, weight, bias, o,
                                {{&dy, "grad_output"}, {&dres, "grad_residual"}});
  want_dweight = want_dweight && B::defined(p.weight);
  want_dbias = want_dbias && B::defined(p.bias);
  std::size_t k = norm.size();
  Rows<B> hr = as_rows(b, h, k), dyr = as_rows(b, dy, k), drr;
  if (B::defined(dres)) drr = as_rows(b, dres, k);
  int64_t rows = hr.rows, d = hr.d;
  Grads<B> g;
  if (!start_grads(b, &g, p, shape, dt, norm, rows, d, want_dweight, want_dbias)) return g;
  auto r = stat_arg(b, rstd, "rstd", dt, rows);
  rmsnorm_config cfg = config(dt, p.param_dtype, o);
  run(b, static_cast<std::size_t>(rows * d), "rmsnorm_add_backward", [&](rmsnorm_context *ctx) {
    return rmsnorm_add_backward(ctx, &cfg, rows, d, hr.ptr, hr.ld, dyr.ptr, dyr.ld, drr.ptr,
                                B::defined(dres) ? drr.ld : d, ptr_or_null<B>(p.weight),
                                ptr_or_null<B>(r), B::ptr(g.dx), d, ptr_or_null<B>(g.dweight),
                                ptr_or_null<B>(g.dbias));
  });
  give_back(b, g, p);
  return g;
}

/* ---- QK-norm: RMSNorm of every head of every token ------------------------------ */

/* x of shape (*, heads, head_dim): the leading dims collapse to one token
 * stride, heads at one head stride, head_dim contiguous. */
struct HeadLayout {
  int64_t tokens = 0, heads = 0, head_dim = 0, ld_token = 0, ld_head = 0;
};

inline void check_heads_shape(Dims shape, const char *what) {
  if (shape.size() < 2)
    value_error(message("heads", {{"what", what}, {"shape", list(shape)}}));
}

/* The layout of a (already checked) (*, heads, head_dim) array, or none. */
template <class B>
std::optional<HeadLayout> head_layout(B &b, const typename B::Array &a) {
  Dims shape = B::shape(a);
  std::size_t n = shape.size();
  HeadLayout l{prod(shape.first(n - 2)), shape[n - 2], shape[n - 1], 0, 0};
  if (B::is_contiguous(a)) {
    l.ld_head = l.head_dim;
    l.ld_token = l.heads * l.head_dim;
    return l;
  }
  Dims st;
  if (!b.strides(a, &st)) return std::nullopt;
  if (l.head_dim > 1 && st[n - 1] != 1) return std::nullopt;
  l.ld_head = l.heads > 1 ? st[n - 2] : l.head_dim;
  auto lead = collapse(shape, st, n - 2, (l.heads - 1) * l.ld_head + l.head_dim);
  if (!lead || l.ld_head < 0 || lead->second < 0) return std::nullopt;
  l.ld_token = lead->second;
  // rows must not overlap: token-major or head-major (the library checks too)
  bool token_major = l.ld_head >= l.head_dim && l.ld_token >= (l.heads - 1) * l.ld_head + l.head_dim;
  bool head_major = l.ld_token >= l.head_dim && l.ld_head >= (l.tokens - 1) * l.ld_token + l.head_dim;
  if (l.tokens * l.heads > 1 && !token_major && !head_major) return std::nullopt;
  return l;
}

template <class B>
struct HeadRows {
  typename B::Array array;
  HeadLayout l;
};

template <class B>
HeadRows<B> as_heads(B &b, const typename B::Array &a) {
  if (auto l = head_layout(b, a)) return {a, *l};
  auto c = b.contiguous(a);
  return {c, *head_layout(b, c)};
}

template <class B>
struct QKForward {
  typename B::Array y, rstd;  // rstd: (*, heads, 1)
};

/* QK-norm forward (rmsnorm_qk_norm_forward): y new and contiguous, or x
 * itself when inplace (which needs x's layout and writability). */
template <class B>
QKForward<B> qk_forward(B &b, const typename B::Array &x, const typename B::Array &weight,
                        const typename B::Array &bias, const Options &o, bool want_rstd,
                        bool inplace) {
  int dt = data_dtype<B>(x, "input");
  Dims shape = B::shape(x);
  check_heads_shape(shape, "input");
  Dims norm = shape.last(1);
  Params<B> p = params(b, dt, norm, weight, bias);
  check_flags(RMS, o.flags);
  HeadRows<B> xr;
  HeadLayout ly;
  QKForward<B> r;
  if (inplace) {
    b.writable(x, "input");
    auto l = head_layout(b, x);
    if (!l)
      value_error("qk_norm in place needs input's head_dim contiguous, its heads at one stride and "
                  "its leading dims at one token stride, without overlapping rows");
    xr = {x, *l};
    ly = *l;
    r.y = x;
  } else {
    xr = as_heads(b, x);
    ly = {xr.l.tokens, xr.l.heads, xr.l.head_dim, xr.l.heads * xr.l.head_dim, xr.l.head_dim};
    r.y = b.empty(shape, dt);
  }
  Shape sshape = stats_shape(shape, 1);
  if (ly.head_dim == 0) {
    if (want_rstd) r.rstd = b.full(sshape, stats_dtype(dt), NAN);
    return r;
  }
  if (want_rstd) r.rstd = b.empty(sshape, stats_dtype(dt));
  rmsnorm_config cfg = config(dt, p.param_dtype, o);
  run(b, static_cast<std::size_t>(ly.tokens * ly.heads * ly.head_dim),
      "rmsnorm_qk_norm_forward", [&](rmsnorm_context *ctx) {
    return rmsnorm_qk_norm_forward(ctx, &cfg, ly.tokens, ly.heads, ly.head_dim, B::ptr(xr.array),
                                   xr.l.ld_token, xr.l.ld_head, ptr_or_null<B>(p.weight),
                                   ptr_or_null<B>(p.bias), B::ptr(r.y), ly.ld_token, ly.ld_head,
                                   ptr_or_null<B>(r.rstd));
  });
  return r;
}

/* QK-norm backward (rmsnorm_qk_norm_backward): dx, and dweight/dbias summed
 * over tokens and heads. rstd none: recomputed. */
template <class B>
Grads<B> qk_backward(B &b, const typename B::Array &dy, const typename B::Array &x,
                     const typename B::Array &weight, const typename B::Array &bias,
                     const typename B::Array &rstd, const Options &o, bool want_dweight,
                     bool want_dbias) {
  int dt = data_dtype<B>(x, "input");
  Dims shape = B::shape(x);
  check_heads_shape(shape, "input");
  check_same<B>(dy, shape, dt, "grad_output", "input");
  Dims norm = shape.last(1);
  Params<B> p = params(b, dt, norm, weight, bias);
  check_flags(RMS, o.flags);
  want_dweight = want_dweight && B::defined(p.weight);
  want_dbias = want_dbias && B::defined(p.bias);
  HeadRows<B> xr = as_heads(b, x), dyr = as_heads(b, dy);
  const HeadLayout &l = xr.l;
  int64_t rows = l.tokens * l.heads;
  Grads<B> g;
  if (!start_grads(b, &g, p, shape, dt, norm, rows, l.head_dim, want_dweight, want_dbias)) return g;
  auto r = stat_arg(b, rstd, "rstd", dt, rows);
  rmsnorm_config cfg = config(dt, p.param_dtype, o);
  run(b, static_cast<std::size_t>(rows * l.head_dim),
      "rmsnorm_qk_norm_backward", [&](rmsnorm_context *ctx) {
    return rmsnorm_qk_norm_backward(ctx, &cfg, l.tokens, l.heads, l.head_dim, B::ptr(xr.array),
                                    l.ld_token, l.ld_head, B::ptr(dyr.array), dyr.l.ld_token,
                                    dyr.l.ld_head, ptr_or_null<B>(p.weight), ptr_or_null<B>(r),
                                    B::ptr(g.dx), l.heads * l.head_dim, l.head_dim,
                                    ptr_or_null<B>(g.dweight), ptr_or_null<B>(g.dbias));
  });
  give_back(b, g, p);
  return g;
}

/* ---- RMSNorm with an 8-bit output ----------------------------------------------- */

template <class B>
struct Quant {
  typename B::Array q, scale;
};

/* v as Python's repr writes a float (numpy's for a float32): the fewest
 * digits that read back as v ("1e-50", "0.02", "-1", "nan", "inf"). */
template <class T>
inline std::string number_text(T v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  for (int digits = 1; digits <= 17; digits++) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, static_cast<double>(v));
    T back;
    if constexpr (std::is_same_v<T, float>) back = std::strtof(buf, nullptr);
    else back = std::strtod(buf, nullptr);
    if (back == v) break;
  }
  return buf;
}

/* A static quantization scale as the float32 the library takes, checked
 * before it is narrowed: finite and > 0, and neither so small that it
 * rounds to 0 nor so large that it rounds to inf (the library would see
 * only 0 or inf and could not say which argument was wrong). */
inline float static_scale(double v) {
  auto bad = [](std::string why) {
    throw Error{Kind::Value,
                "rmsnorm_forward_quant: scale " + why + " (" +
                    rmsnorm_status_name(RMSNORM_ERROR_BAD_ARGUMENT) + ")",
                static_cast<int>(RMSNORM_ERROR_BAD_ARGUMENT)};
  };
  if (!(std::isfinite(v) && v > 0)) bad("must be a finite number > 0, got " + number_text(v));
  // from FLT_MAX + half its ulp up, rounding to nearest gives inf
  const double overflow = 0x1.ffffffp+127;
  if (v >= overflow)
    bad(number_text(v) + " would overflow float32, whose largest value is " +
        number_text(FLT_MAX));
  float s = static_cast<float>(v);
  if (s == 0.0f)
    bad(number_text(v) + " would round to 0 in float32, whose smallest positive value is " +
        number_text(std::numeric_limits<float>::denorm_min()));
  return s;
}

/* (q, scale): int8 or fp8 E4M3 codes (rmsnorm_forward_quant). scale none:
 * dynamic, one float32 per row, shape (*leading, 1, ..., 1); else that static
 * scale, given back as a 0-d float32 array. */
template <class B>
Quant<B> forward_quant(B &b, rmsnorm_qtype qtype, const typename B::Array &x, Dims norm,
                       const typename B::Array &weight, const typename B::Array &bias,
                       const Options &o, std::optional<double> scale) {
  auto [dt, shape, p] = norm_in(b, RMS, x, "input", norm, weight, bias, o);
  std::size_t k = norm.size();
  Rows<B> xr = as_rows(b, x, k);
  Quant<B> r;
  float s = scale ? static_scale(*scale) : 0.0f;
  r.q = b.empty_quant(shape, qtype);
  r.scale = scale ? b.scalar_f32(s) : b.empty(stats_shape(shape, k), RMSNORM_F32);
  rmsnorm_config cfg = config(dt, p.param_dtype, o);
  if (xr.d == 0) {
    // nothing to quantize; the configuration is checked (a static scale was above)
    if (!scale) r.scale = b.full(stats_shape(shape, k), RMSNORM_F32, 0.0);
    return r;
  }
  run(b, static_cast<std::size_t>(xr.rows * xr.d),
      "rmsnorm_forward_quant", [&](rmsnorm_context *ctx) {
    return rmsnorm_forward_quant(ctx, &cfg, xr.rows, xr.d, xr.ptr, xr.ld, ptr_or_null<B>(p.weight),
                                 ptr_or_null<B>(p.bias), qtype, scale ? &s : nullptr, B::ptr(r.q), xr.d,
                                 scale ? nullptr : static_cast<float *>(B::ptr(r.scale)), nullptr);
  });
  return r;
}

/* ---- RMSNorm + linear, gain folded -------------------------------------------------- */

inline void require_linear(const char *what) {
  if (rmsnorm_linear_available() != RMSNORM_OK)
    throw Error{Kind::NotAvailable,
                std::string(what) + ": this librmsnorm was built without a BLAS (cblas_sgemm), so "
                                    "rmsnorm_linear_* is not available (RMSNORM_ERROR_NOT_AVAILABLE)",
                RMSNORM_ERROR_NOT_AVAILABLE};
}

template <class B>
struct Linear {
  Rows<B> x;
  int dt = -1;
  int64_t n = 0;
  typename B::Array w;   // (d, n), contiguous, compute type
  int w_dtype = -1;      // the caller's, to give dW back in
  Params<B> p;           // g (d,) as weight, bias (n,)
};

/* x (*, d); w (d, n) of any float dtype, converted to the compute type; g
 * (d,) and bias (n,) in one parameter dtype (as params()). */
template <class B>
Linear<B> linear_args(B &b, const typename B::Array &x, const typename B::Array &w,
                      const typename B::Array &g, const typename B::Array &bias) {
  Linear<B> a;
  a.dt = data_dtype<B>(x, "input");
  Dims shape = B::shape(x);
  if (shape.empty()) value_error(message("linear_rank", {}));
  int64_t d = shape.back();
  a.w_dtype = data_dtype<B>(w, "weight_matrix");
  Dims ws = B::shape(w);
  if (ws.size() != 2 || ws[0] != d)
    value_error(message("linear_matrix", {{"shape", list(ws)}, {"d", std::to_string(d)}}));
  a.n = ws[1];
  if (d == 0 || a.n == 0)
    value_error("rms_norm_linear needs d > 0 and n > 0, got d = " + std::to_string(d) +
                ", n = " + std::to_string(a.n));
  int cdt = compute_dtype(a.dt);
  a.w = a.w_dtype != cdt ? b.cast(w, cdt) : (B::is_contiguous(w) ? w : b.contiguous(w));
  int64_t dd[1] = {d}, nn[1] = {a.n};
  a.p = params(b, a.dt, Dims(dd, 1), g, bias, "norm_weight", Dims(nn, 1));
  a.x = as_rows(b, x, 1);
  return a;
}

/* W' = diag(g) W (diag(1 + g) with the offset flag): rmsnorm_fold_weight. */
template <class B>
typename B::Array fold(B &b, const Linear<B> &a, const Options &o) {
  int64_t d = a.x.d, n = a.n;
  int64_t shape[2] = {d, n};
  auto wf = b.empty(Dims(shape, 2), compute_dtype(a.dt));
  rmsnorm_config cfg = config(a.dt, a.p.param_dtype, o);
  check(rmsnorm_fold_weight(&cfg, d, n, ptr_or_null<B>(a.p.weight), B::ptr(a.w), n, B::ptr(wf), n),
        "rmsnorm_fold_weight");
  return wf;
}

/* (z, rstd): Z = diag(r) (X W') + bias, z (*, n) in the data dtype, rstd (*, 1). */
template <class B>
std::pair<typename B::Array, typename B::Array> linear_forward(B &b, const Linear<B> &a,
                                                               const typename B::Array &wf,
                                                               const Options &o, bool want_rstd) {
  require_linear("rms_norm_linear");
  Dims xs = B::shape(a.x.array);
  Shape zs(xs.begin(), xs.end());
  zs.back() = a.n;
  auto z = b.empty(zs, a.dt);
  typename B::Array rstd;
  if (want_rstd) {
    zs.back() = 1;
    rstd = b.empty(zs, stats_dtype(a.dt));
  }
  rmsnorm_config cfg = config(a.dt, a.p.param_dtype, o);
  run(b, static_cast<std::size_t>(a.x.rows * a.x.d),
      "rmsnorm_linear_forward", [&](rmsnorm_context *ctx) {
    return rmsnorm_linear_forward(ctx, &cfg, a.x.rows, a.x.d, a.n, a.x.ptr, a.x.ld, B::ptr(wf), a.n,
                                  ptr_or_null<B>(a.p.bias), B::ptr(z), a.n, ptr_or_null<B>(rstd));
  });
  return {z, rstd};
}

template <class B>
struct LinearGrads {
  typename B::Array dx, dg, dw, db;
};

/* The gradients of linear_forward, each only when wanted (and its parameter
 * given), in the caller's dtypes (rmsnorm_linear_backward). */
template <class B>
LinearGrads<B> linear_backward(B &b, const Linear<B> &a, const typename B::Array &wf,
                               const typename B::Array &dz, const Options &o, bool want_dg,
                               bool want_dw, bool want_db) {
  require_linear("rms_norm_linear_backward");
  int64_t d = a.x.d, n = a.n, rows = a.x.rows;
  int dt = a.dt;
  Dims xs = B::shape(a.x.array);
  Shape zs(xs.begin(), xs.end());
  zs.back() = n;
  check_same<B>(dz, zs, dt, "grad_output", "rms_norm_linear output");
  Rows<B> dzr = as_rows(b, dz, 1);
  want_dg = want_dg && B::defined(a.p.weight);
  want_db = want_db && B::defined(a.p.bias);
  int cdt = compute_dtype(dt);
  int64_t dshape[1] = {d}, nshape[1] = {n}, wshape[2] = {d, n};
  LinearGrads<B> g;
  g.dx = b.empty(xs, dt);  // the library always writes dx
  auto make = [&](Dims s, int code) { return rows ? b.empty(s, code) : b.full(s, code, 0.0); };
  if (want_dg) g.dg = make(Dims(dshape, 1), a.p.param_dtype);
  if (want_dw) g.dw = make(Dims(wshape, 2), cdt);
  if (want_db) g.db = make(Dims(nshape, 1), a.p.param_dtype);
  rmsnorm_config cfg = config(dt, a.p.param_dtype, o);
  run(b, static_cast<std::size_t>(rows * d), "rmsnorm_linear_backward", [&](rmsnorm_context *ctx) {
    return rmsnorm_linear_backward(ctx, &cfg, rows, d, n, a.x.ptr, a.x.ld, ptr_or_null<B>(a.p.weight),
                                   B::ptr(a.w), n, B::ptr(wf), n, dzr.ptr, dzr.ld, B::ptr(g.dx), d,
                                   ptr_or_null<B>(g.dg), ptr_or_null<B>(g.dw), n, ptr_or_null<B>(g.db));
  });
  if (B::defined(g.dg) && a.p.weight_dtype != a.p.param_dtype) g.dg = b.cast(g.dg, a.p.weight_dtype);
  if (B::defined(g.db) && a.p.bias_dtype != a.p.param_dtype) g.db = b.cast(g.db, a.p.bias_dtype);
  if (B::defined(g.dw) && a.w_dtype != cdt) g.dw = b.cast(g.dw, a.w_dtype);
  return g;
}

/* ---- the kernels: one per op family -------------------------------------------------
 * Shared by the numpy functions (named alike) and the torch ops (ops.def's kernel column).
 * A front end gives a kernel its arguments as an A, by their table names:
 *   using B; B &backend();
 *   Array in(name, none_ok) an input; none for one the op lacks, or None where None is its
 *                           default or none_ok says None may stand for zeros
 *   Array target(name)      an argument written in place (out=, inplace=True), or none
 *   bool inplace()          the op writes its inputs in place
 *   bool want_stats()       the statistics are asked for (return_rstd, or the op returns them)
 *   Dims norm()             normalized_shape
 *   bool flag(name); std::optional<double> real(name); int64_t integer(name)
 *   bool mask(k)            the k-th gradient is asked for
 *   void ret({...})         the outputs in the op's order: the front end returns those its
 *                           function or op has (none for a torch op that writes in place) */
namespace kernels {

template <class A>
Options options(A &a) {
  Options o;
  o.eps = a.real("eps");
  o.partial = a.real("partial").value_or(1.0);
  o.flags = flags_of(a.flag("offset"), a.flag("eps_outside"), a.flag("round_before_weight"));
  return o;
}

template <class A>
void norm(A &a, Norm kind) {
  bool want = a.want_stats();
  auto out = a.target("out");
  auto r = forward(a.backend(), kind, a.in("input"), a.norm(), a.in("weight"), a.in("bias"),
                   options(a), want && kind == LAYER, want, A::B::defined(out) ? &out : nullptr);
  if (!want) a.ret({r.y});
  else if (kind == RMS) a.ret({r.y, r.rstd});
  else a.ret({r.y, r.mean, r.rstd});
}

template <class A>
void norm_backward(A &a, Norm kind) {
  auto g = backward(a.backend(), kind, a.in("grad_output"), a.in("input"), a.norm(),
                    a.in("weight"), a.in("bias"), a.in("mean"), a.in("rstd"), options(a),
                    a.mask(1), a.mask(2));
  a.ret({a.mask(0) ? g.dx : decltype(g.dx)(), g.dweight, g.dbias});
}

template <class A> void rms_norm(A &a) { norm(a, RMS); }
template <class A> void layer_norm(A &a) { norm(a, LAYER); }
template <class A> void rms_norm_backward(A &a) { norm_backward(a, RMS); }
template <class A> void layer_norm_backward(A &a) { norm_backward(a, LAYER); }

template <class A>
void fused_add_rms_norm(A &a) {
  bool inplace = a.inplace(), want = a.want_stats();
  auto r = add_forward(a.backend(), inplace ? a.target("input") : a.in("input"),
                       inplace ? a.target("residual") : a.in("residual"), a.norm(),
                       a.in("weight"), a.in("bias"), options(a), want, inplace);
  if (want) a.ret({r.y, r.h, r.rstd});
  else a.ret({r.y, r.h});
}

template <class A>
void fused_add_rms_norm_backward(A &a) {
  auto g = add_backward(a.backend(), a.in("grad_output"), a.in("grad_residual", true),
                        a.in("new_residual"), a.norm(), a.in("weight"), a.in("bias"),
                        a.in("rstd"), options(a), a.mask(1), a.mask(2));
  a.ret({a.mask(0) ? g.dx : decltype(g.dx)(), g.dweight, g.dbias});
}

template <class A>
void qk_norm(A &a) {
  bool inplace = a.inplace(), want = a.want_stats();
  auto r = qk_forward(a.backend(), inplace ? a.target("input") : a.in("input"), a.in("weight"),
                      a.in("bias"), options(a), want, inplace);
  if (want) a.ret({r.y, r.rstd});
  else a.ret({r.y});
}

template <class A>
void qk_norm_backward(A &a) {
  auto g = qk_backward(a.backend(), a.in("grad_output"), a.in("input"), a.in("weight"),
                       a.in("bias"), a.in("rstd"), options(a), a.mask(1), a.mask(2));
  a.ret({a.mask(0) ? g.dx : decltype(g.dx)(), g.dweight, g.dbias});
}

template <class A>
void quant(A &a, rmsnorm_qtype q) {
  auto r = forward_quant(a.backend(), q, a.in("input"), a.norm(), a.in("weight"), a.in("bias"),
                         options(a), a.real("scale"));
  a.ret({r.q, r.scale});
}

template <class A> void rms_norm_int8(A &a) { quant(a, RMSNORM_Q_INT8); }
template <class A> void rms_norm_fp8(A &a) { quant(a, RMSNORM_Q_FP8_E4M3); }

template <class A>
auto linear_of(A &a) {
  return linear_args(a.backend(), a.in("input"), a.in("weight_matrix"), a.in("norm_weight"),
                     a.in("bias"));
}

template <class A>
void rms_norm_linear(A &a) {
  auto o = options(a);
  auto l = linear_of(a);
  bool want = a.want_stats();
  auto [z, rstd] = linear_forward(a.backend(), l, fold(a.backend(), l, o), o, want);
  if (want) a.ret({z, rstd});
  else a.ret({z});
}

template <class A>
void rms_norm_linear_backward(A &a) {
  auto o = options(a);
  auto l = linear_of(a);
  auto g = linear_backward(a.backend(), l, fold(a.backend(), l, o), a.in("grad_output"), o,
                           a.mask(2), a.mask(1), a.mask(3));
  a.ret({a.mask(0) ? g.dx : decltype(g.dx)(), g.dw, g.dg, g.db});
}

/* The steps of RMSNorm over a column shard (see "sharded hidden dimension" above). */
template <class A>
void rms_norm_shard_stats(A &a) {
  a.ret({shard_stats(a.backend(), a.in("input"), a.integer("d_global"),
                     a.integer("column_offset"), options(a))});
}

template <class A>
void rms_norm_shard_forward(A &a) {
  a.ret({shard_forward(a.backend(), a.in("input"), a.in("stats"), a.integer("d_global"),
                       a.integer("column_offset"), a.in("weight"), a.in("bias"), options(a))});
}

template <class A>
void rms_norm_shard_backward_dots(A &a) {
  a.ret({shard_backward_dots(a.backend(), a.in("grad_output"), a.in("input"), a.in("stats"),
                             a.integer("d_global"), a.integer("column_offset"), a.in("weight"),
                             options(a))});
}

template <class A>
void rms_norm_shard_backward(A &a) {
  auto g = shard_backward(a.backend(), a.in("grad_output"), a.in("input"), a.in("stats"),
                          a.in("dots"), a.integer("d_global"), a.integer("column_offset"),
                          a.in("weight"), a.in("bias"), options(a), a.mask(1), a.mask(2));
  a.ret({a.mask(0) ? g.dx : decltype(g.dx)(), g.dweight, g.dbias});
}

}  // namespace kernels
}  // namespace rncore

#endif
