#include "stall_inspector.h"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "../common/logging.h"

namespace horovodlike {

StallInspector::StallInspector(const Config& config)
    : config_(config), last_check_(Clock::now()),
      last_warning_(Clock::now() - std::chrono::hours(24)) {}

bool StallInspector::CheckDue(Clock::time_point now) const {
  if (!config_.stall_check_enabled) return false;
  // Often enough that warnings and the shutdown come close to their times, at most once a
  // second: a check costs one small gather and broadcast.
  double interval = std::min(1.0, config_.stall_warning_seconds / 2);
  if (config_.stall_shutdown_seconds > 0) {
    interval = std::min(interval, config_.stall_shutdown_seconds / 2);
  }
  return now - last_check_ >= std::chrono::duration<double>(std::max(interval, 0.05));
}

StallInspector::Verdict StallInspector::Judge(const std::map<std::string, Waiting>& waiting,
                                              int num_ranks, bool all_blocked,
                                              Clock::time_point now) {
  last_check_ = now;
  // Every rank blocked in a wait and nothing ready on all of them: no rank can go on (the
  // ranks diverged: one skipped a collective or submitted them in another order). Past the
  // warning time that is an error rather than a warning, which would repeat for ever; unless
  // HOROVOD_STALL_SHUTDOWN_TIME_SECONDS says when to stop, which then decides.
  bool runnable = false;
  for (const auto& [name, w] : waiting) {
    if (std::find(w.present.begin(), w.present.end(), false) == w.present.end()) runnable = true;
  }
  const bool deadlocked = num_ranks == config_.size && all_blocked && !runnable &&
                          !waiting.empty() && config_.stall_shutdown_seconds <= 0;
  if (!deadlocked) {
    deadlocked_since_.reset();
  } else if (!deadlocked_since_) {
    deadlocked_since_ = now;
  }
  const bool deadlock_error =
      deadlocked && std::chrono::duration<double>(now - *deadlocked_since_).count() >=
                        config_.stall_warning_seconds;
  Verdict verdict;
  std::ostringstream list;
  bool shutdown = deadlock_error;
  int stalled = 0;
  for (const auto& [name, w] : waiting) {
    std::vector<int> missing;
    for (int r = 0; r < num_ranks; ++r) {
      if (!w.present[r]) missing.push_back(r);
    }
    const bool stop = config_.stall_shutdown_seconds > 0 &&
                      w.seconds >= config_.stall_shutdown_seconds;
    if (missing.empty() ||
        (w.seconds < config_.stall_warning_seconds && !stop && !deadlock_error)) {
      continue;
    }
    shutdown = shutdown || stop;
    if (verdict.origin < 0 || missing[0] < verdict.origin) verdict.origin = missing[0];
    list << (stalled++ ? "; " : "") << "'" << name << "' missing on rank"
         << (missing.size() > 1 ? "s " : " ");
    for (size_t i = 0; i < missing.size(); ++i) list << (i ? ", " : "") << missing[i];
    list << " (waited " << std::fixed << std::setprecision(1) << w.seconds << " s)";
    list.unsetf(std::ios::fixed);
  }
  if (deadlock_error) {
    std::ostringstream out;
    out << "ranks diverged: every rank has been blocked for more than "
        << config_.stall_warning_seconds
        << " s (HOROVOD_STALL_CHECK_TIME_SECONDS) waiting for a tensor that another rank has "
           "not submitted, so none can go on (a rank skipped a collective, or the ranks "
           "submitted them in different orders): " << list.str();
    verdict.shutdown_message = out.str();
  } else if (shutdown) {
    std::ostringstream out;
    out << "stall shutdown: tensors were submitted by some ranks and not by the others for "
           "more than " << config_.stall_shutdown_seconds
        << " s (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS): " << list.str();
    verdict.shutdown_message = out.str();
  } else if (stalled > 0 && now - last_warning_ >=
                                std::chrono::duration<double>(config_.stall_warning_seconds)) {
    last_warning_ = now;
    HVDL_LOG(kWarning, "Stalled tensors: some ranks submitted them more than "
                           << config_.stall_warning_seconds
                           << " s ago (HOROVOD_STALL_CHECK_TIME_SECONDS) and others have not; "
                              "the ranks may run different code paths, or one is stuck: "
                           << list.str());
  }
  return verdict;
}

}  // namespace horovodlike
