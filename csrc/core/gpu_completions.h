// The finalizer of CUDA work: the executor queues a collective's work on the core's stream and
// moves on; this thread polls the completion events and completes the handles when theirs
// fires, so the loop is never held up by the GPU. It also watches the NCCL communicators for
// an asynchronous error, which stops the runtime instead of leaving a wait that never ends.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "handle_table.h"
#include "../collectives/nccl/nccl_collectives.h"

namespace horovodlike {

class GpuCompletions {
 public:
  // `wake_loop` is called once when a communicator reports an error: the loop then stops the
  // runtime with failure() (from its own thread, like any other link failure).
  GpuCompletions(HandleTable& handles, std::function<void()> wake_loop);
  ~GpuCompletions();

  struct Pending {
    std::shared_ptr<void> event;  // on the core's stream, after the operation's last work
    std::vector<std::shared_ptr<HandleState>> handles;  // completed when the event fires
    std::vector<std::shared_ptr<void>> keep;  // memory the work uses, released then
    std::shared_ptr<NcclCollectives> nccl;    // watched while the work is pending
  };
  void Add(Pending pending);
  // Keeps `memory` until `event` (on a caller's stream) has fired: an output the caller's
  // stream still copies from.
  void ReleaseAfter(std::shared_ptr<void> event, std::shared_ptr<void> memory);
  // A communicator to abort when the runtime stops.
  void Watch(const std::shared_ptr<NcclCollectives>& nccl);

  // Why the GPU work failed ("" while it has not); failed() is the cheap test of it.
  std::string failure();
  bool failed() const { return has_failure_.load(std::memory_order_relaxed); }
  // Waits up to `seconds` for the pending work to complete (shutdown lets it finish).
  void WaitIdle(double seconds);
  // The runtime stopped: every watched communicator is aborted (its queued work ends), every
  // pending handle fails with `status`, and later Adds fail at once.
  void Fail(const Status& status);

  // After a wait returned `state` done: the stream the caller enqueued on waits for the core's
  // completion event, so its next kernel sees the result (no host-side synchronize).
  static void AfterWait(const HandleState& state);
  // Copies `state`'s output (host or device memory) to the device memory at `dst`, ordered on
  // `stream` (after the completion event); the output is kept until that copy has run.
  void CopyOutput(const std::shared_ptr<HandleState>& state, void* dst, void* stream);

 private:
  // Starts the polling thread on first use and wakes it; mutex_ held.
  void StartLocked();
  void Run();

  HandleTable& handles_;
  std::function<void()> wake_loop_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<Pending> pending_;
  size_t outstanding_ = 0;  // added and not yet completed (pending_ or being polled)
  std::vector<std::pair<std::shared_ptr<void>, std::shared_ptr<void>>> release_after_;
  std::vector<std::weak_ptr<NcclCollectives>> watched_;
  std::string failure_;
  std::atomic<bool> has_failure_{false};
  bool failed_ = false;
  Status fail_status_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace horovodlike
