// Runs negotiated responses: packs fused tensors into the fusion buffer with prescaling, calls
// the collective, unpacks with postscaling, and completes the handles.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "fusion_buffer.h"
#include "handle_table.h"
#include "message.h"
#include "tensor_queue.h"
#include "timeline.h"
#include "../collectives/adasum_allreduce.h"
#include "../collectives/hierarchical_allgather.h"
#include "../collectives/hierarchical_allreduce.h"
#include "../collectives/ring_allreduce.h"
#include "../collectives/ring_reducescatter.h"
#include "../transport/transport.h"

namespace horovodlike {

class Executor {
 public:
  // Applies an add/remove_process_set response; returns the set's id.
  using ProcessSetChange = std::function<int64_t(const Response&)>;

  Executor(Transport& transport, TensorQueue& queue, HandleTable& handles, Timeline& timeline,
           int process_set_id, ProcessSetChange on_process_set_change = nullptr)
      : transport_(transport), queue_(queue), handles_(handles), timeline_(timeline),
        process_set_id_(process_set_id), allreduce_label_(AllreduceLabel(transport)),
        on_process_set_change_(std::move(on_process_set_change)) {}

  // Runs one collective: `parts` are the responses of its tensors (one, or several fused; see
  // Controller::Round). Throws TransportError after returning the entries to the queue.
  void Execute(const Response* const* parts, size_t count);

  // Counters since init, for tests and tuning: collectives run and tensors they carried, and
  // how many of the allreduces and allgathers went inside and across hosts
  // (hierarchical_allreduce.h, hierarchical_allgather.h); and the fusion buffer's size.
  struct Stats {
    int64_t allreduce_collectives = 0;
    int64_t allreduce_tensors = 0;
    int64_t errors = 0;
    int64_t hierarchical_allreduces = 0;
    int64_t hierarchical_allgathers = 0;
    int64_t fusion_buffer_bytes = 0;  // held now
  };
  Stats stats() const {
    return {allreduce_collectives_.load(), allreduce_tensors_.load(), errors_.load(),
            hierarchical_allreduces_.load(), hierarchical_allgathers_.load(),
            static_cast<int64_t>(fusion_.capacity())};
  }

 private:
  void Allreduce(const Response& response, std::vector<TensorEntry>& entries);
  void Allgather(const Response* const* parts, std::vector<TensorEntry>& entries);
  void Reducescatter(const Response& response, std::vector<TensorEntry>& entries);
  void Alltoall(const Response& response, TensorEntry& entry);
  void Broadcast(const Response& response, TensorEntry& entry);
  // In-place allreduce of a contiguous buffer, the result multiplied by `scale`: by host when
  // the transport offers a hierarchy for it, else the backend's own algorithm (which scales as it
  // writes the result), else the ring.
  void Reduce(void* buf, size_t count, DataType dtype, ReduceOp op, double scale);
  // Reduce for op Adasum: `counts` are the element counts of the tensors laid end to end in
  // `buf`, each combined on its own (adasum_allreduce.h); always over send/recv, as neither the
  // backends nor the hierarchy know the operation. `tensor` names them in errors.
  void ReduceAdasum(void* buf, const size_t* counts, size_t num_tensors, DataType dtype,
                    double scale, const std::string& tensor);
  // In-place allgatherv of blocks in rank order (this rank's already in place): by host when
  // the transport offers a hierarchy for it, else the ring.
  void Gather(void* out, const std::vector<size_t>& block_bytes);

  // Tensors from this size up are reduced in place even when fused with others (Allreduce).
  static constexpr size_t kDirectAllreduceBytes = 1 << 20;

  Transport& transport_;
  TensorQueue& queue_;
  HandleTable& handles_;
  Timeline& timeline_;
  int process_set_id_;
  // The timeline's name for the allreduce itself; a literal, so it outlives this executor.
  static const char* AllreduceLabel(const Transport& transport);
  const char* allreduce_label_;
  ProcessSetChange on_process_set_change_;
  FusionBuffer fusion_;
  // Reused by every collective, so that running one allocates nothing.
  std::vector<TensorEntry> entries_;
  std::string key_;
  RingAllreduce ring_;
  HierarchicalAllreduce hierarchical_;
  HierarchicalAllgather hierarchical_allgather_;
  AdasumAllreduce adasum_;
  std::vector<size_t> adasum_counts_;  // element counts of the fused tensors (Allreduce)
  // The allgather's sizes by tensor and by rank, and offsets (Allgather).
  std::vector<size_t> row_bytes_;
  std::vector<size_t> block_bytes_;
  std::vector<size_t> block_offset_;
  std::vector<size_t> out_offset_;
  RingReducescatter reducescatter_;
  std::atomic<int64_t> allreduce_collectives_{0};
  std::atomic<int64_t> allreduce_tensors_{0};
  std::atomic<int64_t> errors_{0};
  std::atomic<int64_t> hierarchical_allreduces_{0};
  std::atomic<int64_t> hierarchical_allgathers_{0};
};

}  // namespace horovodlike
