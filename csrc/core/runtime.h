// The process-global state created by init() and torn down by shutdown(): configuration,
// link, tensor queue, handles, and the background thread that negotiates and executes.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "controller.h"
#include "process_set.h"
#include "round_bells.h"
#include "runtime_args.h"
#include "../common/env_config.h"
#include "executor.h"
#include "gpu_completions.h"
#include "handle_table.h"
#include "parameter_manager.h"
#include "point_to_point.h"
#include "tensor_queue.h"
#include "timeline.h"
#include "../links/link.h"

namespace horovodlike {

class Runtime {
 public:
  // Creates the global runtime; throws if already initialized or if set-up fails.
  static void Init();
  // Stops the loop (pending work on every rank fails), frees everything; init() may follow.
  static void Shutdown();
  static bool IsInitialized();
  // Throws InvalidArgument("horovodlike has not been initialized...") when not initialized.
  // The caller shares ownership, so a shutdown() meanwhile cannot free the runtime under it.
  static std::shared_ptr<Runtime> Get();

  const Config& config() const { return config_; }
  // Checks the arguments (InvalidArgument) and queues the work; returns a handle at once.
  // Collectives over a tensor only; join and process-set changes go to EnqueueControl.
  int64_t Enqueue(EnqueueArgs args);
  // A control operation (join, add/remove_process_set) on the global set, ordered with the
  // collectives; its handle reports the last rank to join or the set's id.
  int64_t EnqueueControl(OpType op, std::string name, ControlRequest control);
  HandleTable& handles() { return handles_; }
  GpuCompletions& gpu_completions() { return gpu_completions_; }
  // Waits up to `seconds` for `handle`, like handles().WaitFor, but first runs negotiation
  // rounds on this thread while that brings the handle closer (the peers take part in them
  // too, from their loop or their own waiting callers): no hand-off to the loop and back,
  // which costs more than a small collective itself. Falls back to the loop when it holds the
  // round, after a few rounds that did not complete the handle, with HOROVOD_CALLER_ROUNDS=0,
  // and over links that cannot be interrupted (Gloo): a round, once begun, must be finished,
  // so its waits ask the thread's interrupt check (common/interrupt.h), and an interrupted
  // round stops the runtime.
  // `drive` false: only wait (a caller that already ran its rounds for this handle, and now
  // waits in slices to look at signals, leaves the rest to the loop).
  std::shared_ptr<HandleState> WaitDriving(int64_t handle, double seconds, bool drive = true);
  // Rounds run so far by the loop and by waiting callers.
  struct RoundCounts {
    int64_t loop = 0;
    int64_t caller = 0;
    int64_t loop_cycle_us = 0;  // the loop's wait between rounds now (LoopCycle)
  };
  RoundCounts round_counts() const {
    return {loop_rounds_.load(), caller_rounds_run_.load(), LoopCycle().count()};
  }
  // Point-to-point between two ranks of a process set (`message.peer` a global rank); checks
  // that both ranks are in the set, then hands over to PointToPoint.
  int64_t Send(const PointToPoint::Message& message, const void* data);
  int64_t Recv(const PointToPoint::Message& message, void* data);
  // This rank failed while exchanging messages in process set `set_id`: tell its other ranks.
  void NotifyPointToPointFailure(int set_id, const std::string& reason);
  // What carries point-to-point messages ("tcp", "mpi"); nullptr when this job has none.
  const char* PointToPointLinkName() const { return p2p_->link_name(); }
  // The shared-memory link among this host's ranks, or nullptr.
  const ShmLink* shared_memory() const { return link_->shared_memory(); }
  // The link whose tagged messages point-to-point uses (null when there is none), for tests
  // of the link API itself.
  Link* TaggedLink() const {
    return p2p_link_ ? p2p_link_.get() : link_->tagged() ? link_.get() : nullptr;
  }
  Executor::Stats stats() { return process_sets_.TotalStats(); }
  // Round bells this rank rang to peers on other hosts (-1 without a network bell).
  int64_t network_bells() const { return bells_->network_rings(); }
  // Ranks of a process set; throws InvalidArgument when it does not exist.
  std::vector<int> ProcessSetRanks(int id);
  std::vector<int> ProcessSetIds() { return process_sets_.Ids(); }
  // How process set `id` runs GPU tensors ("nccl", "staged: <why>"); "" before its first.
  std::string DeviceMode(int id);
  // The parameters in force (the same on every rank after each round) and the global round in
  // which they took effect.
  struct TunedState {
    TunedParameters parameters;
    int64_t round = 0;
  };
  TunedState tuned();
  // hvd.start_timeline / stop_timeline: rank 0 records, as in Horovod; elsewhere they do
  // nothing. Start throws InvalidArgument naming a path that cannot be written.
  void StartTimeline(const std::string& path, bool mark_cycles);
  void StopTimeline() { timeline_->Stop(); }

  // Stops the loop, fails pending work and closes the timeline; idempotent.
  void Close();
  ~Runtime();

 private:
  Runtime(Config config, std::unique_ptr<Link> link, int generation,
          std::unique_ptr<ParameterManager> tuner, std::unique_ptr<Timeline> timeline,
          std::unique_ptr<Link> p2p_link, std::string p2p_unavailable);
  void CheckPointToPoint(const PointToPoint::Message& message, const char* what);
  // What the loop keeps from round to round, with its storage, so that a round of tensors
  // seen before allocates nothing here (nor in the controller and executor).
  struct RoundState {
    TunedParameters in_force;
    std::vector<std::pair<int, Request>> popped;
    std::map<int, std::vector<Request>> by_set;
    std::vector<int> set_ids;
    bool worked = false;  // the last round took in requests, ran parts, or left work pending
  };
  void Loop();
  // One round, with round_mutex_ held: takes the queue's new requests, negotiates and executes
  // every set. Returns false when the runtime ended in it (shutdown agreed, or a failure).
  bool RunRoundLocked();
  // One round: the queue's new requests by set; every set negotiates and executes (returns
  // whether the global set agreed to shut down, and which ranks asked); requests left for
  // sets removed meanwhile fail.
  void TakeNewRequests(RoundState& state);
  bool RunSets(RoundState& state, std::vector<int>* shutdown_ranks);
  void FailRequestsOfRemovedSets(RoundState& state);
  void StopOnShutdown(const std::vector<int>& shutdown_ranks);
  // Tells the launcher why the loop stopped (see ReportFailureToLauncher), then fails all work
  // (`internal`: a failure, which also closes the connections; else a peer's shutdown).
  void Stop(StatusCode code, const std::string& cause, int origin, const char* kind,
            bool internal);
  int64_t ChangeProcessSets(const Response& response);
  // A new set's NCCL communicator, split from the job's when it has one.
  void SplitNcclCommunicator(int id, const std::vector<int>& ranks);
  // Queues an entry whose handle is `handle` (or completes it at once when the loop stopped).
  int64_t Submit(TensorEntry entry, int64_t handle, bool wake_loop = true);
  void FailEverything(StatusCode code, const std::string& message);

  Config config_;
  int generation_;  // which init() of this process; keys its rendezvous entries
  std::unique_ptr<Link> link_;
  TensorQueue queue_;
  HandleTable handles_;
  std::unique_ptr<Timeline> timeline_;  // before the executors, which record into it
  GpuCompletions gpu_completions_;        // likewise: the executors hand GPU work to it
  ProcessSetTable process_sets_;
  std::unique_ptr<ParameterManager> tuner_;  // rank 0 with HOROVOD_AUTOTUNE only
  std::mutex tuned_mutex_;
  TunedState tuned_;
  std::atomic<bool> shutdown_requested_{false};
  std::atomic<bool> stopped_{false};
  std::mutex stop_mutex_;
  Status stop_status_;  // why the loop stopped; later work fails with it
  std::unique_ptr<Link> p2p_link_;  // point-to-point's own mesh where link_ has no tags
  std::unique_ptr<PointToPoint> p2p_;
  std::mutex close_mutex_;
  // One round at a time, run by the loop or by a waiting caller (WaitDriving); guards the
  // round state and `finished_` (a round ended the runtime: nobody runs another).
  std::mutex round_mutex_;
  RoundState round_state_;
  bool finished_ = false;
  const bool caller_rounds_;  // HOROVOD_CALLER_ROUNDS and an interruptible link
  // When the last round ended, and the cycle time in force (read by the loop between rounds).
  std::atomic<int64_t> last_round_end_ns_{0};
  std::atomic<int64_t> cycle_time_us_{1000};
  std::atomic<int64_t> loop_rounds_{0};
  std::atomic<int64_t> caller_rounds_run_{0};
  // HOROVOD_OVERLAP=0: new requests do not wake the loop, which runs a round only when a
  // caller waits, or kDeferredCycle after the last round.
  const bool deferred_;
  static constexpr std::chrono::microseconds kDeferredCycle{50000};
  // Rounds in a row that took in no request, ran nothing and left no work pending on this rank
  // (RoundState::worked). Past kIdleRoundsAtFullPace of them the loop's cycle doubles with each
  // one, up to kIdleCycleMax (or the cycle in force, if longer): an idle job's loop no longer
  // takes a few percent of every core (a round each millisecond, each a meeting of the ranks),
  // nor wakes up between a training step's collectives to preempt its compute. Work resets it,
  // and a new request wakes the loop at once whatever its cycle; a peer with work waits for
  // this rank's next round only until this rank has the same work, which any collective of
  // the global set needs. Not in a job with process sets: a set's collective also waits for
  // the ranks outside it.
  std::atomic<int> idle_rounds_{0};
  static constexpr int kIdleRoundsAtFullPace = 2;
  static constexpr std::chrono::microseconds kIdleCycleMax{50000};
  // The loop's wait between rounds: the cycle time (kDeferredCycle at least when deferred),
  // stretched while idle (above).
  std::chrono::microseconds LoopCycle() const;
  // With deferred_, the threads in WaitDriving waiting for a handle the rounds have not
  // completed: the loop runs rounds back to back while there is one (see Loop).
  std::atomic<int> waiting_callers_{0};
  // Declared after the queue and the link, which it uses; stopped before them (Close).
  std::unique_ptr<RoundBells> bells_;
  std::thread loop_;
};

}  // namespace horovodlike
