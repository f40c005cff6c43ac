// The executor's path for tensors in GPU memory (one per process set). The core's stream
// waits for each tensor's ready event; then either NCCL runs the collective on the device
// (fusing through the device's fusion buffer), or the data is staged: copied to pinned host
// memory, reduced by the CPU providers like any host tensor, and copied back. Either way the
// work ends with a completion event that GpuCompletions turns into completed handles.
//
// Staging is chosen for the whole set when NCCL is absent, declined
// (HOROVOD_GPU_OPERATIONS=staged), or when two ranks share a GPU (NCCL refuses that); and
// for single operations NCCL cannot do as asked (Adasum, int16, Min with a scale, ...).
// The choice is made once per set from what every rank reports, so all ranks agree.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gpu_completions.h"
#include "../collectives/ring_allreduce.h"
#include "message.h"
#include "tensor_queue.h"
#include "timeline.h"

namespace horovodlike {

class DeviceContext;
class HostHierarchy;

// What the GPU path takes from the job's settings.
struct GpuSettings {
  std::string operations;  // HOROVOD_GPU_OPERATIONS, lower case
  std::string host;        // the launcher's name for this rank's host ("": the machine's)
  // The job's ranks by host, when every rank asked for the hierarchical allreduce (the job's
  // set only): NCCL inside each host, the CPU link across hosts.
  const HostHierarchy* hosts = nullptr;
};

class DeviceCollectives {
 public:
  // What the set's host side offers: the CPU path for staged work, and byte exchanges over the
  // set's link for the agreement (allgather of blocks in rank order, broadcast from a root).
  struct Host {
    std::function<void()> run_collective;  // the executor's host path over the entries
    std::function<void(void* out, const std::vector<size_t>& block_bytes)> allgather;
    std::function<void(void* buf, size_t bytes, int root)> broadcast;
  };
  DeviceCollectives(int rank, int size, const GpuSettings& settings,
                    GpuCompletions& completions, Timeline& timeline)
      : rank_(rank), size_(size), gpu_operations_(settings.operations), host_(settings.host),
        hosts_(settings.hosts), completions_(completions), timeline_(timeline) {}

  // Runs one collective of GPU tensors (`parts` as in Executor::Execute, `entries` taken from
  // the queue) and hands its handles to GpuCompletions. Throws TransportError on failure.
  void Execute(const Response* const* parts, size_t count, std::vector<TensorEntry>& entries,
               const Host& host);

  // Starts with `nccl` (split from another set's) instead of deciding at the first collective.
  void Adopt(std::shared_ptr<NcclCollectives> nccl);
  // "nccl", "staged" or "" before the first GPU collective of the set; with the reason.
  std::string mode() const;
  const std::shared_ptr<NcclCollectives>& nccl() const { return nccl_; }

 private:
  enum class Mode { kUndecided, kNccl, kStaged, kRefused };
  // Every rank of the set reports what it has; all decide the same.
  void Decide(DeviceContext& device, const Host& host);
  bool NcclRuns(const Response& response) const;
  void Staged(DeviceContext& device, const Response& response, std::vector<TensorEntry>& entries,
              const Host& host, GpuCompletions::Pending* pending);
  void Allreduce(DeviceContext& device, const Response& response,
                 std::vector<TensorEntry>& entries);
  // Whether this allreduce goes by host (hierarchical_allreduce.h's plan, NCCL inside hosts).
  bool ByHost(const Response& response) const;
  // In place: reduce-scatter inside the host over NCCL, allreduce of this rank's block across
  // hosts over the CPU link (scaled there), allgather inside the host over NCCL.
  void AllreduceByHost(DeviceContext& device, const Response& response, void* buffer,
                       size_t count);
  void Allgather(DeviceContext& device, const Response* const* parts,
                 std::vector<TensorEntry>& entries);
  void Reducescatter(DeviceContext& device, const Response& response,
                     std::vector<TensorEntry>& entries);
  void Alltoall(DeviceContext& device, const Response& response, TensorEntry& entry);
  void Broadcast(DeviceContext& device, const Response& response, TensorEntry& entry);

  int rank_;
  int size_;
  std::string gpu_operations_;  // HOROVOD_GPU_OPERATIONS, lower case
  std::string host_;
  const HostHierarchy* hosts_;
  std::shared_ptr<NcclCollectives> host_nccl_;  // this host's ranks, for ByHost
  RingAllreduce cross_ring_;
  std::shared_ptr<uint8_t> scratch_;  // device memory for ByHost's block
  size_t scratch_bytes_ = 0;
  // Host memory the queued work still reads: released with the collective's completion.
  std::vector<std::shared_ptr<void>> keep_;
  GpuCompletions& completions_;
  Timeline& timeline_;
  Mode mode_ = Mode::kUndecided;
  std::string reason_;  // why staged or refused
  int device_ = -1;     // the GPU this rank uses in this set
  std::shared_ptr<NcclCollectives> nccl_;
};

}  // namespace horovodlike
