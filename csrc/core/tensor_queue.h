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

struct TensorEntry {
  Request request;
  const void* input = nullptr;
  void* output = nullptr;  // allreduce and broadcast write here; may equal input
  std::shared_ptr<HandleState> handle;
};

class TensorQueue {
 public:
  // Throws InvalidArgument when an entry of the same name is still in flight.
  void Add(TensorEntry entry);
  std::vector<Request> PopNewRequests();
  // Blocks up to `timeout` for new requests or a Notify(); returns at once if some are queued.
  void WaitForWork(std::chrono::microseconds timeout);
  void Notify();
  // Removes and returns the entry; false when no such entry exists.
  bool Take(const std::string& name, TensorEntry* entry);
  std::vector<TensorEntry> TakeAll();
  size_t InFlight();

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool notified_ = false;
  std::unordered_map<std::string, TensorEntry> entries_;
  std::vector<Request> new_requests_;
};

}  // namespace horovodlike
