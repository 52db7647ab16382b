/* numpy_module.cpp - rmsnorm._native: the numpy functions of the package as
 * CPython functions over numpy's C API (bfloat16 and float8 come from
 * ml_dtypes, whose dtypes numpy's buffer protocol cannot export). Arguments
 * are parsed here (METH_FASTCALL), arrays are read in place, outputs are
 * made here (large ones in the shared output cache, runtime.h), and the GIL
 * is released around library calls on more than a few thousand elements.
 * The operations themselves are core.hpp's. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define PY_ARRAY_UNIQUE_SYMBOL rmsnorm_native_ARRAY_API
#include <numpy/arrayobject.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core.hpp"
#include "runtime.h"

static_assert(sizeof(npy_intp) == sizeof(int64_t), "npy_intp is 64-bit");

namespace {

using rncore::Dims;

/* ---- module state (one interpreter) ------------------------------------------ */

// numpy's type numbers by rmsnorm_dtype code; bfloat16's is ml_dtypes' (-1 without it)
int g_type_num[] = {NPY_FLOAT32, NPY_FLOAT16, -1, NPY_FLOAT64};
PyArray_Descr *g_bf16 = nullptr; // ml_dtypes.bfloat16
PyArray_Descr *g_fp8 = nullptr;  // ml_dtypes.float8_e4m3fn (uint8 without ml_dtypes)
PyArray_Descr *g_e8m0 = nullptr; // ml_dtypes.float8_e8m0fnu (uint8 without it: ml_dtypes < 0.5)
PyObject *g_error_cls[4];        // rmsnorm.ArgumentError, DtypeError, OutOfMemoryError, NotAvailableError
std::atomic<int> g_threads{0};   // rmsnorm.set_num_threads (0: the library's default)

/* Elements below which the GIL is kept: releasing and taking it back costs
 * more than such a call, and taking it back may wait for another thread. */
constexpr std::size_t kReleaseGil = std::size_t(1) << 15;

/* A Python error is already set. */
struct PyErrorSet {};

/* An owned reference. */
class Ref {
 public:
  Ref() = default;
  explicit Ref(PyObject *p) : p_(p) {}  // steals
  static Ref borrow(PyObject *p) {
    Py_XINCREF(p);
    return Ref(p);
  }
  Ref(const Ref &o) : p_(o.p_) { Py_XINCREF(p_); }
  Ref(Ref &&o) noexcept : p_(o.p_) { o.p_ = nullptr; }
  Ref &operator=(Ref o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  ~Ref() { Py_XDECREF(p_); }
  PyObject *get() const { return p_; }
  PyArrayObject *arr() const { return reinterpret_cast<PyArrayObject *>(p_); }
  PyObject *release() {
    PyObject *p = p_;
    p_ = nullptr;
    return p;
  }

 private:
  PyObject *p_ = nullptr;
};

Ref checked(PyObject *p) {
  if (!p) throw PyErrorSet{};
  return Ref(p);
}

PyArray_Descr *descr_of(int code) {
  if (code != RMSNORM_BF16) return PyArray_DescrFromType(g_type_num[code]);
  Py_INCREF(g_bf16);
  return g_bf16;
}

/* The capsule that owns a cache block under a numpy array (its base). */
constexpr const char *kBlockCapsule = "rmsnorm.output_block";

void free_block_capsule(PyObject *capsule) {
  rnpy::block_free(static_cast<rnpy::Block *>(PyCapsule_GetPointer(capsule, kBlockCapsule)));
}

/* A new C-contiguous array: in a cache block when large, else numpy's own. */
Ref new_array(Dims shape, PyArray_Descr *descr /* stolen */) {
  auto nd = static_cast<int>(shape.size());
  auto *dims = const_cast<npy_intp *>(reinterpret_cast<const npy_intp *>(shape.data()));
  std::size_t nbytes = static_cast<std::size_t>(rncore::prod(shape)) * PyDataType_ELSIZE(descr);
  if (nbytes < rnpy::kCacheMinBytes)
    return checked(PyArray_Empty(nd, dims, descr, 0));
  rnpy::Block *block = rnpy::block_alloc(nbytes);
  if (!block) {
    Py_DECREF(descr);
    PyErr_NoMemory();
    throw PyErrorSet{};
  }
  PyObject *capsule = PyCapsule_New(block, kBlockCapsule, free_block_capsule);
  if (!capsule) {
    rnpy::block_free(block);
    Py_DECREF(descr);
    throw PyErrorSet{};
  }
  PyObject *a = PyArray_NewFromDescr(&PyArray_Type, descr, nd, dims, nullptr, rnpy::block_data(block),
                                     NPY_ARRAY_CARRAY, nullptr);
  if (!a) {
    Py_DECREF(capsule);
    throw PyErrorSet{};
  }
  if (PyArray_SetBaseObject(reinterpret_cast<PyArrayObject *>(a), capsule) < 0) {  // steals
    Py_DECREF(a);
    throw PyErrorSet{};
  }
  return Ref(a);
}

/* ---- the numpy backend of core.hpp ------------------------------------------ */

struct Unlock {
  PyThreadState *state = nullptr;
  explicit Unlock(bool release) {
    if (release) state = PyEval_SaveThread();
  }
  Unlock(const Unlock &) = delete;
  ~Unlock() {
    if (state) PyEval_RestoreThread(state);
  }
};

struct NumpyBackend {
  using Array = Ref;

  static bool defined(const Ref &a) { return a.get() != nullptr; }
  static int dtype(const Ref &a) {
    int num = PyArray_DESCR(a.arr())->type_num;
    for (int code = 0; code < 4; code++)
      if (num == g_type_num[code]) return code;
    return -1;
  }
  static std::string dtype_name(const Ref &a) {
    Ref s(PyObject_Str(reinterpret_cast<PyObject *>(PyArray_DESCR(a.arr()))));
    const char *c = s.get() ? PyUnicode_AsUTF8(s.get()) : nullptr;
    if (!c) PyErr_Clear();
    return c ? c : "?";
  }
  static Dims shape(const Ref &a) {
    return Dims(reinterpret_cast<const int64_t *>(PyArray_DIMS(a.arr())),
                static_cast<std::size_t>(PyArray_NDIM(a.arr())));
  }
  static bool is_contiguous(const Ref &a) { return PyArray_IS_C_CONTIGUOUS(a.arr()); }
  bool strides(const Ref &a, Dims *out) {
    int nd = PyArray_NDIM(a.arr());
    npy_intp size = PyArray_ITEMSIZE(a.arr());
    const npy_intp *st = PyArray_STRIDES(a.arr());
    for (int i = 0; i < nd; i++) {
      if (st[i] % size) return false;
      scratch_[i] = st[i] / size;
    }
    *out = Dims(scratch_, static_cast<std::size_t>(nd));
    return true;
  }
  static void *ptr(const Ref &a) { return PyArray_DATA(a.arr()); }

  Ref contiguous(const Ref &a) {
    if (is_contiguous(a)) return a;
    return checked(PyArray_NewCopy(a.arr(), NPY_CORDER));
  }
  Ref cast(const Ref &a, int code) {
    Ref out = empty(shape(a), code);
    if (PyArray_CopyInto(out.arr(), a.arr()) < 0) throw PyErrorSet{};
    return out;
  }
  Ref empty(Dims shape, int code) { return new_array(shape, descr_of(code)); }
  Ref full(Dims shape, int code, double v) {
    Ref a = empty(shape, code);
    Ref value = checked(PyFloat_FromDouble(v));
    if (PyArray_FillWithScalar(a.arr(), value.get()) < 0) throw PyErrorSet{};
    return a;
  }
  Ref empty_quant(Dims shape, int store) {
    PyArray_Descr *d = store == rncore::ST_INT8  ? PyArray_DescrFromType(NPY_INT8)
                       : store == rncore::ST_U8  ? PyArray_DescrFromType(NPY_UINT8)
                       : store == rncore::ST_E4M3 ? (Py_INCREF(g_fp8), g_fp8)
                                                  : (Py_INCREF(g_e8m0), g_e8m0);
    return new_array(shape, d);
  }
  Ref scalar_f32(float v) {
    Ref a = checked(PyArray_Empty(0, nullptr, PyArray_DescrFromType(NPY_FLOAT32), 0));
    *static_cast<float *>(PyArray_DATA(a.arr())) = v;
    return a;
  }
  void writable(const Ref &a, const char *what) {
    if (!PyArray_ISWRITEABLE(a.arr())) rncore::value_error(std::string(what) + " is read-only");
    if (!PyArray_ISNOTSWAPPED(a.arr()))
      rncore::value_error(std::string(what) + " has a non-native byte order (" + dtype_name(a) +
                          "); rmsnorm writes it in place and cannot: pass a native-order array");
  }
  Ref index(const Ref &a, const char *what) {
    if (!PyArray_ISINTEGER(a.arr()))
      rncore::type_error(rncore::message("index_dtype", {{"what", what}, {"dtype", dtype_name(a)}}));
    return checked(PyArray_FromArray(a.arr(), PyArray_DescrFromType(NPY_INT64),
                                     NPY_ARRAY_IN_ARRAY | NPY_ARRAY_FORCECAST));
  }
  rmsnorm_context *context() {
    rmsnorm_context *ctx = nullptr;
    rncore::check(rnpy::thread_context(g_threads.load(std::memory_order_relaxed), &ctx),
                  "rmsnorm_context_create");
    return ctx;
  }
  Unlock unlocked(std::size_t elements) { return Unlock(elements >= kReleaseGil); }

 private:
  int64_t scratch_[64];
};

using B = NumpyBackend;

/* ---- errors --------------------------------------------------------------------- */

/* Sets the Python exception for a core error: library statuses raise the
 * rmsnorm.Error classes (carrying .status and .name), checks made here the
 * built-in ValueError / TypeError / MemoryError. */
void set_error(const rncore::Error &e) {
  int idx = e.kind == rncore::Kind::Value ? 0 : e.kind == rncore::Kind::Type ? 1
            : e.kind == rncore::Kind::Memory ? 2 : 3;
  if (e.status < 0 && idx < 3) {
    PyObject *cls = idx == 0 ? PyExc_ValueError : idx == 1 ? PyExc_TypeError : PyExc_MemoryError;
    PyErr_SetString(cls, e.message.c_str());
    return;
  }
  int status = e.status < 0 ? RMSNORM_ERROR_NOT_AVAILABLE : e.status;
  PyObject *exc = PyObject_CallFunction(g_error_cls[idx], "sis", e.message.c_str(), status,
                                        rmsnorm_status_name(static_cast<rmsnorm_status>(status)));
  if (exc) {
    PyErr_SetObject(reinterpret_cast<PyObject *>(Py_TYPE(exc)), exc);
    Py_DECREF(exc);
  }
}

/* Runs f, turning C++ exceptions into Python ones (nullptr returned). */
template <class F>
PyObject *guarded(F &&f) {
  try {
    return f();
  } catch (const rncore::Error &e) {
    set_error(e);
  } catch (const PyErrorSet &) {
  } catch (const std::bad_alloc &) {
    PyErr_NoMemory();
  } catch (const std::exception &e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

/* ---- argument parsing ----------------------------------------------------------- */

/* The numpy functions, their signatures from the op table (ops.def). */
enum Fn {
#define RN_OP(...)
#define RN_FN(name, where, op, sig, doc) FN_##name,
#include "ops.def"
#undef RN_FN
  FN_COUNT
};

/* Their rows: name, signature, docstring. */
constexpr struct {
  const char *name;
  std::string_view sig;
  const char *doc;
} kFns[] = {
#define RN_FN(name, where, op, sig, doc) {#name, sig, doc},
#include "ops.def"
#undef RN_FN
};

constexpr int kMaxArgs = 16;

/* A function's parameters, parsed from its signature once: the first `positional` may be
 * passed by position, those without a default must be given; all may be passed by keyword. */
struct Signature {
  const char *fname = nullptr;
  std::vector<std::string> names;
  std::vector<PyObject *> defaults;  // nullptr: required
  int positional = 0;
};

Signature g_sig[FN_COUNT];

int parse_signature(Signature *out, const char *fname, std::string_view sig) {
  out->fname = fname;
  out->positional = -1;
  for (std::size_t at = 0; at <= sig.size();) {
    std::size_t end = std::min(sig.find(',', at), sig.size());
    std::string item(sig.substr(at, end - at));
    at = end + 1;
    item.erase(0, item.find_first_not_of(' '));
    if (item == "*") {
      out->positional = static_cast<int>(out->names.size());
      continue;
    }
    std::size_t eq = item.find('=');
    out->names.push_back(item.substr(0, eq));
    PyObject *d = nullptr;
    if (eq != std::string::npos) {
      std::string v = item.substr(eq + 1);
      bool integer = v.find_first_not_of("-0123456789") == std::string::npos;
      bool text = v.size() >= 2 && v.front() == '\'' && v.back() == '\'';  // 'silu'
      d = text ? PyUnicode_FromStringAndSize(v.data() + 1, static_cast<Py_ssize_t>(v.size() - 2))
          : v == "None" ? (Py_INCREF(Py_None), Py_None)
          : v == "False" ? PyBool_FromLong(0)
          : v == "True" ? PyBool_FromLong(1)
          : integer ? PyLong_FromString(v.c_str(), nullptr, 10)
                    : PyFloat_FromDouble(std::strtod(v.c_str(), nullptr));
      if (!d) return -1;
    }
    out->defaults.push_back(d);  // kept for the process
  }
  if (out->positional < 0) out->positional = static_cast<int>(out->names.size());
  return 0;
}

/* Fills v (borrowed references: the given values, or the defaults). */
void parse(const Signature &sig, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
           PyObject **v) {
  int n = static_cast<int>(sig.names.size());
  for (int i = 0; i < n; i++) v[i] = nullptr;
  if (nargs > sig.positional) {
    PyErr_Format(PyExc_TypeError, "%s() takes at most %d positional arguments (%zd given)", sig.fname,
                 sig.positional, nargs);
    throw PyErrorSet{};
  }
  for (Py_ssize_t i = 0; i < nargs; i++) v[i] = args[i];
  Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t j = 0; j < nkw; j++) {
    PyObject *key = PyTuple_GET_ITEM(kwnames, j);
    int i = 0;
    while (i < n && PyUnicode_CompareWithASCIIString(key, sig.names[i].c_str()) != 0) i++;
    if (i == n) {
      PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", sig.fname, key);
      throw PyErrorSet{};
    }
    if (v[i]) {
      PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%U'", sig.fname, key);
      throw PyErrorSet{};
    }
    v[i] = args[nargs + j];
  }
  for (int i = 0; i < n; i++) {
    if (v[i]) continue;
    if (!sig.defaults[i]) {
      PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", sig.fname,
                   sig.names[i].c_str());
      throw PyErrorSet{};
    }
    v[i] = sig.defaults[i];
  }
}

bool given(PyObject *o) { return o && o != Py_None; }

/* An input array: np.asarray(o), converted to native byte order when not. */
Ref input_array(PyObject *o) {
  Ref a;
  if (PyArray_Check(o)) {
    a = Ref::borrow(o);
  } else {
    a = checked(PyArray_FromAny(o, nullptr, 0, 0, 0, nullptr));
  }
  if (!PyArray_ISNOTSWAPPED(a.arr())) {
    PyArray_Descr *native = PyArray_DescrNewByteorder(PyArray_DESCR(a.arr()), NPY_NATIVE);
    if (!native) throw PyErrorSet{};
    a = checked(PyArray_CastToType(a.arr(), native, 0));
  }
  return a;
}

/* An array the call writes into (out=, inplace=True): used as it is, never
 * converted, so that what is written is what the caller holds. */
Ref output_array(PyObject *o, const char *what) {
  if (!PyArray_Check(o))
    rncore::type_error(std::string(what) + " must be a numpy.ndarray to be written in place, got " +
                       Py_TYPE(o)->tp_name);
  return Ref::borrow(o);
}

/* normalized_shape: an int, or a sequence of ints. */
struct NormShape {
  int64_t v[NPY_MAXDIMS];
  std::size_t n = 0;
  Dims dims() const { return Dims(v, n); }
};

NormShape normalized_shape(PyObject *o) {
  NormShape shape;
  auto bad = [&]() {
    PyErr_Clear();
    Ref r(PyObject_Repr(o));
    PyErr_Format(PyExc_TypeError, "normalized_shape must be an int or a sequence of ints, got %s",
                 r.get() ? PyUnicode_AsUTF8(r.get()) : "?");
    throw PyErrorSet{};
  };
  if (PyIndex_Check(o)) {
    Py_ssize_t v = PyNumber_AsSsize_t(o, PyExc_OverflowError);
    if (v == -1 && PyErr_Occurred()) bad();
    shape.v[0] = v;
    shape.n = 1;
    return shape;
  }
  // the items held by a tuple (a list's copied, any other sequence's listed):
  // an item's __index__ may change or empty the list, which must not free
  // the items read after it
  Ref seq = PyTuple_Check(o) ? Ref::borrow(o)
                             : Ref(PyList_Check(o) ? PyList_AsTuple(o) : PySequence_Tuple(o));
  if (!seq.get()) bad();
  Py_ssize_t n = PyTuple_GET_SIZE(seq.get());
  if (n > NPY_MAXDIMS) bad();
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *item = PyTuple_GET_ITEM(seq.get(), i);
    if (!PyIndex_Check(item)) bad();
    Py_ssize_t v = PyNumber_AsSsize_t(item, PyExc_OverflowError);
    if (v == -1 && PyErr_Occurred()) bad();
    shape.v[i] = v;
  }
  shape.n = static_cast<std::size_t>(n);
  return shape;
}

double as_double(PyObject *o, const char *what) {
  double v = PyFloat_AsDouble(o);
  if (v == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    rncore::type_error(std::string(what) + " must be a number, got " + Py_TYPE(o)->tp_name);
  }
  return v;
}

bool as_bool(PyObject *o) {
  int v = PyObject_IsTrue(o);
  if (v < 0) throw PyErrorSet{};
  return v != 0;
}

/* A call's arguments as core.hpp's kernels read them, by name (see core.hpp). */
class Args {
 public:
  using B = NumpyBackend;
  Args(const Signature &sig, PyObject *const *v) : sig_(sig), v_(v) {}
  B &backend() { return b_; }
  /* np.asarray of the argument; none for None where None is its default or none_ok */
  Ref in(std::string_view n, bool none_ok = false) {
    int i = find(n);
    if (i < 0 || (v_[i] == Py_None && (none_ok || sig_.defaults[i] == Py_None))) return Ref();
    return input_array(v_[i]);
  }
  Ref target(std::string_view n) {
    int i = find(n);
    return i < 0 || !given(v_[i]) ? Ref() : output_array(v_[i], sig_.names[i].c_str());
  }
  bool flag(std::string_view n) {
    int i = find(n);
    return i >= 0 && as_bool(v_[i]);
  }
  bool inplace() { return flag("inplace"); }
  bool want_stats() { return flag("return_rstd") || flag("return_mean_rstd"); }
  std::optional<double> real(std::string_view n) {
    int i = find(n);
    if (i < 0 || v_[i] == Py_None) return std::nullopt;
    return as_double(v_[i], sig_.names[i].c_str());
  }
  int64_t integer(std::string_view n) {
    int i = find(n);
    long long v = PyLong_AsLongLong(v_[i]);
    if (v == -1 && PyErr_Occurred()) throw PyErrorSet{};
    return v;
  }
  std::string text(std::string_view n) {
    int i = find(n);
    if (!PyUnicode_Check(v_[i]))
      rncore::type_error(sig_.names[i] + " must be a str, got " + Py_TYPE(v_[i])->tp_name);
    const char *c = PyUnicode_AsUTF8(v_[i]);
    if (!c) throw PyErrorSet{};
    return c;
  }
  int dtype_arg(std::string_view n) {
    int i = find(n);
    PyArray_Descr *d = nullptr;
    if (!PyArray_DescrConverter(v_[i], &d)) throw PyErrorSet{};
    Ref hold(reinterpret_cast<PyObject *>(d));
    for (int code = 0; code < 4; code++)
      if (d->type_num == g_type_num[code]) return code;
    return -1;
  }
  Dims norm() {
    shape_ = normalized_shape(v_[find("normalized_shape")]);
    return shape_.dims();
  }
  static bool mask(int) { return true; }  // the numpy backward functions give every gradient
  /* one output as itself, several as a tuple (None for an absent one) */
  void ret(std::initializer_list<Ref> outs) {
    if (outs.size() == 1) {
      result_ = *outs.begin();
      return;
    }
    result_ = checked(PyTuple_New(static_cast<Py_ssize_t>(outs.size())));
    Py_ssize_t i = 0;
    for (const Ref &o : outs)  // None for an absent one
      PyTuple_SET_ITEM(result_.get(), i++, Ref::borrow(o.get() ? o.get() : Py_None).release());
  }
  PyObject *result() { return result_.release(); }

 private:
  int find(std::string_view n) const {  // the parameter named n, or -1 (lengths compared first)
    int i = static_cast<int>(sig_.names.size()) - 1;
    while (i >= 0 && sig_.names[static_cast<std::size_t>(i)] != n) i--;
    return i;
  }
  const Signature &sig_;
  PyObject *const *v_;
  B b_;
  NormShape shape_;
  Ref result_;
};

/* The METH_FASTCALL function F: its kernel K (core.hpp's, of the function's name). */
template <Fn F, void (*K)(Args &)>
PyObject *fastcall(PyObject *, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  return guarded([&]() -> PyObject * {
    PyObject *v[kMaxArgs];
    parse(g_sig[F], args, nargs, kwnames, v);
    Args a(g_sig[F], v);
    K(a);
    return a.result();
  });
}

/* ---- settings and information ------------------------------------------------------- */

PyObject *py_set_num_threads(PyObject *, PyObject *arg) {
  return guarded([&]() -> PyObject * {
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) throw PyErrorSet{};
    if (n < INT_MIN || n > INT_MAX) n = -1;  // the library refuses it (not 0..1024)
    rmsnorm_context *ctx = nullptr;
    rncore::check(rnpy::thread_context(static_cast<int>(n), &ctx), "rmsnorm_context_set_threads");
    g_threads.store(static_cast<int>(n));
    Py_RETURN_NONE;
  });
}

PyObject *py_get_num_threads(PyObject *, PyObject *) {
  return guarded([&]() -> PyObject * {
    int n = 0;
    rncore::check(rmsnorm_context_get_threads(NumpyBackend().context(), &n),
                  "rmsnorm_context_get_threads");
    return PyLong_FromLong(n);
  });
}

PyObject *py_isa(PyObject *, PyObject *) {
  return guarded([&]() -> PyObject * {
    rmsnorm_isa isa;
    rncore::check(rmsnorm_context_get_isa(NumpyBackend().context(), &isa),
                  "rmsnorm_context_get_isa");
    return PyUnicode_FromString(rmsnorm_isa_name(isa));
  });
}

PyObject *py_cpu_features(PyObject *, PyObject *) {
  return guarded([&]() -> PyObject * {
    static const char *names[] = {"avx2",     "fma",        "f16c", "avx512f", "avx512bw",
                                  "avx512vl", "avx512bf16", "neon", "fp16"};
    unsigned bits = 0;
    rncore::check(rmsnorm_cpu_features(&bits), "rmsnorm_cpu_features");
    Ref out = checked(PyList_New(0));
    for (unsigned i = 0; i < sizeof names / sizeof names[0]; i++)
      if (bits >> i & 1) {
        Ref s = checked(PyUnicode_FromString(names[i]));
        if (PyList_Append(out.get(), s.get()) < 0) throw PyErrorSet{};
      }
    return out.release();
  });
}

PyObject *py_linear_available(PyObject *, PyObject *) {
  return PyBool_FromLong(rmsnorm_linear_available() == RMSNORM_OK);
}

PyObject *py_library_version(PyObject *, PyObject *) {
  return PyUnicode_FromString(rmsnorm_version_string());
}

PyObject *py_cache_info(PyObject *, PyObject *) {
  rnpy::CacheInfo c = rnpy::cache_info();
  return Py_BuildValue("{s:n,s:n,s:n,s:n,s:n,s:K,s:K}", "limit", (Py_ssize_t)c.limit, "cached_bytes",
                       (Py_ssize_t)c.cached_bytes, "cached_blocks", (Py_ssize_t)c.cached_blocks,
                       "live_bytes", (Py_ssize_t)c.live_bytes, "live_blocks", (Py_ssize_t)c.live_blocks,
                       "hits", (unsigned long long)c.hits, "misses", (unsigned long long)c.misses);
}

PyObject *py_set_cache_limit(PyObject *, PyObject *arg) {
  Py_ssize_t n = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
  if (n == -1 && PyErr_Occurred()) return nullptr;
  if (n < 0) {
    PyErr_SetString(PyExc_ValueError, "set_cache_limit: the limit must be >= 0 bytes");
    return nullptr;
  }
  return PyLong_FromSize_t(rnpy::cache_set_limit(static_cast<std::size_t>(n)));
}

PyObject *py_context_threads(PyObject *, PyObject *) {
  return PyLong_FromLong(rnpy::thread_context_threads());
}

PyObject *py_empty_cache(PyObject *, PyObject *) {
  rnpy::cache_release();
  Py_RETURN_NONE;
}

/* ---- the module ------------------------------------------------------------------------ */

#define NUMPY_FN(name) {#name, reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>( \
  fastcall<FN_##name, &rncore::kernels::name<Args>>)), METH_FASTCALL | METH_KEYWORDS, nullptr},
#define RN_FN_NUMPY(name) NUMPY_FN(name)
#define RN_FN_BOTH(name) NUMPY_FN(name)
#define RN_FN_TORCH(name)

PyMethodDef methods[] = {
#define RN_FN(name, where, op, sig, doc) RN_FN_##where(name)
#include "ops.def"
#undef RN_FN
    {"set_num_threads", py_set_num_threads, METH_O,
     "set_num_threads($module, threads, /)\n--\n\n"
     "The most threads one call of the numpy functions may use, for every Python\n"
     "thread; 0 restores the default (one per online CPU). rmsnorm.torch follows\n"
     "torch.get_num_threads() instead."},
    {"get_num_threads", py_get_num_threads, METH_NOARGS,
     "get_num_threads($module, /)\n--\n\nThe most threads one call of the numpy functions may use."},
    {"isa", py_isa, METH_NOARGS,
     "isa($module, /)\n--\n\nThe kernel set in use: \"scalar\", \"avx2\", \"avx512\" or \"neon\"."},
    {"cpu_features", py_cpu_features, METH_NOARGS,
     "cpu_features($module, /)\n--\n\nThe CPU features the library detected (OS support checked)."},
    {"linear_available", py_linear_available, METH_NOARGS,
     "linear_available($module, /)\n--\n\nWhether rms_norm_linear can run (a BLAS was built in)."},
    {"library_version", py_library_version, METH_NOARGS,
     "library_version($module, /)\n--\n\nThe version string of the loaded C library."},
    {"cache_info", py_cache_info, METH_NOARGS,
     "cache_info($module, /)\n--\n\n"
     "The output cache (shared by numpy and torch outputs of 1 MiB or more): a dict\n"
     "of limit, cached_bytes, cached_blocks (free blocks kept), live_bytes,\n"
     "live_blocks (blocks under live outputs), hits and misses (allocations served\n"
     "from a kept block / from fresh memory)."},
    {"set_cache_limit", py_set_cache_limit, METH_O,
     "set_cache_limit($module, nbytes, /)\n--\n\n"
     "The most bytes of free output blocks kept for reuse (0: none); trims to it at\n"
     "once and returns the previous limit."},
    {"_context_threads", py_context_threads, METH_NOARGS,
     "_context_threads($module, /)\n--\n\n"
     "The thread count the calling thread's context was last set to (-1: none yet);\n"
     "for tests: rmsnorm.torch sets it to torch.get_num_threads() on every call."},
    {"empty_cache", py_empty_cache, METH_NOARGS,
     "empty_cache($module, /)\n--\n\nReturns every kept output block to the system."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "rmsnorm._native",
                          "The numpy functions of rmsnorm (see the package's docstring).", -1,
                          methods, nullptr, nullptr, nullptr, nullptr};

/* bfloat16 and float8_e4m3fn from ml_dtypes, when it is installed. */
int load_ml_dtypes() {
  Ref mod(PyImport_ImportModule("ml_dtypes"));
  g_e8m0 = PyArray_DescrFromType(NPY_UINT8);  // E8M0 scales as bytes, unless ml_dtypes has them
  if (!mod.get()) {
    PyErr_Clear();
    g_fp8 = PyArray_DescrFromType(NPY_UINT8);  // fp8 codes as bytes
    return 0;
  }
  for (auto [name, out] : {std::pair{"bfloat16", &g_bf16}, std::pair{"float8_e4m3fn", &g_fp8}}) {
    Ref type(PyObject_GetAttrString(mod.get(), name));
    if (!type.get() || !PyArray_DescrConverter(type.get(), out)) return -1;
  }
  if (Ref e8m0(PyObject_GetAttrString(mod.get(), "float8_e8m0fnu")); e8m0.get()) {
    Py_DECREF(g_e8m0);
    if (!PyArray_DescrConverter(e8m0.get(), &g_e8m0)) return -1;
  } else {
    PyErr_Clear();
  }
  g_type_num[RMSNORM_BF16] = g_bf16->type_num;
  return 0;
}

}  // namespace

PyMODINIT_FUNC PyInit__native(void) {
  import_array();
  if (load_ml_dtypes() < 0) return nullptr;
  Ref errors(PyImport_ImportModule("rmsnorm._errors"));
  if (!errors.get()) return nullptr;
  const char *names[4] = {"ArgumentError", "DtypeError", "OutOfMemoryError", "NotAvailableError"};
  for (int i = 0; i < 4; i++) {
    g_error_cls[i] = PyObject_GetAttrString(errors.get(), names[i]);  // kept for the process
    if (!g_error_cls[i]) return nullptr;
  }
  // the signatures and docstrings of the op table's functions
  static std::string docs[FN_COUNT];
  for (int f = 0; f < FN_COUNT; f++) {
    if (parse_signature(&g_sig[f], kFns[f].name, kFns[f].sig) < 0) return nullptr;
    docs[f] = std::string(kFns[f].name) + "($module, " + std::string(kFns[f].sig) + ")\n--\n\n" +
              kFns[f].doc;
  }
  for (PyMethodDef *m = methods; m->ml_name; m++)
    for (int f = 0; f < FN_COUNT; f++)
      if (!m->ml_doc && std::string_view(m->ml_name) == kFns[f].name) m->ml_doc = docs[f].c_str();
  return PyModule_Create(&module_def);
}
