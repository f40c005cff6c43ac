// What the core calls to run a collective: a provider, either one of our algorithms over a link
// (ring, hierarchical, shared memory) or a library's own collective (MPI_Allreduce). Each
// backend registers its providers (provider_registry.h); the ProviderTable (provider_table.h)
// says which one runs each operation. kOperation names the operation in --check-build.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../common/common.h"

namespace horovodlike {

class AllreduceProvider {
 public:
  static constexpr const char* kOperation = "allreduce";
  virtual ~AllreduceProvider() = default;
  // Short name for --check-build and stats ("ring_allreduce", "shm_allreduce", ...).
  virtual const char* name() const = 0;
  // Whether it takes these arguments; the table's next provider for the operation runs if not.
  // The same answer on every rank for the same arguments.
  virtual bool Supports(size_t count, DataType dtype, ReduceOp op) const { return true; }
  // In place over every rank of its link, Average reduced as Sum, the result multiplied by
  // `scale` (1: unscaled); every rank passes the same arguments.
  virtual void Run(void* buf, size_t count, DataType dtype, ReduceOp op, double scale) = 0;

  // Early staging, for a provider whose collective begins with each rank publishing its input
  // where the others read it (shared memory's one-round allreduce). StagingFor returns where
  // this rank's input for the provider's next call goes, when that may be written now, before
  // the ranks have agreed to run it (null: no early staging, the default); the caller writes
  // the input there, multiplied by its prescale factor, and Staged returns a nonzero token for
  // it. The negotiation then tells every rank whether all of them staged the same tensor with
  // the same token (its message is written after the stores, so the peers see the data with
  // it); if so each calls RunStaged with the token instead of Run, which skips the staging and
  // the wait for it, and returns true. Between StagingFor and that call no other call of the
  // provider is made. A token no longer valid makes RunStaged a Run that returns false (the
  // same on every rank: tokens count calls).
  virtual void* StagingFor(size_t /*count*/, DataType /*dtype*/, ReduceOp /*op*/) {
    return nullptr;
  }
  virtual uint64_t Staged() { return 0; }
  virtual bool RunStaged(void* buf, size_t count, DataType dtype, ReduceOp op, double scale,
                         uint64_t /*token*/) {
    Run(buf, count, dtype, op, scale);
    return false;
  }
};

class AllgatherProvider {
 public:
  static constexpr const char* kOperation = "allgather";
  virtual ~AllgatherProvider() = default;
  virtual const char* name() const = 0;
  // In-place allgatherv of blocks in rank order (`block_bytes[r]` from rank r; this rank's
  // block is already in place in `out`).
  virtual void Run(void* out, const std::vector<size_t>& block_bytes) = 0;
};

class ReducescatterProvider {
 public:
  static constexpr const char* kOperation = "reducescatter";
  virtual ~ReducescatterProvider() = default;
  virtual const char* name() const = 0;
  // `buf` holds the blocks in rank order, block_counts[r] elements each, and is work space; on
  // return block `rank` is reduced over every rank (Average as Sum).
  virtual void Run(void* buf, const std::vector<size_t>& block_counts, DataType dtype,
                   ReduceOp op) = 0;
};

class AlltoallProvider {
 public:
  static constexpr const char* kOperation = "alltoall";
  virtual ~AlltoallProvider() = default;
  virtual const char* name() const = 0;
  // send_bytes[j] of `input` (packed in rank order) go to rank j; recv_bytes[j] from rank j
  // land in `output`, packed in rank order.
  virtual void Run(const void* input, const std::vector<size_t>& send_bytes, void* output,
                   const std::vector<size_t>& recv_bytes) = 0;
};

class BroadcastProvider {
 public:
  static constexpr const char* kOperation = "broadcast";
  virtual ~BroadcastProvider() = default;
  virtual const char* name() const = 0;
  // `bytes` of `buf` from rank `root` to every rank, in place.
  virtual void Run(void* buf, size_t bytes, int root) = 0;
};

class AdasumProvider {
 public:
  static constexpr const char* kOperation = "adasum";
  virtual ~AdasumProvider() = default;
  virtual const char* name() const = 0;
  // Combines `buf` in place: `counts` are the element counts of the tensors laid end to end in
  // it, each combined on its own; `tensor` names them in errors (adasum_allreduce.h).
  virtual void Run(void* buf, const size_t* counts, size_t num_tensors, DataType dtype,
                   const std::string& tensor) = 0;
};

}  // namespace horovodlike
