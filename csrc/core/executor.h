// Runs negotiated responses: packs fused tensors into the fusion buffer with prescaling, calls
// the collective, unpacks with postscaling, and completes the handles.
#pragma once

#include <atomic>
#include <vector>

#include "fusion_buffer.h"
#include "handle_table.h"
#include "message.h"
#include "tensor_queue.h"
#include "../collectives/ring_allreduce.h"
#include "../transport/transport.h"

namespace horovodlike {

class Executor {
 public:
  Executor(Transport& transport, TensorQueue& queue, HandleTable& handles)
      : transport_(transport), queue_(queue), handles_(handles) {}

  // Throws TransportError after failing the handles of this response.
  void Execute(const Response& response);

  // Counters since init, for tests and tuning: collectives run and tensors they carried.
  struct Stats {
    int64_t allreduce_collectives = 0;
    int64_t allreduce_tensors = 0;
    int64_t errors = 0;
  };
  Stats stats() const { return {allreduce_collectives_.load(), allreduce_tensors_.load(), errors_.load()}; }

 private:
  void Allreduce(const Response& response, std::vector<TensorEntry>& entries);
  void Allgather(const Response& response, TensorEntry& entry);
  // In-place allreduce of a contiguous buffer: the backend's own algorithm, else the ring.
  void Reduce(void* buf, size_t count, DataType dtype, ReduceOp op);
  void Broadcast(const Response& response, TensorEntry& entry);

  Transport& transport_;
  TensorQueue& queue_;
  HandleTable& handles_;
  FusionBuffer fusion_;
  RingAllreduce ring_;
  std::atomic<int64_t> allreduce_collectives_{0};
  std::atomic<int64_t> allreduce_tensors_{0};
  std::atomic<int64_t> errors_{0};
};

}  // namespace horovodlike
