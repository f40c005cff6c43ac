// The CUDA runtime, loaded at run time: the few types and functions the core uses, declared
// here with the runtime's own ABI (no CUDA headers at build time), and a table of function
// pointers resolved once by dlsym.
#pragma once

#include <cstddef>
#include <string>

namespace horovodlike {

using cudaError_t = int;
using cudaStream_t = void*;
using cudaEvent_t = void*;

constexpr cudaError_t kCudaSuccess = 0;
constexpr cudaError_t kCudaErrorNotReady = 600;
enum CudaMemcpyKind : int {
  kHostToHost = 0, kHostToDevice = 1, kDeviceToHost = 2, kDeviceToDevice = 3, kMemcpyDefault = 4
};
constexpr unsigned kCudaStreamNonBlocking = 0x01;
constexpr unsigned kCudaEventDisableTiming = 0x02;
constexpr unsigned kCudaHostAllocPortable = 0x01;

struct CudaApi {
  std::string path;          // the file loaded
  int runtime_version = 0;   // cudaRuntimeGetVersion: 1000 * major + 10 * minor
  int driver_version = 0;    // 0 where no driver is installed
  int device_count = 0;      // 0 where none is usable; `no_device` says why
  std::string no_device;

  cudaError_t (*GetDeviceCount)(int*) = nullptr;
  cudaError_t (*SetDevice)(int) = nullptr;
  cudaError_t (*GetDevice)(int*) = nullptr;
  cudaError_t (*DeviceGetPCIBusId)(char*, int, int) = nullptr;
  cudaError_t (*StreamCreateWithFlags)(cudaStream_t*, unsigned) = nullptr;
  cudaError_t (*StreamSynchronize)(cudaStream_t) = nullptr;
  cudaError_t (*StreamWaitEvent)(cudaStream_t, cudaEvent_t, unsigned) = nullptr;
  cudaError_t (*EventCreateWithFlags)(cudaEvent_t*, unsigned) = nullptr;
  cudaError_t (*EventDestroy)(cudaEvent_t) = nullptr;
  cudaError_t (*EventRecord)(cudaEvent_t, cudaStream_t) = nullptr;
  cudaError_t (*EventQuery)(cudaEvent_t) = nullptr;
  cudaError_t (*EventSynchronize)(cudaEvent_t) = nullptr;
  cudaError_t (*MemcpyAsync)(void*, const void*, size_t, int, cudaStream_t) = nullptr;
  cudaError_t (*Malloc)(void**, size_t) = nullptr;
  cudaError_t (*Free)(void*) = nullptr;
  cudaError_t (*HostAlloc)(void**, size_t, unsigned) = nullptr;
  cudaError_t (*FreeHost)(void*) = nullptr;
  const char* (*GetErrorString)(cudaError_t) = nullptr;
  cudaError_t (*RuntimeGetVersion)(int*) = nullptr;
  cudaError_t (*DriverGetVersion)(int*) = nullptr;

  // Throws TransportError("<what>: <CUDA's message>") when `error` is not success.
  void Check(cudaError_t error, const char* what) const;
  std::string ErrorString(cudaError_t error) const;
};

// What was found, without throwing: for --check-build and gpu_info().
struct GpuLibraryStatus {
  bool found = false;
  std::string path;
  std::string version;  // "12.8"
  std::string error;    // why it cannot be used
  int devices = 0;
};
GpuLibraryStatus CudaStatus();

// The loaded runtime with at least one device; throws InvalidArgument saying what to install
// (or that no GPU is present) otherwise. Loaded on first use, never unloaded.
const CudaApi& Cuda();

// Makes `device` current on this thread for the guard's life, restoring the caller's device
// after (a caller's current device is theirs).
class DeviceGuard {
 public:
  DeviceGuard(const CudaApi& cuda, int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  const CudaApi& cuda_;
  int previous_ = -1;
  int device_;
};

}  // namespace horovodlike
