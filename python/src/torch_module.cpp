/* torch_module.cpp - rmsnorm._torch: importing it registers the rmsnorm:: ops
 * (torch_ops.cpp), and it holds the eager entry points of rmsnorm.torch:
 * CPython functions that take the Python API's arguments in a fixed order,
 * convert them without Python-level work, release the GIL and call the op
 * through the dispatcher (so autograd and any mode or subclass below
 * __torch_function__ see the op itself). torch's generic path for calling a
 * torch.ops op from Python converts every argument against the schema and
 * costs 5-15 us a call; this one costs about 1 us.
 *
 * Each returns NotImplemented when an argument is symbolic (a SymInt in
 * normalized_shape): the caller then takes the torch.ops path. */
#include <Python.h>

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/object_ptr.h>

#include <c10/util/SmallVector.h>

#include <string>

#include "torch_ops.h"

namespace {

using namespace rnops;

PyObject *g_symint_type = nullptr;  // torch.SymInt

/* The GIL is released while an op runs (as torch's own bindings do); a
 * Python mode or subclass reached by the dispatcher takes it back. */
struct NoGil {
  PyThreadState *state = PyEval_SaveThread();
  NoGil() = default;
  NoGil(const NoGil &) = delete;
  ~NoGil() { PyEval_RestoreThread(state); }
};

struct Symbolic {};  // an argument only torch.ops can take

const Tensor &tensor(PyObject *o, const char *name) {
  TORCH_CHECK_TYPE(THPVariable_Check(o), name, " must be a torch.Tensor, got ", Py_TYPE(o)->tp_name);
  return THPVariable_Unpack(o);
}

OptTensor opt_tensor(PyObject *o, const char *name) {
  if (o == Py_None) return std::nullopt;
  return tensor(o, name);
}

using Shape = c10::SmallVector<c10::SymInt, 8>;

int64_t shape_item(PyObject *o, PyObject *whole) {
  if (!PyLong_CheckExact(o)) {
    if (g_symint_type && PyObject_TypeCheck(o, reinterpret_cast<PyTypeObject *>(g_symint_type)))
      throw Symbolic{};
    TORCH_CHECK_TYPE(PyIndex_Check(o), "normalized_shape must be an int or a sequence of ints, got ",
                     Py_TYPE(whole)->tp_name);
  }
  Py_ssize_t v = PyNumber_AsSsize_t(o, PyExc_OverflowError);
  if (v == -1 && PyErr_Occurred()) throw python_error();
  return v;
}

void shape(PyObject *o, Shape *out) {
  if (PyLong_Check(o) || (PyIndex_Check(o) && !PySequence_Check(o))) {
    out->emplace_back(shape_item(o, o));
    return;
  }
  TORCH_CHECK_TYPE(PyTuple_Check(o) || PyList_Check(o),
                   "normalized_shape must be an int or a sequence of ints, got ",
                   Py_TYPE(o)->tp_name);
  // the items held by a tuple (a list's copied): an item's __index__ may
  // change or empty the list, which must not free the items read after it
  THPObjectPtr items;
  if (PyList_Check(o)) {
    items = PyList_AsTuple(o);
    if (!items) throw python_error();
  } else {
    Py_INCREF(o);
    items = o;
  }
  Py_ssize_t n = PyTuple_GET_SIZE(items.get());
  for (Py_ssize_t i = 0; i < n; i++)
    out->emplace_back(shape_item(PyTuple_GET_ITEM(items.get(), i), o));
}

double number(PyObject *o, const char *name) {
  double v = PyFloat_AsDouble(o);
  if (v == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    TORCH_CHECK_TYPE(false, name, " must be a number, got ", Py_TYPE(o)->tp_name);
  }
  return v;
}

OptDouble opt_number(PyObject *o, const char *name) {
  if (o == Py_None) return std::nullopt;
  return number(o, name);
}

bool flag(PyObject *o) {
  int v = PyObject_IsTrue(o);
  if (v < 0) throw python_error();
  return v != 0;
}

void nargs_is(Py_ssize_t nargs, Py_ssize_t want, const char *fname) {
  TORCH_CHECK_TYPE(nargs == want, "rmsnorm._torch.", fname, "() takes ", want,
                   " positional arguments (", nargs, " given)");
}

PyObject *wrap(Tensor t) { return THPVariable_Wrap(std::move(t)); }

PyObject *tuple_of(std::initializer_list<Tensor> ts) {
  PyObject *t = PyTuple_New(static_cast<Py_ssize_t>(ts.size()));
  if (!t) return nullptr;
  Py_ssize_t i = 0;
  for (const Tensor &x : ts) {
    PyObject *o = wrap(x);
    if (!o) {
      Py_DECREF(t);
      return nullptr;
    }
    PyTuple_SET_ITEM(t, i++, o);
  }
  return t;
}

PyObject *same(PyObject *o) {
  Py_INCREF(o);
  return o;
}

/* Runs an entry point body: torch's error translation, and NotImplemented
 * for symbolic arguments. */
template <class F>
PyObject *entry(F &&f) {
  HANDLE_TH_ERRORS
  try {
    return f();
  } catch (const Symbolic &) {
    Py_RETURN_NOTIMPLEMENTED;
  }
  END_HANDLE_TH_ERRORS
}

#define ARGS PyObject *, PyObject *const *a, Py_ssize_t nargs

// rms_norm(input, normalized_shape, weight, eps, bias, offset, eps_outside, partial,
//          round_before_weight, out)
PyObject *rms_norm(ARGS) {
  return entry([&]() -> PyObject * {
    nargs_is(nargs, 10, "rms_norm");
    const Tensor &x = tensor(a[0], "input");
    Shape ns;
    shape(a[1], &ns);
    OptTensor w = opt_tensor(a[2], "weight"), b = opt_tensor(a[4], "bias");
    OptDouble eps = opt_number(a[3], "eps");
    bool offset = flag(a[5]), outside = flag(a[6]), rbw = flag(a[8]);
    double partial = number(a[7], "partial");
    if (a[9] != Py_None) {
      const Tensor &out = tensor(a[9], "out");
      RN_OP(op, RmsNormOutSig, "rmsnorm::rms_norm", "out");
      {
        NoGil nogil;
        op.call(x, ns, w, eps, b, offset, outside, partial, rbw, out);
      }
      return same(a[9]);
    }
    RN_OP(op, RmsNormSig, "rmsnorm::rms_norm", "");
    Tensor y;
    {
      NoGil nogil;
      y = op.call(x, ns, w, eps, b, offset, outside, partial, rbw);
    }
    return wrap(std::move(y));
  });
}

// rms_norm_forward(input, normalized_shape, weight, eps, bias, offset, eps_outside, partial,
//                  round_before_weight) -> (output, rstd)
PyObject *rms_norm_forward(ARGS) {
  return entry([&]() -> PyObject * {
    nargs_is(nargs, 9, "rms_norm_forward");
    const Tensor &x = tensor(a[0], "input");
    Shape ns;
    shape(a[1], &ns);
    OptTensor w = opt_tensor(a[2], "weight"), b = opt_tensor(a[4], "bias");
    OptDouble eps = opt_number(a[3], "eps");
    bool offset = flag(a[5]), outside = flag(a[6]), rbw = flag(a[8]);
    double partial = number(a[7], "partial");
    RN_OP(op, RmsNormForwardSig, "rmsnorm::rms_norm_forward", "");
    Tensor2 r;
    {
      NoGil nogil;
      r = op.call(x, ns, w, eps, b, offset, outside, partial, rbw);
    }
    return tuple_of({std::get<0>(r), std::get<1>(r)});
  });
}

// layer_norm(input, normalized_shape, weight, bias, eps, offset, round_before_weight, out)
PyObject *layer_norm(ARGS) {
  return entry([&]() -> PyObject * {
    nargs_is(nargs, 8, "layer_norm");
    const Tensor &x = tensor(a[0], "input");
    Shape ns;
    shape(a[1], &ns);
    OptTensor w = opt_tensor(a[2], "weight"), b = opt_tensor(a[3], "bias");
    OptDouble eps = opt_number(a[4], "eps");
    bool offset = flag(a[5]), rbw = flag(a[6]);
    if (a[7] != Py_None) {
      const Tensor &out = tensor(a[7], "out");
      RN_OP(op, LayerNormOutSig, "rmsnorm::layer_norm", "out");
      {
        NoGil nogil;
        op.call(x, ns, w, b, eps, offset, rbw, out);
      }
      return same(a[7]);
    }
    RN_OP(op, LayerNormSig, "rmsnorm::layer_norm", "");
    Tensor y;
    {
      NoGil nogil;
      y = op.call(x, ns, w, b, eps, offset, rbw);
    }
    return wrap(std::move(y));
  });
}

// layer_norm_forward(input, normalized_shape, weight, bias, eps, offset, round_before_weight)
//   -> (output, mean, rstd)
PyObject *layer_norm_forward(ARGS) {
  return entry([&]() -> PyObject * {
    nargs_is(nargs, 7, "layer_norm_forward");
    const Tensor &x = tensor(a[0], "input");
    Shape ns;
    shape(a[1], &ns);
    OptTensor w = opt_tensor(a[2], "weight"), b = opt_tensor(a[3], "bias");
    OptDouble eps = opt_number(a[4], "eps");
    bool offset = flag(a[5]), rbw = flag(a[6]);
    RN_OP(op, LayerNormForwardSig, "rmsnorm::layer_norm_forward", "");
    Tensor3 r;
    {
      NoGil nogil;
      r = op.call(x, ns, w, b, eps, offset, rbw);
    }
    return tuple_of({std::get<0>(r), std::get<1>(r), std::get<2>(r)});
  });
}

// fused_add_rms_norm(input, residual, normalized_shape, weight, eps, bias, offset, eps_outside,
//                    partial, inplace) -> (output, new_residual)
PyObject *fused_add_rms_norm(ARGS) {
  return entry([&]() -> PyObject * {
    nargs_is(nargs, 10, "fused_add_rms_norm");
    const Tensor &u = tensor(a[0], "input");
    const Tensor &h = tensor(a[1], "residual");
    Shape ns;
    shape(a[2], &ns);
    OptTensor w = opt_tensor(a[3], "weight"), b = opt_tensor(a[5], "bias");
    OptDouble eps = opt_number(a[4], "eps");
    bool offset = flag(a[6]), outside = flag(a[7]), inplace = flag(a[9]);
    double partial = number(a[8], "partial");
    if (inplace) {
      RN_OP(op, FusedAddInplaceSig, "rmsnorm::fused_add_rms_norm_inplace", "");
      {
        NoGil nogil;
        op.call(u, h, ns, w, eps, b, offset, outside, partial);
      }
      return PyTuple_Pack(2, a[0], a[1]);
    }
    RN_OP(op, FusedAddSig, "rmsnorm::fused_add_rms_norm", "");
    Tensor2 r;
    {
      NoGil nogil;
      r = op.call(u, h, ns, w, eps, b, offset, outside, partial);
    }
    return tuple_of({std::get<0>(r), std::get<1>(r)});
  });
}

// qk_norm(input, weight, eps, bias, offset, eps_outside, partial, inplace)
PyObject *qk_norm(ARGS) {
  return entry([&]() -> PyObject * {
    nargs_is(nargs, 8, "qk_norm");
    const Tensor &x = tensor(a[0], "input");
    OptTensor w = opt_tensor(a[1], "weight"), b = opt_tensor(a[3], "bias");
    OptDouble eps = opt_number(a[2], "eps");
    bool offset = flag(a[4]), outside = flag(a[5]), inplace = flag(a[7]);
    double partial = number(a[6], "partial");
    if (inplace) {
      RN_OP(op, QkNormInplaceSig, "rmsnorm::qk_norm_inplace", "");
      {
        NoGil nogil;
        op.call(x, w, eps, b, offset, outside, partial);
      }
      return same(a[0]);
    }
    RN_OP(op, QkNormSig, "rmsnorm::qk_norm", "");
    Tensor y;
    {
      NoGil nogil;
      y = op.call(x, w, eps, b, offset, outside, partial);
    }
    return wrap(std::move(y));
  });
}

// rms_norm_int8 / rms_norm_fp8(input, normalized_shape, weight, eps, bias, scale, offset,
//                              eps_outside, partial) -> (q, scale)
PyObject *quant(const char *fname, const c10::TypedOperatorHandle<QuantSig> &op, PyObject *const *a,
                Py_ssize_t nargs) {
  return entry([&]() -> PyObject * {
    nargs_is(nargs, 9, fname);
    const Tensor &x = tensor(a[0], "input");
    Shape ns;
    shape(a[1], &ns);
    OptTensor w = opt_tensor(a[2], "weight"), b = opt_tensor(a[4], "bias");
    OptDouble eps = opt_number(a[3], "eps"), scale = opt_number(a[5], "scale");
    bool offset = flag(a[6]), outside = flag(a[7]);
    double partial = number(a[8], "partial");
    Tensor2 r;
    {
      NoGil nogil;
      r = op.call(x, ns, w, eps, b, scale, offset, outside, partial);
    }
    return tuple_of({std::get<0>(r), std::get<1>(r)});
  });
}

PyObject *rms_norm_int8(ARGS) {
  RN_OP(op, QuantSig, "rmsnorm::rms_norm_int8", "");
  return quant("rms_norm_int8", op, a, nargs);
}

PyObject *rms_norm_fp8(ARGS) {
  RN_OP(op, QuantSig, "rmsnorm::rms_norm_fp8", "");
  return quant("rms_norm_fp8", op, a, nargs);
}

// rms_norm_linear(input, weight_matrix, norm_weight, eps, bias, offset, eps_outside, partial)
PyObject *rms_norm_linear(ARGS) {
  return entry([&]() -> PyObject * {
    nargs_is(nargs, 8, "rms_norm_linear");
    const Tensor &x = tensor(a[0], "input");
    const Tensor &W = tensor(a[1], "weight_matrix");
    OptTensor g = opt_tensor(a[2], "norm_weight"), b = opt_tensor(a[4], "bias");
    OptDouble eps = opt_number(a[3], "eps");
    bool offset = flag(a[5]), outside = flag(a[6]);
    double partial = number(a[7], "partial");
    RN_OP(op, LinearSig, "rmsnorm::rms_norm_linear", "");
    Tensor z;
    {
      NoGil nogil;
      z = op.call(x, W, g, eps, b, offset, outside, partial);
    }
    return wrap(std::move(z));
  });
}

#define FAST(name) \
  { #name, reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(name)), METH_FASTCALL, \
    "The eager entry point of rmsnorm.torch." #name " (positional arguments, in its order)." }

PyMethodDef methods[] = {FAST(rms_norm),
                         FAST(rms_norm_forward),
                         FAST(layer_norm),
                         FAST(layer_norm_forward),
                         FAST(fused_add_rms_norm),
                         FAST(qk_norm),
                         FAST(rms_norm_int8),
                         FAST(rms_norm_fp8),
                         FAST(rms_norm_linear),
                         {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "rmsnorm._torch",
                          "The rmsnorm:: torch ops (registered on import) and rmsnorm.torch's eager "
                          "entry points.",
                          -1, methods, nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__torch(void) {
  PyObject *torch = PyImport_ImportModule("torch");
  if (!torch) return nullptr;
  g_symint_type = PyObject_GetAttrString(torch, "SymInt");  // kept for the process
  Py_DECREF(torch);
  if (!g_symint_type) return nullptr;
  return PyModule_Create(&module_def);
}
