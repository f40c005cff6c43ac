#include "gpu_completions.h"

#include <pthread.h>

#include <chrono>

#include "../cuda/device_context.h"

namespace horovodlike {
namespace {

bool Fired(const CudaApi& cuda, void* event) {
  const cudaError_t result = cuda.EventQuery(event);
  if (result == kCudaSuccess) return true;
  if (result == kCudaErrorNotReady) return false;
  cuda.Check(result, "cudaEventQuery");
  return false;
}

}  // namespace

GpuCompletions::GpuCompletions(HandleTable& handles, std::function<void()> wake_loop)
    : handles_(handles), wake_loop_(std::move(wake_loop)) {}

GpuCompletions::~GpuCompletions() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void GpuCompletions::Add(Pending pending) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (failed_) {
    const Status status = fail_status_;
    lock.unlock();
    for (auto& handle : pending.handles) handles_.Complete(handle, status);
    return;
  }
  pending_.push_back(std::move(pending));
  ++outstanding_;
  StartLocked();
}

void GpuCompletions::ReleaseAfter(std::shared_ptr<void> event, std::shared_ptr<void> memory) {
  std::lock_guard<std::mutex> lock(mutex_);
  release_after_.emplace_back(std::move(event), std::move(memory));
  StartLocked();
}

void GpuCompletions::StartLocked() {
  if (!thread_.joinable()) {
    thread_ = std::thread([this] { Run(); });
    pthread_setname_np(thread_.native_handle(), "hvdl-gpu-done");
  }
  cv_.notify_all();
}

void GpuCompletions::Watch(const std::shared_ptr<NcclCollectives>& nccl) {
  std::lock_guard<std::mutex> lock(mutex_);
  watched_.push_back(nccl);
}

std::string GpuCompletions::failure() {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

void GpuCompletions::Fail(const Status& status) {
  std::vector<Pending> pending;
  std::vector<std::shared_ptr<NcclCollectives>> watched;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failed_) return;
    failed_ = true;
    fail_status_ = status;
    pending.swap(pending_);
    outstanding_ = 0;
    for (auto& weak : watched_) {
      if (auto nccl = weak.lock()) watched.push_back(std::move(nccl));
    }
    watched_.clear();
  }
  cv_.notify_all();
  // Aborting ends the queued work of the communicators (a real NCCL kernel waiting for a dead
  // peer would wait for ever); the memory it used is not reused (it may still be written).
  for (auto& nccl : watched) nccl->Abort();
  for (auto& p : pending) {
    for (auto& handle : p.handles) handles_.Complete(handle, status);
    for (auto& memory : p.keep) new std::shared_ptr<void>(std::move(memory));  // kept for ever
  }
}

void GpuCompletions::WaitIdle(double seconds) {
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
  std::unique_lock<std::mutex> lock(mutex_);
  while (outstanding_ > 0 && !failed_ && failure_.empty() &&
         std::chrono::steady_clock::now() < until) {
    cv_.wait_for(lock, std::chrono::milliseconds(1));
  }
}

void GpuCompletions::Run() {
  // Work was queued before this thread started, so the runtime is loaded.
  const CudaApi& cuda = Cuda();
  auto pause = std::chrono::microseconds(10);
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || !pending_.empty() || !release_after_.empty(); });
    if (stopping_) return;
    // Poll outside the lock: the executor adds work meanwhile.
    std::vector<Pending> pending;
    pending.swap(pending_);
    auto release = std::move(release_after_);
    release_after_.clear();
    lock.unlock();
    std::vector<Pending> waiting;
    std::string error;
    size_t completed = 0;
    for (auto& p : pending) {
      bool fired = false;
      try {
        fired = Fired(cuda, p.event.get());
      } catch (const std::exception& e) {
        error = e.what();
      }
      if (fired) {
        for (auto& handle : p.handles) handles_.Complete(handle, Status::Ok());
        ++completed;
        continue;
      }
      if (error.empty() && p.nccl) {
        const std::string nccl_error = p.nccl->AsyncError();
        if (!nccl_error.empty()) error = "NCCL reported an error: " + nccl_error;
      }
      waiting.push_back(std::move(p));
    }
    decltype(release) still;
    for (auto& r : release) {
      bool fired = true;
      try {
        fired = Fired(cuda, r.first.get());
      } catch (const std::exception&) {
      }
      if (!fired) still.push_back(std::move(r));
    }
    lock.lock();
    outstanding_ -= std::min(outstanding_, completed);
    // What came in meanwhile goes after what was waiting, in order.
    for (auto& p : pending_) waiting.push_back(std::move(p));
    pending_.swap(waiting);
    for (auto& r : release_after_) still.push_back(std::move(r));
    release_after_.swap(still);
    if (!error.empty() && failure_.empty() && !failed_) {
      failure_ = error;
      has_failure_ = true;
      lock.unlock();
      wake_loop_();
      lock.lock();
    }
    if (completed > 0) {
      pause = std::chrono::microseconds(10);
    } else {
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
    if (!pending_.empty() || !release_after_.empty()) {
      cv_.wait_for(lock, pause, [&] { return stopping_; });
      if (stopping_) return;
    }
  }
}

void GpuCompletions::AfterWait(const HandleState& state) {
  if (!state.completion_event || !state.status.ok()) return;
  const CudaApi& cuda = Cuda();
  cuda.Check(cuda.StreamWaitEvent(state.caller_stream, state.completion_event.get(), 0),
             "cudaStreamWaitEvent (the caller's stream on the collective's completion)");
}

void GpuCompletions::CopyOutput(const std::shared_ptr<HandleState>& state, void* dst,
                                void* stream) {
  if (state->device < 0) {
    throw InvalidArgument("output_to_device: the operation's tensors were not on a GPU");
  }
  DeviceContext& device = DeviceContext::For(state->device);
  const CudaApi& cuda = device.cuda();
  DeviceGuard guard(cuda, state->device);
  if (state->completion_event) {
    cuda.Check(cuda.StreamWaitEvent(stream, state->completion_event.get(), 0),
               "cudaStreamWaitEvent");
  }
  if (state->device_output) {
    cuda.Check(cuda.MemcpyAsync(dst, state->device_output.get(), state->device_output_bytes,
                                kDeviceToDevice, stream),
               "cudaMemcpyAsync (output)");
  } else if (!state->output.empty()) {
    cuda.Check(cuda.MemcpyAsync(dst, state->output.data(), state->output.size(), kHostToDevice,
                                stream),
               "cudaMemcpyAsync (output)");
  } else {
    return;
  }
  ReleaseAfter(device.RecordOn(stream), state);
}

}  // namespace horovodlike
