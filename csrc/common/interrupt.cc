#include "interrupt.h"

namespace horovodlike {
namespace {
thread_local InterruptCheck t_check = nullptr;
thread_local void* t_context = nullptr;
}  // namespace

ScopedInterruptCheck::ScopedInterruptCheck(InterruptCheck check, void* context)
    : outer_check_(t_check), outer_context_(t_context) {
  t_check = check;
  t_context = context;
}

ScopedInterruptCheck::~ScopedInterruptCheck() {
  t_check = outer_check_;
  t_context = outer_context_;
}

bool InterruptCheckInstalled() { return t_check != nullptr; }

bool InterruptRequested() { return t_check != nullptr && t_check(t_context); }

std::string InterruptedWaitMessage(int peer) {
  std::string message = "interrupted by a signal while waiting";
  if (peer >= 0) message += " for rank " + std::to_string(peer);
  return message;
}

}  // namespace horovodlike
