#include "runtime.h"

#include <algorithm>
#include <chrono>
#include <map>

#include "logging.h"
#include "../transport/factory.h"

namespace horovodlike {
namespace {
std::mutex g_mutex;
std::unique_ptr<Runtime> g_runtime;
int g_generation = 0;  // init() count, so a re-init rendezvouses under fresh keys
}  // namespace

void Runtime::Init() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_runtime) return;  // init() twice is harmless, as in Horovod
  Config config = Config::FromEnvironment();
  SetLogLevel(config.log_level, config.rank);
  auto transport = CreateTransport(config, g_generation++);
  g_runtime.reset(new Runtime(std::move(config), std::move(transport)));
}

void Runtime::Shutdown() {
  std::unique_ptr<Runtime> runtime;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    runtime = std::move(g_runtime);
  }
  // The destructor stops and joins the loop outside the lock.
}

bool Runtime::IsInitialized() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_runtime != nullptr;
}

Runtime& Runtime::Get() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_runtime) {
    throw InvalidArgument("horovodlike has not been initialized; call hvd.init() first");
  }
  return *g_runtime;
}

Runtime::Runtime(Config config, std::unique_ptr<Transport> transport)
    : config_(std::move(config)), transport_(std::move(transport)),
      process_sets_(*transport_, config_, queue_, handles_,
                    [this](const Response& r) { return ChangeProcessSets(r); }) {
  loop_ = std::thread([this] { Loop(); });
}

Runtime::~Runtime() {
  shutdown_requested_ = true;
  queue_.Notify();
  if (loop_.joinable()) loop_.join();
  FailEverything(StatusCode::kShutdown, "horovodlike was shut down");
}

int64_t Runtime::Enqueue(EnqueueArgs args) {
  if (args.name.empty()) throw InvalidArgument("a collective needs a non-empty name");
  if (args.name.find_first_of(" \n") != std::string::npos) {
    throw InvalidArgument("tensor name '" + args.name + "' must not contain spaces or newlines");
  }
  for (int64_t d : args.shape) {
    if (d < 0) throw InvalidArgument("tensor '" + args.name + "' has a negative dimension");
  }
  if (args.device >= 0) {
    throw InvalidArgument("tensor '" + args.name + "' is on GPU " + std::to_string(args.device) +
                          ", but this build of horovodlike has no GPU support");
  }
  if (args.dtype == DataType::kBool &&
      (args.reduce_op == ReduceOp::kAverage || args.prescale != 1.0 || args.postscale != 1.0)) {
    if (args.op == OpType::kAllreduce) {
      throw InvalidArgument("tensor '" + args.name +
                            "' is bool: Average and scale factors are not defined for bool; use "
                            "Sum (logical or), Min, Max or Product");
    }
  }
  std::vector<int> members;
  if (!process_sets_.Ranks(args.process_set, &members)) {
    throw InvalidArgument("'" + args.name + "': process set " + std::to_string(args.process_set) +
                          " does not exist (it was never added, or was removed)");
  }
  if (!std::binary_search(members.begin(), members.end(), config_.rank)) {
    throw InvalidArgument("'" + args.name + "': rank " + std::to_string(config_.rank) +
                          " is not in process set " + std::to_string(args.process_set) +
                          " (ranks " + ShapeString(std::vector<int64_t>(members.begin(),
                                                                        members.end())) + ")");
  }
  const int set_size = static_cast<int>(members.size());
  if (args.op == OpType::kBroadcast && (args.root_rank < 0 || args.root_rank >= set_size)) {
    throw InvalidArgument("broadcast of '" + args.name + "': root_rank " +
                          std::to_string(args.root_rank) + " is not a rank of " +
                          (args.process_set == 0 ? std::string("this job")
                                                 : "process set " +
                                                       std::to_string(args.process_set)) +
                          " (size " + std::to_string(set_size) + ")");
  }
  if (args.op == OpType::kAlltoall) {
    if (args.shape.empty()) {
      throw InvalidArgument("alltoall of '" + args.name + "': a scalar cannot be split");
    }
    if (static_cast<int>(args.splits.size()) != set_size) {
      throw InvalidArgument("alltoall of '" + args.name + "': " +
                            std::to_string(args.splits.size()) + " splits for " +
                            std::to_string(set_size) + " ranks");
    }
    int64_t sum = 0;
    for (int64_t s : args.splits) {
      if (s < 0) throw InvalidArgument("alltoall of '" + args.name + "': negative split");
      sum += s;
    }
    if (sum != args.shape[0]) {
      throw InvalidArgument("alltoall of '" + args.name + "': splits " +
                            ShapeString(args.splits) + " add up to " + std::to_string(sum) +
                            ", not to the first dimension " + std::to_string(args.shape[0]));
    }
  }
  if (args.op == OpType::kReducescatter && args.shape.empty()) {
    throw InvalidArgument("reducescatter of '" + args.name +
                          "': a scalar cannot be scattered; give it at least one dimension");
  }
  if ((args.op == OpType::kJoin || args.op == OpType::kAddProcessSet ||
       args.op == OpType::kRemoveProcessSet) && args.process_set != 0) {
    throw InvalidArgument(std::string(OpTypeName(args.op)) + " runs on the global process set");
  }
  if (args.op == OpType::kAllgather && args.shape.empty()) {
    throw InvalidArgument("allgather of '" + args.name +
                          "': a scalar cannot be gathered; give it at least one dimension");
  }

  int64_t handle = handles_.Create();
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
  entry.handle = handles_.Get(handle);
  {
    std::lock_guard<std::mutex> lock(stop_mutex_);
    if (stopped_) {
      handles_.Complete(entry.handle, stop_status_);
      return handle;
    }
    try {
      queue_.Add(std::move(entry));
    } catch (...) {
      handles_.Release(handle);
      throw;
    }
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
}

std::vector<int> Runtime::ProcessSetRanks(int id) {
  std::vector<int> ranks;
  if (!process_sets_.Ranks(id, &ranks)) {
    throw InvalidArgument("process set " + std::to_string(id) + " does not exist");
  }
  return ranks;
}

int64_t Runtime::ChangeProcessSets(const Response& response) {
  std::vector<int> ranks(response.first_dims.begin(), response.first_dims.end());
  if (response.type == Response::Type::kAddProcessSet) return process_sets_.Add(ranks);
  const int id = ranks.empty() ? -1 : ranks[0];
  process_sets_.Remove(id);
  return id;
}

void Runtime::Loop() {
  const auto cycle = std::chrono::microseconds(static_cast<int64_t>(config_.cycle_time_ms * 1000));
  std::map<int, std::vector<Request>> by_set;
  try {
    while (true) {
      queue_.WaitForWork(cycle);
      for (auto& [set_id, request] : queue_.PopNewRequests()) {
        by_set[set_id].push_back(std::move(request));
      }
      bool shutdown = false;
      // Every rank visits its sets in the same (id) order, so each set's members negotiate
      // and execute in step; sets added this round are visited from the next one.
      for (int id : process_sets_.MemberIds()) {
        ProcessSet* set = process_sets_.Member(id);
        if (set == nullptr) continue;  // removed earlier in this round
        auto round = set->controller->Negotiate(std::move(by_set[id]),
                                                id == 0 && shutdown_requested_.load());
        by_set.erase(id);
        for (const Response& response : round.responses) set->executor->Execute(response);
        if (id == 0) shutdown = round.shutdown;
      }
      for (auto& [id, requests] : by_set) {
        // Requests for a set removed while they were queued.
        for (const Request& request : requests) {
          TensorEntry entry;
          if (queue_.Take(QueueKey(id, request.name), &entry)) {
            handles_.Complete(entry.handle, Status::Error(StatusCode::kInvalidArgument,
                                                          "process set " + std::to_string(id) +
                                                              " was removed"));
          }
        }
      }
      by_set.clear();
      if (shutdown) {
        FailEverything(StatusCode::kShutdown,
                       "horovodlike was shut down on one of the ranks before this operation "
                       "completed");
        return;
      }
    }
  } catch (const std::exception& e) {
    HVDL_LOG(kError, "stopping: " << e.what());
    transport_->abort();
    FailEverything(StatusCode::kInternal,
                   std::string("horovodlike stopped on rank ") + std::to_string(config_.rank) +
                       ": " + e.what() + ". Call shutdown() and init() to start again.");
  }
}

}  // namespace horovodlike
