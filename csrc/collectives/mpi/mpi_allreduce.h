// MPI's own allreduce over the MPI link's communicator, for the small messages where its
// algorithms beat the ring (mpi_allreduce.cc).
#pragma once

#include <vector>

#include "../../links/mpi/mpi_link.h"
#include "../provider.h"

namespace horovodlike {

class MpiAllreduce final : public AllreduceProvider {
 public:
  explicit MpiAllreduce(MpiLink& link);
  const char* name() const override { return "mpi_allreduce"; }
  // Up to 256 KiB, and the dtypes and ops MPI reduces as we do (not int8/int16: Open MPI's
  // vectorized sums saturate; not Adasum).
  bool Supports(size_t count, DataType dtype, ReduceOp op) const override;
  void Run(void* buf, size_t count, DataType dtype, ReduceOp op, double scale) override;

 private:
  MpiLink& link_;
  std::vector<char> scratch_;  // what MPI works on: the caller's buffer is never given to MPI
};

}  // namespace horovodlike
