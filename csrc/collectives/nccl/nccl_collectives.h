// NCCL's own collectives on one process set: a communicator over the set's ranks, one GPU per
// rank, and the operations the executor runs on the device's core stream. Nothing here waits:
// each call only queues work on the stream, and the caller records the completion event.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../../common/common.h"
#include "../../cuda/device_context.h"
#include "../../cuda/nccl_api.h"

namespace horovodlike {

class NcclCollectives {
 public:
  // Every rank of the set calls this at the same point (the executor runs responses in the
  // same order everywhere): rank 0 makes NCCL's unique id and `broadcast_id` hands its bytes to
  // the others, over the set's own link.
  using BroadcastBytes = std::function<void(void* bytes, size_t size)>;
  NcclCollectives(DeviceContext& device, int rank, int size, const BroadcastBytes& broadcast_id);
  // A communicator made by ncclCommSplit from `parent` (the caller checked has_split).
  NcclCollectives(DeviceContext& device, ncclComm_t comm, int rank, int size);
  ~NcclCollectives();
  // Every rank of `parent`'s set calls this at the same point; ranks outside the new set pass
  // `member` false and get nullptr.
  static std::unique_ptr<NcclCollectives> Split(NcclCollectives& parent, bool member, int key,
                                                int new_rank, int new_size);

  DeviceContext& device() const { return device_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

  // Whether NCCL reduces `dtype` with `op`, the sum multiplied by `scale` (Average: the mean
  // multiplied by `scale`), on this NCCL: the executor stages the rest through host memory.
  bool CanReduce(DataType dtype, ReduceOp op, double scale) const;
  // out = reduce(in) over the ranks, as CanReduce allows; `in` may equal `out`.
  void Allreduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                 double scale);
  // `in` holds block r (block_counts[r] elements) for each rank r in turn; `out` receives this
  // rank's block reduced over the ranks.
  void ReduceScatter(const void* in, void* out, const std::vector<size_t>& block_counts,
                     DataType dtype, ReduceOp op, double scale);
  // `out` receives every rank's block in rank order; this rank's block is already in place.
  void Allgather(void* out, const std::vector<size_t>& block_bytes);
  void Alltoall(const void* in, const std::vector<size_t>& send_bytes, void* out,
                const std::vector<size_t>& recv_bytes);
  void Broadcast(void* buf, size_t bytes, int root);

  // NCCL's asynchronous error ("" while there is none). Safe from another thread.
  std::string AsyncError();
  // Stops the communicator: queued work ends, later calls fail. Idempotent.
  void Abort();

 private:
  // The op for `dtype`/`op`/`scale` (a PreMulSum op is created, and destroyed by the caller
  // through ReleaseOp).
  ncclRedOp_t MakeOp(DataType dtype, ReduceOp op, double scale, bool* created);
  // NCCL before 2.29.7 leaves the last elements of a one-rank PreMulSum (which ncclAvg on
  // floating-point types is) unwritten once the buffer passes 16 KiB (NVIDIA/nccl#1950). On
  // such a library and one rank, an average is a plain sum (NCCL copies it) and a scaled sum
  // goes through the host.
  bool OneRankScalingBroken() const { return size_ == 1 && nccl_.version < 22907; }
  void ReleaseOp(ncclRedOp_t op, bool created);

  const NcclApi& nccl_;
  DeviceContext& device_;
  ncclComm_t comm_ = nullptr;
  int rank_;
  int size_;
  std::atomic<bool> aborted_{false};
};

}  // namespace horovodlike
