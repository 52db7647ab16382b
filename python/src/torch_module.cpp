/* torch_module.cpp - rmsnorm._torch: importing it registers the rmsnorm:: ops
 * (torch_ops.cpp); it also holds the eager entry point of rmsnorm.torch, call(),
 * which converts an op's arguments by its schema's types without Python-level
 * work, releases the GIL and calls the op through the dispatcher (so autograd
 * and any mode or subclass below __torch_function__ see the op itself).
 * torch's generic path for calling a torch.ops op from Python costs 5-15 us a
 * call; this one about 1 us. It returns NotImplemented when an argument is
 * symbolic (a SymInt in normalized_shape): the caller then takes torch.ops. */
#include <Python.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/object_ptr.h>

#include <string>
#include <vector>

#include "core.hpp"

namespace {

PyObject *g_symint_type = nullptr;  // torch.SymInt

/* The ops call() knows, by the handle op() gave for them. */
std::vector<c10::OperatorHandle> g_ops;

/* The GIL is released while an op runs (as torch's own bindings do); a
 * Python mode or subclass reached by the dispatcher takes it back. */
struct NoGil {
  PyThreadState *state = PyEval_SaveThread();
  NoGil() = default;
  NoGil(const NoGil &) = delete;
  ~NoGil() { PyEval_RestoreThread(state); }
};

struct Symbolic {};  // an argument only torch.ops can take

at::Tensor tensor(PyObject *o, const std::string &name) {
  TORCH_CHECK_TYPE(THPVariable_Check(o), name, " must be a torch.Tensor, got ", Py_TYPE(o)->tp_name);
  return THPVariable_Unpack(o);
}

int64_t shape_item(PyObject *o, PyObject *whole) {
  if (!PyLong_CheckExact(o)) {
    if (PyObject_TypeCheck(o, reinterpret_cast<PyTypeObject *>(g_symint_type))) throw Symbolic{};
    TORCH_CHECK_TYPE(PyIndex_Check(o), "normalized_shape must be an int or a sequence of ints, got ",
                     Py_TYPE(whole)->tp_name);
  }
  Py_ssize_t v = PyNumber_AsSsize_t(o, PyExc_OverflowError);
  if (v == -1 && PyErr_Occurred()) throw python_error();
  return v;
}

c10::IValue shape(PyObject *o) {
  std::vector<int64_t> out;
  if (PyLong_Check(o) || (PyIndex_Check(o) && !PySequence_Check(o))) {
    out.push_back(shape_item(o, o));
    return out;
  }
  TORCH_CHECK_TYPE(PyTuple_Check(o) || PyList_Check(o),
                   "normalized_shape must be an int or a sequence of ints, got ", Py_TYPE(o)->tp_name);
  // the items held by a tuple (a list's copied): an item's __index__ may
  // change or empty the list, which must not free the items read after it
  THPObjectPtr items(PyList_Check(o) ? PyList_AsTuple(o) : (Py_INCREF(o), o));
  if (!items) throw python_error();
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(items.get()); i++)
    out.push_back(shape_item(PyTuple_GET_ITEM(items.get(), i), o));
  return out;
}

double number(PyObject *o, const std::string &name) {
  double v = PyFloat_AsDouble(o);
  if (v == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    TORCH_CHECK_TYPE(false, name, " must be a number, got ", Py_TYPE(o)->tp_name);
  }
  return v;
}

/* o as the schema argument `arg` takes it. */
c10::IValue convert(PyObject *o, const c10::Argument &arg) {
  const c10::TypePtr &t = arg.real_type();
  if (o == Py_None && t->kind() == c10::TypeKind::OptionalType) return c10::IValue();
  const c10::TypePtr &base = t->kind() == c10::TypeKind::OptionalType
                                 ? t->expectRef<c10::OptionalType>().getElementType()
                                 : t;
  switch (base->kind()) {
    case c10::TypeKind::TensorType: return tensor(o, arg.name());
    case c10::TypeKind::FloatType: return number(o, arg.name());
    case c10::TypeKind::BoolType: {
      int v = PyObject_IsTrue(o);
      if (v < 0) throw python_error();
      return v != 0;
    }
    case c10::TypeKind::IntType: {
      int64_t v = PyLong_AsLongLong(o);
      if (v == -1 && PyErr_Occurred()) throw python_error();
      return v;
    }
    case c10::TypeKind::StringType: {
      TORCH_CHECK_TYPE(PyUnicode_Check(o), arg.name(), " must be a str, got ", Py_TYPE(o)->tp_name);
      const char *c = PyUnicode_AsUTF8(o);
      if (!c) throw python_error();
      return std::string(c);
    }
    case c10::TypeKind::ListType: return shape(o);  // SymInt[] normalized_shape
    default: TORCH_CHECK(false, "rmsnorm._torch.call: no conversion for ", t->str());
  }
}

PyObject *wrap(const c10::IValue &v) {
  if (v.isNone()) Py_RETURN_NONE;
  return THPVariable_Wrap(v.toTensor());
}

/* op(name, overload) -> a handle for call(). */
PyObject *op(PyObject *, PyObject *args) {
  HANDLE_TH_ERRORS
  const char *name, *overload;
  if (!PyArg_ParseTuple(args, "ss", &name, &overload)) return nullptr;
  g_ops.push_back(c10::Dispatcher::singleton().findSchemaOrThrow(name, overload));
  return PyLong_FromSize_t(g_ops.size() - 1);
  END_HANDLE_TH_ERRORS
}

/* call(handle, *args): the op with every schema argument given by position; its
 * result (None for an op that returns nothing, a tuple for several). */
PyObject *call(PyObject *, PyObject *const *a, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  try {
    std::size_t h = nargs > 0 ? PyLong_AsSize_t(a[0]) : g_ops.size();
    TORCH_CHECK(h < g_ops.size(), "rmsnorm._torch.call: not an op handle");
    const c10::OperatorHandle &handle = g_ops[h];
    const auto &args = handle.schema().arguments();
    TORCH_CHECK_TYPE(static_cast<std::size_t>(nargs - 1) == args.size(), "rmsnorm._torch.call(",
                     handle.schema().name(), ") takes ", args.size(), " arguments (", nargs - 1,
                     " given)");
    torch::jit::Stack stack;
    stack.reserve(args.size());
    for (std::size_t i = 0; i < args.size(); i++) stack.push_back(convert(a[i + 1], args[i]));
    {
      NoGil nogil;
      handle.callBoxed(stack);
    }
    if (stack.empty()) Py_RETURN_NONE;
    if (stack.size() == 1) return wrap(stack[0]);
    THPObjectPtr t(PyTuple_New(static_cast<Py_ssize_t>(stack.size())));
    if (!t) return nullptr;
    for (std::size_t i = 0; i < stack.size(); i++) {
      PyObject *o = wrap(stack[i]);
      if (!o) return nullptr;
      PyTuple_SET_ITEM(t.get(), static_cast<Py_ssize_t>(i), o);
    }
    return t.release();
  } catch (const Symbolic &) {
    Py_RETURN_NOTIMPLEMENTED;
  }
  END_HANDLE_TH_ERRORS
}

/* The messages the fake kernels share with core.hpp, as str.format templates. */
PyObject *messages(PyObject *, PyObject *) {
  THPObjectPtr d(PyDict_New());
  if (!d) return nullptr;
  for (const auto &[key, text] : rncore::kMessages) {
    THPObjectPtr s(PyUnicode_FromString(text));
    if (!s || PyDict_SetItemString(d.get(), key, s.get()) < 0) return nullptr;
  }
  return d.release();
}

/* The data dtypes' names, by rmsnorm_dtype code. */
PyObject *dtypes(PyObject *, PyObject *) {
  THPObjectPtr l(PyList_New(0));
  for (const char *name : rncore::kDtypeNames) {
    THPObjectPtr s(PyUnicode_FromString(name));
    if (!l || !s || PyList_Append(l.get(), s.get()) < 0) return nullptr;
  }
  return l.release();
}

PyMethodDef methods[] = {
    {"op", op, METH_VARARGS, "op(name, overload): a handle of the op rmsnorm::name.overload for call()."},
    {"call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(call)), METH_FASTCALL,
     "call(handle, *args): the op, every schema argument by position (rmsnorm.torch's eager path)."},
    {"messages", messages, METH_NOARGS, "The error messages of core.hpp, as str.format templates."},
    {"dtypes", dtypes, METH_NOARGS, "The data dtypes' names, by rmsnorm_dtype code."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "rmsnorm._torch",
                          "The rmsnorm:: torch ops (registered on import) and rmsnorm.torch's eager "
                          "entry point.",
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
