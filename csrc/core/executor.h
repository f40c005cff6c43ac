// Runs negotiated responses: packs fused tensors into the fusion buffer with prescaling, calls
// the collective, unpacks with postscaling, and completes the handles.
#pragma once

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

 private:
  void Allreduce(const Response& response, std::vector<TensorEntry>& entries);
  void Allgather(const Response& response, TensorEntry& entry);
  void Broadcast(const Response& response, TensorEntry& entry);

  Transport& transport_;
  TensorQueue& queue_;
  HandleTable& handles_;
  FusionBuffer fusion_;
  RingAllreduce ring_;
};

}  // namespace horovodlike
