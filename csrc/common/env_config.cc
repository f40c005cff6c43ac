#include "env_config.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <string>

#include "backend_names.h"
#include "common.h"

namespace horovodlike {
namespace {

const char* Get(const char* name) {
  const char* value = std::getenv(name);
  return (value != nullptr && value[0] != '\0') ? value : nullptr;
}

int64_t GetInt(const char* name, int64_t fallback) {
  const char* value = Get(name);
  if (value == nullptr) return fallback;
  char* end = nullptr;
  long long parsed = std::strtoll(value, &end, 10);
  if (*end != '\0') {
    throw InvalidArgument(std::string(name) + "='" + value + "' is not an integer");
  }
  return parsed;
}

double GetDouble(const char* name, double fallback) {
  const char* value = Get(name);
  if (value == nullptr) return fallback;
  char* end = nullptr;
  double parsed = std::strtod(value, &end);
  if (*end != '\0') {
    throw InvalidArgument(std::string(name) + "='" + value + "' is not a number");
  }
  return parsed;
}

bool GetBool(const char* name, bool fallback) {
  const char* value = Get(name);
  if (value == nullptr) return fallback;
  std::string v(value);
  return !(v == "0" || v == "false" || v == "False" || v == "FALSE");
}

int ParseLogLevel(const char* value) {
  if (value == nullptr) return 3;
  std::string v(value);
  for (auto& c : v) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const char* names[] = {"TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"};
  for (int i = 0; i < 6; ++i) {
    if (v == names[i]) return i;
  }
  throw InvalidArgument(std::string("HOROVOD_LOG_LEVEL='") + value +
                        "' is not one of TRACE, DEBUG, INFO, WARNING, ERROR, FATAL");
}

// Read whether or not tuning is on, so that a mistyped value is reported before it matters.
void ReadAutotune(Config& c) {
  c.fusion_threshold_given = Get("HOROVOD_FUSION_THRESHOLD") != nullptr;
  c.cycle_time_given = Get("HOROVOD_CYCLE_TIME") != nullptr;
  c.cache_capacity_given = Get("HOROVOD_CACHE_CAPACITY") != nullptr;
  c.autotune = GetBool("HOROVOD_AUTOTUNE", false);
  if (const char* log = Get("HOROVOD_AUTOTUNE_LOG")) c.autotune_log = log;
  auto count = [](const char* name, int64_t fallback, int64_t least) {
    const int64_t v = GetInt(name, fallback);
    if (v < least || v > 1000000) {
      throw InvalidArgument(std::string(name) + "=" + std::to_string(v) + " must be between " +
                            std::to_string(least) + " and 1000000");
    }
    return static_cast<int>(v);
  };
  c.autotune_warmup_samples = count("HOROVOD_AUTOTUNE_WARMUP_SAMPLES", 3, 0);
  c.autotune_steps_per_sample = count("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", 10, 1);
  c.autotune_max_samples = count("HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", 20, 1);
  c.autotune_noise = GetDouble("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", 0.8);
  if (!(c.autotune_noise >= 0) || c.autotune_noise == HUGE_VAL) {
    throw InvalidArgument("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE must be a finite number >= 0");
  }
}

size_t GetBytes(const char* name, size_t fallback, size_t lo, size_t hi) {
  const char* value = Get(name);
  if (value == nullptr) return fallback;
  char* end = nullptr;
  unsigned long long parsed = std::strtoull(value, &end, 10);
  if (*end != '\0' || value[0] == '-' || parsed < lo || parsed > hi) {
    throw InvalidArgument(std::string(name) + "='" + value + "' must be a number from " +
                          std::to_string(lo) + " to " + std::to_string(hi));
  }
  return static_cast<size_t>(parsed);
}

// A backend name, lower case; empty when unset.
std::string GetBackend(const char* name) {
  const char* value = Get(name);
  std::string v = value != nullptr ? value : "";
  for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (v == "ccl") {
    throw InvalidArgument(std::string(name) + "=ccl: horovodlike has no oneCCL support; use "
                          "mpi, gloo or tcp");
  }
  Backend backend;
  if (!v.empty() && !ParseBackend(v, &backend)) {
    throw InvalidArgument(std::string(name) + "='" + (value != nullptr ? value : "") +
                          "' is not one of " + BackendNames());
  }
  return v;
}

std::string GetGpuOperations() {
  const char* value = Get("HOROVOD_GPU_OPERATIONS");
  std::string v = value != nullptr ? value : "";
  for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (!(v.empty() || v == kGpuNccl || AsksForStaging(v))) {
    throw InvalidArgument("HOROVOD_GPU_OPERATIONS='" + std::string(value) + "' is not one of " +
                          kGpuNccl + ", " + kGpuStaged + " (GPU tensors through host memory), " +
                          NameOf(Backend::kMpi) + ", " + NameOf(Backend::kGloo));
  }
  return v;
}

void ReadLinkSettings(Config& c) {
  c.cpu_operations = GetBackend("HOROVOD_CPU_OPERATIONS");
  c.gpu_operations = GetGpuOperations();
  c.controller = GetBackend("HOROVOD_CONTROLLER");
  c.shm_disabled = GetBool("HOROVOD_SHM_DISABLE", false);
  if (const char* host = Get("HOROVOD_HOSTNAME")) c.launcher_hostname = host;
  c.shm_channel_bytes = GetBytes("HOROVOD_SHM_CHANNEL_BYTES", c.shm_channel_bytes, 4096,
                                 size_t{1} << 30);
  c.shm_chunk_bytes = GetBytes("HOROVOD_SHM_CHUNK_BYTES", c.shm_chunk_bytes, 4096,
                               size_t{1} << 30);
  c.shm_small_bytes = GetBytes("HOROVOD_SHM_SMALL_BYTES", c.shm_small_bytes, 0, size_t{1} << 30);
  c.shm_spin_given = Get("HOROVOD_SHM_SPIN_US") != nullptr;
  c.shm_spin_us = static_cast<int64_t>(GetBytes("HOROVOD_SHM_SPIN_US",
                                                static_cast<size_t>(c.shm_spin_us), 0, 1000000));
  c.shm_yield_us = static_cast<int64_t>(GetBytes("HOROVOD_SHM_YIELD_US",
                                                 static_cast<size_t>(c.shm_yield_us), 0, 1000000));
  c.mpi_threads_disabled = GetBool("HOROVOD_MPI_THREADS_DISABLE", false);
  if (const char* stores = Get("HOROVOD_SHM_STREAM_STORES")) {
    const std::string value = stores;
    if (value != "auto" && value != "on" && value != "off") {
      throw InvalidArgument("HOROVOD_SHM_STREAM_STORES='" + value + "': use auto (the "
                            "default), on or off");
    }
    c.shm_stream_stores = value;
  }
  if (const char* bell = Get("HOROVOD_ROUND_BELL")) {
    const std::string value = bell;
    if (value != "auto" && value != "off" && value != "host" && value != "all") {
      throw InvalidArgument("HOROVOD_ROUND_BELL='" + value + "': use auto (the default), off, "
                            "host or all");
    }
    c.round_bell = value;
  }
}

}  // namespace

std::string CpuOperationsFromEnvironment() { return GetBackend("HOROVOD_CPU_OPERATIONS"); }

std::string GpuLibraryPathFromEnvironment(const char* variable) {
  const char* value = Get(variable);
  return value != nullptr ? value : "";
}

std::string LogFdFromEnvironment() {
  const char* value = Get("HOROVODLIKE_STDERR_FD");
  return value != nullptr ? value : "";
}

bool LogTimestampFromEnvironment() {
  const char* value = Get("HOROVOD_LOG_HIDE_TIME");
  return value != nullptr && std::string(value) == "0";
}

Config Config::FromEnvironment() {
  Config c;
  c.rank = static_cast<int>(GetInt("HOROVOD_RANK", 0));
  c.size = static_cast<int>(GetInt("HOROVOD_SIZE", 1));
  c.local_rank = static_cast<int>(GetInt("HOROVOD_LOCAL_RANK", c.rank));
  c.local_size = static_cast<int>(GetInt("HOROVOD_LOCAL_SIZE", c.size));
  c.cross_rank = static_cast<int>(GetInt("HOROVOD_CROSS_RANK", 0));
  c.cross_size = static_cast<int>(GetInt("HOROVOD_CROSS_SIZE", 1));
  c.launched_by_mpirun = Get("OMPI_COMM_WORLD_RANK") != nullptr &&
                         Get("OMPI_COMM_WORLD_SIZE") != nullptr;
  if (c.launched_by_mpirun && Get("HOROVOD_RANK") == nullptr) {
    c.rank = static_cast<int>(GetInt("OMPI_COMM_WORLD_RANK", 0));
    c.size = static_cast<int>(GetInt("OMPI_COMM_WORLD_SIZE", 1));
    c.local_rank = static_cast<int>(GetInt("OMPI_COMM_WORLD_LOCAL_RANK", c.rank));
    c.local_size = static_cast<int>(GetInt("OMPI_COMM_WORLD_LOCAL_SIZE", c.size));
    // Open MPI names no host index. Exact on one host; on several, an estimate that assumes
    // equal hosts filled in rank order (--map-by slot). The MPI transport replaces both with
    // what MPI reports.
    const int hosts = static_cast<int>(GetInt("OMPI_MCA_orte_num_nodes", 1));
    c.cross_size = hosts > 1 ? hosts : 1;
    c.cross_rank = hosts > 1 ? c.rank / c.local_size : 0;
  }
  if (c.size < 1 || c.rank < 0 || c.rank >= c.size) {
    throw InvalidArgument("HOROVOD_RANK=" + std::to_string(c.rank) + " and HOROVOD_SIZE=" +
                          std::to_string(c.size) + " do not describe a rank of the job");
  }
  if (const char* addr = Get("HOROVOD_RENDEZVOUS_ADDR")) c.rendezvous_addr = addr;
  c.rendezvous_port = static_cast<int>(GetInt("HOROVOD_RENDEZVOUS_PORT", 0));
  if (const char* key = Get("HOROVOD_SECRET_KEY")) c.secret_key = key;
  if (const char* iface = Get("HOROVOD_GLOO_IFACE")) c.network_interface = iface;
  c.start_timeout_seconds = GetDouble("HOROVOD_START_TIMEOUT", c.start_timeout_seconds);
  c.elastic_round = static_cast<int>(GetInt("HOROVOD_ELASTIC_ROUND", -1));

  c.fusion_threshold_bytes = GetInt("HOROVOD_FUSION_THRESHOLD", c.fusion_threshold_bytes);
  if (c.fusion_threshold_bytes < 0) throw InvalidArgument("HOROVOD_FUSION_THRESHOLD must be >= 0");
  c.cycle_time_ms = GetDouble("HOROVOD_CYCLE_TIME", c.cycle_time_ms);
  c.caller_rounds = GetBool("HOROVOD_CALLER_ROUNDS", c.caller_rounds);
  c.overlap = GetBool("HOROVOD_OVERLAP", c.overlap);
  c.early_staging = GetBool("HOROVOD_EARLY_STAGING", c.early_staging);
  if (c.cycle_time_ms < 0) throw InvalidArgument("HOROVOD_CYCLE_TIME must be >= 0");
  c.cache_capacity = static_cast<int>(GetInt("HOROVOD_CACHE_CAPACITY", c.cache_capacity));
  if (c.cache_capacity < 0) throw InvalidArgument("HOROVOD_CACHE_CAPACITY must be >= 0");
  c.stall_check_enabled = !GetBool("HOROVOD_STALL_CHECK_DISABLE", false);
  c.stall_warning_seconds =
      GetDouble("HOROVOD_STALL_CHECK_TIME_SECONDS", c.stall_warning_seconds);
  if (!(c.stall_warning_seconds > 0)) {
    throw InvalidArgument("HOROVOD_STALL_CHECK_TIME_SECONDS must be a positive number of seconds");
  }
  c.stall_shutdown_seconds =
      GetDouble("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", c.stall_shutdown_seconds);
  if (!(c.stall_shutdown_seconds >= 0)) {
    throw InvalidArgument("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS must be >= 0 (0: never)");
  }
  c.peer_timeout_seconds = GetDouble("HOROVOD_PEER_TIMEOUT_SECONDS", c.peer_timeout_seconds);
  if (!(c.peer_timeout_seconds > 0)) {
    throw InvalidArgument("HOROVOD_PEER_TIMEOUT_SECONDS must be a positive number of seconds");
  }
  c.gloo_timeout_seconds = GetDouble("HOROVOD_GLOO_TIMEOUT_SECONDS", c.peer_timeout_seconds);
  if (!(c.gloo_timeout_seconds > 0)) {
    throw InvalidArgument("HOROVOD_GLOO_TIMEOUT_SECONDS must be a positive number of seconds");
  }
  c.log_level = ParseLogLevel(Get("HOROVOD_LOG_LEVEL"));
  ReadLinkSettings(c);
  ReadAutotune(c);
  c.hierarchical_allreduce = GetBool("HOROVOD_HIERARCHICAL_ALLREDUCE", false);
  c.hierarchical_allgather = GetBool("HOROVOD_HIERARCHICAL_ALLGATHER", false);
  if (const char* timeline = Get("HOROVOD_TIMELINE")) c.timeline_path = timeline;
  c.timeline_mark_cycles = GetBool("HOROVOD_TIMELINE_MARK_CYCLES", false);
  if (c.timeline_mark_cycles && c.timeline_path.empty()) {
    // Harmless, but most likely a forgotten HOROVOD_TIMELINE: say so rather than do nothing.
    throw InvalidArgument("HOROVOD_TIMELINE_MARK_CYCLES is set but HOROVOD_TIMELINE is not; "
                          "set HOROVOD_TIMELINE to the trace file to write");
  }
  return c;
}

}  // namespace horovodlike
