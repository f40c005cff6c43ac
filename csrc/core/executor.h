// Runs negotiated responses: packs fused tensors into the fusion buffer with prescaling, calls
// the collective, unpacks with postscaling, and completes the handles.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "device_collectives.h"
#include "fusion_buffer.h"
#include "handle_table.h"
#include "message.h"
#include "tensor_queue.h"
#include "timeline.h"
#include "../collectives/provider_table.h"
#include "../links/link.h"

namespace horovodlike {

class Executor {
 public:
  // Applies an add/remove_process_set response; returns the set's id.
  using ProcessSetChange = std::function<int64_t(const Response&)>;

  // `providers`: which provider runs each collective over `link` (provider_table.h).
  Executor(Link& link, std::unique_ptr<ProviderTable> providers, TensorQueue& queue,
           HandleTable& handles, Timeline& timeline, int process_set_id,
           ProcessSetChange on_process_set_change = nullptr, GpuCompletions* gpu = nullptr,
           GpuSettings gpu_settings = {})
      : link_(link), providers_(std::move(providers)), queue_(queue),
        handles_(handles), timeline_(timeline), process_set_id_(process_set_id),
        on_process_set_change_(std::move(on_process_set_change)), gpu_(gpu),
        gpu_settings_(std::move(gpu_settings)) {}

  const ProviderTable& providers() const { return *providers_; }
  // The set's GPU path, once a GPU collective ran (null before).
  const DeviceCollectives* device() const { return device_.get(); }
  // The set's NCCL communicator, made from another's (ncclCommSplit) before its first GPU
  // collective.
  void AdoptNccl(std::shared_ptr<NcclCollectives> nccl);

  // Sizes the storage reused by every collective for up to `parts` tensors in one collective
  // and the fusion buffer for `fused_bytes` packed, so that later rounds, however they happen
  // to be fused, allocate nothing. Called with the controller's Round::max_parts and
  // max_fused_bytes, which change only when the cache does.
  void Prepare(size_t parts, size_t fused_bytes);

  // Runs one collective: `parts` are the responses of its tensors (one, or several fused; see
  // Controller::Round). Throws TransportError after returning the entries to the queue.
  // `staged`: the token of an early staging (StageEarly) that every rank of the set made for
  // this collective's one tensor, as the negotiation found (Controller::Round::staged); 0: none.
  void Execute(const Response* const* parts, size_t count, uint64_t staged = 0);
  // Before the negotiation: stages a single host tensor's input (of `response`, an allreduce
  // seen before, queued on this rank) where the provider that would run it reads it
  // (AllreduceProvider::StagingFor); returns the provider's token, 0 when it did not.
  uint64_t StageEarly(const Response& response);

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
    int64_t early_staged_allreduces = 0;  // run from an early staging (StageEarly)
  };
  Stats stats() const {
    return {allreduce_collectives_.load(), allreduce_tensors_.load(), errors_.load(),
            hierarchical_allreduces_.load(), hierarchical_allgathers_.load(),
            static_cast<int64_t>(fusion_.capacity()), early_staged_.load()};
  }

 private:
  static bool OnDevice(Response::Type type);
  // The collective over host memory (the entries' own, or GPU tensors staged there).
  void RunOnHost(const Response* const* parts, size_t count, std::vector<TensorEntry>& entries);
  // Tensors in GPU memory: DeviceCollectives runs them and completes their handles.
  void ExecuteOnDevice(const Response* const* parts, size_t count,
                       std::vector<TensorEntry>& entries);
  void Allreduce(const Response& response, std::vector<TensorEntry>& entries);
  void Allgather(const Response* const* parts, std::vector<TensorEntry>& entries);
  void Reducescatter(const Response& response, std::vector<TensorEntry>& entries);
  void Alltoall(const Response& response, TensorEntry& entry);
  void Broadcast(const Response& response, TensorEntry& entry);
  // In-place allreduce of a contiguous buffer, the result multiplied by `scale`, by the
  // provider the table picks for it.
  // A staged_ token goes to the provider it came from (RunStaged).
  void Reduce(void* buf, size_t count, DataType dtype, ReduceOp op, double scale);
  // Reduce for op Adasum: `counts` are the element counts of the tensors laid end to end in
  // `buf`, each combined on its own (adasum_allreduce.h); always over send/recv, as neither the
  // backends nor the hierarchy know the operation. `tensor` names them in errors.
  void ReduceAdasum(void* buf, const size_t* counts, size_t num_tensors, DataType dtype,
                    double scale, const std::string& tensor);
  // In-place allgatherv of blocks in rank order (this rank's already in place), by the
  // table's provider.
  void Gather(void* out, const std::vector<size_t>& block_bytes);

  Link& link_;
  std::unique_ptr<ProviderTable> providers_;
  TensorQueue& queue_;
  HandleTable& handles_;
  Timeline& timeline_;
  int process_set_id_;
  ProcessSetChange on_process_set_change_;
  GpuCompletions* gpu_;
  GpuSettings gpu_settings_;
  std::unique_ptr<DeviceCollectives> device_;
  FusionBuffer fusion_;
  // Reused by every collective, so that running one allocates nothing.
  std::vector<TensorEntry> entries_;
  std::string key_;
  uint64_t staged_ = 0;                          // this collective's staging token (Execute)
  AllreduceProvider* staged_provider_ = nullptr;  // whose token StageEarly got last
  std::vector<size_t> adasum_counts_;  // element counts of the fused tensors (Allreduce)
  // The allgather's sizes by tensor and by rank, and offsets (Allgather).
  std::vector<size_t> row_bytes_;
  std::vector<size_t> block_bytes_;
  std::vector<size_t> block_offset_;
  std::vector<size_t> out_offset_;
  std::atomic<int64_t> allreduce_collectives_{0};
  std::atomic<int64_t> allreduce_tensors_{0};
  std::atomic<int64_t> errors_{0};
  std::atomic<int64_t> hierarchical_allreduces_{0};
  std::atomic<int64_t> hierarchical_allgathers_{0};
  std::atomic<int64_t> early_staged_{0};
};

}  // namespace horovodlike
