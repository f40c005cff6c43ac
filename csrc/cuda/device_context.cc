#include "device_context.h"

#include <cstring>

#include "../common/common.h"

namespace horovodlike {

DeviceContext& DeviceContext::For(int device) {
  static std::mutex mutex;
  static auto* contexts = new std::map<int, DeviceContext*>();
  std::lock_guard<std::mutex> lock(mutex);
  auto it = contexts->find(device);
  if (it != contexts->end()) return *it->second;
  const CudaApi& cuda = Cuda();
  if (device < 0 || device >= cuda.device_count) {
    throw InvalidArgument("CUDA device " + std::to_string(device) + " does not exist (this " +
                          "machine has " + std::to_string(cuda.device_count) + ")");
  }
  auto* context = new DeviceContext(device);
  (*contexts)[device] = context;
  return *context;
}

DeviceContext::DeviceContext(int device) : cuda_(Cuda()), device_(device) {
  DeviceGuard guard(cuda_, device_);
  cuda_.Check(cuda_.StreamCreateWithFlags(&stream_, kCudaStreamNonBlocking),
              "cudaStreamCreateWithFlags");
}

std::shared_ptr<void> DeviceContext::Event() {
  cudaEvent_t event = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!free_events_.empty()) {
      event = free_events_.back();
      free_events_.pop_back();
    }
  }
  if (event == nullptr) {
    DeviceGuard guard(cuda_, device_);
    cuda_.Check(cuda_.EventCreateWithFlags(&event, kCudaEventDisableTiming),
                "cudaEventCreateWithFlags");
  }
  return std::shared_ptr<void>(event, [this](void* e) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_events_.push_back(e);
  });
}

std::shared_ptr<void> DeviceContext::RecordOn(cudaStream_t stream) {
  std::shared_ptr<void> event = Event();
  DeviceGuard guard(cuda_, device_);
  cuda_.Check(cuda_.EventRecord(event.get(), stream), "cudaEventRecord");
  return event;
}

void DeviceContext::StreamWait(cudaEvent_t event) {
  cuda_.Check(cuda_.StreamWaitEvent(stream_, event, 0), "cudaStreamWaitEvent");
}

void DeviceContext::Copy(void* dst, const void* src, size_t bytes, CudaMemcpyKind kind) {
  if (bytes == 0) return;
  cuda_.Check(cuda_.MemcpyAsync(dst, src, bytes, kind, stream_), "cudaMemcpyAsync");
}

void DeviceContext::Zero(void* dst, size_t bytes) {
  if (bytes == 0) return;
  if (zeros_bytes_ < bytes) {
    zeros_ = Pinned(bytes);
    std::memset(zeros_.get(), 0, bytes);
    zeros_bytes_ = bytes;
  }
  Copy(dst, zeros_.get(), bytes, kHostToDevice);
}

void DeviceContext::Synchronize() {
  cuda_.Check(cuda_.StreamSynchronize(stream_), "cudaStreamSynchronize");
}

std::shared_ptr<uint8_t> DeviceContext::Pinned(size_t bytes) {
  bytes = std::max<size_t>(bytes, 64);
  uint8_t* memory = nullptr;
  size_t size = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_pinned_.lower_bound(bytes);
    if (it != free_pinned_.end() && it->first <= 2 * bytes) {
      size = it->first;
      memory = it->second;
      free_pinned_.erase(it);
    }
  }
  if (memory == nullptr) {
    size = bytes;
    void* p = nullptr;
    DeviceGuard guard(cuda_, device_);
    cuda_.Check(cuda_.HostAlloc(&p, size, kCudaHostAllocPortable), "cudaHostAlloc");
    memory = static_cast<uint8_t*>(p);
  }
  return std::shared_ptr<uint8_t>(memory, [this, size](uint8_t* p) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_pinned_.emplace(size, p);
  });
}

std::shared_ptr<uint8_t> DeviceContext::DeviceMemory(size_t bytes) {
  void* p = nullptr;
  DeviceGuard guard(cuda_, device_);
  cuda_.Check(cuda_.Malloc(&p, std::max<size_t>(bytes, 1)), "cudaMalloc");
  const CudaApi* cuda = &cuda_;
  return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [cuda](uint8_t* q) { cuda->Free(q); });
}

uint8_t* DeviceContext::FusionBuffer(size_t bytes) {
  if (bytes > fusion_bytes_) {
    // The old buffer may still be in use by queued work: cudaFree waits for the device.
    fusion_.reset();
    fusion_ = DeviceMemory(bytes);
    fusion_bytes_ = bytes;
  }
  return fusion_.get();
}

}  // namespace horovodlike
