// Runtime settings, read once per init() from Horovod's environment variable names.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace horovodlike {

struct Config {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  int cross_rank = 0;
  int cross_size = 1;
  // Started by mpirun (Open MPI's OMPI_COMM_WORLD_* variables are set): the MPI transport is
  // the default, and without HOROVOD_RANK the rank and size come from Open MPI.
  bool launched_by_mpirun = false;

  std::string rendezvous_addr;  // empty: no launcher (single process)
  int rendezvous_port = 0;
  std::string secret_key;
  std::string network_interface;  // HOROVOD_GLOO_IFACE
  double start_timeout_seconds = 30.0;
  int elastic_round = -1;  // HOROVOD_ELASTIC_ROUND: rendezvous generation set by the driver

  int64_t fusion_threshold_bytes = 128LL * 1024 * 1024;
  double cycle_time_ms = 1.0;
  // HOROVOD_CALLER_ROUNDS (default 1): a thread waiting for its operation runs the negotiation
  // rounds itself instead of handing them to the background loop and being woken by it
  // (core/runtime.h, Runtime::WaitDriving); 0 leaves every round to the loop.
  bool caller_rounds = true;
  // HOROVOD_OVERLAP=0: asynchronous collectives wait for a caller to wait on one of them (or
  // for kDeferredCycle) instead of starting at once; for hosts with no core free for the exchange.
  bool overlap = true;
  // HOROVOD_EARLY_STAGING (default 1): a small allreduce that a rank has alone ready is staged
  // for shared memory's one-round allreduce before the negotiation (Controller::StageEarly);
  // 0 stages it after.
  bool early_staging = true;
  int cache_capacity = 1024;
  bool stall_check_enabled = true;
  double stall_warning_seconds = 60.0;
  double stall_shutdown_seconds = 0.0;  // 0: a stall never stops the job
  double peer_timeout_seconds = 300.0;  // a peer silent for this long counts as failed
  // HOROVOD_GLOO_TIMEOUT_SECONDS: the Gloo transport's own timeout (default: the peer timeout)
  double gloo_timeout_seconds = 300.0;
  int log_level = 3;  // 0 trace, 1 debug, 2 info, 3 warning, 4 error, 5 fatal
  // HOROVOD_HIERARCHICAL_ALLREDUCE: allreduce inside each host, then across hosts (TCP transport).
  bool hierarchical_allreduce = false;
  // HOROVOD_HIERARCHICAL_ALLGATHER: allgather inside each host, then across hosts (TCP transport).
  bool hierarchical_allgather = false;
  // HOROVOD_TIMELINE: the Chrome trace rank 0 writes from init() on (timeline.h); empty: none.
  std::string timeline_path;
  bool timeline_mark_cycles = false;  // HOROVOD_TIMELINE_MARK_CYCLES

  // Autotuning (HOROVOD_AUTOTUNE*, see parameter_manager.h). Parameters the user set explicitly
  // are held constant while the others are tuned.
  bool autotune = false;
  std::string autotune_log;  // CSV of the samples, written by rank 0; empty: none
  int autotune_warmup_samples = 3;
  int autotune_steps_per_sample = 10;
  int autotune_max_samples = 20;
  double autotune_noise = 0.8;
  bool fusion_threshold_given = false;
  bool cycle_time_given = false;
  bool cache_capacity_given = false;

  // Which operations run the tensors' collectives (HOROVOD_CPU_OPERATIONS, lower case: tcp for
  // our algorithms only, mpi for MPI's own allreduce at every size it takes, gloo; empty: the
  // defaults), and the controller (HOROVOD_CONTROLLER). The job's link is the one the first of
  // them that is set names, else MPI under mpirun, else TCP (links/connect.cc).
  std::string cpu_operations;
  // HOROVOD_GPU_OPERATIONS, lower case: "" (NCCL when every rank can), "nccl" (NCCL or an
  // error), "staged" (GPU tensors through host memory and the CPU operations; also "mpi",
  // "gloo").
  std::string gpu_operations;
  std::string controller;
  // Links (read here so that no link reads the environment): HOROVOD_SHM_DISABLE, the host
  // name the launcher gave this rank (HOROVOD_HOSTNAME; ranks with the same one may share
  // memory), the shared-memory geometry and spinning (HOROVOD_SHM_CHANNEL_BYTES,
  // HOROVOD_SHM_CHUNK_BYTES, HOROVOD_SHM_SMALL_BYTES, HOROVOD_SHM_SPIN_US,
  // HOROVOD_SHM_YIELD_US; see docs/performance.md; the defaults were tuned on a 2-core
  // machine), HOROVOD_MPI_THREADS_DISABLE and HOROVOD_ROUND_BELL (the round bells of
  // links/link.h: "auto", the shared-memory one when every rank of the job is on one host;
  // "off"; "host": the shared-memory one always; "all": that and the network one,
  // links/tcp/network_bell.h).
  bool shm_disabled = false;
  std::string round_bell = "auto";
  std::string launcher_hostname;
  size_t shm_channel_bytes = 1 << 20;
  size_t shm_chunk_bytes = 1 << 20;
  size_t shm_small_bytes = 64 << 10;
  int64_t shm_spin_us = 2000;  // longest busy-wait before sleeping
  bool shm_spin_given = false;  // spin even with more ranks than cores
  int64_t shm_yield_us = 500;  // with more ranks than cores: yield-and-look before sleeping
  std::string shm_stream_stores = "auto";  // the allreduce's slot stores: auto, on, off
  bool mpi_threads_disabled = false;

  // Reads HOROVOD_* variables; throws InvalidArgument naming the variable on a bad value.
  static Config FromEnvironment();
};

}  // namespace horovodlike

namespace horovodlike {
// HOROVOD_CPU_OPERATIONS alone, checked as FromEnvironment checks it (for --check-build, which
// reports the providers it would pick without starting a job).
std::string CpuOperationsFromEnvironment();
// A GPU library's explicit path (HOROVOD_CUDART_PATH, HOROVOD_NCCL_PATH); "" when unset. Read
// when the library is first needed, which may be before init() (gpu_info()).
std::string GpuLibraryPathFromEnvironment(const char* variable);
// Read when the first log line is written, which may be before init(): the launcher's duplicate
// of the rank's stderr pipe (HOROVODLIKE_STDERR_FD, "FD:INODE"; "" when unset), and whether lines
// carry the local time (HOROVOD_LOG_HIDE_TIME=0, horovodlikerun --log-with-timestamp).
std::string LogFdFromEnvironment();
bool LogTimestampFromEnvironment();
}  // namespace horovodlike
