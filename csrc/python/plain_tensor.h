// The fast path of horovodlike._core for a framework's plain tensor: run_plain() takes the
// tensor object itself, where run() takes its pointer, dtype code and shape. The framework layer
// registers what "plain" means for it (register_plain_tensors): its exact tensor class, the
// dtype codes of its dtypes, its dense layout; the core learns no framework type otherwise.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

namespace horovodlike {

// module.cc's run(): enqueue + wait + release of a collective into the caller's buffer; None,
// or (status code, message) when it failed.
pybind11::object RunCall(int op, const std::string& name, uintptr_t input, uintptr_t output,
                         int dtype, std::vector<int64_t> shape, int reduce_op, double prescale,
                         double postscale, int root_rank, int device, int process_set,
                         uintptr_t stream);

// A Python int (bools included) that fits a long long, into `out`; false (no error set) for
// anything else.
bool ArgInt(PyObject* arg, long long& out);

void DefinePlainTensorFunctions(pybind11::module_& core);

// Sets the module's attribute `def->ml_name` to the C function `def` describes (METH_FASTCALL
// functions, which pybind11 does not make); `def` must outlive the module.
void AddCFunction(pybind11::module_& core, PyMethodDef* def);

}  // namespace horovodlike
