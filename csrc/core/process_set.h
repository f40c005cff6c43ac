// Process sets: groups of ranks that run collectives among themselves. Set 0 is every rank.
// Each set this rank belongs to has its own controller and executor over a view of the
// link; sets are added and removed by a negotiated global operation, so every rank
// changes its table in the same round and gives a new set the same id.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "controller.h"
#include "executor.h"
#include "../links/link.h"

namespace horovodlike {

struct ProcessSet {
  int id = 0;
  std::vector<int> ranks;               // global ranks, ascending
  std::unique_ptr<Link> view;      // null for the global set (the job's link)
  std::unique_ptr<Controller> controller;
  std::unique_ptr<Executor> executor;   // both null when this rank is not a member
};

class ProcessSetTable {
 public:
  // Registers the global set over `link`.
  ProcessSetTable(Link& link, const Config& config, TensorQueue& queue,
                  HandleTable& handles, Timeline& timeline, Executor::ProcessSetChange on_change,
                  GpuCompletions* gpu = nullptr);

  // Adds a set (background thread only); throws InvalidArgument for bad or duplicate ranks.
  int Add(const std::vector<int>& ranks);
  void Remove(int id);
  // Ids of the sets this rank belongs to, ascending (background thread only).
  void MemberIds(std::vector<int>* out);
  // The set if it still exists and this rank is a member, else null (background thread only;
  // valid until the next Remove).
  ProcessSet* Member(int id);
  // Whether this rank has work in any of its sets: requests new this round (`new_requests`,
  // by set) or left by earlier rounds in a controller (background thread only).
  bool HasWork(const std::map<int, std::vector<Request>>& new_requests);
  // Ranks of a set, or false when it does not exist (any thread).
  bool Ranks(int id, std::vector<int>* ranks);
  std::vector<int> Ids();
  // Sets of the job, this rank a member or not (the global set counts).
  size_t Count();
  Executor::Stats TotalStats();

 private:
  Link& link_;
  const Config& config_;
  TensorQueue& queue_;
  HandleTable& handles_;
  Timeline& timeline_;
  Executor::ProcessSetChange on_change_;
  GpuCompletions* gpu_;
  std::mutex mutex_;
  std::map<int, std::unique_ptr<ProcessSet>> sets_;
  int next_id_ = 1;
};

}  // namespace horovodlike
