// Our algorithms over links as providers, registered for every link: the ring, pairwise and
// chain ones over the set's own link (tried last: they take every argument), and the
// hierarchical ones over the job's ranks grouped by host when the job asked for them.
#include <memory>
#include <string>
#include <vector>

#include "../reduce/reduce.h"
#include "adasum_allreduce.h"
#include "chain_broadcast.h"
#include "hierarchical_allgather.h"
#include "hierarchical_allreduce.h"
#include "pairwise_alltoall.h"
#include "provider_registry.h"
#include "recursive_doubling_allreduce.h"
#include "ring_allgather.h"
#include "ring_allreduce.h"
#include "ring_reducescatter.h"

namespace horovodlike {
namespace {

// One of our allreduce algorithms over the set's link; `fits`: the messages it takes (null:
// every one).
template <class Algorithm>
class AllreduceOverLink : public AllreduceProvider {
 public:
  using Fits = bool (*)(size_t count, DataType dtype);
  AllreduceOverLink(Link& link, const char* name, Fits fits)
      : link_(link), name_(name), fits_(fits) {}
  const char* name() const override { return name_; }
  bool Supports(size_t count, DataType dtype, ReduceOp op) const override {
    return fits_ == nullptr || fits_(count, dtype);
  }
  void Run(void* buf, size_t count, DataType dtype, ReduceOp op, double scale) override {
    if (link_.size() > 1) algorithm_.Run(link_, buf, count, dtype, op);
    ScaleInPlace(buf, count, dtype, scale);
  }

 private:
  Link& link_;
  const char* name_;
  Fits fits_;
  Algorithm algorithm_;
};

class RingAllreduceProvider final : public AllreduceOverLink<RingAllreduce> {
 public:
  explicit RingAllreduceProvider(Link& link) : AllreduceOverLink(link, "ring_allreduce", nullptr) {}
};

class RecursiveDoublingAllreduceProvider final
    : public AllreduceOverLink<RecursiveDoublingAllreduce> {
 public:
  explicit RecursiveDoublingAllreduceProvider(Link& link)
      : AllreduceOverLink(link, "recursive_doubling_allreduce",
                          &RecursiveDoublingAllreduce::Fits) {}
};

class HierarchicalAllreduceProvider final : public AllreduceProvider {
 public:
  // `host_allreduce`: shared memory's own allreduce over this host's ranks, or null.
  HierarchicalAllreduceProvider(const HostHierarchy& hosts,
                                std::shared_ptr<AllreduceProvider> host_allreduce)
      : hosts_(hosts), host_allreduce_(std::move(host_allreduce)) {}
  const char* name() const override { return "hierarchical_allreduce"; }
  void Run(void* buf, size_t count, DataType dtype, ReduceOp op, double scale) override {
    algorithm_.Run(hosts_, host_allreduce_.get(), buf, count, dtype, op);
    ScaleInPlace(buf, count, dtype, scale);
  }

 private:
  const HostHierarchy& hosts_;
  std::shared_ptr<AllreduceProvider> host_allreduce_;
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

// Runs over any link.
template <class Provider, class Algorithm>
std::shared_ptr<Provider> OverLink(const ProviderContext& context) {
  return std::make_shared<Algorithm>(context.link);
}

// The hierarchy is the job's: only for the job's own link, and only for what it was asked.
std::shared_ptr<AllreduceProvider> HierarchicalAllreduceIfAsked(const ProviderContext& context) {
  if (!context.spans_job || context.hosts == nullptr || !context.hosts->allreduce()) {
    return nullptr;
  }
  return std::make_shared<HierarchicalAllreduceProvider>(*context.hosts, context.host_allreduce);
}

std::shared_ptr<AllgatherProvider> HierarchicalAllgatherIfAsked(const ProviderContext& context) {
  if (!context.spans_job || context.hosts == nullptr || !context.hosts->allgather()) {
    return nullptr;
  }
  return std::make_shared<HierarchicalAllgatherProvider>(*context.hosts);
}

const ProviderRegistrar<AllreduceProvider> kHierarchicalAllreduce({
    "hierarchical_allreduce", kCpuDevice, 30, "HOROVOD_HIERARCHICAL_ALLREDUCE=1",
    OverBuiltInLinks, HierarchicalAllreduceIfAsked, kByHost});
const ProviderRegistrar<AllreduceProvider> kRecursiveDoublingAllreduce({
    "recursive_doubling_allreduce", kCpuDevice, 90, "up to 32 KiB", OverAnyLink,
    OverLink<AllreduceProvider, RecursiveDoublingAllreduceProvider>, kOverLink});
const ProviderRegistrar<AllreduceProvider> kRingAllreduce({
    "ring_allreduce", kCpuDevice, 100, "", OverAnyLink,
    OverLink<AllreduceProvider, RingAllreduceProvider>, kOverLink});
const ProviderRegistrar<AllgatherProvider> kHierarchicalAllgather({
    "hierarchical_allgather", kCpuDevice, 30, "HOROVOD_HIERARCHICAL_ALLGATHER=1",
    OverBuiltInLinks, HierarchicalAllgatherIfAsked, kByHost});
const ProviderRegistrar<AllgatherProvider> kRingAllgather({
    "ring_allgather", kCpuDevice, 100, "", OverAnyLink,
    OverLink<AllgatherProvider, RingAllgatherProvider>, kOverLink});
const ProviderRegistrar<ReducescatterProvider> kRingReducescatter({
    "ring_reducescatter", kCpuDevice, 100, "", OverAnyLink,
    OverLink<ReducescatterProvider, RingReducescatterProvider>, kOverLink});
const ProviderRegistrar<AlltoallProvider> kPairwiseAlltoall({
    "pairwise_alltoall", kCpuDevice, 100, "", OverAnyLink,
    OverLink<AlltoallProvider, PairwiseAlltoallProvider>, kOverLink});
const ProviderRegistrar<BroadcastProvider> kChainBroadcast({
    "chain_broadcast", kCpuDevice, 100, "", OverAnyLink,
    OverLink<BroadcastProvider, ChainBroadcastProvider>, kOverLink});
const ProviderRegistrar<AdasumProvider> kAdasumAllreduce({
    "adasum_allreduce", kCpuDevice, 100, "", OverAnyLink,
    OverLink<AdasumProvider, AdasumAllreduceProvider>, kOverLink});

}  // namespace
}  // namespace horovodlike
