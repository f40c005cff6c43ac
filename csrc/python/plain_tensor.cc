#include "plain_tensor.h"

#include <cstdint>

namespace py = pybind11;

namespace horovodlike {
namespace {

// What register_plain_tensors() was given (references kept for the process's life).
struct PlainTensors {
  PyObject* type = nullptr;              // the framework's tensor class (subclasses excluded)
  PyObject* dtypes = nullptr;            // dict: the framework's dtype object -> dtype code
  PyObject* dense_layout = nullptr;      // the layout of a dense (strided) tensor
  PyObject* reduce_ops = nullptr;        // the reduce ops' codes (a set or frozenset of ints)
  PyObject* in_flight = nullptr;         // dict: the asynchronous operations in flight
  PyObject* keep_interrupted = nullptr;  // keeps an interrupted call's buffers alive
  PyObject* is_cpu = nullptr;            // interned attribute names
  PyObject* layout = nullptr;
  PyObject* is_contiguous = nullptr;
  PyObject* dtype = nullptr;
  PyObject* data_ptr = nullptr;
  PyObject* shape = nullptr;
} g_plain;

// An attribute (or, `call`, a method's result) of `object` that must be exactly `expected`.
bool Is(PyObject* object, PyObject* name, PyObject* expected, bool call = false) {
  PyObject* value = call ? PyObject_CallMethodNoArgs(object, name) : PyObject_GetAttr(object, name);
  const bool same = value == expected;
  Py_XDECREF(value);
  return same;
}

// An int itself (not a bool).
bool ExactInt(PyObject* arg, long long& out) { return PyLong_CheckExact(arg) && ArgInt(arg, out); }

bool FitsInt(long long value) { return value >= INT32_MIN && value <= INT32_MAX; }

bool Number(PyObject* arg, double& out) {
  if (PyFloat_CheckExact(arg)) {
    out = PyFloat_AS_DOUBLE(arg);
    return true;
  }
  if (!PyLong_CheckExact(arg)) return false;
  out = PyLong_AsDouble(arg);
  return !(out == -1.0 && PyErr_Occurred());
}

// The tensor's dtype code, pointer and shape when it is plain: of the registered class itself,
// on the CPU, dense, contiguous, of a registered dtype.
bool Plain(PyObject* tensor, long long& dtype, long long& pointer, std::vector<int64_t>& shape) {
  if (reinterpret_cast<PyObject*>(Py_TYPE(tensor)) != g_plain.type ||
      !Is(tensor, g_plain.is_cpu, Py_True) || !Is(tensor, g_plain.layout, g_plain.dense_layout) ||
      !Is(tensor, g_plain.is_contiguous, Py_True, /*call=*/true)) {
    return false;
  }
  PyObject* dtype_object = PyObject_GetAttr(tensor, g_plain.dtype);
  if (dtype_object == nullptr) return false;
  PyObject* code = PyDict_GetItemWithError(g_plain.dtypes, dtype_object);  // borrowed
  Py_DECREF(dtype_object);
  if (code == nullptr || !ExactInt(code, dtype)) return false;
  PyObject* data = PyObject_CallMethodNoArgs(tensor, g_plain.data_ptr);
  const bool pointed = data != nullptr && ExactInt(data, pointer) && pointer >= 0;
  Py_XDECREF(data);
  if (!pointed) return false;
  PyObject* dims = PyObject_GetAttr(tensor, g_plain.shape);
  if (dims == nullptr) return false;
  bool ok = PyTuple_Check(dims);
  if (ok) {
    const Py_ssize_t n = PyTuple_GET_SIZE(dims);
    shape.resize(static_cast<size_t>(n));
    for (Py_ssize_t i = 0; ok && i < n; ++i) {
      long long dim = 0;
      ok = ExactInt(PyTuple_GET_ITEM(dims, i), dim);
      shape[static_cast<size_t>(i)] = dim;
    }
  }
  Py_DECREF(dims);
  return ok;
}

// Whether an asynchronous operation of the global set named `name` is in flight (its key in
// requests.in_flight is (0, name)); looked up only while any is.
bool InFlight(PyObject* name) {
  if (PyDict_GET_SIZE(g_plain.in_flight) == 0) return false;
  PyObject* key = Py_BuildValue("(iO)", 0, name);
  const int found = key == nullptr ? 1 : PyDict_Contains(g_plain.in_flight, key);
  Py_XDECREF(key);
  return found != 0;
}

// run_plain(op, name, tensor, reduce_op, prescale, postscale): the collective `op` of the
// global process set, in place, on a plain tensor (see Plain) with an integer reduce op the
// core takes, numbers for the scales, and no asynchronous operation under the same name in
// flight (the general path refuses it). Returns None when any of that does not hold, having done nothing
// (the caller then takes its general path, whose checks say what is wrong); True when the
// collective completed; (status code, message) when it failed.
PyObject* RunPlain(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 6) {
    PyErr_SetString(PyExc_TypeError,
                    "run_plain(op, name, tensor, reduce_op, prescale, postscale) takes 6 "
                    "positional arguments");
    return nullptr;
  }
  long long op = 0, reduce_op = 0, dtype = 0, pointer = 0;
  double prescale = 1.0, postscale = 1.0;
  std::vector<int64_t> shape;
  const char* name = nullptr;
  Py_ssize_t name_size = 0;
  PyObject* tensor = args[2];
  const bool plain =
      g_plain.type != nullptr && !InFlight(args[1]) &&
      ExactInt(args[0], op) && FitsInt(op) && PyUnicode_Check(args[1]) &&
      (name = PyUnicode_AsUTF8AndSize(args[1], &name_size)) != nullptr &&
      ExactInt(args[3], reduce_op) && FitsInt(reduce_op) &&
      PySet_Contains(g_plain.reduce_ops, args[3]) == 1 &&
      Number(args[4], prescale) && Number(args[5], postscale) &&
      Plain(tensor, dtype, pointer, shape) && FitsInt(dtype);
  if (!plain) {
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  try {
    const auto address = static_cast<uintptr_t>(pointer);
    py::object failed = RunCall(static_cast<int>(op), std::string(name, name_size), address,
                                address, static_cast<int>(dtype), std::move(shape),
                                static_cast<int>(reduce_op), prescale, postscale, 0, -1, 0, 0);
    if (failed.is_none()) Py_RETURN_TRUE;
    return failed.release().ptr();
  } catch (...) {
    py::detail::try_translate_exceptions();  // as pybind11's dispatcher does
  }
  // Refused before it was queued (ValueError, TypeError): the core never saw the buffer.
  // Otherwise (interrupted while waiting) the core may still use it: kept alive.
  if (!PyErr_ExceptionMatches(PyExc_ValueError) && !PyErr_ExceptionMatches(PyExc_TypeError)) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyObject* kept = PyObject_CallFunction(g_plain.keep_interrupted, "((OO))", tensor, tensor);
    Py_XDECREF(kept);
    PyErr_Restore(type, value, traceback);
  }
  return nullptr;
}

void Register(py::object type, py::dict dtypes, py::object dense_layout, py::object reduce_ops,
              py::dict in_flight, py::object keep_interrupted) {
  if (!PyType_Check(type.ptr())) throw py::type_error("register_plain_tensors: not a class");
  if (!PyAnySet_Check(reduce_ops.ptr())) {
    throw py::type_error("register_plain_tensors: reduce_ops must be a set or frozenset");
  }
  auto keep = [](const py::handle& object) { return object.inc_ref().ptr(); };
  g_plain.dtypes = keep(dtypes);
  g_plain.dense_layout = keep(dense_layout);
  g_plain.reduce_ops = keep(reduce_ops);
  g_plain.in_flight = keep(in_flight);
  g_plain.keep_interrupted = keep(keep_interrupted);
  g_plain.is_cpu = PyUnicode_InternFromString("is_cpu");
  g_plain.layout = PyUnicode_InternFromString("layout");
  g_plain.is_contiguous = PyUnicode_InternFromString("is_contiguous");
  g_plain.dtype = PyUnicode_InternFromString("dtype");
  g_plain.data_ptr = PyUnicode_InternFromString("data_ptr");
  g_plain.shape = PyUnicode_InternFromString("shape");
  g_plain.type = keep(type);  // last: run_plain looks at it first
}

}  // namespace

void DefinePlainTensorFunctions(py::module_& m) {
  m.def("register_plain_tensors", &Register, py::arg("tensor_type"), py::arg("dtypes"),
        py::arg("dense_layout"), py::arg("reduce_ops"), py::arg("in_flight"),
        py::arg("keep_interrupted"),
        "Tells run_plain() what a plain tensor is: an object of `tensor_type` itself with "
        "is_cpu, layout (`dense_layout`), is_contiguous(), dtype (a key of `dtypes`, whose "
        "value is the core's dtype code), data_ptr() and shape; `reduce_ops`: the reduce "
        "ops' codes; `in_flight`: the dict of asynchronous operations in flight, keyed by "
        "(process set id, name) (run_plain steps aside for a name in it); "
        "`keep_interrupted(buffers)`: called with the "
        "tensor when a wait is interrupted while the core may still use it.");
  static PyMethodDef run_plain_def = {
      "run_plain", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&RunPlain)),
      METH_FASTCALL,
      "run_plain(op, name, tensor, reduce_op, prescale, postscale) -> None | True | tuple\n\n"
      "The collective `op` of the global process set, in place, on a plain tensor (see "
      "register_plain_tensors). None: not a plain call, nothing done (take the general path); "
      "True: done; (status code, message): it failed."};
  AddCFunction(m, &run_plain_def);
}

void AddCFunction(py::module_& m, PyMethodDef* def) {
  m.attr(def->ml_name) = py::reinterpret_steal<py::object>(
      PyCFunction_NewEx(def, nullptr, m.attr("__name__").ptr()));
}

}  // namespace horovodlike
