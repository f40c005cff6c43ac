#include "provider_table.h"

#include <cctype>
#include <cstring>
#include <map>
#include <mutex>
#include <set>

#include "../common/backend_names.h"

namespace horovodlike {
namespace {

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

// The registered cpu providers of Provider's operation that can run in `context`, in order
// (`every`), or the first of them; each owned by `owned`.
template <class Provider>
std::vector<ProviderTable::Entry<Provider>> Pick(const ProviderContext& context, bool every,
                                                 std::vector<std::shared_ptr<void>>* owned) {
  std::vector<ProviderTable::Entry<Provider>> entries;
  for (const ProviderRegistration<Provider>& registration : ProviderRegistry<Provider>::All()) {
    if (registration.make == nullptr || std::strcmp(registration.device, kCpuDevice) != 0) {
      continue;
    }
    std::shared_ptr<Provider> provider = registration.make(context);
    if (provider == nullptr) continue;
    const Link* over = (registration.traits & kOverLink) ? &context.link : nullptr;
    entries.push_back({provider.get(), Intern(MakeLabel(provider->name(), over)),
                       (registration.traits & kByHost) != 0});
    owned->push_back(std::move(provider));
    if (!every) break;
  }
  if (entries.empty()) {  // the algorithms over links run everywhere: a registration is missing
    throw InvalidArgument(std::string("no ") + Provider::kOperation + " provider can run over " +
                          context.link.name());
  }
  return entries;
}

// Appends (operation, what runs it in order) for the registrations of `device` that may run
// with `cpu_operations`; nothing when none may.
template <class Provider>
void AppendAvailable(const char* device, const std::string& cpu_operations,
                     std::vector<std::pair<std::string, std::string>>* available) {
  const bool cpu = std::strcmp(device, kCpuDevice) == 0;
  // Over the link HOROVOD_CPU_OPERATIONS names, the providers for any link say which it is.
  const std::string over = OverBuiltInLinks(cpu_operations) || !cpu ? ""
                                                                   : "over " + cpu_operations;
  std::string providers;
  for (const ProviderRegistration<Provider>& registration : ProviderRegistry<Provider>::All()) {
    if (std::strcmp(registration.device, device) != 0 || !registration.offered(cpu_operations)) {
      continue;
    }
    if (!providers.empty()) providers += ", ";
    providers += registration.name;
    // "(when it applies, over the link)", either part alone, or nothing.
    std::string note = registration.applies;
    if (!over.empty() && (note.empty() || (registration.traits & kOverLink))) {
      note += note.empty() ? over : ", " + over;
    }
    if (!note.empty()) providers += " (" + note + ")";
  }
  if (providers.empty()) return;
  const std::string operation = Provider::kOperation;
  available->emplace_back(cpu ? operation : operation + " (" + device + ")", providers);
}

template <class... Providers>
void AppendEachAvailable(const char* device, const std::string& cpu_operations,
                         std::vector<std::pair<std::string, std::string>>* available) {
  (AppendAvailable<Providers>(device, cpu_operations, available), ...);
}

}  // namespace

ProviderTable::ProviderTable(const ProviderContext& context)
    : allreduce_(Pick<AllreduceProvider>(context, /*every=*/true, &owned_)),
      allgather_(Pick<AllgatherProvider>(context, false, &owned_)[0]),
      reducescatter_(Pick<ReducescatterProvider>(context, false, &owned_)[0]),
      alltoall_(Pick<AlltoallProvider>(context, false, &owned_)[0]),
      broadcast_(Pick<BroadcastProvider>(context, false, &owned_)[0]),
      adasum_(Pick<AdasumProvider>(context, false, &owned_)[0]) {}

ProviderTable::~ProviderTable() = default;

std::unique_ptr<ProviderTable> ProviderTable::ForJob(Link& link,
                                                   const std::string& cpu_operations) {
  // The job's link follows HOROVOD_CPU_OPERATIONS when it is set (links/connect.cc): a mismatch
  // here means a caller built the link some other way.
  if (!cpu_operations.empty() && !IsBackend(cpu_operations, Backend::kTcp) &&
      std::string(link.name()) != cpu_operations) {
    throw InvalidArgument("HOROVOD_CPU_OPERATIONS=" + cpu_operations +
                          " asks for its operations, but the job's ranks are connected over " +
                          link.name());
  }
  std::unique_ptr<ProviderTable> table(
      new ProviderTable(ProviderContext(link, /*spans_job=*/true, cpu_operations)));
  auto described = table->Describe();
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_running_job == nullptr) g_running_job = new std::vector<std::pair<std::string, std::string>>();
  *g_running_job = std::move(described);
  return table;
}

std::unique_ptr<ProviderTable> ProviderTable::ForSubset(Link& view) {
  return std::unique_ptr<ProviderTable>(
      new ProviderTable(ProviderContext(view, /*spans_job=*/false, "")));
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
  std::vector<std::pair<std::string, std::string>> available;
  for (const char* device : {kCpuDevice, kCudaDevice}) {
    AppendEachAvailable<AllreduceProvider, AllgatherProvider, ReducescatterProvider,
                        AlltoallProvider, BroadcastProvider, AdasumProvider>(
        device, cpu_operations, &available);
  }
  return available;
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
