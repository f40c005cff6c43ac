// The providers each backend offers, registered by its own folder from its own file with a
// static ProviderRegistrar: per operation and device, in the order they are tried, each with when
// it applies (what --check-build prints) and a factory that checks whether it can run over a
// process set's link. The ProviderTable (provider_table.h) builds each set's table from this
// list once, when the set is made; nothing here is looked at per collective.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "../links/link.h"
#include "provider.h"

namespace horovodlike {

// What a process set's link offers the providers, gathered when its table is built.
struct ProviderContext {
  // `link`: the job's link (`spans_job`) or a process set's view of it; `cpu_operations`:
  // HOROVOD_CPU_OPERATIONS, lower case ("" when unset).
  ProviderContext(Link& link, bool spans_job, std::string cpu_operations);

  Link& link;
  ShmLink* shared_memory;       // the ranks of this host (link.shared_memory()), or null
  const HostHierarchy* hosts;   // the job's ranks by host (link.hosts()), or null
  bool spans_job;               // the link's ranks are the job's, in job rank order
  std::string cpu_operations;
  // Shared memory's own allreduce among this host's ranks, one per table whichever providers
  // run it (its steps must match on every rank); null without shared memory.
  std::shared_ptr<AllreduceProvider> host_allreduce;
};

// The devices a provider serves: the CPU tables are built from the "cpu" entries; the "cuda"
// entries describe the GPU path (core/device_collectives.cc picks between them at run time).
inline constexpr char kCpuDevice[] = "cpu";
inline constexpr char kCudaDevice[] = "cuda";

// Whether a provider may run when HOROVOD_CPU_OPERATIONS is `cpu_operations` ("" when unset):
// what --check-build lists for that setting.
using OfferedWith = bool (*)(const std::string& cpu_operations);
bool OverAnyLink(const std::string& cpu_operations);
// The built-in links only (tcp, with shared memory between the ranks of a host).
bool OverBuiltInLinks(const std::string& cpu_operations);

// Flags of a registration.
enum ProviderTraits : unsigned {
  kNoTraits = 0,
  kOverLink = 1,  // one of our algorithms over the set's link: its label names the link
  kByHost = 2,    // works inside each host, then across hosts (counted in the stats)
};

template <class Provider>
struct ProviderRegistration {
  const char* name;     // the provider's name(), as --check-build and the labels say it
  const char* device;   // kCpuDevice or kCudaDevice
  int order;            // lower first among the (operation, device)'s registrations
  const char* applies;  // when it applies, for --check-build ("every rank on one host"); "": always
  OfferedWith offered;
  // The provider over the context's link, or null where it cannot run there; null for the
  // entries that no CPU table builds (the GPU path's).
  std::shared_ptr<Provider> (*make)(const ProviderContext& context);
  unsigned traits;      // ProviderTraits
};

// Every registration of one operation (Provider::kOperation).
template <class Provider>
class ProviderRegistry {
 public:
  // In order: lowest `order` first, equal ones as registered.
  static const std::vector<ProviderRegistration<Provider>>& All() { return Mutable(); }
  static void Add(const ProviderRegistration<Provider>& registration) {
    auto& all = Mutable();
    const auto later = std::upper_bound(
        all.begin(), all.end(), registration.order,
        [](int order, const ProviderRegistration<Provider>& r) { return order < r.order; });
    all.insert(later, registration);
  }

 private:
  // Built on first use: registrars run during static initialization, in no set order.
  static std::vector<ProviderRegistration<Provider>>& Mutable() {
    static auto* all = new std::vector<ProviderRegistration<Provider>>();
    return *all;
  }
};

// A backend's file registers each of its providers with one of these, at namespace scope.
template <class Provider>
struct ProviderRegistrar {
  explicit ProviderRegistrar(const ProviderRegistration<Provider>& registration) {
    ProviderRegistry<Provider>::Add(registration);
  }
};

}  // namespace horovodlike
