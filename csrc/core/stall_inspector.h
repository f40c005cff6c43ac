// The stall inspector: notices tensors that some ranks of a set submitted and others have not,
// warns about them (naming the missing ranks) after HOROVOD_STALL_CHECK_TIME_SECONDS, and past
// HOROVOD_STALL_SHUTDOWN_TIME_SECONDS says the set must stop. The coordinator decides; the
// controller carries the reports and the verdict between the ranks.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "../common/env_config.h"

namespace horovodlike {

class StallInspector {
 public:
  using Clock = std::chrono::steady_clock;

  explicit StallInspector(const Config& config);

  // Whether the coordinator should ask the ranks for their reports this round.
  bool CheckDue(Clock::time_point now) const;

  // One tensor: which ranks of the set have submitted it, and the longest any has waited.
  struct Waiting {
    std::vector<bool> present;
    double seconds = 0;
  };
  struct Verdict {
    std::string shutdown_message;  // empty: go on
    int origin = -1;               // the lowest rank missing a stalled tensor (-1: none)
  };
  // Coordinator, once per check: logs a warning (at most once per warning interval) and
  // returns the shutdown message once a tensor has waited past the shutdown time, or once
  // every rank (`all_blocked`: each has a thread blocked in a wait) has waited past the
  // warning time with nothing ready anywhere (the ranks diverged).
  Verdict Judge(const std::map<std::string, Waiting>& waiting, int num_ranks, bool all_blocked,
                Clock::time_point now);

 private:
  const Config& config_;
  Clock::time_point last_check_;
  Clock::time_point last_warning_;
  // Global set: since when every rank has been blocked waiting with no tensor ready on all
  // ranks (a deadlock: none can go on), unset while that is not so.
  std::optional<Clock::time_point> deadlocked_since_;
};

}  // namespace horovodlike
