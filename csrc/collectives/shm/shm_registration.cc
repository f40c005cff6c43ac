// Registers shared memory's own allreduce: first for every size when every rank of the job is
// on this host (over several hosts it serves the hierarchical allreduce inside each host).
#include "../provider_registry.h"
#include "shm_allreduce.h"

namespace horovodlike {
namespace {

std::shared_ptr<AllreduceProvider> OnOneHost(const ProviderContext& context) {
  if (!context.spans_job || context.shared_memory == nullptr ||
      context.shared_memory->size() != context.link.size()) {
    return nullptr;
  }
  return context.host_allreduce;  // the one instance the table's providers share
}

const ProviderRegistrar<AllreduceProvider> kShmAllreduce({
    "shm_allreduce", kCpuDevice, 10, "every rank on one host", OverBuiltInLinks, OnOneHost,
    kNoTraits});

}  // namespace
}  // namespace horovodlike
