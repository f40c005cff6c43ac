#include "connect.h"

#include <atomic>
#include <string>

#include "../common/backend_names.h"
#include "../common/env_config.h"
#include "../common/logging.h"
#include "per_peer_link.h"
#include "tcp/tcp_link.h"
#ifdef HOROVODLIKE_MPI_FOUND
#include "mpi/mpi_link.h"
#endif
#ifdef HOROVODLIKE_GLOO_FOUND
#include "gloo/gloo_link.h"
#endif

namespace horovodlike {
namespace {

std::atomic<const char*> g_last_name{nullptr};

constexpr bool kMpiBuilt =
#ifdef HOROVODLIKE_MPI_FOUND
    true;
#else
    false;
#endif

// HOROVOD_CPU_OPERATIONS, else HOROVOD_CONTROLLER (horovodrun sets both; under mpirun a job may
// ask for tcp or gloo this way); by default MPI in a job started by mpirun, else TCP.
std::string RequestedBackend(const Config& config) {
  if (!config.cpu_operations.empty()) return config.cpu_operations;
  if (!config.controller.empty()) return config.controller;
  // Without MPI built in, a job started by horovodlikerun --mpi still has the launcher's
  // rendezvous server and can use TCP.
  if (config.launched_by_mpirun && (kMpiBuilt || config.rendezvous_addr.empty())) {
    return NameOf(Backend::kMpi);
  }
  return NameOf(Backend::kTcp);
}

std::unique_ptr<Link> ConnectMpi(Config& config) {
#ifdef HOROVODLIKE_MPI_FOUND
  return MpiLink::Connect(config);
#else
  throw InvalidArgument(std::string(config.launched_by_mpirun
                                        ? "this job was started by mpirun"
                                        : "HOROVOD_CPU_OPERATIONS=mpi asks for MPI") +
                        ", but this build of horovodlike has no MPI support (MPI was not found "
                        "when it was built: install Open MPI's development files, e.g. "
                        "libopenmpi-dev, and reinstall); start the job with horovodlikerun "
                        "without --mpi to use the built-in TCP transport");
#endif
}

std::unique_ptr<Link> ConnectGloo(const Config& config, int generation) {
#ifdef HOROVODLIKE_GLOO_FOUND
  return GlooLink::Connect(config, generation);
#else
  throw InvalidArgument("HOROVOD_CPU_OPERATIONS=gloo asks for Gloo, but this build of "
                        "horovodlike has no Gloo support (Gloo was not found when it was "
                        "built: install libgloo-dev and reinstall); leave out --gloo to use "
                        "the built-in TCP transport");
#endif
}

}  // namespace

std::unique_ptr<Link> ConnectLink(Config& config, int generation) {
  const std::string backend = RequestedBackend(config);
  Backend id;
  if (!ParseBackend(backend, &id)) {
    // Config::FromEnvironment accepts no other name.
    throw InvalidArgument("unknown transport '" + backend + "'");
  }
  std::unique_ptr<Link> link;
  switch (id) {
    case Backend::kMpi:
      link = ConnectMpi(config);
      break;
    case Backend::kGloo:
      link = ConnectGloo(config, generation);
      break;
    case Backend::kTcp:
      // TCP between hosts, shared memory between the ranks of one host (HOROVOD_SHM_DISABLE=1:
      // TCP only).
      link = PerPeerLink::Connect(config, generation);
      break;
  }
  const bool builtin = id == Backend::kTcp;
  if (config.hierarchical_allreduce && !builtin && config.rank == 0) {
    HVDL_LOG(kWarning, "HOROVOD_HIERARCHICAL_ALLREDUCE applies to the built-in transport only; "
                       "over " << backend << " it is ignored");
  }
  if (config.hierarchical_allgather && !builtin && config.rank == 0) {
    HVDL_LOG(kWarning, "HOROVOD_HIERARCHICAL_ALLGATHER applies to the built-in transport only; "
                       "over " << backend << " it is ignored");
  }
  g_last_name = link->name();
  return link;
}

const char* LastLinkName() { return g_last_name.load(); }

}  // namespace horovodlike
