#include "runtime.h"

#include <chrono>

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
      controller_(*transport_, config_), executor_(*transport_, queue_, handles_) {
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
  if (args.op == OpType::kBroadcast && (args.root_rank < 0 || args.root_rank >= config_.size)) {
    throw InvalidArgument("broadcast of '" + args.name + "': root_rank " +
                          std::to_string(args.root_rank) + " is not a rank of this job (size " +
                          std::to_string(config_.size) + ")");
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

void Runtime::Loop() {
  const auto cycle = std::chrono::microseconds(static_cast<int64_t>(config_.cycle_time_ms * 1000));
  try {
    while (true) {
      queue_.WaitForWork(cycle);
      auto round = controller_.Negotiate(queue_.PopNewRequests(), shutdown_requested_.load());
      for (const Response& response : round.responses) executor_.Execute(response);
      if (round.shutdown) {
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
