#include "process_set.h"

#include <algorithm>

#include "enqueue_checks.h"
#include "../links/subset_link.h"

namespace horovodlike {

ProcessSetTable::ProcessSetTable(Link& link, const Config& config, TensorQueue& queue,
                                 HandleTable& handles, Timeline& timeline,
                                 Executor::ProcessSetChange on_change, GpuCompletions* gpu)
    : link_(link), config_(config), queue_(queue), handles_(handles),
      timeline_(timeline), on_change_(std::move(on_change)), gpu_(gpu) {
  auto global = std::make_unique<ProcessSet>();
  global->id = 0;
  for (int r = 0; r < link.size(); ++r) global->ranks.push_back(r);
  global->controller = std::make_unique<Controller>(link_, config_,
                                                    /*carries_parameters=*/true);
  global->executor = std::make_unique<Executor>(
      link_, ProviderTable::ForJob(link_, config_.cpu_operations), queue_, handles_,
      timeline_, 0, on_change_, gpu_,
      GpuSettings{config_.gpu_operations, config_.launcher_hostname, link_.hosts()});
  if (config_.early_staging) {
    // Small allreduces of the global set staged before its negotiation (controller.h).
    Executor* executor = global->executor.get();
    global->controller->StageEarly(
        [executor](const Response& response) { return executor->StageEarly(response); });
  }
  sets_[0] = std::move(global);
}

int ProcessSetTable::Add(const std::vector<int>& ranks) {
  CheckProcessSetRanks(ranks, link_.size());
  std::vector<int> sorted(ranks);
  std::sort(sorted.begin(), sorted.end());
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [id, set] : sets_) {
    if (set->ranks == sorted) {
      throw InvalidArgument("a process set with ranks " +
                            ShapeString(std::vector<int64_t>(sorted.begin(), sorted.end())) +
                            " already exists (id " + std::to_string(id) + ")");
    }
  }
  auto set = std::make_unique<ProcessSet>();
  set->id = next_id_++;
  set->ranks = sorted;
  if (std::binary_search(sorted.begin(), sorted.end(), link_.rank())) {
    set->view = std::make_unique<SubsetLink>(link_, sorted);
    set->controller = std::make_unique<Controller>(*set->view, config_);
    set->executor = std::make_unique<Executor>(*set->view, ProviderTable::ForSubset(*set->view),
                                               queue_, handles_, timeline_, set->id, nullptr,
                                               gpu_,
                                               GpuSettings{config_.gpu_operations,
                                                           config_.launcher_hostname});
  }
  const int id = set->id;
  sets_[id] = std::move(set);
  return id;
}

void ProcessSetTable::Remove(int id) {
  if (id == 0) throw InvalidArgument("the global process set cannot be removed");
  std::unique_ptr<ProcessSet> removed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = sets_.find(id);
    if (it == sets_.end()) {
      throw InvalidArgument("process set " + std::to_string(id) + " does not exist");
    }
    removed = std::move(it->second);
    sets_.erase(it);
  }
  for (TensorEntry& entry : queue_.TakeProcessSet(id)) {
    handles_.Complete(entry.handle,
                      Status::Error(StatusCode::kInvalidArgument,
                                    "process set " + std::to_string(id) + " was removed while '" +
                                        entry.request.name + "' was pending"));
  }
}

void ProcessSetTable::MemberIds(std::vector<int>* out) {
  out->clear();
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [id, set] : sets_) {
    if (set->controller) out->push_back(id);
  }
}

size_t ProcessSetTable::Count() {
  std::lock_guard<std::mutex> lock(mutex_);
  return sets_.size();
}

bool ProcessSetTable::HasWork(const std::map<int, std::vector<Request>>& new_requests) {
  for (const auto& [id, requests] : new_requests) {
    if (!requests.empty()) return true;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [id, set] : sets_) {
    if (set->controller && set->controller->HasWork()) return true;
  }
  return false;
}

ProcessSet* ProcessSetTable::Member(int id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = sets_.find(id);
  return (it == sets_.end() || !it->second->controller) ? nullptr : it->second.get();
}

bool ProcessSetTable::Ranks(int id, std::vector<int>* ranks) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = sets_.find(id);
  if (it == sets_.end()) return false;
  *ranks = it->second->ranks;
  return true;
}

std::vector<int> ProcessSetTable::Ids() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<int> ids;
  for (auto& [id, set] : sets_) ids.push_back(id);
  return ids;
}

Executor::Stats ProcessSetTable::TotalStats() {
  std::lock_guard<std::mutex> lock(mutex_);
  Executor::Stats total;
  for (auto& [id, set] : sets_) {
    if (!set->executor) continue;
    auto s = set->executor->stats();
    total.allreduce_collectives += s.allreduce_collectives;
    total.allreduce_tensors += s.allreduce_tensors;
    total.errors += s.errors;
    total.hierarchical_allreduces += s.hierarchical_allreduces;
    total.hierarchical_allgathers += s.hierarchical_allgathers;
    total.early_staged_allreduces += s.early_staged_allreduces;
    total.fusion_buffer_bytes += s.fusion_buffer_bytes;
  }
  return total;
}

}  // namespace horovodlike
