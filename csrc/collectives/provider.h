// What the core calls to run a collective: a provider, either one of our algorithms over a link
// (ring, hierarchical, shared memory) or a library's own collective (MPI_Allreduce). The
// ProviderTable (provider_table.h) says which one runs each operation.
#pragma once

#include <cstddef>
#include <vector>

#include "../common/common.h"

namespace horovodlike {

class AllreduceProvider {
 public:
  virtual ~AllreduceProvider() = default;
  // Short name for --check-build and stats ("ring_allreduce", "shm_allreduce", ...).
  virtual const char* name() const = 0;
  // Whether it takes these arguments; the table's next provider for the operation runs if not.
  // The same answer on every rank for the same arguments.
  virtual bool Supports(size_t count, DataType dtype, ReduceOp op) const { return true; }
  // In place over every rank of its link, Average reduced as Sum, the result multiplied by
  // `scale` (1: unscaled); every rank passes the same arguments.
  virtual void Run(void* buf, size_t count, DataType dtype, ReduceOp op, double scale) = 0;
};

class AllgatherProvider {
 public:
  virtual ~AllgatherProvider() = default;
  virtual const char* name() const = 0;
  // In-place allgatherv of blocks in rank order (`block_bytes[r]` from rank r; this rank's
  // block is already in place in `out`).
  virtual void Run(void* out, const std::vector<size_t>& block_bytes) = 0;
};

}  // namespace horovodlike
