// The one place that decides which provider runs each collective of a process set: built once
// per set at init (or when the set is added) from the registered providers
// (provider_registry.h), each asked whether it can run over the set's link, then only looked up.
// Its Describe() is what --check-build and the stats print; each provider's timeline label
// names the algorithm and the link it runs over.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../links/link.h"
#include "provider.h"
#include "provider_registry.h"

namespace horovodlike {

class ProviderTable {
 public:
  // For the job's global process set over `link` (the link ConnectLink returned): per
  // operation, the registered cpu providers that can run over it, in their order. Shared
  // memory's allreduce when it spans the job, MPI's over MPI (small messages; every size with
  // `cpu_operations` "mpi", HOROVOD_CPU_OPERATIONS), by host when the job asked for it, and the
  // ring over `link` for the rest. Throws InvalidArgument when `cpu_operations` names
  // operations that `link` cannot run.
  static std::unique_ptr<ProviderTable> ForJob(Link& link, const std::string& cpu_operations);
  // For a process set: the providers that run over its view of the job's link (the algorithms
  // over links: the others need the job's own link).
  static std::unique_ptr<ProviderTable> ForSubset(Link& view);
  ~ProviderTable();

  // A provider with its timeline label: its name in capitals, prefixed with the link for our
  // algorithms over a link ("TCP_RING_ALLREDUCE", "SHM_ALLREDUCE", "MPI_ALLREDUCE"). Labels
  // live as long as the process, as the timeline may write them after the set is gone.
  template <class Provider>
  struct Entry {
    Provider* provider;
    const char* label;
    bool by_host;  // runs inside each host, then across hosts (kByHost)
  };
  // The first allreduce provider, in the table's order, that takes these arguments.
  Entry<AllreduceProvider> Allreduce(size_t count, DataType dtype, ReduceOp op) const;
  Entry<AllgatherProvider> Allgather() const { return allgather_; }
  Entry<ReducescatterProvider> Reducescatter() const { return reducescatter_; }
  Entry<AlltoallProvider> Alltoall() const { return alltoall_; }
  Entry<BroadcastProvider> Broadcast() const { return broadcast_; }
  Entry<AdasumProvider> Adasum() const { return adasum_; }

  // (operation, providers in the order they are tried) for this set: "allreduce" ->
  // "shm_allreduce, ring_allreduce", ... with the link they run over.
  std::vector<std::pair<std::string, std::string>> Describe() const;

  // What this build can run, per operation, in the order tried, each with when it applies,
  // as ForJob would pick them for `cpu_operations` (HOROVOD_CPU_OPERATIONS); then the GPU
  // path's, per operation ("allreduce (cuda)"). All from the registered providers.
  static std::vector<std::pair<std::string, std::string>> Available(
      const std::string& cpu_operations);
  // Describe() of the last table ForJob built (the running job's), empty before the first.
  static std::vector<std::pair<std::string, std::string>> ForRunningJob();

  // Runs per label since the process started, for tests: which provider and link ran.
  static std::vector<std::pair<std::string, int64_t>> Runs();
  // Counts a run of the provider with this label (one from an Entry).
  static void CountRun(const char* label);

 private:
  explicit ProviderTable(const ProviderContext& context);

  std::vector<std::shared_ptr<void>> owned_;  // every provider below; first, so built first
  std::vector<Entry<AllreduceProvider>> allreduce_;
  Entry<AllgatherProvider> allgather_;
  Entry<ReducescatterProvider> reducescatter_;
  Entry<AlltoallProvider> alltoall_;
  Entry<BroadcastProvider> broadcast_;
  Entry<AdasumProvider> adasum_;
};

}  // namespace horovodlike
