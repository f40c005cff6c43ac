// The controller's stall inspection round (controller.h, ExchangeStallReports): every rank
// reports the cached tensors it has been waiting on, the coordinator adds the uncached ones it
// holds, judges (stall_inspector.h), and tells every rank whether to stop.
#include <algorithm>
#include <map>

#include "controller.h"
#include "handle_table.h"
#include "../collectives/star_exchange.h"

namespace horovodlike {

void Controller::ExchangeStallReports() {
  const auto now = std::chrono::steady_clock::now();
  WireWriter report;
  WriteStallReport(now, report);
  auto reports = GatherToRoot(link_, report.bytes(), kCoordinator);
  WireWriter verdict;
  if (link_.rank() == kCoordinator) JudgeStallReports(reports, now, verdict);
  BroadcastFromRoot(link_, verdict.bytes(), kCoordinator);
  WireReader in(verdict.bytes().data(), verdict.bytes().size());
  const int origin = in.GetI32();
  const std::string message = in.GetString();
  if (!message.empty()) throw TransportError(message, origin, TransportError::Cause::kStall);
}

void Controller::WriteStallReport(std::chrono::steady_clock::time_point now, WireWriter& out) {
  // The cached tensors this rank has ready and how long it has waited on each, in ms.
  std::vector<int64_t> slots, waited_ms;
  for (int slot = 0; slot < cache_.num_slots(); ++slot) {
    if (!IsCachedReady(slot)) continue;
    slots.push_back(slot);
    waited_ms.push_back(std::chrono::duration_cast<std::chrono::milliseconds>(
                            now - cached_since_[slot]).count());
  }
  if (joined_) {  // a joined rank stands in for every allreduce
    for (int slot = 0; slot < cache_.num_slots(); ++slot) {
      if (cache_.occupied(slot) && cache_.response(slot).type == Response::Type::kAllreduce &&
          !IsCachedReady(slot)) {
        slots.push_back(slot);
        waited_ms.push_back(0);
      }
    }
  }
  out.PutI64Vector(slots);
  out.PutI64Vector(waited_ms);
  out.PutI32(HandleTable::blocked_waiters());
}

void Controller::JudgeStallReports(const std::vector<std::vector<uint8_t>>& reports,
                                   std::chrono::steady_clock::time_point now,
                                   WireWriter& verdict) {
  using Waiting = StallInspector::Waiting;
  const int n = link_.size();
  std::map<std::string, Waiting> waiting;
  bool all_blocked = true;
  // The cached tensors, from every rank's report.
  for (int r = 0; r < n; ++r) {
    WireReader in(reports[r].data(), reports[r].size());
    auto their_slots = in.GetI64Vector();
    auto their_ms = in.GetI64Vector();
    if (in.GetI32() <= 0) all_blocked = false;
    for (size_t i = 0; i < their_slots.size() && i < their_ms.size(); ++i) {
      const int64_t slot = their_slots[i];
      if (slot < 0 || slot >= cache_.num_slots() || !cache_.occupied(static_cast<int>(slot))) {
        continue;
      }
      Waiting& w = waiting[cache_.response(static_cast<int>(slot)).names.at(0)];
      w.present.resize(n, false);
      w.present[r] = true;
      w.seconds = std::max(w.seconds, their_ms[i] / 1000.0);
    }
  }
  // The uncached ones, from the coordinator's table.
  for (const auto& [seq, name] : arrival_order_) {
    const Pending& pending = table_.at(name).second;
    Waiting& w = waiting[name];
    w.present.resize(n, false);
    for (int r = 0; r < n; ++r) if (pending.present[r]) w.present[r] = true;
    for (int r : joined_ranks_) w.present[r] = true;
    w.seconds = std::max(w.seconds,
                         std::chrono::duration<double>(now - pending.first_seen).count());
  }
  const StallInspector::Verdict judged = stall_inspector_.Judge(waiting, n, all_blocked, now);
  // Ranks of a process set other than the global one are numbered within the set; only the
  // global set's are job ranks the launcher can name.
  verdict.PutI32(n == config_.size ? judged.origin : -1);
  verdict.PutText(judged.shutdown_message);
}

}  // namespace horovodlike
