// MPI's own allreduce over the MPI link's communicator: by default for the small messages where
// its algorithms beat the ring (mpi_allreduce.cc), at every size when the job asked for MPI's
// operations (HOROVOD_CPU_OPERATIONS=mpi).
#pragma once

#include <vector>

#include "../../links/mpi/mpi_link.h"
#include "../provider.h"

namespace horovodlike {

class MpiAllreduce final : public AllreduceProvider {
 public:
  // Up to this size unless `every_size`.
  static constexpr size_t kSmallMessageBytes = size_t{256} << 10;
  MpiAllreduce(MpiLink& link, bool every_size);
  const char* name() const override { return "mpi_allreduce"; }
  // Up to kSmallMessageBytes (unless every_size), and the dtypes and ops MPI reduces as we do
  // (not int8/int16: Open MPI's vectorized sums saturate; not Adasum).
  bool Supports(size_t count, DataType dtype, ReduceOp op) const override;
  void Run(void* buf, size_t count, DataType dtype, ReduceOp op, double scale) override;

 private:
  MpiLink& link_;
  const size_t max_bytes_;
  std::vector<char> scratch_;  // what MPI works on: the caller's buffer is never given to MPI
};

}  // namespace horovodlike
