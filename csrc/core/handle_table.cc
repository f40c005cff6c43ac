#include "handle_table.h"

#include <chrono>

namespace horovodlike {

std::atomic<int> HandleTable::blocked_waiters_{0};

int64_t HandleTable::Create() {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t id = next_++;
  handles_.emplace(id, std::make_shared<HandleState>());
  return id;
}

std::shared_ptr<HandleState> HandleTable::Get(int64_t handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = handles_.find(handle);
  if (it == handles_.end()) {
    throw InvalidArgument("unknown handle " + std::to_string(handle) +
                          " (already synchronized or released)");
  }
  return it->second;
}

void HandleTable::Complete(const std::shared_ptr<HandleState>& state, Status status) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (state->done) return;
    state->status = std::move(status);
    state->done = true;
  }
  done_cv_.notify_all();
}

bool HandleTable::Poll(int64_t handle) {
  const std::shared_ptr<HandleState> state = Get(handle);
  if (!Done(state) && state->progress) state->progress(0);
  return Done(state);
}

bool HandleTable::Done(const std::shared_ptr<HandleState>& state) {
  std::lock_guard<std::mutex> lock(mutex_);
  return state->done;
}

std::shared_ptr<HandleState> HandleTable::Wait(int64_t handle) {
  auto state = Get(handle);
  if (state->progress) {
    while (!Done(state)) state->progress(1.0);
    return state;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [&] { return state->done; });
  return state;
}

std::shared_ptr<HandleState> HandleTable::WaitFor(int64_t handle, double seconds) {
  return WaitFor(Get(handle), seconds);
}

std::shared_ptr<HandleState> HandleTable::WaitFor(const std::shared_ptr<HandleState>& state,
                                                  double seconds) {
  if (state->progress) {
    // The waiting thread moves the operation along itself, in slices.
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
    while (!Done(state)) {
      const double left = std::chrono::duration<double>(deadline -
                                                        std::chrono::steady_clock::now()).count();
      if (left <= 0) return nullptr;
      state->progress(left);
    }
    return state;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  const bool done = done_cv_.wait_for(
      lock, std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6)),
      [&] { return state->done; });
  return done ? state : nullptr;
}

void HandleTable::Release(int64_t handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  handles_.erase(handle);
}

}  // namespace horovodlike
