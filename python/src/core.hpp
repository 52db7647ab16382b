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
 *   Array empty_quant(Dims, int store);     codes or scales of a Store kind (int8,
 *                                           float8_e4m3fn, uint8, float8_e8m0fnu)
 *   Array scalar_f32(float);                a 0-d float32 array
 *   void writable(const Array&, const char *what);  refuse an output that
 *                                           cannot be written where it is
 *   Array index(const Array&, const char *what);  an array of integers as a
 *                                           C-contiguous int64 one (or itself);
 *                                           others refused (message "index_dtype")
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
    {"same_device", "Tensor on device {device} is not on the expected device {ref_device}! "
                    "({what} is on {device}, {ref} on {ref_device}: materialize every argument "
                    "on one device)"},
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
    {"qformat", "format must be one of 'int8', 'fp8_e4m3', 'q8_0', 'q8_1', 'q8_k', 'mxfp8', "
                "'mxfp4'; got {format}"},
    {"qoptions", "format {format} with group = {group}, pow2_scale = {pow2}, scale = {scale}: "
                 "group, pow2_scale and scale apply to int8 and fp8_e4m3 only, group is 0 (one "
                 "scale per row) or a multiple of 32, and a static scale takes neither"},
    {"qsize", "format {format} needs rows of a positive multiple of {block} elements "
              "({unit}); normalized_shape {norm} has {d}"},
    {"gate_activation", "activation must be 'silu' (or its other name 'swish') or 'sigmoid', "
                        "got {activation}"},
    {"gate_group", "group_size must be 0 (one statistic per row) or a positive divisor of the "
                   "last dim, {d}; got {group}"},
    {"index_dtype", "{what} has dtype {dtype}; it must hold integers (int64)"},
    {"rope_style", "style must be 'neox' (pairs i, i + rotary_dim/2: rotate-half) or 'gptj' "
                   "(pairs 2i, 2i + 1: interleaved), got {style}"},
    {"rope_dim", "rotary_dim must be 0 (head_dim) or an even number of at most head_dim, "
                 "{head_dim}; got {rotary_dim}"},
    {"rope_table", "cos_sin has shape {shape}; expected (n_positions, {rotary_dim}): per position "
                   "the cos of the rotary_dim/2 frequencies, then their sin"},
    {"rope_positions", "positions has {n} values (shape {shape}); expected one per token, "
                       "{tokens}, or a shape that broadcasts to the input's leading dims"},
    {"rope_rows", "cos_sin has {n} rows; without positions token t takes row t, so it needs one "
                  "per token, {tokens}"},
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

/* mean and rstd (and rmsnorm_linear_*'s matrices) are float for fp32/fp16/bf16 data, double
 * for fp64. */
inline int stats_dtype(int dt) { return dt == RMSNORM_F64 ? RMSNORM_F64 : RMSNORM_F32; }

/* QK: RMSNorm over the last dim of an input of shape (*, heads, head_dim). */
enum Norm { RMS, LAYER, QK };

struct Options {
  std::optional<double> eps;  // none: the library's default for the dtype
  double partial = 1.0;
  unsigned flags = 0;  // RMSNORM_FLAG_*
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
inline std::optional<std::pair<int64_t, int64_t>> row_layout(Dims shape, Dims strides,
                                                            std::size_t k) {
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

template <class B>
using Array = typename B::Array;

/* a itself when C-contiguous, else a contiguous copy. */
template <class B>
Array<B> dense(B &b, const Array<B> &a) {
  return B::is_contiguous(a) ? a : b.contiguous(a);
}

/* An array seen as rows x d, row i at ptr + i*ld elements. */
template <class B>
struct Rows {
  Array<B> array;  // whose memory ptr is in: the input, or a copy
  int64_t rows = 0, d = 0, ld = 0;
  void *ptr = nullptr;
};

/* a as rows x d (its last k dims): itself when it has a row-strided view, else a copy. An
 * array the library writes in place (`written`: its name; out=, inplace) must have the view
 * and be writable where it is. */
template <class B>
Rows<B> as_rows(B &b, const Array<B> &a, std::size_t k, const char *written = nullptr) {
  if (written) b.writable(a, written);
  Dims shape = B::shape(a), st;
  int64_t rows = prod(shape.first(shape.size() - k)), d = prod(shape.last(k));
  if (B::is_contiguous(a)) return {a, rows, d, d, B::ptr(a)};
  if (b.strides(a, &st))
    if (auto lay = row_layout(shape, st, k)) return {a, lay->first, d, lay->second, B::ptr(a)};
  if (written)
    value_error(std::string(written) +
                " must hold the normalized dims contiguously and its rows at one stride (a "
                "contiguous array, or a row slice of one) to be written in place");
  auto c = b.contiguous(a);
  return {c, rows, d, d, B::ptr(c)};
}

/* A new per-row array: shape with its last k dims made 1, none when not wanted; `fill` when
 * those k dims hold no element (the library writes nothing then). */
template <class B>
Array<B> per_row_out(B &b, bool want, Dims shape, std::size_t k, int dtype, double fill) {
  if (!want) return Array<B>();
  Shape s(shape.begin(), shape.end() - static_cast<std::ptrdiff_t>(k));
  s.insert(s.end(), k, 1);
  return prod(shape.last(k)) ? b.empty(s, dtype) : b.full(s, dtype, fill);
}

/* Runs the library call f(ctx, &cfg) on the calling thread's context with the backend's guard
 * held (the GIL released for numpy, for `elements` elements), then checks its status. */
template <class B, class F>
void run(B &b, int dt, int param_dtype, const Options &o, int64_t elements, const char *fn,
         F &&f) {
  rmsnorm_config cfg = config(dt, param_dtype, o);
  rmsnorm_context *ctx = b.context();
  rmsnorm_status st;
  {
    [[maybe_unused]] auto unlocked = b.unlocked(static_cast<std::size_t>(elements));
    st = f(ctx, &cfg);
  }
  check(st, fn);
}

/* ---- argument checks ---------------------------------------------------------- */

template <class B>
int data_dtype(const Array<B> &a, const char *what) {
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
void check_same(const Array<B> &a, Dims shape, int dt, const char *what, const char *ref_what) {
  Dims s = B::shape(a);
  if (!std::equal(s.begin(), s.end(), shape.begin(), shape.end()))
    value_error(message("same_shape", {{"what", what}, {"shape", list(s)}, {"ref", ref_what},
                                       {"ref_shape", list(shape)}}));
  if (data_dtype<B>(a, what) != dt)
    type_error(message("same_dtype", {{"what", what}, {"dtype", B::dtype_name(a)},
                                      {"ref", ref_what}, {"ref_dtype", dtype_name(dt)}}));
}

/* A saved mean or rstd (dtype stats_dtype(dt)), or a shard's per-row sums (`sums`: float64
 * whatever the data), as the library takes it: rows contiguous values. */
template <class B>
Array<B> per_row_arg(B &b, const Array<B> &s, const char *name, int dt, int64_t rows,
                     bool sums = false) {
  if (!B::defined(s)) return s;
  if (sums && B::dtype(s) != RMSNORM_F64)
    type_error(message("row_sums", {{"what", name}, {"dtype", B::dtype_name(s)}}));
  if (!sums && B::dtype(s) != stats_dtype(dt))
    type_error(std::string(name) + " has dtype " + B::dtype_name(s) + "; it must be " +
               dtype_name(stats_dtype(dt)) + " for " + dtype_name(dt) +
               " data (as the forward returns it)");
  int64_t n = prod(B::shape(s));
  if (n != rows)
    value_error(std::string(name) + " has " + std::to_string(n) + " values (shape " +
                list(B::shape(s)) + "); expected one per row, " + std::to_string(rows));
  return dense(b, s);
}

/* The weight and bias as the library takes them: shape normalized_shape,
 * contiguous, and one parameter dtype for both, the data's or float32 (other
 * float dtypes are converted to float32, exactly for float16/bfloat16). */
template <class B>
struct Params {
  Array<B> weight, bias;
  int param_dtype = -1;
  int weight_dtype = -1, bias_dtype = -1;  // the caller's, to give gradients back in
};

template <class B>
int param_code(const Array<B> &p, const char *name, Dims norm) {
  int code = data_dtype<B>(p, name);
  Dims s = B::shape(p);
  if (!std::equal(s.begin(), s.end(), norm.begin(), norm.end()))
    value_error(message("param_shape", {{"what", name}, {"shape", list(s)}, {"norm", list(norm)}}));
  return code;
}

template <class B>
Params<B> params(B &b, int dt, Dims norm, const Array<B> &weight, const Array<B> &bias,
                 const char *weight_name = "weight", std::optional<Dims> bias_shape = {}) {
  Params<B> p;
  if (B::defined(weight)) p.weight_dtype = param_code<B>(weight, weight_name, norm);
  if (B::defined(bias)) p.bias_dtype = param_code<B>(bias, "bias", bias_shape.value_or(norm));
  auto data_or_none = [dt](int code) { return code < 0 || code == dt; };
  p.param_dtype = data_or_none(p.weight_dtype) && data_or_none(p.bias_dtype) ? dt : RMSNORM_F32;
  auto prep = [&](const Array<B> &a, int code) -> Array<B> {
    if (!B::defined(a)) return a;
    return code != p.param_dtype ? b.cast(a, p.param_dtype) : dense(b, a);
  };
  p.weight = prep(weight, p.weight_dtype);
  p.bias = prep(bias, p.bias_dtype);
  return p;
}

template <class B>
void *ptr_or_null(const Array<B> &a) {
  return B::defined(a) ? B::ptr(a) : nullptr;
}

/* x (named what) of a norm over normalized_shape (QK: over x's last dim), checked in the
 * order of the messages: normalized_shape, x's dtype and shape, the arrays of x's shape and
 * dtype (`same`: array and name; absent ones skipped), the parameters, the flags.
 * across_heads (QK only): the parameters span a token's heads, (heads * head_dim,). */
template <class B>
struct NormIn {
  int dt;
  Dims shape;
  Params<B> p;
};

template <class B>
NormIn<B> norm_in(B &b, Norm kind, const Array<B> &x, const char *what, Dims norm,
                  const Array<B> &weight, const Array<B> &bias, const Options &o,
                  std::initializer_list<std::pair<const Array<B> *, const char *>> same = {},
                  bool across_heads = false) {
  if (kind != QK && norm.empty()) value_error(message("empty_norm", {}));
  for (int64_t v : norm)
    if (v < 0) value_error("normalized_shape must not be negative, got " + list(norm));
  int dt = data_dtype<B>(x, what);
  Dims shape = B::shape(x);
  if (kind == QK) {
    if (shape.size() < 2) value_error(message("heads", {{"what", what}, {"shape", list(shape)}}));
    norm = shape.last(1);
  }
  check_input(shape, norm, what);
  for (const auto &[a, name] : same)
    if (B::defined(*a)) check_same<B>(*a, shape, dt, name, what);
  int64_t flat[1] = {kind == QK ? shape[shape.size() - 2] * shape.back() : 0};
  Params<B> p = params(b, dt, across_heads ? Dims(flat, 1) : norm, weight, bias);
  if (kind == LAYER && (o.flags & RMSNORM_FLAG_EPS_OUTSIDE))
    value_error("eps_outside applies to rms_norm only");
  return {dt, shape, std::move(p)};
}

/* ---- gradients -------------------------------------------------------------------- */

template <class B>
struct Grads {
  Array<B> dx, dweight, dbias;
};

/* A new gradient of shape s, none when not wanted; 0 when there are no rows (the library
 * writes nothing then). */
template <class B>
Array<B> new_grad(B &b, bool want, Dims s, int dtype, int64_t rows) {
  if (!want) return Array<B>();
  return rows ? b.empty(s, dtype) : b.full(s, dtype, 0.0);
}

/* dx (x's shape and dtype dt), and dweight/dbias (shape pshape) when asked for (the output
 * mask's 1 and 2) and their parameter is given. */
template <class A, class B>
Grads<B> new_grads(A &a, B &b, const Params<B> &p, Dims shape, int dt, Dims pshape, int64_t rows) {
  return {b.empty(shape, dt),
          new_grad(b, a.mask(1) && B::defined(p.weight), pshape, p.param_dtype, rows),
          new_grad(b, a.mask(2) && B::defined(p.bias), pshape, p.param_dtype, rows)};
}

/* A gradient computed in dtype `have`, given back in the caller's `want`. */
template <class B>
Array<B> in_dtype(B &b, const Array<B> &g, int have, int want) {
  return B::defined(g) && have != want ? b.cast(g, want) : g;
}

/* Returns (dx when asked for, dweight, dbias), the latter in their parameters' dtypes. */
template <class A, class B>
void ret_grads(A &a, B &b, const Grads<B> &g, const Params<B> &p) {
  a.ret({a.mask(0) ? g.dx : Array<B>(), in_dtype(b, g.dweight, p.param_dtype, p.weight_dtype),
         in_dtype(b, g.dbias, p.param_dtype, p.bias_dtype)});
}

/* ---- QK-norm layouts ---------------------------------------------------------------- */

/* x of shape (*, heads, head_dim): the leading dims collapse to one token
 * stride, heads at one head stride, head_dim contiguous. */
struct HeadLayout {
  int64_t tokens = 0, heads = 0, head_dim = 0, ld_token = 0, ld_head = 0;
};

/* The layout of a (already checked) (*, heads, head_dim) array, or none. */
template <class B>
std::optional<HeadLayout> head_layout(B &b, const Array<B> &a) {
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
  int64_t span = (l.heads - 1) * l.ld_head + l.head_dim;  // a token's heads, first to last
  auto lead = collapse(shape, st, n - 2, span);
  if (!lead || l.ld_head < 0 || lead->second < 0) return std::nullopt;
  l.ld_token = lead->second;
  // rows must not overlap: token-major or head-major (the library checks too)
  bool token_major = l.ld_head >= l.head_dim && l.ld_token >= span;
  bool head_major =
      l.ld_token >= l.head_dim && l.ld_head >= (l.tokens - 1) * l.ld_token + l.head_dim;
  if (l.tokens * l.heads > 1 && !token_major && !head_major) return std::nullopt;
  return l;
}

template <class B>
struct HeadRows {
  Array<B> array;
  HeadLayout l;
};

/* a itself when it has a head layout, else a copy; in place, a must have one. */
template <class B>
HeadRows<B> as_heads(B &b, const Array<B> &a, bool inplace = false) {
  if (inplace) b.writable(a, "input");
  if (auto l = head_layout(b, a)) return {a, *l};
  if (inplace)
    value_error("qk_norm in place needs input's head_dim contiguous, its heads at one stride and "
                "its leading dims at one token stride, without overlapping rows");
  auto c = b.contiguous(a);
  return {c, *head_layout(b, c)};
}

/* ---- quantization and linear helpers ------------------------------------------------ */

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

/* The element kinds of quantized outputs (empty_quant); the first two are rmsnorm_qtype's. */
enum Store { ST_INT8 = RMSNORM_Q_INT8, ST_E4M3 = RMSNORM_Q_FP8_E4M3, ST_U8, ST_E8M0 };

/* The formats of rmsnorm_forward_quantized by their Python names. codes: the element kind of
 * the codes, per element (int8, e4m3) or bytes of blocks (uint8); block: the elements of a
 * block, 0 for int8/fp8_e4m3 (the group, or the row). */
struct QFormat {
  const char *name;
  rmsnorm_qformat format;
  Store codes;
  int64_t block;
};
inline constexpr QFormat kQFormats[] = {
    {"int8", RMSNORM_QF_INT8, ST_INT8, 0},  {"fp8_e4m3", RMSNORM_QF_FP8_E4M3, ST_E4M3, 0},
    {"q8_0", RMSNORM_QF_Q8_0, ST_U8, 32},    {"q8_1", RMSNORM_QF_Q8_1, ST_U8, 32},
    {"q8_k", RMSNORM_QF_Q8_K, ST_U8, 256},
    {"mxfp8", RMSNORM_QF_MXFP8_E4M3, ST_E4M3, 32}, {"mxfp4", RMSNORM_QF_MXFP4, ST_U8, 32}};

/* A row's quantized layout: the descriptor, a row's code bytes and scales. */
struct QLayout {
  const QFormat *f = nullptr;
  rmsnorm_quant q{};
  float static_scale = 0;
  std::size_t row_bytes = 0, row_scales = 0;
};

/* The format's layout for rows of normalized_shape `norm`, checked (the messages name the
 * Python arguments rather than the library's status alone). The caller points q.static_scale
 * at its copy's static_scale (when scale is given) before using q. */
inline QLayout qlayout(std::string_view format, int64_t group, bool pow2,
                       std::optional<double> scale, Dims norm) {
  QLayout l;
  for (const QFormat &f : kQFormats)
    if (format == f.name) l.f = &f;
  if (!l.f) value_error(message("qformat", {{"format", "'" + std::string(format) + "'"}}));
  rmsnorm_quant_init(&l.q, l.f->format);
  l.q.group = static_cast<std::size_t>(group);
  l.q.flags = pow2 ? static_cast<unsigned>(RMSNORM_QUANT_SCALE_POW2) : 0u;
  if (scale) l.static_scale = static_scale(*scale);
  l.q.static_scale = scale ? &l.static_scale : nullptr;
  int64_t d = prod(norm);
  rmsnorm_status st = group < 0 ? RMSNORM_ERROR_BAD_ARGUMENT
                                : rmsnorm_quant_row_size(&l.q, static_cast<std::size_t>(d),
                                                         &l.row_bytes, &l.row_scales);
  if (st == RMSNORM_ERROR_BAD_ARGUMENT)
    throw Error{Kind::Value,
                message("qoptions", {{"format", l.f->name}, {"group", std::to_string(group)},
                                     {"pow2", pow2 ? "True" : "False"},
                                     {"scale", scale ? number_text(*scale) : "None"}}),
                static_cast<int>(st)};
  if (st == RMSNORM_ERROR_BAD_SIZE) {
    int64_t block = l.f->block ? l.f->block : group ? group : 1;
    const char *unit = l.f->block ? "its block" : group ? "the group" : "any length";
    throw Error{Kind::Value,
                message("qsize", {{"format", l.f->name}, {"block", std::to_string(block)},
                                  {"unit", unit}, {"norm", list(norm)}, {"d", std::to_string(d)}}),
                static_cast<int>(st)};
  }
  check(st, "rmsnorm_quant_row_size");
  return l;
}

inline void require_linear(const char *what) {
  if (rmsnorm_linear_available() != RMSNORM_OK)
    throw Error{Kind::NotAvailable,
                std::string(what) + ": this librmsnorm was built without a BLAS (cblas_sgemm), "
                                    "so rmsnorm_linear_* is not available "
                                    "(RMSNORM_ERROR_NOT_AVAILABLE)",
                RMSNORM_ERROR_NOT_AVAILABLE};
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
 *   std::string text(name)  a str argument
 *   int dtype_arg(name)     a dtype argument as an rmsnorm_dtype code, -1 for others (numpy
 *                           only: the functions without a torch op)
 *   bool mask(k)            the k-th gradient is asked for
 *   void ret({...})         the outputs in the op's order: the front end returns those its
 *                           function or op has (none for a torch op that writes in place) */
namespace kernels {

template <class A>
Options options(A &a) {
  Options o{a.real("eps"), a.real("partial").value_or(1.0), 0};
  if (a.flag("offset")) o.flags |= RMSNORM_FLAG_WEIGHT_OFFSET;
  if (a.flag("eps_outside")) o.flags |= RMSNORM_FLAG_EPS_OUTSIDE;
  if (a.flag("round_before_weight")) o.flags |= RMSNORM_FLAG_ROUND_BEFORE_WEIGHT;
  if (a.flag("round_before_rotation")) o.flags |= RMSNORM_FLAG_ROUND_BEFORE_ROTATION;
  if (a.flag("float_rotation")) o.flags |= RMSNORM_FLAG_FLOAT_ROTATION;
  return o;
}


/* y = norm(x) into a new contiguous array, or into out= (its rows at one stride; out may be
 * x itself); with the statistics, mean (LAYER) and rstd of shape (*leading, 1, ..., 1). */
template <class A, class B = typename A::B>
void norm_forward(A &a, Norm kind) {
  B &b = a.backend();
  Dims norm = a.norm();
  auto x = a.in("input"), out = a.target("out");
  Options o = options(a);
  auto [dt, shape, p] = norm_in(b, kind, x, "input", norm, a.in("weight"), a.in("bias"), o);
  bool want = a.want_stats();
  std::size_t k = norm.size();
  int64_t ldy = prod(norm);
  if (B::defined(out)) {
    check_same<B>(out, shape, dt, "out", "input");
    ldy = as_rows(b, out, k, "out").ld;
  }
  Rows<B> xr = as_rows(b, x, k);
  auto y = B::defined(out) ? out : b.empty(shape, dt);
  // d == 0: nothing to normalize; torch gives mean 0 and rstd NaN
  auto mean = per_row_out(b, want && kind == LAYER, shape, k, stats_dtype(dt), 0.0);
  auto rstd = per_row_out(b, want, shape, k, stats_dtype(dt), NAN);
  if (xr.d)
    run(b, dt, p.param_dtype, o, xr.rows * xr.d,
        kind == RMS ? "rmsnorm_forward" : "rmsnorm_layernorm_forward", [&](auto ctx, auto cfg) {
      void *w = ptr_or_null<B>(p.weight), *bias = ptr_or_null<B>(p.bias), *yp = B::ptr(y);
      return kind == RMS ? rmsnorm_forward(ctx, cfg, xr.rows, xr.d, xr.ptr, xr.ld, w, bias, yp,
                                           ldy, ptr_or_null<B>(rstd))
                         : rmsnorm_layernorm_forward(ctx, cfg, xr.rows, xr.d, xr.ptr, xr.ld, w,
                                                     bias, yp, ldy, ptr_or_null<B>(mean),
                                                     ptr_or_null<B>(rstd));
    });
  if (!want) a.ret({y});
  else if (kind == RMS) a.ret({y, rstd});
  else a.ret({y, mean, rstd});
}

/* (dx, dweight, dbias); dweight/dbias only when asked for and their parameter is given (bias
 * only tells the dtype and shape of dbias). */
template <class A, class B = typename A::B>
void norm_backward(A &a, Norm kind) {
  B &b = a.backend();
  Dims norm = a.norm();
  auto dy = a.in("grad_output"), x = a.in("input"), mean = a.in("mean"), rstd = a.in("rstd");
  Options o = options(a);
  auto [dt, shape, p] = norm_in(b, kind, x, "input", norm, a.in("weight"), a.in("bias"), o,
                                {{&dy, "grad_output"}});
  std::size_t k = norm.size();
  Rows<B> xr = as_rows(b, x, k), dyr = as_rows(b, dy, k);
  int64_t rows = xr.rows, d = xr.d;
  Grads<B> g = new_grads(a, b, p, shape, dt, norm, rows);
  if (d) {
    auto r = per_row_arg(b, rstd, "rstd", dt, rows), m = Array<B>();
    if (kind == LAYER) {
      m = per_row_arg(b, mean, "mean", dt, rows);
      if (B::defined(m) != B::defined(r))
        value_error("layer_norm_backward takes both mean and rstd, or neither");
    }
    run(b, dt, p.param_dtype, o, rows * d,
        kind == RMS ? "rmsnorm_backward" : "rmsnorm_layernorm_backward", [&](auto ctx, auto cfg) {
      void *w = ptr_or_null<B>(p.weight), *dw = ptr_or_null<B>(g.dweight),
           *db = ptr_or_null<B>(g.dbias), *dx = B::ptr(g.dx);
      return kind == RMS ? rmsnorm_backward(ctx, cfg, rows, d, xr.ptr, xr.ld, dyr.ptr, dyr.ld, w,
                                            ptr_or_null<B>(r), dx, d, dw, db)
                         : rmsnorm_layernorm_backward(ctx, cfg, rows, d, xr.ptr, xr.ld, dyr.ptr,
                                                      dyr.ld, w, ptr_or_null<B>(m),
                                                      ptr_or_null<B>(r), dx, d, dw, db);
    });
  }
  ret_grads(a, b, g, p);
}

template <class A> void rms_norm(A &a) { norm_forward(a, RMS); }
template <class A> void layer_norm(A &a) { norm_forward(a, LAYER); }
template <class A> void rms_norm_backward(A &a) { norm_backward(a, RMS); }
template <class A> void layer_norm_backward(A &a) { norm_backward(a, LAYER); }

/* The rows of a residual op (fused add + norm, sandwich): h, the residual, and u, the
 * sub-layer output, with y the normed output. In place, h and u themselves (both writable,
 * rows at one stride) and y = u; otherwise a new contiguous copy of h (the library updates
 * it), u as it is, and a new y. */
template <class B>
struct ResidualRows {
  Rows<B> h, u;
  Array<B> y;
};

template <class B, class DType, class Shape>
ResidualRows<B> residual_rows(B &b, const Array<B> &h, const Array<B> &u, std::size_t k,
                              DType dt, const Shape &shape, bool inplace) {
  if (inplace) return {as_rows(b, h, k, "residual"), as_rows(b, u, k, "input"), u};
  return {as_rows(b, b.cast(h, dt), k), as_rows(b, u, k), b.empty(shape, dt)};
}

/* ---- residual add + RMSNorm ------------------------------------------------------------ */

/* h' = h + u (rounded to the data dtype) and y = RMSNorm(h') in one pass, u the sub-layer
 * output ("input"), h the residual. In place, h' is written into h and y into u (both
 * writable, rows at one stride); otherwise h is copied first and y is new. */
template <class A, class B = typename A::B>
void fused_add_rms_norm(A &a) {
  B &b = a.backend();
  bool inplace = a.inplace(), want = a.want_stats();
  auto u = inplace ? a.target("input") : a.in("input");
  auto h = inplace ? a.target("residual") : a.in("residual");
  Dims norm = a.norm();
  Options o = options(a);
  auto [dt, shape, p] = norm_in(b, RMS, u, "input", norm, a.in("weight"), a.in("bias"), o,
                                {{&h, "residual"}});
  std::size_t k = norm.size();
  auto [hr, ur, y] = residual_rows(b, h, u, k, dt, shape, inplace);
  auto rstd = per_row_out(b, want, shape, k, stats_dtype(dt), NAN);
  if (hr.d)
    run(b, dt, p.param_dtype, o, hr.rows * hr.d, "rmsnorm_add_forward", [&](auto ctx, auto cfg) {
      return rmsnorm_add_forward(ctx, cfg, hr.rows, hr.d, hr.ptr, hr.ld, ur.ptr, ur.ld,
                                 ptr_or_null<B>(p.weight), ptr_or_null<B>(p.bias), B::ptr(y),
                                 inplace ? ur.ld : hr.d, ptr_or_null<B>(rstd));
    });
  if (want) a.ret({y, hr.array, rstd});
  else a.ret({y, hr.array});
}

/* (dh, dweight, dbias): dh = dres + the norm's backward at h' (new_residual), the gradient
 * of both input and residual; dres none is 0. */
template <class A, class B = typename A::B>
void fused_add_rms_norm_backward(A &a) {
  B &b = a.backend();
  auto dy = a.in("grad_output"), dres = a.in("grad_residual", true), h = a.in("new_residual");
  Dims norm = a.norm();
  auto rstd = a.in("rstd");
  Options o = options(a);
  auto [dt, shape, p] = norm_in(b, RMS, h, "new_residual", norm, a.in("weight"), a.in("bias"), o,
                                {{&dy, "grad_output"}, {&dres, "grad_residual"}});
  std::size_t k = norm.size();
  Rows<B> hr = as_rows(b, h, k), dyr = as_rows(b, dy, k), drr;
  if (B::defined(dres)) drr = as_rows(b, dres, k);
  int64_t rows = hr.rows, d = hr.d;
  Grads<B> g = new_grads(a, b, p, shape, dt, norm, rows);
  if (d) {
    auto r = per_row_arg(b, rstd, "rstd", dt, rows);
    run(b, dt, p.param_dtype, o, rows * d, "rmsnorm_add_backward", [&](auto ctx, auto cfg) {
      return rmsnorm_add_backward(ctx, cfg, rows, d, hr.ptr, hr.ld, dyr.ptr, dyr.ld, drr.ptr,
                                  B::defined(dres) ? drr.ld : d, ptr_or_null<B>(p.weight),
                                  ptr_or_null<B>(r), B::ptr(g.dx), d, ptr_or_null<B>(g.dweight),
                                  ptr_or_null<B>(g.dbias));
    });
  }
  ret_grads(a, b, g, p);
}

/* ---- QK-norm: RMSNorm of every head of every token ------------------------------------- */

/* y new and contiguous, or x itself in place (which needs x's layout and writability);
 * rstd (*, heads, 1). */
template <class A, class B = typename A::B>
void qk_norm(A &a) {
  B &b = a.backend();
  bool inplace = a.inplace(), want = a.want_stats();
  auto x = inplace ? a.target("input") : a.in("input");
  Options o = options(a);
  auto [dt, shape, p] = norm_in(b, QK, x, "input", {}, a.in("weight"), a.in("bias"), o);
  HeadRows<B> xr = as_heads(b, x, inplace);
  const HeadLayout &l = xr.l;
  auto y = inplace ? x : b.empty(shape, dt);
  auto rstd = per_row_out(b, want, shape, 1, stats_dtype(dt), NAN);
  if (l.head_dim)
    run(b, dt, p.param_dtype, o, l.tokens * l.heads * l.head_dim, "rmsnorm_qk_norm_forward",
        [&](auto ctx, auto cfg) {
      return rmsnorm_qk_norm_forward(ctx, cfg, l.tokens, l.heads, l.head_dim, B::ptr(xr.array),
                                     l.ld_token, l.ld_head, ptr_or_null<B>(p.weight),
                                     ptr_or_null<B>(p.bias), B::ptr(y),
                                     inplace ? l.ld_token : l.heads * l.head_dim,
                                     inplace ? l.ld_head : l.head_dim, ptr_or_null<B>(rstd));
    });
  if (want) a.ret({y, rstd});
  else a.ret({y});
}

/* dx, and dweight/dbias summed over tokens and heads. rstd none: recomputed. */
template <class A, class B = typename A::B>
void qk_norm_backward(A &a) {
  B &b = a.backend();
  auto dy = a.in("grad_output"), x = a.in("input"), rstd = a.in("rstd");
  Options o = options(a);
  auto [dt, shape, p] = norm_in(b, QK, x, "input", {}, a.in("weight"), a.in("bias"), o,
                                {{&dy, "grad_output"}});
  HeadRows<B> xr = as_heads(b, x), dyr = as_heads(b, dy);
  const HeadLayout &l = xr.l;
  int64_t rows = l.tokens * l.heads;
  Grads<B> g = new_grads(a, b, p, shape, dt, shape.last(1), rows);
  if (l.head_dim) {
    auto r = per_row_arg(b, rstd, "rstd", dt, rows);
    run(b, dt, p.param_dtype, o, rows * l.head_dim, "rmsnorm_qk_norm_backward",
        [&](auto ctx, auto cfg) {
      return rmsnorm_qk_norm_backward(ctx, cfg, l.tokens, l.heads, l.head_dim, B::ptr(xr.array),
                                      l.ld_token, l.ld_head, B::ptr(dyr.array), dyr.l.ld_token,
                                      dyr.l.ld_head, ptr_or_null<B>(p.weight), ptr_or_null<B>(r),
                                      B::ptr(g.dx), l.heads * l.head_dim, l.head_dim,
                                      ptr_or_null<B>(g.dweight), ptr_or_null<B>(g.dbias));
    });
  }
  ret_grads(a, b, g, p);
}

/* ---- QK-norm + RoPE: RMSNorm of every head, then its rotation -------------------------
 * input (*, heads, head_dim) as QK-norm's, one weight (head_dim,) (across_heads: one
 * statistic per token over its heads, weight (heads * head_dim,)); the rotation's table
 * cos_sin (n_positions, rotary_dim) (a position's cos of the rotary_dim/2 frequencies, then
 * their sin; any float dtype, used in the compute type), token t at row positions[t] (any
 * integers, as int64) or t. See rmsnorm.h for the formulas. */

template <class B>
struct RopeIn {
  rmsnorm_rope rope;
  Array<B> table, positions;  // what rope points into
  std::vector<int64_t> spread;  // or positions broadcast over the leading dims
};

/* positions of shape `pos` broadcast to the leading dims `lead` (numpy's rules: aligned at
 * the right, each dim equal or 1), one per token in order; false when they do not
 * broadcast. As transformers passes position_ids of (1, seq) for a batch. */
inline bool spread_positions(const int64_t *p, Dims pos, Dims lead, std::vector<int64_t> &out) {
  if (pos.size() > lead.size()) return false;
  std::size_t off = lead.size() - pos.size();
  std::vector<int64_t> stride(lead.size(), 0);  // pos's element stride per lead dim (0: broadcast)
  int64_t st = 1;
  for (std::size_t i = pos.size(); i-- > 0;) {
    if (pos[i] != lead[off + i] && pos[i] != 1) return false;
    stride[off + i] = pos[i] == 1 ? 0 : st;
    st *= pos[i];
  }
  out.assign(static_cast<std::size_t>(prod(lead)), 0);
  std::vector<int64_t> idx(lead.size(), 0);
  for (std::size_t t = 0; t < out.size(); t++) {
    int64_t at = 0;
    for (std::size_t i = 0; i < lead.size(); i++) at += idx[i] * stride[i];
    out[t] = p[at];
    for (std::size_t i = lead.size(); i-- > 0;)  // the next index, last dim fastest
      if (++idx[i] < lead[i]) break;
      else idx[i] = 0;
  }
  return true;
}

/* The rotation of the arguments style, rotary_dim, cos_sin and positions for rows laid out
 * as l, checked (the messages the fake kernels give too). */
template <class A, class B = typename A::B>
RopeIn<B> rope_of(A &a, int dt, const HeadLayout &l, Dims shape) {
  B &b = a.backend();
  RopeIn<B> r;
  std::string style = a.text("style");
  if (style != "neox" && style != "gptj")
    value_error(message("rope_style", {{"style", "'" + style + "'"}}));
  rmsnorm_rope_init(&r.rope, style == "neox" ? RMSNORM_ROPE_NEOX : RMSNORM_ROPE_GPTJ);
  if (a.flag("across_heads")) r.rope.norm = RMSNORM_ROPE_NORM_TOKEN;
  int64_t rot = a.integer("rotary_dim");
  if (rot < 0 || rot % 2 || rot > l.head_dim)
    value_error(message("rope_dim", {{"head_dim", std::to_string(l.head_dim)},
                                     {"rotary_dim", std::to_string(rot)}}));
  int64_t rd = rot ? rot : l.head_dim;
  auto cs = a.in("cos_sin");
  int cs_dtype = data_dtype<B>(cs, "cos_sin");
  Dims cshape = B::shape(cs);
  if (cshape.size() != 2 || cshape[1] != rd)
    value_error(message("rope_table", {{"shape", list(cshape)},
                                       {"rotary_dim", std::to_string(rd)}}));
  r.table = cs_dtype != stats_dtype(dt) ? b.cast(cs, stats_dtype(dt)) : dense(b, cs);
  r.rope.rotary_dim = static_cast<size_t>(rd);
  r.rope.cos_sin = B::ptr(r.table);
  r.rope.n_positions = static_cast<size_t>(cshape[0]);
  auto pos = a.in("positions");
  if (B::defined(pos)) {
    r.positions = b.index(pos, "positions");
    int64_t n = prod(B::shape(pos));
    const auto *p = static_cast<const int64_t *>(B::ptr(r.positions));
    if (n != l.tokens && !spread_positions(p, B::shape(pos), shape.first(shape.size() - 2),
                                           r.spread))
      value_error(message("rope_positions", {{"n", std::to_string(n)},
                                             {"shape", list(B::shape(pos))},
                                             {"tokens", std::to_string(l.tokens)}}));
    r.rope.positions = n == l.tokens ? p : r.spread.data();
  } else if (cshape[0] < l.tokens) {
    value_error(message("rope_rows", {{"n", std::to_string(cshape[0])},
                                      {"tokens", std::to_string(l.tokens)}}));
  }
  return r;
}

/* Where the library found a position or a slot out of range (RMSNORM_ERROR_OUT_OF_RANGE;
 * it writes nothing then): the first offending entry, in the order it checks them (the
 * cache's slots, then the positions), named with its value and its bound. */
[[noreturn]] inline void rope_range_error(const rmsnorm_rope &r, const rmsnorm_kv_cache *c,
                                          int64_t tokens) {
  std::string m = "a position or cache slot is out of range";
  auto at = [](const char *what, int64_t i, int64_t v) {
    return std::string(what) + "[" + std::to_string(i) + "] = " + std::to_string(v);
  };
  bool found = false;
  for (int64_t t = 0; c && t < tokens && !found; t++)
    if (c->slots[t] >= 0 && static_cast<uint64_t>(c->slots[t]) >= c->n_slots) {
      m = at("slots", t, c->slots[t]) + " is past the cache's " + std::to_string(c->n_slots) +
          " slots";
      found = true;
    }
  for (int64_t t = 0; r.positions && t < tokens && !found; t++)
    if (r.positions[t] < 0 || static_cast<uint64_t>(r.positions[t]) >= r.n_positions) {
      m = at("positions", t, r.positions[t]) + " is outside [0, " +
          std::to_string(r.n_positions) + "), the rows of cos_sin";
      found = true;
    }
  throw Error{Kind::Value, m + " (" + rmsnorm_status_name(RMSNORM_ERROR_OUT_OF_RANGE) + ")",
              static_cast<int>(RMSNORM_ERROR_OUT_OF_RANGE)};
}

/* run() for the library's QK-norm + RoPE calls: a range error names its entry. */
template <class B, class F>
void rope_run(B &b, int dt, int param_dtype, const Options &o, int64_t elements, const char *fn,
              const rmsnorm_rope &r, const rmsnorm_kv_cache *c, int64_t tokens, F &&f) {
  try {
    run(b, dt, param_dtype, o, elements, fn, std::forward<F>(f));
  } catch (const Error &e) {
    if (e.status == static_cast<int>(RMSNORM_ERROR_OUT_OF_RANGE)) rope_range_error(r, c, tokens);
    throw;
  }
}

/* A KV cache of the arguments k_cache, slots, v and v_cache (rmsnorm_kv_cache): caches of
 * shape (*, heads, head_dim) and the data's dtype, written where they are (their leading
 * dims, the slots, at one stride; v_cache laid out as k_cache), v of input's shape. */
template <class B>
struct CacheIn {
  rmsnorm_kv_cache c;
  Array<B> k, v, v_src, slots;
};

template <class B>
HeadLayout cache_layout(B &b, const Array<B> &c, const char *what, int dt, const HeadLayout &l) {
  b.writable(c, what);
  if (data_dtype<B>(c, what) != dt)
    type_error(message("same_dtype", {{"what", what}, {"dtype", B::dtype_name(c)},
                                      {"ref", "input"}, {"ref_dtype", dtype_name(dt)}}));
  Dims s = B::shape(c);
  if (s.size() < 2 || s[s.size() - 2] != l.heads || s.back() != l.head_dim)
    value_error(std::string(what) + " has shape " + list(s) + "; expected (*, " +
                std::to_string(l.heads) + ", " + std::to_string(l.head_dim) +
                "): slots of input's heads and head_dim");
  auto cl = head_layout(b, c);
  if (!cl)
    value_error(std::string(what) + " must hold head_dim contiguously, its heads at one stride "
                "and its slots at one stride, without overlapping rows, to be written in place");
  return *cl;
}

template <class A, class B = typename A::B>
CacheIn<B> cache_of(A &a, int dt, Dims shape, const HeadLayout &l) {
  B &b = a.backend();
  CacheIn<B> k;
  k.k = a.target("k_cache");
  k.v = a.target("v_cache");
  auto v = a.in("v");
  HeadLayout kl = cache_layout(b, k.k, "k_cache", dt, l);
  if (B::defined(v) != B::defined(k.v))
    value_error("v and v_cache come together (the V heads to copy and where to)");
  rmsnorm_kv_cache_init(&k.c);
  if (B::defined(v)) {
    check_same<B>(v, shape, dt, "v", "input");
    HeadLayout vl = cache_layout(b, k.v, "v_cache", dt, l);
    if (vl.tokens != kl.tokens || vl.ld_token != kl.ld_token || vl.ld_head != kl.ld_head)
      value_error("v_cache must have k_cache's shape and strides");
    HeadRows<B> vr = as_heads(b, v);
    k.v_src = vr.array;
    k.c.v = B::ptr(k.v);
    k.c.v_src = B::ptr(vr.array);
    k.c.ldv_token = static_cast<size_t>(vr.l.ld_token);
    k.c.ldv_head = static_cast<size_t>(vr.l.ld_head);
  }
  auto slots = a.in("slots");
  k.slots = b.index(slots, "slots");
  int64_t n = prod(B::shape(slots));
  if (n != l.tokens)
    value_error("slots has " + std::to_string(n) + " values (shape " + list(B::shape(slots)) +
                "); expected one per token, " + std::to_string(l.tokens));
  k.c.k = B::ptr(k.k);
  k.c.n_slots = static_cast<size_t>(kl.tokens);
  k.c.ld_slot = static_cast<size_t>(kl.ld_token);
  k.c.ld_head = static_cast<size_t>(kl.ld_head);
  k.c.slots = static_cast<const int64_t *>(B::ptr(k.slots));
  return k;
}

/* y (new, contiguous; rstd (*, heads, 1) with the statistics, (*, 1, 1) across heads), or
 * with `cache` only the cache's slots (k_cache, and v copied into v_cache), returned as
 * (k_cache, v_cache). */
template <class A, class B = typename A::B>
void rope_forward(A &a, bool cache) {
  B &b = a.backend();
  bool want = a.want_stats(), across = a.flag("across_heads");
  auto x = a.in("input");
  Options o = options(a);
  auto [dt, shape, p] =
      norm_in(b, QK, x, "input", {}, a.in("weight", true), Array<B>(), o, {}, across);
  HeadRows<B> xr = as_heads(b, x);
  const HeadLayout &l = xr.l;
  RopeIn<B> r = rope_of(a, dt, l, shape);
  CacheIn<B> c;
  if (cache) c = cache_of(a, dt, shape, l);
  auto y = cache ? Array<B>() : b.empty(shape, dt);
  auto rstd = per_row_out(b, want, shape, across ? 2 : 1, stats_dtype(dt), NAN);
  if (l.head_dim)
    rope_run(b, dt, p.param_dtype, o, l.tokens * l.heads * l.head_dim,
             "rmsnorm_qk_norm_rope_forward", r.rope, cache ? &c.c : nullptr, l.tokens,
             [&](auto ctx, auto cfg) {
      return rmsnorm_qk_norm_rope_forward(ctx, cfg, l.tokens, l.heads, l.head_dim,
                                          B::ptr(xr.array), l.ld_token, l.ld_head,
                                          ptr_or_null<B>(p.weight), &r.rope,
                                          cache ? &c.c : nullptr, ptr_or_null<B>(y),
                                          l.heads * l.head_dim, l.head_dim,
                                          ptr_or_null<B>(rstd));
    });
  if (cache) a.ret({c.k, c.v});
  else if (want) a.ret({y, rstd});
  else a.ret({y});
}

template <class A> void qk_norm_rope(A &a) { rope_forward(a, false); }
template <class A> void qk_norm_rope_cache(A &a) { rope_forward(a, true); }

/* (dx, dweight): dweight summed over tokens and heads (across heads: over tokens, of
 * heads * head_dim), only when asked for and weight is given. rstd none: recomputed. */
template <class A, class B = typename A::B>
void qk_norm_rope_backward(A &a) {
  B &b = a.backend();
  auto dy = a.in("grad_output"), x = a.in("input"), rstd = a.in("rstd");
  bool across = a.flag("across_heads");
  Options o = options(a);
  auto [dt, shape, p] = norm_in(b, QK, x, "input", {}, a.in("weight", true), Array<B>(), o,
                                {{&dy, "grad_output"}}, across);
  HeadRows<B> xr = as_heads(b, x), dyr = as_heads(b, dy);
  const HeadLayout &l = xr.l;
  RopeIn<B> r = rope_of(a, dt, l, shape);
  int64_t rows = l.tokens * l.heads, flat[1] = {l.heads * l.head_dim};
  auto dx = b.empty(shape, dt);
  auto dw = new_grad(b, a.mask(1) && B::defined(p.weight), across ? Dims(flat, 1) : shape.last(1),
                     p.param_dtype, rows);
  if (l.head_dim) {
    auto rs = per_row_arg(b, rstd, "rstd", dt, across ? l.tokens : rows);
    rope_run(b, dt, p.param_dtype, o, rows * l.head_dim, "rmsnorm_qk_norm_rope_backward",
             r.rope, nullptr, l.tokens, [&](auto ctx, auto cfg) {
      return rmsnorm_qk_norm_rope_backward(
          ctx, cfg, l.tokens, l.heads, l.head_dim, B::ptr(xr.array), l.ld_token, l.ld_head,
          B::ptr(dyr.array), dyr.l.ld_token, dyr.l.ld_head, ptr_or_null<B>(p.weight), &r.rope,
          ptr_or_null<B>(rs), B::ptr(dx), l.heads * l.head_dim, l.head_dim,
          ptr_or_null<B>(dw));
    });
  }
  a.ret({a.mask(0) ? dx : Array<B>(), in_dtype(b, dw, p.param_dtype, p.weight_dtype)});
}

/* A table for rmsnorm_rope (rmsnorm_rope_table): (n_positions, rotary_dim) of dtype
 * float32 or float64. */
template <class A, class B = typename A::B>
void rope_table(A &a) {
  B &b = a.backend();
  int64_t n = a.integer("n_positions"), rot = a.integer("rotary_dim");
  int dt = a.dtype_arg("dtype");
  if (dt != RMSNORM_F32 && dt != RMSNORM_F64)
    type_error(std::string("rope_table: dtype must be float32 or float64, got ") +
               (dt < 0 ? "another dtype" : dtype_name(dt)));
  if (n < 0) value_error("rope_table: n_positions must be >= 0, got " + std::to_string(n));
  if (rot <= 0) value_error("rope_table: rotary_dim must be > 0, got " + std::to_string(rot));
  int64_t s[2] = {n, rot};
  double theta = *a.real("theta"), factor = *a.real("linear_factor");
  auto t = b.empty(Dims(s, 2), dt);
  rmsnorm_status st = rmsnorm_rope_table(B::ptr(t), static_cast<rmsnorm_dtype>(dt),
                                         static_cast<size_t>(n), static_cast<size_t>(rot), theta,
                                         factor);
  if (st == RMSNORM_ERROR_BAD_ROPE) {  // the argument that makes no rotation, named
    auto repr = [](double v) {  // as Python's repr writes a float: 1.0, not 1
      std::string txt = number_text(v);
      return txt.find_first_not_of("-0123456789") == std::string::npos ? txt + ".0" : txt;
    };
    std::string m = rot % 2 ? "rotary_dim = " + std::to_string(rot) + " must be even"
                    : !(theta > 1 && std::isfinite(theta))
                        ? "theta = " + repr(theta) + " must be a finite number > 1"
                        : "linear_factor = " + repr(factor) + " must be a finite number > 0";
    throw Error{Kind::Value, "rope_table: " + m + " (" + rmsnorm_status_name(st) + ")",
                static_cast<int>(st)};
  }
  check(st, "rmsnorm_rope_table");
  a.ret({t});
}

/* ---- gated RMSNorm ---------------------------------------------------------------------
 * Over the last dim d of input and gate (one shape and dtype), one statistic per group of
 * group_size columns (0: the row), the weight (d,) of the data's dtype or float32. */

/* The rmsnorm_gate of the arguments activation, group_size and norm_before_gate, checked
 * against d. */
template <class A>
rmsnorm_gate gate_of(A &a, int64_t d) {
  std::string act = a.text("activation");
  rmsnorm_gate g;
  if (act == "silu" || act == "swish") rmsnorm_gate_init(&g, RMSNORM_GATE_SILU);
  else if (act == "sigmoid") rmsnorm_gate_init(&g, RMSNORM_GATE_SIGMOID);
  else value_error(message("gate_activation", {{"activation", "'" + act + "'"}}));
  int64_t group = a.integer("group_size");
  if (group < 0 || (group > 0 && d % group != 0))
    value_error(
        message("gate_group", {{"d", std::to_string(d)}, {"group", std::to_string(group)}}));
  g.group = static_cast<std::size_t>(group);
  if (a.flag("norm_before_gate")) g.flags |= RMSNORM_GATE_NORM_FIRST;
  return g;
}

/* Statistics per row: d / group_size (1 for group_size 0). */
inline int64_t gate_groups(const rmsnorm_gate &g, int64_t d) {
  return g.group ? d / static_cast<int64_t>(g.group) : 1;
}

/* The checked arguments of a gated norm: input x (named what), gate z and weight; the arrays
 * of x's shape and dtype in `same` (grad_output) are checked too. */
template <class B>
struct GatedIn {
  int dt;
  Dims shape;
  Params<B> p;
  rmsnorm_gate gate;
  int64_t d, groups;
};

template <class A, class B = typename A::B>
GatedIn<B> gated_in(A &a, const Array<B> &x, const Array<B> &z, const Options &o,
                    std::initializer_list<std::pair<const Array<B> *, const char *>> same = {}) {
  B &b = a.backend();
  int dt = data_dtype<B>(x, "input");
  Dims shape = B::shape(x);
  if (shape.empty()) value_error(message("linear_rank", {}));
  check_same<B>(z, shape, dt, "gate", "input");
  auto [dt2, shape2, p] = norm_in(b, RMS, x, "input", shape.last(1), a.in("weight"), Array<B>(),
                                  o, same);
  int64_t d = shape.back();
  rmsnorm_gate g = gate_of(a, d);
  return {dt2, shape2, std::move(p), g, d, gate_groups(g, d)};
}

/* y (and rstd, (*leading, groups)) of the gated norm, new and contiguous. */
template <class A, class B = typename A::B>
void gated_rms_norm(A &a) {
  B &b = a.backend();
  auto x = a.in("input"), z = a.in("gate");
  Options o = options(a);
  GatedIn<B> in = gated_in(a, x, z, o);
  Rows<B> xr = as_rows(b, x, 1), zr = as_rows(b, z, 1);
  auto y = b.empty(in.shape, in.dt);
  bool want = a.want_stats();
  Array<B> rstd;
  if (want) {
    Shape s(in.shape.begin(), in.shape.end() - 1);
    s.push_back(in.groups);
    rstd = in.d ? b.empty(s, stats_dtype(in.dt)) : b.full(s, stats_dtype(in.dt), NAN);
  }
  if (in.d)
    run(b, in.dt, in.p.param_dtype, o, xr.rows * in.d, "rmsnorm_gated_forward",
        [&](auto ctx, auto cfg) {
      return rmsnorm_gated_forward(ctx, cfg, &in.gate, xr.rows, in.d, xr.ptr, xr.ld, zr.ptr,
                                   zr.ld, ptr_or_null<B>(in.p.weight), B::ptr(y), in.d,
                                   ptr_or_null<B>(rstd));
    });
  if (want) a.ret({y, rstd});
  else a.ret({y});
}

/* (dx, dz, dweight): dweight only when asked for and weight is given. rstd: the forward's
 * (rows x groups values) or none (recomputed). */
template <class A, class B = typename A::B>
void gated_rms_norm_backward(A &a) {
  B &b = a.backend();
  auto dy = a.in("grad_output"), x = a.in("input"), z = a.in("gate"), rstd = a.in("rstd");
  Options o = options(a);
  GatedIn<B> in = gated_in(a, x, z, o, {{&dy, "grad_output"}});
  Rows<B> xr = as_rows(b, x, 1), zr = as_rows(b, z, 1), dyr = as_rows(b, dy, 1);
  int64_t rows = xr.rows, d = in.d;
  auto dx = b.empty(in.shape, in.dt), dz = b.empty(in.shape, in.dt);  // both always written
  auto dw = new_grad(b, a.mask(2) && B::defined(in.p.weight), in.shape.last(1),
                     in.p.param_dtype, rows);
  if (d) {
    if (B::defined(rstd) && in.groups != 1 && prod(B::shape(rstd)) != rows * in.groups)
      value_error("rstd has " + std::to_string(prod(B::shape(rstd))) + " values (shape " +
                  list(B::shape(rstd)) + "); expected one per group of each row, " +
                  std::to_string(rows * in.groups));
    auto r = per_row_arg(b, rstd, "rstd", in.dt, rows * in.groups);
    run(b, in.dt, in.p.param_dtype, o, rows * d, "rmsnorm_gated_backward",
        [&](auto ctx, auto cfg) {
      return rmsnorm_gated_backward(ctx, cfg, &in.gate, rows, d, xr.ptr, xr.ld, zr.ptr, zr.ld,
                                    dyr.ptr, dyr.ld, ptr_or_null<B>(in.p.weight),
                                    ptr_or_null<B>(r), B::ptr(dx), d, B::ptr(dz), d,
                                    ptr_or_null<B>(dw));
    });
  }
  a.ret({a.mask(0) ? dx : Array<B>(), a.mask(1) ? dz : Array<B>(),
         in_dtype(b, dw, in.p.param_dtype, in.p.weight_dtype)});
}

/* ---- sandwich norms (Gemma 2/3) ----------------------------------------------------------
 * new_residual = residual + post_norm(input), output = pre_norm(new_residual): input is the
 * sub-layer's output, residual the stream. */

/* The two norms' weights in one parameter dtype (the library takes one for both): the
 * data's when both are of it (or absent), else float32. */
template <class B>
struct PairParams {
  Array<B> post, pre;
  int param_dtype = -1, post_dtype = -1, pre_dtype = -1;  // the latter two: the caller's
};

template <class A, class B = typename A::B>
PairParams<B> pair_params(A &a, int dt, Dims norm) {
  B &b = a.backend();
  Params<B> post = params(b, dt, norm, a.in("post_weight"), Array<B>(), "post_weight");
  Params<B> pre = params(b, dt, norm, a.in("pre_weight"), Array<B>(), "pre_weight");
  int pdt = post.param_dtype == pre.param_dtype ? post.param_dtype : RMSNORM_F32;
  auto as = [&](const Params<B> &p) {
    return B::defined(p.weight) && p.param_dtype != pdt ? b.cast(p.weight, pdt) : p.weight;
  };
  return {as(post), as(pre), pdt, post.weight_dtype, pre.weight_dtype};
}

/* (output, new_residual[, rstd_post, rstd_pre]). In place, new_residual is written into
 * residual and output into input (both writable, rows at one stride); otherwise residual is
 * copied first and output is new. */
template <class A, class B = typename A::B>
void sandwich_rms_norm(A &a) {
  B &b = a.backend();
  bool inplace = a.inplace(), want = a.want_stats();
  auto u = inplace ? a.target("input") : a.in("input");
  auto h = inplace ? a.target("residual") : a.in("residual");
  Dims norm = a.norm();
  Options o = options(a);
  auto [dt, shape, unused] = norm_in(b, RMS, u, "input", norm, Array<B>(), Array<B>(), o,
                                     {{&h, "residual"}});
  PairParams<B> pp = pair_params(a, dt, norm);
  std::size_t k = norm.size();
  auto [hr, ur, y] = residual_rows(b, h, u, k, dt, shape, inplace);
  auto rpost = per_row_out(b, want, shape, k, stats_dtype(dt), NAN);
  auto rpre = per_row_out(b, want, shape, k, stats_dtype(dt), NAN);
  if (hr.d)
    run(b, dt, pp.param_dtype, o, hr.rows * hr.d, "rmsnorm_sandwich_forward",
        [&](auto ctx, auto cfg) {
      return rmsnorm_sandwich_forward(ctx, cfg, hr.rows, hr.d, ur.ptr, ur.ld, hr.ptr, hr.ld,
                                      ptr_or_null<B>(pp.post), ptr_or_null<B>(pp.pre),
                                      B::ptr(y), inplace ? ur.ld : hr.d, ptr_or_null<B>(rpost),
                                      ptr_or_null<B>(rpre));
    });
  if (want) a.ret({y, hr.array, rpost, rpre});
  else a.ret({y, hr.array});
}

/* (da, dh, dweight_post, dweight_pre): dh = grad_new_residual (none: 0) + pre_norm's dx at
 * new_residual, the residual's gradient; da = post_norm's dx at input from dh. */
template <class A, class B = typename A::B>
void sandwich_rms_norm_backward(A &a) {
  B &b = a.backend();
  auto dy = a.in("grad_output"), dres = a.in("grad_new_residual", true);
  auto u = a.in("input"), h = a.in("new_residual");
  Dims norm = a.norm();
  Options o = options(a);
  auto [dt, shape, unused] = norm_in(b, RMS, h, "new_residual", norm, Array<B>(), Array<B>(), o,
                                     {{&dy, "grad_output"}, {&dres, "grad_new_residual"},
                                      {&u, "input"}});
  PairParams<B> pp = pair_params(a, dt, norm);
  std::size_t k = norm.size();
  Rows<B> hr = as_rows(b, h, k), ur = as_rows(b, u, k), dyr = as_rows(b, dy, k), drr;
  if (B::defined(dres)) drr = as_rows(b, dres, k);
  int64_t rows = hr.rows, d = hr.d;
  auto da = b.empty(shape, dt), dh = b.empty(shape, dt);  // both always written
  auto dwpost = new_grad(b, a.mask(2) && B::defined(pp.post), norm, pp.param_dtype, rows);
  auto dwpre = new_grad(b, a.mask(3) && B::defined(pp.pre), norm, pp.param_dtype, rows);
  if (d) {
    auto rpost = per_row_arg(b, a.in("rstd_post"), "rstd_post", dt, rows);
    auto rpre = per_row_arg(b, a.in("rstd_pre"), "rstd_pre", dt, rows);
    run(b, dt, pp.param_dtype, o, rows * d, "rmsnorm_sandwich_backward", [&](auto ctx, auto cfg) {
      return rmsnorm_sandwich_backward(
          ctx, cfg, rows, d, ur.ptr, ur.ld, hr.ptr, hr.ld, drr.ptr, B::defined(dres) ? drr.ld : d,
          dyr.ptr, dyr.ld, ptr_or_null<B>(pp.post), ptr_or_null<B>(pp.pre), ptr_or_null<B>(rpost),
          ptr_or_null<B>(rpre), B::ptr(da), d, B::ptr(dh), d, ptr_or_null<B>(dwpost),
          ptr_or_null<B>(dwpre));
    });
  }
  a.ret({a.mask(0) ? da : Array<B>(), a.mask(1) ? dh : Array<B>(),
         in_dtype(b, dwpost, pp.param_dtype, pp.post_dtype),
         in_dtype(b, dwpre, pp.param_dtype, pp.pre_dtype)});
}

/* ---- RMSNorm with an 8-bit output ------------------------------------------------------- */

/* (q, scale): int8 or fp8 E4M3 codes. scale none: dynamic, one float32 per row, shape
 * (*leading, 1, ..., 1); else that static scale, given back as a 0-d float32 array. */
template <class A, class B = typename A::B>
void quant(A &a, rmsnorm_qtype qtype) {
  B &b = a.backend();
  auto x = a.in("input");
  Dims norm = a.norm();
  Options o = options(a);
  std::optional<double> scale = a.real("scale");
  auto [dt, shape, p] = norm_in(b, RMS, x, "input", norm, a.in("weight"), a.in("bias"), o);
  std::size_t k = norm.size();
  Rows<B> xr = as_rows(b, x, k);
  float s = scale ? static_scale(*scale) : 0.0f;
  auto q = b.empty_quant(shape, qtype);
  auto sc = scale ? b.scalar_f32(s) : per_row_out(b, true, shape, k, RMSNORM_F32, 0.0);
  if (!xr.d)  // nothing to quantize; the configuration is checked (a static scale was above)
    config(dt, p.param_dtype, o);
  else
    run(b, dt, p.param_dtype, o, xr.rows * xr.d, "rmsnorm_forward_quant", [&](auto ctx, auto cfg) {
      return rmsnorm_forward_quant(ctx, cfg, xr.rows, xr.d, xr.ptr, xr.ld, ptr_or_null<B>(p.weight),
                                   ptr_or_null<B>(p.bias), qtype, scale ? &s : nullptr, B::ptr(q),
                                   xr.d, scale ? nullptr : static_cast<float *>(B::ptr(sc)),
                                   nullptr);
    });
  a.ret({q, sc});
}

template <class A> void rms_norm_int8(A &a) { quant(a, RMSNORM_Q_INT8); }
template <class A> void rms_norm_fp8(A &a) { quant(a, RMSNORM_Q_FP8_E4M3); }

/* ---- RMSNorm into the formats of rmsnorm_forward_quantized ------------------------------ */

/* (codes, scales[, new_residual]) of RMSNorm(input), or with `add` of RMSNorm(residual +
 * input) and that sum (rounded to the dtype) in a new array. codes: the input's shape
 * (int8, fp8_e4m3, mxfp8: one code per element) or (*leading, row bytes) of uint8 blocks;
 * scales: (*leading, scales per row), float32 (E8M0 bytes for mxfp8; none, (*leading, 0),
 * for the formats whose scales are inside the blocks), or a 0-d float32 static scale. */
template <class A, class B = typename A::B>
void quantized(A &a, bool add) {
  B &b = a.backend();
  auto u = a.in("input"), h = add ? a.in("residual") : Array<B>();
  Dims norm = a.norm();
  Options o = options(a);
  auto [dt, shape, p] = norm_in(b, RMS, u, "input", norm, a.in("weight"), a.in("bias"), o,
                                {{&h, "residual"}});
  std::optional<double> scale = a.real("scale");
  QLayout l = qlayout(a.text("format"), a.integer("group"), a.flag("pow2_scale"), scale, norm);
  if (scale) l.q.static_scale = &l.static_scale;
  std::size_t k = norm.size();
  Rows<B> ur = as_rows(b, u, k), hr;
  if (add) hr = as_rows(b, b.cast(h, dt), k);  // a new contiguous copy: the library updates it
  Shape lead(shape.begin(), shape.end() - static_cast<std::ptrdiff_t>(k)), cs = lead, ss = lead;
  cs.push_back(static_cast<int64_t>(l.row_bytes));
  ss.push_back(static_cast<int64_t>(l.row_scales));
  auto codes = b.empty_quant(l.f->codes == ST_U8 ? Dims(cs) : shape, l.f->codes);
  auto sc = scale ? b.scalar_f32(l.static_scale)
            : l.f->format == RMSNORM_QF_MXFP8_E4M3 ? b.empty_quant(ss, ST_E8M0)
                                                   : b.empty(ss, RMSNORM_F32);
  void *sp = l.row_scales ? B::ptr(sc) : nullptr;
  run(b, dt, p.param_dtype, o, ur.rows * ur.d,
      add ? "rmsnorm_add_forward_quantized" : "rmsnorm_forward_quantized", [&](auto ctx, auto cfg) {
    void *w = ptr_or_null<B>(p.weight), *bias = ptr_or_null<B>(p.bias), *c = B::ptr(codes);
    return add ? rmsnorm_add_forward_quantized(ctx, cfg, ur.rows, ur.d, hr.ptr, hr.ld, ur.ptr,
                                               ur.ld, w, bias, &l.q, c, l.row_bytes, sp,
                                               l.row_scales, nullptr)
               : rmsnorm_forward_quantized(ctx, cfg, ur.rows, ur.d, ur.ptr, ur.ld, w, bias, &l.q,
                                           c, l.row_bytes, sp, l.row_scales, nullptr);
  });
  if (add) a.ret({codes, sc, hr.array});
  else a.ret({codes, sc});
}

template <class A> void rms_norm_quant(A &a) { quantized(a, false); }
template <class A> void fused_add_rms_norm_quant(A &a) { quantized(a, true); }

/* The gradient of fused_add_rms_norm_quant: that of new_residual = input + residual, for both
 * (the codes and scales are not differentiable, so weight and bias get none). */
template <class A, class B = typename A::B>
void fused_add_rms_norm_quant_backward(A &a) {
  B &b = a.backend();
  auto g = a.in("grad_new_residual");
  a.ret({b.cast(g, B::dtype(g)), Array<B>(), Array<B>()});  // a new tensor: ops return no alias
}

/* ---- RMSNorm + linear, gain folded ------------------------------------------------------ */

/* The arguments of RMSNorm + linear: x (*, d); w (d, n) of any float dtype, converted to the
 * compute type (stats_dtype); g (d,) and bias (n,) in one parameter dtype (as params()). */
template <class B>
struct Linear {
  Rows<B> x;
  int dt = -1;
  int64_t n = 0;
  Shape z_shape;      // (*, n): the output's
  Array<B> w;         // (d, n), contiguous, compute type
  int w_dtype = -1;   // the caller's, to give dW back in
  Params<B> p;        // g (d,) as weight, bias (n,)
  Array<B> w_folded;  // W' = diag(g) W (diag(1 + g) with the offset flag)
};

/* The arguments, checked, and W' folded (rmsnorm_fold_weight). */
template <class A, class B = typename A::B>
Linear<B> linear_of(A &a, const Options &o) {
  B &b = a.backend();
  auto x = a.in("input"), w = a.in("weight_matrix"), g = a.in("norm_weight"), bias = a.in("bias");
  Linear<B> l;
  l.dt = data_dtype<B>(x, "input");
  Dims shape = B::shape(x);
  if (shape.empty()) value_error(message("linear_rank", {}));
  int64_t d = shape.back();
  l.w_dtype = data_dtype<B>(w, "weight_matrix");
  Dims ws = B::shape(w);
  if (ws.size() != 2 || ws[0] != d)
    value_error(message("linear_matrix", {{"shape", list(ws)}, {"d", std::to_string(d)}}));
  l.n = ws[1];
  if (d == 0 || l.n == 0)
    value_error("rms_norm_linear needs d > 0 and n > 0, got d = " + std::to_string(d) +
                ", n = " + std::to_string(l.n));
  int cdt = stats_dtype(l.dt);
  l.w = l.w_dtype != cdt ? b.cast(w, cdt) : dense(b, w);
  l.p = params(b, l.dt, ws.first(1), g, bias, "norm_weight", ws.last(1));
  l.x = as_rows(b, x, 1);
  l.z_shape.assign(shape.begin(), shape.end());
  l.z_shape.back() = l.n;
  l.w_folded = b.empty(ws, cdt);
  rmsnorm_config cfg = config(l.dt, l.p.param_dtype, o);
  check(rmsnorm_fold_weight(&cfg, d, l.n, ptr_or_null<B>(l.p.weight), B::ptr(l.w), l.n,
                            B::ptr(l.w_folded), l.n),
        "rmsnorm_fold_weight");
  return l;
}

/* (z, rstd): Z = diag(r) (X W') + bias, z (*, n) in the data dtype, rstd (*, 1). */
template <class A, class B = typename A::B>
void rms_norm_linear(A &a) {
  B &b = a.backend();
  Options o = options(a);
  Linear<B> l = linear_of(a, o);
  bool want = a.want_stats();
  require_linear("rms_norm_linear");
  auto z = b.empty(l.z_shape, l.dt);
  auto rstd = per_row_out(b, want, B::shape(l.x.array), 1, stats_dtype(l.dt), NAN);
  run(b, l.dt, l.p.param_dtype, o, l.x.rows * l.x.d, "rmsnorm_linear_forward",
      [&](auto ctx, auto cfg) {
    return rmsnorm_linear_forward(ctx, cfg, l.x.rows, l.x.d, l.n, l.x.ptr, l.x.ld,
                                  B::ptr(l.w_folded), l.n, ptr_or_null<B>(l.p.bias), B::ptr(z),
                                  l.n, ptr_or_null<B>(rstd));
  });
  if (want) a.ret({z, rstd});
  else a.ret({z});
}

/* The gradients, each only when asked for (and its parameter given), in the caller's
 * dtypes. */
template <class A, class B = typename A::B>
void rms_norm_linear_backward(A &a) {
  B &b = a.backend();
  Options o = options(a);
  Linear<B> l = linear_of(a, o);
  auto dz = a.in("grad_output");
  require_linear("rms_norm_linear_backward");
  int64_t d = l.x.d, n = l.n, rows = l.x.rows, ws[2] = {d, n};
  int dt = l.dt, cdt = stats_dtype(dt), pdt = l.p.param_dtype;
  check_same<B>(dz, l.z_shape, dt, "grad_output", "rms_norm_linear output");
  Rows<B> dzr = as_rows(b, dz, 1);
  auto dx = b.empty(B::shape(l.x.array), dt);  // the library always writes dx
  auto dg = new_grad(b, a.mask(2) && B::defined(l.p.weight), Dims(ws, 1), pdt, rows);
  auto dw = new_grad(b, a.mask(1), Dims(ws, 2), cdt, rows);
  auto db = new_grad(b, a.mask(3) && B::defined(l.p.bias), Dims(ws + 1, 1), pdt, rows);
  run(b, dt, pdt, o, rows * d, "rmsnorm_linear_backward", [&](auto ctx, auto cfg) {
    return rmsnorm_linear_backward(ctx, cfg, rows, d, n, l.x.ptr, l.x.ld,
                                   ptr_or_null<B>(l.p.weight), B::ptr(l.w), n, B::ptr(l.w_folded),
                                   n, dzr.ptr, dzr.ld, B::ptr(dx), d, ptr_or_null<B>(dg),
                                   ptr_or_null<B>(dw), n, ptr_or_null<B>(db));
  });
  a.ret({a.mask(0) ? dx : Array<B>(), in_dtype(b, dw, cdt, l.w_dtype),
         in_dtype(b, dg, pdt, l.p.weight_dtype), in_dtype(b, db, pdt, l.p.bias_dtype)});
}

/* ---- sharded hidden dimension (rmsnorm_shard_*) ------------------------------------------
 * x holds columns [offset, offset + width) of rows of d_global columns: its last dim is the
 * shard's width, its leading dims the rows. Per-row sums (stats, dots) are float64 arrays of
 * x's leading shape; weight and bias hold the shard's width elements. */

template <class B>
double *f64(const Array<B> &a) {
  return static_cast<double *>(B::ptr(a));
}

/* A shard op's arguments, checked in the order of the messages: input, grad_output like it,
 * the parameters (width elements), the summed statistics; those the op lacks are none. */
template <class B>
struct Shard {
  Rows<B> x, dy;  // rows x width
  int dt = -1;
  Shape lead;  // x's leading dims: the shape of the per-row sums
  int64_t d_global = 0, offset = 0;
  Options o;
  Params<B> p;
  Array<B> stats;
  Dims cols() const { return Dims(&x.d, 1); }  // {width}: weight's, bias's, their gradients'

  template <class F>
  void run(B &b, const char *fn, F &&f) {
    rncore::run(b, dt, p.param_dtype, o, x.rows * x.d, fn, f);
  }
};

template <class A, class B = typename A::B>
Shard<B> shard_of(A &a) {
  B &b = a.backend();
  auto dy = a.in("grad_output"), x = a.in("input"), stats = a.in("stats");
  Shard<B> s;
  s.dt = data_dtype<B>(x, "input");
  Dims shape = B::shape(x);
  if (shape.empty()) value_error(message("shard_rank", {}));
  int64_t width = shape.back();
  s.d_global = a.integer("d_global");
  s.offset = a.integer("column_offset");
  if (s.d_global < 1 || s.offset < 0 || s.offset > s.d_global - width)
    value_error(message("shard_columns", {{"begin", std::to_string(s.offset)},
                                          {"end", std::to_string(s.offset + width)},
                                          {"d_global", std::to_string(s.d_global)}}));
  s.lead.assign(shape.begin(), shape.end() - 1);
  s.x = as_rows(b, x, 1);
  s.o = options(a);
  if (B::defined(dy)) check_same<B>(dy, shape, s.dt, "grad_output", "input");
  s.p = params(b, s.dt, s.cols(), a.in("weight"), a.in("bias"));
  s.stats = per_row_arg(b, stats, "stats", s.dt, s.x.rows, true);
  if (B::defined(dy)) s.dy = as_rows(b, dy, 1);
  return s;
}

/* Per-row partial sums over the shard's columns, float64 of x's leading shape: the sums of
 * squares (stats), or the backward's dot products, sums of gy_j xhat_j (dots). */
template <class A, class B = typename A::B>
void shard_sums(A &a, bool dots) {
  B &b = a.backend();
  Shard<B> s = shard_of(a);
  auto out = b.empty(s.lead, RMSNORM_F64);
  s.run(b, dots ? "rmsnorm_shard_backward_dots" : "rmsnorm_shard_stats", [&](auto ctx, auto cfg) {
    if (!dots)
      return rmsnorm_shard_stats(ctx, cfg, s.x.rows, s.d_global, s.offset, s.x.d, s.x.ptr,
                                 s.x.ld, f64<B>(out));
    return rmsnorm_shard_backward_dots(ctx, cfg, s.x.rows, s.d_global, s.offset, s.x.d, s.x.ptr,
                                       s.x.ld, s.dy.ptr, s.dy.ld, ptr_or_null<B>(s.p.weight),
                                       f64<B>(s.stats), f64<B>(out));
  });
  a.ret({out});
}

template <class A> void rms_norm_shard_stats(A &a) { shard_sums(a, false); }
template <class A> void rms_norm_shard_backward_dots(A &a) { shard_sums(a, true); }

/* y of the shard's columns from the summed statistics. */
template <class A, class B = typename A::B>
void rms_norm_shard_forward(A &a) {
  B &b = a.backend();
  Shard<B> s = shard_of(a);
  auto y = b.empty(B::shape(s.x.array), s.dt);
  s.run(b, "rmsnorm_shard_forward", [&](auto ctx, auto cfg) {
    return rmsnorm_shard_forward(ctx, cfg, s.x.rows, s.d_global, s.offset, s.x.d, s.x.ptr, s.x.ld,
                                 ptr_or_null<B>(s.p.weight), ptr_or_null<B>(s.p.bias),
                                 f64<B>(s.stats), B::ptr(y), s.x.d, nullptr);
  });
  a.ret({y});
}

/* dx of the shard's columns from the summed statistics and dots; dweight and dbias (summed
 * over this call's rows) when asked for and their parameter is given. */
template <class A, class B = typename A::B>
void rms_norm_shard_backward(A &a) {
  B &b = a.backend();
  Shard<B> s = shard_of(a);
  auto dots = per_row_arg(b, a.in("dots"), "dots", s.dt, s.x.rows, true);
  Grads<B> g = new_grads(a, b, s.p, B::shape(s.x.array), s.dt, s.cols(), s.x.rows);
  s.run(b, "rmsnorm_shard_backward", [&](auto ctx, auto cfg) {
    return rmsnorm_shard_backward(ctx, cfg, s.x.rows, s.d_global, s.offset, s.x.d, s.x.ptr,
                                  s.x.ld, s.dy.ptr, s.dy.ld, ptr_or_null<B>(s.p.weight),
                                  f64<B>(s.stats), f64<B>(dots), B::ptr(g.dx), s.x.d,
                                  ptr_or_null<B>(g.dweight), ptr_or_null<B>(g.dbias));
  });
  ret_grads(a, b, g, s.p);
}

}  // namespace kernels
}  // namespace rncore

#endif
