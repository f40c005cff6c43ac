// The GPU entry points of horovodlike._core: which CUDA runtime and NCCL were found, where to
// look for NVIDIA's wheels, and copying a core-allocated output into a framework's GPU tensor.
#pragma once

#include <pybind11/pybind11.h>

namespace horovodlike {

void DefineGpuFunctions(pybind11::module_& core);

}  // namespace horovodlike
