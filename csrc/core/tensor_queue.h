// Work enqueued by the caller and not yet executed: the entries by name, and the requests the
// background loop has not yet picked up.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "handle_table.h"
#include "message.h"

namespace horovodlike {

// Entries are keyed by process set and name: one name may be in flight in several sets.
std::string QueueKey(int process_set_id, const std::string& name);
// The same, written into `key` (reusing its storage).
void QueueKey(int process_set_id, const std::string& name, std::string* key);

struct TensorEntry {
  std::string key;  // QueueKey(process set, request.name)
  int process_set_id = 0;
  Request request;
  const void* input = nullptr;
  void* output = nullptr;  // allreduce and broadcast write here; may equal input
  // CUDA tensors: the caller's stream and an event recorded on it at enqueue, the point at
  // which the input is ready (the core's stream waits for it).
  void* stream = nullptr;
  std::shared_ptr<void> ready_event;
  std::shared_ptr<HandleState> handle;
};

class TensorQueue {
 public:
  // Throws InvalidArgument when an entry of the same name is still in flight. `wake` false:
  // the background loop is not woken (the caller is about to run a round itself).
  void Add(TensorEntry entry, bool wake = true);
  // Moves the new requests since the last call into `out` (replacing its contents), with the
  // process set each belongs to. Swaps storage with the queue, so neither side reallocates.
  void PopNewRequests(std::vector<std::pair<int, Request>>* out);
  // Blocks up to `timeout` for new requests, a Notify() or a Ring(); returns at once if some
  // are queued. A Ring (a peer's round bell) ranks below the others.
  enum class Wake { kTimeout, kNewRequests, kNotified, kBell };
  Wake WaitForWork(std::chrono::microseconds timeout);
  void Notify();
  void Ring();
  // Whether requests were added since the last PopNewRequests.
  bool HasNewRequests();
  // Removes and returns the entry; false when no such entry exists.
  bool Take(const std::string& name, TensorEntry* entry);
  // The input of an entry in host memory that has an output, left in the queue; null for any
  // other (or none). `key` as QueueKey makes it.
  const void* HostInput(const std::string& key);
  std::vector<TensorEntry> TakeAll();
  // Removes and returns every entry of one process set.
  std::vector<TensorEntry> TakeProcessSet(int process_set_id);

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool rung_ = false;
  bool notified_ = false;
  std::unordered_map<std::string, TensorEntry> entries_;
  std::vector<std::pair<int, Request>> new_requests_;
};

}  // namespace horovodlike
