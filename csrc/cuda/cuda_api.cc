#include "cuda_api.h"

#include <mutex>

#include "../common/common.h"
#include "library_search.h"

namespace horovodlike {
namespace {

struct Loaded {
  bool located = false;  // the file was found (it may still be unusable: `error`)
  CudaApi api;
  std::string error;  // set: the runtime is not usable
};

Loaded* Load() {
  auto* loaded = new Loaded();
  FoundLibrary found = FindLibrary("HOROVOD_CUDART_PATH",
                                   {"libcudart.so.13", "libcudart.so.12", "libcudart.so"},
                                   CudartDirs());
  if (found.handle == nullptr) {
    loaded->error = "the CUDA runtime (libcudart) was " + found.error;
    return loaded;
  }
  loaded->located = true;
  CudaApi& api = loaded->api;
  api.path = found.path;
  void* h = found.handle;
  std::string missing;
  ResolveSymbol(h, "cudaGetDeviceCount", &api.GetDeviceCount, &missing);
  ResolveSymbol(h, "cudaSetDevice", &api.SetDevice, &missing);
  ResolveSymbol(h, "cudaGetDevice", &api.GetDevice, &missing);
  ResolveSymbol(h, "cudaDeviceGetPCIBusId", &api.DeviceGetPCIBusId, &missing);
  ResolveSymbol(h, "cudaStreamCreateWithFlags", &api.StreamCreateWithFlags, &missing);
  ResolveSymbol(h, "cudaStreamSynchronize", &api.StreamSynchronize, &missing);
  ResolveSymbol(h, "cudaStreamWaitEvent", &api.StreamWaitEvent, &missing);
  ResolveSymbol(h, "cudaEventCreateWithFlags", &api.EventCreateWithFlags, &missing);
  ResolveSymbol(h, "cudaEventDestroy", &api.EventDestroy, &missing);
  ResolveSymbol(h, "cudaEventRecord", &api.EventRecord, &missing);
  ResolveSymbol(h, "cudaEventQuery", &api.EventQuery, &missing);
  ResolveSymbol(h, "cudaEventSynchronize", &api.EventSynchronize, &missing);
  ResolveSymbol(h, "cudaMemcpyAsync", &api.MemcpyAsync, &missing);
  ResolveSymbol(h, "cudaMalloc", &api.Malloc, &missing);
  ResolveSymbol(h, "cudaFree", &api.Free, &missing);
  ResolveSymbol(h, "cudaHostAlloc", &api.HostAlloc, &missing);
  ResolveSymbol(h, "cudaFreeHost", &api.FreeHost, &missing);
  ResolveSymbol(h, "cudaGetErrorString", &api.GetErrorString, &missing);
  ResolveSymbol(h, "cudaRuntimeGetVersion", &api.RuntimeGetVersion, &missing);
  ResolveSymbol(h, "cudaDriverGetVersion", &api.DriverGetVersion, &missing);
  if (!missing.empty()) {
    loaded->error = "the CUDA runtime " + api.path + " lacks " + missing;
    return loaded;
  }
  api.RuntimeGetVersion(&api.runtime_version);
  if (api.DriverGetVersion(&api.driver_version) != kCudaSuccess) api.driver_version = 0;
  const cudaError_t error = api.GetDeviceCount(&api.device_count);
  if (error != kCudaSuccess || api.device_count <= 0) {
    api.device_count = 0;
    api.no_device = "no GPU is usable on this machine (" + api.path + ": " +
                    (error != kCudaSuccess ? api.ErrorString(error) : "0 devices") +
                    (api.driver_version == 0 ? "; no NVIDIA driver is installed" : "") + ")";
  }
  return loaded;
}

const Loaded& Get() { return LoadOnce(&Load); }

std::string VersionString(int v) {
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

}  // namespace

std::string CudaApi::ErrorString(cudaError_t error) const {
  const char* text = GetErrorString != nullptr ? GetErrorString(error) : nullptr;
  return (text != nullptr ? text : "CUDA error") + std::string(" (") + std::to_string(error) + ")";
}

void CudaApi::Check(cudaError_t error, const char* what) const {
  if (error != kCudaSuccess) throw TransportError(std::string(what) + ": " + ErrorString(error));
}

GpuLibraryStatus CudaStatus() {
  const Loaded& loaded = Get();
  GpuLibraryStatus status;
  status.found = loaded.error.empty();
  status.path = loaded.api.path;
  status.error = !loaded.error.empty() ? loaded.error : loaded.api.no_device;
  if (status.found) status.version = VersionString(loaded.api.runtime_version);
  status.devices = loaded.api.device_count;
  return status;
}

const CudaApi& Cuda() {
  const Loaded& loaded = Get();
  if (!loaded.error.empty()) {
    throw InvalidArgument(loaded.error + ". Install NVIDIA's CUDA runtime (pip install "
                          "nvidia-cuda-runtime-cu12), or set HOROVOD_CUDART_PATH to "
                          "libcudart.so");
  }
  if (loaded.api.device_count == 0) throw InvalidArgument(loaded.api.no_device);
  return loaded.api;
}

DeviceGuard::DeviceGuard(const CudaApi& cuda, int device) : cuda_(cuda), device_(device) {
  cuda_.Check(cuda_.GetDevice(&previous_), "cudaGetDevice");
  if (previous_ != device_) cuda_.Check(cuda_.SetDevice(device_), "cudaSetDevice");
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0 && previous_ != device_) cuda_.SetDevice(previous_);
}

}  // namespace horovodlike
