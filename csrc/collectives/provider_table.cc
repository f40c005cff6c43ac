#include "provider_table.h"

#include <cctype>
#include <map>
#include <mutex>
#include <set>

#include "../links/per_peer_link.h"
#include "../reduce/reduce.h"
#include "adasum_allreduce.h"
#include "chain_broadcast.h"
#include "hierarchical_allgather.h"
#include "hierarchical_allreduce.h"
#include "ring_allgather.h"
#include "pairwise_alltoall.h"
#include "ring_allreduce.h"
#include "ring_reducescatter.h"
#include "shm/shm_allreduce.h"
#ifdef HOROVODLIKE_MPI_FOUND
#include "../links/mpi/mpi_link.h"
#include "mpi/mpi_allreduce.h"
#endif

namespace horovodlike {
namespace {

// Our algorithms seen through the provider interfaces.
class RingAllreduceProvider final : public AllreduceProvider {
 public:
  explicit RingAllreduceProvider(Link& link) : link_(link) {}
  const char* name() const override { return "ring_allreduce"; }
  void Run(void* buf, size_t count, DataType dtype, ReduceOp op, double scale) override {
    if (link_.size() > 1) ring_.Run(link_, buf, count, dtype, op);
    ScaleInPlace(buf, count, dtype, scale);
  }

 private:
  Link& link_;
  RingAllreduce ring_;
};

class HierarchicalAllreduceProvider final : public AllreduceProvider {
 public:
  HierarchicalAllreduceProvider(const HostHierarchy& hosts, AllreduceProvider* host_allreduce)
      : hosts_(hosts), host_allreduce_(host_allreduce) {}
  const char* name() const override { return "hierarchical_allreduce"; }
  void Run(void* buf, size_t count, DataType dtype, ReduceOp op, double scale) override {
    algorithm_.Run(hosts_, host_allreduce_, buf, count, dtype, op);
    ScaleInPlace(buf, count, dtype, scale);
  }

 private:
  const HostHierarchy& hosts_;
  AllreduceProvider* host_allreduce_;
  HierarchicalAllreduce algorithm_;
};

class RingAllgatherProvider final : public AllgatherProvider {
 public:
  explicit RingAllgatherProvider(Link& link) : link_(link) {}
  const char* name() const override { return "ring_allgather"; }
  void Run(void* out, const std::vector<size_t>& block_bytes) override {
    RingAllgatherv(link_, out, block_bytes);
  }

 private:
  Link& link_;
};

class HierarchicalAllgatherProvider final : public AllgatherProvider {
 public:
  explicit HierarchicalAllgatherProvider(const HostHierarchy& hosts) : hosts_(hosts) {}
  const char* name() const override { return "hierarchical_allgather"; }
  void Run(void* out, const std::vector<size_t>& block_bytes) override {
    algorithm_.Run(hosts_, out, block_bytes);
  }

 private:
  const HostHierarchy& hosts_;
  HierarchicalAllgather algorithm_;
};

class RingReducescatterProvider final : public ReducescatterProvider {
 public:
  explicit RingReducescatterProvider(Link& link) : link_(link) {}
  const char* name() const override { return "ring_reducescatter"; }
  void Run(void* buf, const std::vector<size_t>& block_counts, DataType dtype,
           ReduceOp op) override {
    algorithm_.Run(link_, buf, block_counts, dtype, op);
  }

 private:
  Link& link_;
  RingReducescatter algorithm_;
};

class PairwiseAlltoallProvider final : public AlltoallProvider {
 public:
  explicit PairwiseAlltoallProvider(Link& link) : link_(link) {}
  const char* name() const override { return "pairwise_alltoall"; }
  void Run(const void* input, const std::vector<size_t>& send_bytes, void* output,
           const std::vector<size_t>& recv_bytes) override {
    PairwiseAlltoall(link_, input, send_bytes, output, recv_bytes);
  }

 private:
  Link& link_;
};

class ChainBroadcastProvider final : public BroadcastProvider {
 public:
  explicit ChainBroadcastProvider(Link& link) : link_(link) {}
  const char* name() const override { return "chain_broadcast"; }
  void Run(void* buf, size_t bytes, int root) override { ChainBroadcast(link_, buf, bytes, root); }

 private:
  Link& link_;
};

class AdasumAllreduceProvider final : public AdasumProvider {
 public:
  explicit AdasumAllreduceProvider(Link& link) : link_(link) {}
  const char* name() const override { return "adasum_allreduce"; }
  void Run(void* buf, const size_t* counts, size_t num_tensors, DataType dtype,
           const std::string& tensor) override {
    algorithm_.Run(link_, buf, counts, num_tensors, dtype, tensor);
  }

 private:
  Link& link_;
  AdasumAllreduce algorithm_;
};

std::mutex g_mutex;  // guards what follows

// Interned labels: the timeline keeps the pointers.
const char* Intern(const std::string& label) {
  static std::set<std::string>* labels = new std::set<std::string>();
  std::lock_guard<std::mutex> lock(g_mutex);
  return labels->insert(label).first->c_str();
}

// Keyed by interned label.
std::map<const char*, int64_t>& RunCounters() {
  static auto* counters = new std::map<const char*, int64_t>();
  return *counters;
}

std::vector<std::pair<std::string, std::string>>* g_running_job = nullptr;  // under g_mutex

std::string MakeLabel(const char* provider, const Link* link) {
  std::string label = link != nullptr ? std::string(link->name()) + "_" : "";
  label += provider;
  for (char& c : label) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return label;
}

}  // namespace

ProviderTable::ProviderTable(Link& link) : link_(link) {}
ProviderTable::~ProviderTable() = default;

void ProviderTable::AddAllreduce(std::unique_ptr<AllreduceProvider> provider, const Link* link) {
  allreduce_.push_back({provider.get(), Intern(MakeLabel(provider->name(), link))});
  owned_allreduce_.push_back(std::move(provider));
}

void ProviderTable::SetAllgather(std::unique_ptr<AllgatherProvider> provider, const Link* link) {
  allgather_ = {provider.get(), Intern(MakeLabel(provider->name(), link))};
  owned_allgather_ = std::move(provider);
}

template <class Provider>
ProviderTable::Entry<Provider> Own(std::unique_ptr<Provider> provider, const Link& link,
                                   std::unique_ptr<Provider>* owner) {
  ProviderTable::Entry<Provider> entry{provider.get(),
                                       Intern(MakeLabel(provider->name(), &link))};
  *owner = std::move(provider);
  return entry;
}

void ProviderTable::SetOthers() {
  reducescatter_ = Own<ReducescatterProvider>(std::make_unique<RingReducescatterProvider>(link_),
                                              link_, &owned_reducescatter_);
  alltoall_ = Own<AlltoallProvider>(std::make_unique<PairwiseAlltoallProvider>(link_), link_,
                                    &owned_alltoall_);
  broadcast_ = Own<BroadcastProvider>(std::make_unique<ChainBroadcastProvider>(link_), link_,
                                      &owned_broadcast_);
  adasum_ = Own<AdasumProvider>(std::make_unique<AdasumAllreduceProvider>(link_), link_,
                                &owned_adasum_);
}

std::unique_ptr<ProviderTable> ProviderTable::ForJob(Link& link,
                                                   const std::string& cpu_operations) {
  // The job's link follows HOROVOD_CPU_OPERATIONS when it is set (links/connect.cc): a mismatch
  // here means a caller built the link some other way.
  if (!cpu_operations.empty() && cpu_operations != "tcp" &&
      std::string(link.name()) != cpu_operations) {
    throw InvalidArgument("HOROVOD_CPU_OPERATIONS=" + cpu_operations +
                          " asks for its operations, but the job's ranks are connected over " +
                          link.name());
  }
  std::unique_ptr<ProviderTable> table(new ProviderTable(link));
  const HostHierarchy* hosts = nullptr;
  if (auto* per_peer = dynamic_cast<PerPeerLink*>(&link)) {
    hosts = per_peer->hierarchy();
    if (ShmLink* shm = per_peer->shm()) table->shm_ = std::make_unique<ShmAllreduce>(*shm);
    if (table->shm_ && per_peer->shm()->size() == link.size()) {
      // Every rank on this host: shared memory's own allreduce for everything.
      table->allreduce_.push_back({table->shm_.get(), Intern(MakeLabel("shm_allreduce", nullptr))});
    }
  }
#ifdef HOROVODLIKE_MPI_FOUND
  if (auto* mpi = dynamic_cast<MpiLink*>(&link)) {
    table->AddAllreduce(std::make_unique<MpiAllreduce>(*mpi, cpu_operations == "mpi"), nullptr);
  }
#endif
  if (hosts != nullptr && hosts->allreduce()) {
    table->AddAllreduce(std::make_unique<HierarchicalAllreduceProvider>(*hosts, table->shm_.get()),
                        nullptr);
  }
  table->AddAllreduce(std::make_unique<RingAllreduceProvider>(link), &link);
  if (hosts != nullptr && hosts->allgather()) {
    table->SetAllgather(std::make_unique<HierarchicalAllgatherProvider>(*hosts), nullptr);
  } else {
    table->SetAllgather(std::make_unique<RingAllgatherProvider>(link), &link);
  }
  table->SetOthers();
  auto described = table->Describe();
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_running_job == nullptr) g_running_job = new std::vector<std::pair<std::string, std::string>>();
  *g_running_job = std::move(described);
  return table;
}

std::unique_ptr<ProviderTable> ProviderTable::ForSubset(Link& view) {
  std::unique_ptr<ProviderTable> table(new ProviderTable(view));
  table->AddAllreduce(std::make_unique<RingAllreduceProvider>(view), &view);
  table->SetAllgather(std::make_unique<RingAllgatherProvider>(view), &view);
  table->SetOthers();
  return table;
}

ProviderTable::Entry<AllreduceProvider> ProviderTable::Allreduce(size_t count, DataType dtype,
                                                                 ReduceOp op) const {
  for (const auto& entry : allreduce_) {
    if (entry.provider->Supports(count, dtype, op)) return entry;
  }
  return allreduce_.back();  // the ring takes everything
}

std::vector<std::pair<std::string, std::string>> ProviderTable::Describe() const {
  std::string allreduce;
  for (const auto& entry : allreduce_) {
    if (!allreduce.empty()) allreduce += ", ";
    allreduce += entry.label;
  }
  return {{"allreduce", allreduce},
          {"allgather", allgather_.label},
          {"reducescatter", reducescatter_.label},
          {"alltoall", alltoall_.label},
          {"broadcast", broadcast_.label},
          {"adasum", adasum_.label}};
}

std::vector<std::pair<std::string, std::string>> ProviderTable::ForRunningJob() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_running_job == nullptr) return {};
  return *g_running_job;
}

std::vector<std::pair<std::string, std::string>> ProviderTable::Available(
    const std::string& cpu_operations) {
  // Over MPI or Gloo there is neither shared memory nor a host hierarchy (per_peer_link.h).
  const bool per_peer = cpu_operations.empty() || cpu_operations == "tcp";
  std::string allreduce = per_peer ? "shm_allreduce (every rank on one host), " : "";
#ifdef HOROVODLIKE_MPI_FOUND
  if (cpu_operations == "mpi") {
    allreduce += "mpi_allreduce (every size, HOROVOD_CPU_OPERATIONS=mpi), ";
  } else if (cpu_operations.empty()) {
    allreduce += "mpi_allreduce (over MPI, up to 256 KiB), ";
  }
#endif
  if (per_peer) {
    allreduce += "hierarchical_allreduce (HOROVOD_HIERARCHICAL_ALLREDUCE=1), ";
  }
  const std::string over = per_peer ? "" : " (over " + cpu_operations + ")";
  allreduce += "ring_allreduce" + over;
  return {{"allreduce", allreduce},
          {"allgather", per_peer ? "hierarchical_allgather (HOROVOD_HIERARCHICAL_ALLGATHER=1), "
                                   "ring_allgather"
                                 : "ring_allgather" + over},
          {"reducescatter", "ring_reducescatter" + over},
          {"alltoall", "pairwise_alltoall" + over},
          {"broadcast", "chain_broadcast" + over},
          {"adasum", "adasum_allreduce" + over}};
}

void ProviderTable::CountRun(const char* label) {
  std::lock_guard<std::mutex> lock(g_mutex);
  ++RunCounters()[label];
}

std::vector<std::pair<std::string, int64_t>> ProviderTable::Runs() {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<std::pair<std::string, int64_t>> runs;
  for (const auto& [label, count] : RunCounters()) runs.emplace_back(label, count);
  return runs;
}

}  // namespace horovodlike
