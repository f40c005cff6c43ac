// Interrupting a long wait on the thread that runs it.
//
// The background loop's waits are never interrupted: it has nobody to hand a signal to. But a
// caller's thread that runs negotiation rounds itself while it waits for its own operation
// (Runtime::WaitDriving) must still answer Ctrl-C: it installs a check for the length of that
// wait, and the links' waits that last (over kInterruptAfter) ask it between their sleeps.
// An interrupted wait throws; what that means for the round is the caller's business.
#pragma once

#include <chrono>
#include <string>

namespace horovodlike {

// Waits shorter than this never look. A round normally ends within milliseconds; one that
// waits a second for a peer finds it stopped or hung, rather than slow on a loaded machine
// (an interrupted round stops the runtime, so the check must not catch a merely slow peer).
constexpr std::chrono::milliseconds kInterruptAfter(1000);

// Returns true when the thread should stop waiting (its pending signal handler raised).
using InterruptCheck = bool (*)(void* context);

// Installs `check` on this thread for its lifetime (nested scopes restore the outer one).
class ScopedInterruptCheck {
 public:
  ScopedInterruptCheck(InterruptCheck check, void* context);
  ~ScopedInterruptCheck();
  ScopedInterruptCheck(const ScopedInterruptCheck&) = delete;
  ScopedInterruptCheck& operator=(const ScopedInterruptCheck&) = delete;

 private:
  InterruptCheck outer_check_;
  void* outer_context_;
};

// Whether this thread has a check installed (a wait can then sleep in shorter slices).
bool InterruptCheckInstalled();
// Asks the installed check; false when none is installed.
bool InterruptRequested();
// What an interrupted wait says, the same on every link: "interrupted by a signal while
// waiting for rank <peer>" (no rank when peer < 0).
std::string InterruptedWaitMessage(int peer);

}  // namespace horovodlike
