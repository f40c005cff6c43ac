// One GPU as the core uses it: its own stream (the core's work is ordered on it and never on a
// framework's), a pool of events, pinned host memory for staging, device memory for fusion and
// for outputs the core allocates. Created on first use of a device, kept for the process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "cuda_api.h"

namespace horovodlike {

class DeviceContext {
 public:
  // The context of CUDA device `device`; throws InvalidArgument when CUDA is not usable or the
  // device does not exist.
  static DeviceContext& For(int device);

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  const CudaApi& cuda() const { return cuda_; }

  // An event from the pool; it goes back when the last owner lets go.
  std::shared_ptr<void> Event();
  // An event recorded on `stream` (a caller's: the point its data is ready).
  std::shared_ptr<void> RecordOn(cudaStream_t stream);
  // The core's stream waits for `event` (no host-side wait).
  void StreamWait(cudaEvent_t event);
  // Asynchronous copy on the core's stream.
  void Copy(void* dst, const void* src, size_t bytes, CudaMemcpyKind kind);
  // Zeros in device memory, on the core's stream.
  void Zero(void* dst, size_t bytes);
  // Blocks this thread until the core's stream has done everything queued so far.
  void Synchronize();

  // Pinned host memory of at least `bytes`, pooled.
  std::shared_ptr<uint8_t> Pinned(size_t bytes);
  // Device memory of `bytes` (at least 1), freed when the last owner lets go.
  std::shared_ptr<uint8_t> DeviceMemory(size_t bytes);
  // The device fusion buffer, grown to at least `bytes`; used by one collective at a time
  // (the core's stream orders its uses).
  uint8_t* FusionBuffer(size_t bytes);
  size_t fusion_capacity() const { return fusion_bytes_; }

 private:
  explicit DeviceContext(int device);

  const CudaApi& cuda_;
  int device_;
  cudaStream_t stream_ = nullptr;
  std::mutex mutex_;  // guards the pools
  std::vector<cudaEvent_t> free_events_;
  std::multimap<size_t, uint8_t*> free_pinned_;
  std::shared_ptr<uint8_t> fusion_;
  size_t fusion_bytes_ = 0;
  std::shared_ptr<uint8_t> zeros_;  // pinned, all zero
  size_t zeros_bytes_ = 0;
};

}  // namespace horovodlike
