#include "runtime.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>

#include "enqueue_checks.h"
#include "../cuda/device_context.h"
#include "../common/logging.h"
#include "../collectives/adasum_allreduce.h"
#include "../links/connect.h"
#include "../links/per_peer_link.h"
#include "../links/rendezvous_client.h"
#include "../links/tcp/tcp_link.h"
#ifdef HOROVODLIKE_MPI_FOUND
#include "../links/mpi/tcp_mesh_over_mpi.h"
#endif

namespace horovodlike {
namespace {
// Guards the three below; never held while connecting or stopping, so that calls from other
// threads (rank(), is_initialized(), ...) answer at once meanwhile.
std::mutex g_mutex;
std::condition_variable g_init_done;
bool g_initializing = false;  // an init() is connecting; a second one waits for it
std::shared_ptr<Runtime> g_runtime;
int g_generation = 0;  // init() count, so a re-init rendezvouses under fresh keys

const char* FailureKind(TransportError::Cause cause) {
  switch (cause) {
    case TransportError::Cause::kPeerLost: return "lost";
    case TransportError::Cause::kPeerTimeout: return "timeout";
    case TransportError::Cause::kStall: return "stall";
    case TransportError::Cause::kInterrupted: return "interrupted";
    case TransportError::Cause::kOther: break;
  }
  return "error";
}

// Point-to-point rides the job's link, its tagged messages (point_to_point.h). A link without
// them (MPI without MPI_THREAD_MULTIPLE) has point-to-point get a TCP mesh of its own, which may
// then stay idle for as long as a pipeline waits: silence is never a failure there, and a peer
// that dies still fails it. Returns that mesh, or null (*unavailable then says why when the job
// cannot have point-to-point at all).
std::unique_ptr<Link> ConnectPointToPointLink(const Config& config, int generation, Link& link,
                                              std::string* unavailable) {
  if (config.size == 1 || link.tagged()) return nullptr;
  constexpr double kPointToPointIdleSeconds = 1e9;  // for ever, in effect
  const bool has_rendezvous = !config.rendezvous_addr.empty() && config.rendezvous_port > 0;
  try {
    if (has_rendezvous) {
      // Set up under the peer timeout; idle for ever afterwards.
      std::unique_ptr<TcpLink> tcp = TcpLink::Connect(config, generation, "p2p");
      tcp->set_timeout_seconds(kPointToPointIdleSeconds);
      return tcp;
    }
#ifdef HOROVODLIKE_MPI_FOUND
    if (link.mpi() != nullptr) {  // mpirun started the job: addresses travel over MPI
      Config mesh_config = config;
      mesh_config.peer_timeout_seconds = kPointToPointIdleSeconds;
      return ConnectTcpMeshOverMpi(mesh_config, generation);
    }
#endif
  } catch (const TransportError& e) {
    ReportFailureToLauncher(config, generation, {e.peer(), FailureKind(e.cause()), e.what()});
    throw;
  }
  *unavailable = "point-to-point needs the launcher's rendezvous server, or MPI in a job that "
                 "mpirun started, and this job has neither; start it with horovodlikerun";
  return nullptr;
}

}  // namespace

void Runtime::Init() {
  int generation = 0;
  Config config;
  {
    std::unique_lock<std::mutex> lock(g_mutex);
    g_init_done.wait(lock, [] { return !g_initializing; });
    if (g_runtime) return;  // init() twice is harmless, as in Horovod
    config = Config::FromEnvironment();
    // Elastic workers join rounds formed by the driver: the round names the rendezvous keys,
    // so a worker started late meets the others under the same keys.
    generation = config.elastic_round >= 0 ? config.elastic_round : g_generation++;
    g_initializing = true;
  }
  // Whatever happens below, the next init() may go ahead.
  struct InitDone {
    ~InitDone() {
      {
        std::lock_guard<std::mutex> lock(g_mutex);
        g_initializing = false;
      }
      g_init_done.notify_all();
    }
  } done;
  SetLogLevel(config.log_level, config.rank);
  // Rank 0 decides the tuned parameters; a log file it cannot write fails init before any
  // connection is made.
  std::unique_ptr<ParameterManager> tuner;
  if (config.autotune && config.rank == 0) {
    TunedParameters initial;
    initial.fusion_threshold_bytes = config.fusion_threshold_bytes;
    initial.cycle_time_ms = config.cycle_time_ms;
    initial.cache_enabled = config.cache_capacity > 0;
    tuner = std::make_unique<ParameterManager>(config, initial);
  }
  // Likewise a timeline file that cannot be written.
  auto timeline = std::make_unique<Timeline>();
  if (config.rank == 0 && !config.timeline_path.empty()) {
    try {
      timeline->Start(config.timeline_path, config.timeline_mark_cycles);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(std::string("HOROVOD_TIMELINE: ") + e.what());
    }
  }
  std::unique_ptr<Link> link;
  try {
    link = ConnectLink(config, generation);
  } catch (const TransportError& e) {
    // A peer that died or vanished during set-up: tell the launcher which one it was.
    ReportFailureToLauncher(config, generation, {e.peer(), FailureKind(e.cause()), e.what()});
    throw;
  }
  std::string p2p_unavailable;
  std::unique_ptr<Link> p2p_link = ConnectPointToPointLink(config, generation, *link,
                                                           &p2p_unavailable);
  std::shared_ptr<Runtime> runtime(new Runtime(std::move(config), std::move(link),
                                               generation, std::move(tuner), std::move(timeline),
                                               std::move(p2p_link), std::move(p2p_unavailable)));
  std::lock_guard<std::mutex> lock(g_mutex);
  g_runtime = std::move(runtime);
}

void Runtime::Shutdown() {
  std::shared_ptr<Runtime> runtime;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    runtime = std::move(g_runtime);
  }
  // Outside the lock: stopping waits for the loop. A caller still holding the runtime keeps
  // the object (its calls fail with the shutdown status) until it lets go.
  if (runtime) runtime->Close();
}

bool Runtime::IsInitialized() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_runtime != nullptr;
}

std::shared_ptr<Runtime> Runtime::Get() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_runtime) {
    throw InvalidArgument("horovodlike has not been initialized; call hvd.init() first");
  }
  return g_runtime;
}

Runtime::Runtime(Config config, std::unique_ptr<Link> link, int generation,
                 std::unique_ptr<ParameterManager> tuner, std::unique_ptr<Timeline> timeline,
                 std::unique_ptr<Link> p2p_link, std::string p2p_unavailable)
    : config_(std::move(config)), generation_(generation), link_(std::move(link)),
      timeline_(std::move(timeline)),
      gpu_completions_(handles_, [this] { queue_.Notify(); }),
      process_sets_(*link_, config_, queue_, handles_, *timeline_,
                    [this](const Response& r) { return ChangeProcessSets(r); },
                    &gpu_completions_), tuner_(std::move(tuner)),
      p2p_link_(std::move(p2p_link)),
      p2p_(std::make_unique<PointToPoint>(config_.rank, config_.size, TaggedLink(), handles_,
                                          std::move(p2p_unavailable))),
      caller_rounds_(config_.caller_rounds && link_->interruptible()),
      deferred_(!config_.overlap) {
  tuned_.parameters = process_sets_.Member(0)->controller->parameters();
  tuned_.parameters.tuning = config_.autotune;  // until rank 0's first round says otherwise
  round_state_.in_force = tuned_.parameters;
  cycle_time_us_ = static_cast<int64_t>(round_state_.in_force.cycle_time_ms * 1000);
  bells_ = std::make_unique<RoundBells>(*link_, config_, queue_);  // collective
  loop_ = std::thread([this] { Loop(); });
  // Named for top, gdb and py-spy (and tests that look at this thread alone).
  pthread_setname_np(loop_.native_handle(), "hvdl-loop");
}

Runtime::~Runtime() { Close(); }

void Runtime::Close() {
  std::lock_guard<std::mutex> lock(close_mutex_);
  shutdown_requested_ = true;
  bells_->Stop();
  queue_.Notify();
  if (loop_.joinable()) loop_.join();
  gpu_completions_.WaitIdle(10.0);  // GPU work already queued finishes; then the rest fails
  timeline_->Stop();
  // Point-to-point waits are not in the queue: they fail here, not when the object goes.
  p2p_->Abort(Status::Error(StatusCode::kShutdown, "horovodlike was shut down"));
  FailEverything(StatusCode::kShutdown, "horovodlike was shut down");
}

int64_t Runtime::Enqueue(EnqueueArgs args) {
  if (IsControlOp(args.op)) {
    throw InvalidArgument(std::string(OpTypeName(args.op)) +
                          " is a control operation, not a collective over a tensor");
  }
  CheckTensorArgs(args);
  thread_local std::vector<int> members;  // keeps its storage from call to call
  if (!process_sets_.Ranks(args.process_set, &members)) {
    throw InvalidArgument("'" + args.name + "': process set " + std::to_string(args.process_set) +
                          " does not exist (it was never added, or was removed)");
  }
  CheckSetArgs(args, members, config_.rank);

  TensorEntry entry;
  entry.request.rank = config_.rank;
  entry.request.op = args.op;
  entry.request.name = std::move(args.name);
  entry.request.dtype = args.dtype;
  entry.request.shape = std::move(args.shape);
  entry.request.reduce_op = args.reduce_op;
  entry.request.prescale = args.prescale;
  entry.request.postscale = args.postscale;
  entry.request.root_rank = args.root_rank;
  entry.request.device = args.device;
  entry.request.splits = std::move(args.splits);
  entry.request.group_id = args.group_id;
  entry.request.group_size = args.group_size;
  entry.process_set_id = args.process_set;
  entry.input = args.input;
  entry.output = args.output;
  if (args.device >= 0) {
    // The point in the caller's stream at which the input is ready: the core's stream waits
    // for it before touching the tensor (never a host-side synchronize here).
    entry.stream = args.stream;
    entry.ready_event = DeviceContext::For(args.device).RecordOn(args.stream);
  }
  // A caller that waits runs its own rounds where it can; asynchronous work wakes the loop,
  // unless it is deferred until someone waits for it.
  const bool wake_loop = args.caller_waits ? !caller_rounds_ : !deferred_;
  return Submit(std::move(entry), handles_.Create(), wake_loop);
}

int64_t Runtime::EnqueueControl(OpType op, std::string name, ControlRequest control) {
  if (!IsControlOp(op)) {
    throw InvalidArgument(std::string(OpTypeName(op)) + " is a collective, not a control "
                          "operation");
  }
  if (name.empty()) throw InvalidArgument(std::string(OpTypeName(op)) + " needs a name");
  CheckNameLength(name, std::string(OpTypeName(op)) + " name");
  // Checked here, on the caller's rank, as well as where every rank applies the change: a
  // negative rank cannot even be sent (the decoder refuses it).
  if (op == OpType::kAddProcessSet) CheckProcessSetRanks(control.ranks, config_.size);
  TensorEntry entry;
  entry.request.rank = config_.rank;
  entry.request.op = op;
  entry.request.name = std::move(name);
  entry.request.control = std::move(control);
  entry.process_set_id = 0;  // control operations run on the global set
  return Submit(std::move(entry), handles_.Create());
}

int64_t Runtime::Submit(TensorEntry entry, int64_t handle, bool wake_loop) {
  entry.handle = handles_.Get(handle);
  std::lock_guard<std::mutex> lock(stop_mutex_);
  if (stopped_) {
    handles_.Complete(entry.handle, stop_status_);
    return handle;
  }
  try {
    queue_.Add(std::move(entry), wake_loop);
  } catch (...) {
    handles_.Release(handle);
    throw;
  }
  return handle;
}

void Runtime::FailEverything(StatusCode code, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(stop_mutex_);
    if (!stopped_) {
      stopped_ = true;
      stop_status_ = Status::Error(code, message);
    }
  }
  for (TensorEntry& entry : queue_.TakeAll()) handles_.Complete(entry.handle, stop_status_);
  gpu_completions_.Fail(stop_status_);
}

void Runtime::CheckPointToPoint(const PointToPoint::Message& message, const char* what) {
  std::vector<int> members;
  if (!process_sets_.Ranks(message.set_id, &members)) {
    throw InvalidArgument(std::string(what) + ": process set " + std::to_string(message.set_id) +
                          " does not exist (it was never added, or was removed)");
  }
  auto in_set = [&](int rank) {
    return std::binary_search(members.begin(), members.end(), rank);
  };
  for (int rank : {config_.rank, message.peer}) {
    if (message.set_id != 0 && !in_set(rank)) {
      throw InvalidArgument(std::string(what) + " on rank " + std::to_string(config_.rank) +
                            ": rank " + std::to_string(rank) + " is not in process set " +
                            std::to_string(message.set_id) + " (ranks " +
                            ShapeString(std::vector<int64_t>(members.begin(), members.end())) +
                            ")");
    }
  }
}

int64_t Runtime::Send(const PointToPoint::Message& message, const void* data) {
  CheckPointToPoint(message, "send");
  return p2p_->Send(message, data);
}

int64_t Runtime::Recv(const PointToPoint::Message& message, void* data) {
  CheckPointToPoint(message, "recv");
  return p2p_->Recv(message, data);
}

void Runtime::NotifyPointToPointFailure(int set_id, const std::string& reason) {
  std::vector<int> members;
  if (process_sets_.Ranks(set_id, &members)) p2p_->NotifyFailure(set_id, members, reason);
}

void Runtime::SplitNcclCommunicator(int id, const std::vector<int>& ranks) {
  // Every rank runs this response at the same point, members or not: when the job's set
  // already has an NCCL communicator, the new set's is split from it (ncclCommSplit, cheaper
  // than a new one); otherwise the set makes its own at its first GPU collective.
  const DeviceCollectives* global = process_sets_.Member(0)->executor->device();
  if (global == nullptr || !global->nccl() || !Nccl().has_split) return;
  std::vector<int> sorted(ranks);
  std::sort(sorted.begin(), sorted.end());
  const auto it = std::lower_bound(sorted.begin(), sorted.end(), config_.rank);
  const bool member = it != sorted.end() && *it == config_.rank;
  std::shared_ptr<NcclCollectives> nccl = NcclCollectives::Split(
      *global->nccl(), member, config_.rank, static_cast<int>(it - sorted.begin()),
      static_cast<int>(sorted.size()));
  if (member) process_sets_.Member(id)->executor->AdoptNccl(std::move(nccl));
}

std::string Runtime::DeviceMode(int id) {
  ProcessSet* set = process_sets_.Member(id);
  if (set == nullptr || set->executor->device() == nullptr) return "";
  return set->executor->device()->mode();
}

std::vector<int> Runtime::ProcessSetRanks(int id) {
  std::vector<int> ranks;
  if (!process_sets_.Ranks(id, &ranks)) {
    throw InvalidArgument("process set " + std::to_string(id) + " does not exist");
  }
  return ranks;
}

int64_t Runtime::ChangeProcessSets(const Response& response) {
  if (response.type == Response::Type::kAddProcessSet) {
    const std::vector<int> ranks(response.control.ranks.begin(), response.control.ranks.end());
    const int id = process_sets_.Add(ranks);
    SplitNcclCommunicator(id, ranks);
    return id;
  }
  process_sets_.Remove(response.control.process_set_id);
  return response.control.process_set_id;
}

void Runtime::StartTimeline(const std::string& path, bool mark_cycles) {
  if (config_.rank != 0) return;
  timeline_->Start(path, mark_cycles);
}

Runtime::TunedState Runtime::tuned() {
  std::lock_guard<std::mutex> lock(tuned_mutex_);
  return tuned_;
}

bool Runtime::RunRoundLocked() {
  RoundState& state = round_state_;
  try {
    if (gpu_completions_.failed()) throw TransportError(gpu_completions_.failure());
    const RoundBells::Round in_round(*bells_);
    TakeNewRequests(state);
    if (!state.popped.empty()) bells_->TookWork();
    std::vector<int> shutdown_ranks;
    state.worked = !state.popped.empty();
    const bool shutdown = RunSets(state, &shutdown_ranks);
    // Only in a job without process sets: any collective of the global set brings every rank
    // by itself, but one of a process set needs the ranks outside it in a round too, including
    // ranks in no set but the global one (a round bell wakes them, but it may come late).
    const bool may_slow = process_sets_.Count() <= 1;
    idle_rounds_.store(state.worked || !may_slow ? 0
                                                 : std::min(idle_rounds_.load() + 1, 1 << 20));
    FailRequestsOfRemovedSets(state);
    cycle_time_us_ = static_cast<int64_t>(state.in_force.cycle_time_ms * 1000);
    last_round_end_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::steady_clock::now().time_since_epoch()).count();
    if (shutdown) {
      StopOnShutdown(shutdown_ranks);
      finished_ = true;
    }
  } catch (const TransportError& e) {
    HVDL_LOG(kError, "stopping: " << e.what());
    Stop(StatusCode::kInternal, e.what(), e.peer(), FailureKind(e.cause()), true);
    finished_ = true;
  } catch (const std::exception& e) {
    HVDL_LOG(kError, "stopping: " << e.what());
    Stop(StatusCode::kInternal, e.what(), config_.rank, "error", true);
    finished_ = true;
  }
  if (finished_) queue_.Notify();  // the loop ends too, if a caller ran this round
  return !finished_;
}

void Runtime::FailRequestsOfRemovedSets(RoundState& state) {
  for (auto it = state.by_set.begin(); it != state.by_set.end();) {
    if (it->second.empty()) {
      ++it;
      continue;
    }
    // Requests for a set removed while they were queued.
    for (const Request& request : it->second) {
      TensorEntry entry;
      if (queue_.Take(QueueKey(it->first, request.name), &entry)) {
        handles_.Complete(entry.handle,
                          Status::Error(StatusCode::kInvalidArgument,
                                        "process set " + std::to_string(it->first) +
                                            " was removed"));
      }
    }
    it = state.by_set.erase(it);
  }
}

void Runtime::StopOnShutdown(const std::vector<int>& shutdown_ranks) {
  std::vector<int> others;
  for (int r : shutdown_ranks) {
    if (r != config_.rank) others.push_back(r);
  }
  if (others.empty() || shutdown_requested_) {
    FailEverything(StatusCode::kShutdown,
                   "horovodlike was shut down before this operation completed");
    return;
  }
  std::string list;
  for (size_t i = 0; i < others.size(); ++i) list += (i ? ", " : "") + std::to_string(others[i]);
  const std::string who = (others.size() == 1 ? "rank " : "ranks ") + list;
  // This rank did not ask to stop: the others did, so its failure is theirs.
  Stop(StatusCode::kShutdown,
       "horovodlike was shut down on " + who + " before this operation completed (" + who +
           " called shutdown() or " + (others.size() == 1 ? "is" : "are") + " exiting)",
       others[0], "shutdown", false);
}

void Runtime::Stop(StatusCode code, const std::string& cause, int origin, const char* kind,
                   bool internal) {
  // First the report, then the connections close, then the handles complete: a peer that loses
  // its connection to this rank finds the report already there (and names the rank this one
  // failed because of), and so does the launcher once this process exits.
  FailureReport report = ReportFailureToLauncher(config_, generation_, {origin, kind, cause});
  if (!internal) {
    FailEverything(code, report.reason);
    return;
  }
  link_->abort();
  const std::string message = "horovodlike stopped on rank " + std::to_string(config_.rank) +
                              ": " + report.reason + ". Call shutdown() and init() to start again.";
  p2p_->Abort(Status::Error(code, message));
  FailEverything(code, message);
}

}  // namespace horovodlike
