#include "provider_registry.h"

#include <utility>

#include "shm/shm_allreduce.h"
#include "../common/backend_names.h"

namespace horovodlike {

ProviderContext::ProviderContext(Link& link, bool spans_job, std::string cpu_operations)
    : link(link),
      shared_memory(link.shared_memory()),
      hosts(link.hosts()),
      spans_job(spans_job),
      cpu_operations(std::move(cpu_operations)) {
  if (shared_memory != nullptr) host_allreduce = std::make_shared<ShmAllreduce>(*shared_memory);
}

bool OverAnyLink(const std::string&) { return true; }

bool OverBuiltInLinks(const std::string& cpu_operations) {
  return cpu_operations.empty() || IsBackend(cpu_operations, Backend::kTcp);
}

}  // namespace horovodlike
