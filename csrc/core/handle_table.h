// Handles returned to the caller of an asynchronous operation: wait(), poll(), the status it
// ended with, and the output the core allocated where the caller gave none.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "../common/common.h"

namespace horovodlike {

struct HandleState {
  bool done = false;
  Status status;
  // The bytes the core allocated and their shape: allgather, alltoall, reducescatter, and a
  // point-to-point receive without a buffer.
  std::vector<uint8_t> output;
  std::vector<int64_t> output_shape;
  // The integers the operation returns besides its output, one meaning per operation (the
  // caller knows which it asked for): allgather, each rank's first dimension (for the
  // gradient); alltoall, the rows received from each rank; join, the last rank to join;
  // add/remove_process_set, the set's id; a point-to-point receive, the sender's dtype code.
  std::vector<int64_t> integers;
  // CUDA work (device_collectives.h): the core's completion event, recorded on its stream
  // after the last of the operation's work, and the stream the caller enqueued on, which waits
  // for it before the caller's next kernel (GpuCompletions::AfterWait).
  int device = -1;
  std::shared_ptr<void> completion_event;
  void* caller_stream = nullptr;
  // Set for an operation that nobody else moves along (a point-to-point message): the waits
  // and polls on the handle call it, with how long it may take at most, until it is done.
  std::function<void(double)> progress;
  // An output the core allocated in device memory (the bytes above are then empty).
  std::shared_ptr<uint8_t> device_output;
  size_t device_output_bytes = 0;
};

class HandleTable {
 public:
  int64_t Create();
  std::shared_ptr<HandleState> Get(int64_t handle);
  void Complete(const std::shared_ptr<HandleState>& state, Status status);
  bool Poll(int64_t handle);
  bool Done(const std::shared_ptr<HandleState>& state);
  // Blocks until done; returns the state (kept alive for the caller to read the output).
  std::shared_ptr<HandleState> Wait(int64_t handle);
  // Waits at most `seconds`; null when the handle is not done by then (so that a caller can
  // look at signals between waits).
  std::shared_ptr<HandleState> WaitFor(int64_t handle, double seconds);
  std::shared_ptr<HandleState> WaitFor(const std::shared_ptr<HandleState>& state, double seconds);
  // Threads of this process blocked waiting on a handle, counted from the first slice of a
  // wait to its end (process-wide, so a wait that outlives shutdown() stays safe): the stall
  // inspector tells ranks that wait on each other (a deadlock) from ranks busy elsewhere.
  class BlockedWaiter {
   public:
    BlockedWaiter() { ++blocked_waiters_; }
    ~BlockedWaiter() { --blocked_waiters_; }
    BlockedWaiter(const BlockedWaiter&) = delete;
    BlockedWaiter& operator=(const BlockedWaiter&) = delete;
  };
  static int blocked_waiters() { return blocked_waiters_.load(); }
  void Release(int64_t handle);

 private:
  std::mutex mutex_;
  std::condition_variable done_cv_;
  std::unordered_map<int64_t, std::shared_ptr<HandleState>> handles_;
  int64_t next_ = 1;
  static std::atomic<int> blocked_waiters_;
};

}  // namespace horovodlike
