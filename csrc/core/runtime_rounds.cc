// Who runs a round, and what one does (runtime.h; docs/architecture.md, "Who runs a round"):
// the background loop's pace, a waiting caller's own rounds, and the negotiation and execution
// of every process set in one round. The rest of the runtime is in runtime.cc.
#include <algorithm>
#include <chrono>

#include "runtime.h"

namespace horovodlike {

std::chrono::microseconds Runtime::LoopCycle() const {
  auto cycle = std::chrono::microseconds(cycle_time_us_.load());
  if (deferred_) cycle = std::max(cycle, kDeferredCycle);
  const int idle = idle_rounds_.load(std::memory_order_relaxed) - kIdleRoundsAtFullPace;
  if (idle <= 0) return cycle;
  const auto stretched = cycle * (int64_t{1} << std::min(idle, 16));
  return std::max(cycle, std::min(stretched, std::chrono::microseconds(kIdleCycleMax)));
}

void Runtime::Loop() {
  using Clock = std::chrono::steady_clock;
  auto wait = LoopCycle();
  while (true) {
    // The cycle time may change between rounds (autotuning). Rounds that waiting callers ran
    // meanwhile count: an idle loop runs one a cycle time after the last round, whoever ran it.
    // Deferred (HOROVOD_OVERLAP=0): while a caller waits, this rank stays inside a round, so
    // that a peer which submits the last part of the caller's collective finds it there at
    // once (the round waits in the link for the peers without using a core, and their own
    // rounds pace it); otherwise the loop turns only every kDeferredCycle.
    const bool caller_waits = deferred_ && waiting_callers_.load(std::memory_order_relaxed) > 0;
    const TensorQueue::Wake wake =
        caller_waits ? TensorQueue::Wake::kNotified : queue_.WaitForWork(wait);
    const auto cycle = LoopCycle();
    auto since_last_round = [&] {
      return std::chrono::duration_cast<std::chrono::microseconds>(
          Clock::now().time_since_epoch() - std::chrono::nanoseconds(last_round_end_ns_.load()));
    };
    if (wake == TensorQueue::Wake::kTimeout && !shutdown_requested_) {
      const auto since = since_last_round();
      if (since < cycle) {
        wait = cycle - since;
        continue;
      }
    }
    wait = cycle;
    std::lock_guard<std::mutex> lock(round_mutex_);
    if (finished_) return;
    // A waiting caller may have run a round while this thread waited for the lock (a long
    // collective), taking in the new requests it was woken for: then an idle round here would
    // only make the peers run one too.
    if (!shutdown_requested_ &&
        ((wake == TensorQueue::Wake::kNewRequests && !queue_.HasNewRequests()) ||
         (wake == TensorQueue::Wake::kBell && bells_->Answered()) ||
         (wake == TensorQueue::Wake::kTimeout && since_last_round() < cycle))) {
      continue;
    }
    ++loop_rounds_;
    if (!RunRoundLocked()) return;
  }
}

std::shared_ptr<HandleState> Runtime::WaitDriving(int64_t handle, double seconds, bool drive) {
  // Rounds that did not complete the handle before it goes back to the loop: the peers may
  // be a round behind (one ran an idle round when this rank's request came), but a handle
  // that waits for a peer's work is better left to the loop's cycle.
  constexpr int kFruitlessRounds = 3;
  const std::shared_ptr<HandleState> state = handles_.Get(handle);
  // A point-to-point message needs no round: the wait itself moves it (point_to_point.h).
  if (state->progress) return handles_.WaitFor(state, seconds);
  if (caller_rounds_ && drive) {
    for (int fruitless = 0; fruitless < kFruitlessRounds && !handles_.Done(state);) {
      std::unique_lock<std::mutex> lock(round_mutex_, std::try_to_lock);
      if (!lock.owns_lock() || finished_) break;  // the loop is in a round; it goes on
      ++caller_rounds_run_;
      if (!RunRoundLocked()) break;
      if (!handles_.Done(state)) ++fruitless;
    }
  }
  // What is left is the loop's: it takes new requests at once and runs a round every cycle
  // time while a peer is late (deferred: back to back while a caller waits).
  if (handles_.Done(state)) return state;
  if (!deferred_) return handles_.WaitFor(state, seconds);
  struct Waiting {
    Runtime& runtime;
    explicit Waiting(Runtime& r) : runtime(r) {
      if (runtime.waiting_callers_.fetch_add(1) == 0) runtime.queue_.Notify();
    }
    ~Waiting() { runtime.waiting_callers_.fetch_sub(1); }
  } waiting(*this);
  return handles_.WaitFor(state, seconds);
}

void Runtime::TakeNewRequests(RoundState& state) {
  queue_.PopNewRequests(&state.popped);
  if (timeline_->active() && !state.popped.empty()) {
    // Only rounds that took in work: an idle loop turns every cycle time.
    timeline_->MarkCycleStart();
    for (const auto& [set_id, request] : state.popped) {
      timeline_->NegotiateStart(request.name, request.op);
    }
  }
  for (auto& [set_id, request] : state.popped) {
    state.by_set[set_id].push_back(std::move(request));
  }
}

bool Runtime::RunSets(RoundState& state, std::vector<int>* shutdown_ranks) {
  using Clock = std::chrono::steady_clock;
  bool shutdown = false;
  // Every rank visits its sets in the same (id) order, so each set's members negotiate and
  // execute in step; sets added this round are visited from the next one.
  process_sets_.MemberIds(&state.set_ids);
  const bool work = bells_->active() && process_sets_.HasWork(state.by_set);
  for (int id : state.set_ids) {
    ProcessSet* set = process_sets_.Member(id);
    if (set == nullptr) continue;  // removed earlier in this round
    // The global set (visited first) puts the tuned parameters in force on every rank; the
    // other sets follow them in the same iteration.
    if (id == 0 && tuner_) {
      tuner_->RoundStarted(Clock::now());
      set->controller->Propose(tuner_->current());
    } else if (id != 0) {
      set->controller->SetParameters(state.in_force);
    }
    // Rings the set's silent peers when this rank's work is in other sets (round_bells.h).
    const RoundBells::Negotiating negotiating(*bells_, state.by_set[id], *set->controller, work);
    const Controller::Round& round = set->controller->Negotiate(
        state.by_set[id], id == 0 && shutdown_requested_.load());
    if (timeline_->active()) {
      for (const Response* part : round.parts) timeline_->NegotiateEnd(part->names.at(0));
    }
    if (id == 0 && set->controller->parameters() != state.in_force) {
      state.in_force = set->controller->parameters();
      std::lock_guard<std::mutex> lock(tuned_mutex_);
      tuned_ = {state.in_force, set->controller->parameters_round()};
    }
    state.worked |= !round.parts.empty() || set->controller->HasWork();
    set->executor->Prepare(round.max_parts, round.max_fused_bytes);
    size_t begin = 0;
    for (size_t end : round.ends) {
      const Response* const* parts = round.parts.data() + begin;
      set->executor->Execute(parts, end - begin, begin == 0 ? round.staged : 0);
      if (tuner_ && parts[0]->type == Response::Type::kAllreduce) {
        tuner_->ObserveAllreduce(id, parts, end - begin, Clock::now());
      }
      begin = end;
    }
    if (id == 0 && round.shutdown) {
      shutdown = true;
      *shutdown_ranks = round.shutdown_ranks;
    }
  }
  return shutdown;
}

}  // namespace horovodlike
