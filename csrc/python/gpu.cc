#include "gpu.h"

#include <pybind11/stl.h>

#include "../core/runtime.h"
#include "../cuda/cuda_api.h"
#include "../cuda/library_search.h"
#include "../cuda/nccl_api.h"

namespace py = pybind11;

namespace horovodlike {
namespace {

py::dict StatusDict(const GpuLibraryStatus& status) {
  py::dict d;
  d["found"] = status.found;
  d["path"] = status.path.empty() ? py::object(py::none()) : py::object(py::str(status.path));
  d["version"] =
      status.version.empty() ? py::object(py::none()) : py::object(py::str(status.version));
  d["error"] = status.error.empty() ? py::object(py::none()) : py::object(py::str(status.error));
  return d;
}

}  // namespace

void DefineGpuFunctions(py::module_& m) {
  m.def("set_gpu_library_dirs", [](std::vector<std::string> cudart_dirs,
                                   std::vector<std::string> nccl_dirs) {
    SetGpuLibraryDirs(std::move(cudart_dirs), std::move(nccl_dirs));
  }, py::arg("cudart_dirs"), py::arg("nccl_dirs"),
     "Folders of NVIDIA's wheels searched for libcudart and libnccl (before the system's).");
  m.def("gpu_info", [] {
    // Loading may take a moment (the first call loads both libraries).
    GpuLibraryStatus cuda, nccl;
    {
      py::gil_scoped_release release;
      cuda = CudaStatus();
      nccl = NcclStatus();
    }
    py::dict info;
    py::dict c = StatusDict(cuda);
    c["devices"] = cuda.devices;
    info["cuda"] = c;
    info["nccl"] = StatusDict(nccl);
    info["search"] = py::make_tuple(CudartDirs(), NcclDirs());
    return info;
  }, "The CUDA runtime and NCCL this process found: found, path, version, error (why not "
     "usable), and the CUDA devices.");
  m.def("output_to_device", [](int64_t handle, uintptr_t dst, uintptr_t stream) {
    auto runtime = Runtime::Get();
    auto state = runtime->handles().Get(handle);
    py::gil_scoped_release release;
    runtime->gpu_completions().CopyOutput(state, reinterpret_cast<void*>(dst),
                                          reinterpret_cast<void*>(stream));
  }, py::arg("handle"), py::arg("dst"), py::arg("stream"),
     "Copies a completed handle's core-allocated output (shape from output()) into GPU memory "
     "at dst, ordered on stream.");
  m.def("gpu_mode", [](int process_set) -> py::object {
    // How the set runs GPU tensors: "nccl", "staged: <why>", or None before its first.
    auto runtime = Runtime::Get();
    const std::string mode = runtime->DeviceMode(process_set);
    if (mode.empty()) return py::none();
    return py::str(mode);
  }, py::arg("process_set") = 0);
}

}  // namespace horovodlike
