// Registers the GPU path's providers, so that --check-build lists them with the rest: NCCL's
// collectives, and host staging where NCCL cannot run. They have no factory: no CPU table
// builds them, and the GPU executor (core/device_collectives.cc) picks one at run time.
#include "../provider_registry.h"

namespace horovodlike {
namespace {

constexpr char kNccl[] = "NCCL, one rank per GPU";
constexpr char kStaging[] = "through host memory: no NCCL, a shared GPU, or "
                            "HOROVOD_GPU_OPERATIONS=staged";

// NCCL's collective named `nccl_name`, then staging, for Provider's operation.
template <class Provider>
struct GpuRegistrations {
  explicit GpuRegistrations(const char* nccl_name)
      : nccl({nccl_name, kCudaDevice, 10, kNccl, OverAnyLink, nullptr, kNoTraits}),
        staging({"cuda_host_staging", kCudaDevice, 20, kStaging, OverAnyLink, nullptr,
                 kNoTraits}) {}
  ProviderRegistrar<Provider> nccl;
  ProviderRegistrar<Provider> staging;
};

const GpuRegistrations<AllreduceProvider> kAllreduce("nccl_allreduce");
const GpuRegistrations<AllgatherProvider> kAllgather("nccl_allgather");
const GpuRegistrations<ReducescatterProvider> kReducescatter("nccl_reducescatter");
const GpuRegistrations<AlltoallProvider> kAlltoall("nccl_alltoall");
const GpuRegistrations<BroadcastProvider> kBroadcast("nccl_broadcast");

}  // namespace
}  // namespace horovodlike
