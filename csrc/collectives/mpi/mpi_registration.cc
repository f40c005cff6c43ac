// Registers MPI's own allreduce over the MPI link's communicator: for small messages by default,
// at every size with HOROVOD_CPU_OPERATIONS=mpi (mpi_allreduce.h). Compiled only when CMake
// finds MPI.
#include "../provider_registry.h"
#include "mpi_allreduce.h"
#include "../../common/backend_names.h"

namespace horovodlike {
namespace {

// The communicator is the job's (a duplicate of MPI_COMM_WORLD): never for a set's view.
MpiLink* JobsMpiLink(const ProviderContext& context) {
  return context.spans_job ? context.link.mpi() : nullptr;
}

std::shared_ptr<AllreduceProvider> EverySize(const ProviderContext& context) {
  MpiLink* mpi = JobsMpiLink(context);
  if (mpi == nullptr || !IsBackend(context.cpu_operations, Backend::kMpi)) return nullptr;
  return std::make_shared<MpiAllreduce>(*mpi, /*every_size=*/true);
}

std::shared_ptr<AllreduceProvider> SmallMessages(const ProviderContext& context) {
  MpiLink* mpi = JobsMpiLink(context);
  if (mpi == nullptr || IsBackend(context.cpu_operations, Backend::kMpi)) return nullptr;
  return std::make_shared<MpiAllreduce>(*mpi, /*every_size=*/false);
}

// HOROVOD_CPU_OPERATIONS=mpi asks for MPI's operations; unset, mpirun's jobs run over MPI.
bool AskedForMpi(const std::string& cpu_operations) { return IsBackend(cpu_operations, Backend::kMpi); }
bool MaybeOverMpi(const std::string& cpu_operations) { return cpu_operations.empty(); }

const ProviderRegistrar<AllreduceProvider> kEverySize({
    "mpi_allreduce", kCpuDevice, 20, "every size, HOROVOD_CPU_OPERATIONS=mpi", AskedForMpi,
    EverySize, kNoTraits});
const ProviderRegistrar<AllreduceProvider> kSmallMessages({
    "mpi_allreduce", kCpuDevice, 21, "over MPI, up to 256 KiB", MaybeOverMpi, SmallMessages,
    kNoTraits});

}  // namespace
}  // namespace horovodlike
