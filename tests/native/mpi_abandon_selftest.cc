// An MPI collective given up on must not be leaked: run under mpirun with 2 ranks. Rank 1
// joins MPI_Iallreduce 3 s late; rank 0, with a 1 s peer timeout, gives up on it first. MPI
// forbids freeing or cancelling a collective's request, so the link keeps it (and the buffer
// MPI may still write) until it completes, then releases both: once both ranks have entered
// the collective, every rank's count of abandoned transfers must come back to 0.
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "../../csrc/collectives/mpi/mpi_allreduce.h"
#include "../../csrc/common/env_config.h"
#include "../../csrc/links/mpi/mpi_link.h"

using namespace horovodlike;

int main() {
  Config config = Config::FromEnvironment();
  config.peer_timeout_seconds = 1;
  int failures = 0;
  size_t most = 0;
  {
    std::unique_ptr<MpiLink> link = MpiLink::Connect(config);
    MpiAllreduce allreduce(*link, /*every_size=*/false);
    const int rank = link->rank();
    if (rank == 1) std::this_thread::sleep_for(std::chrono::seconds(3));
    std::vector<float> data(1000, 1.0f);
    bool gave_up = false;
    try {
      allreduce.Run(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum, 1.0);
    } catch (const TransportError& e) {
      gave_up = true;
      std::printf("rank %d gave up: %s\n", rank, e.what());
    }
    if (rank == 0 && !gave_up) {
      std::printf("rank 0 did not give up\n");
      ++failures;
    }
    most = MpiLink::AbandonedTransfers();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (MpiLink::AbandonedTransfers() > 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    const size_t left = MpiLink::AbandonedTransfers();
    std::printf("rank %d: abandoned %zu, left %zu\n", rank, most, left);
    if (rank == 0 && most != 1) ++failures;
    if (left != 0) ++failures;
  }
  std::printf("%d failures\n", failures);
  return failures == 0 ? 0 : 1;
}
