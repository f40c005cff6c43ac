// Recursive doubling allreduce, for small messages: log2(p) exchanges of the whole buffer, with
// rank ^ 1, then ^ 2, ^ 4, ..., instead of the ring's 2(n - 1) steps of 1/n of it each. For a
// small message every step costs about one latency, so the step count is the time.
//
// A rank count n that is not a power of two (p: the largest power of two below it) first folds
// the first 2(n - p) ranks in pairs: the even one sends its buffer to the odd one and waits for
// the result, which the odd one sends back at the end. Each exchange combines the lower rank's
// data with the higher rank's in that order on both sides (lower op higher), so every rank ends
// with the same bits whatever the operation (a NaN in a Min or Max included).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "../common/common.h"
#include "../links/link.h"

namespace horovodlike {

class RecursiveDoublingAllreduce {
 public:
  // The largest message it is used for: above, the ring's fewer bytes per rank win on slow
  // links (measured across emulated hosts on 1 Gbit/s links: recursive doubling faster at
  // 16 and 32 KiB, the ring at 64 KiB on 2 hosts; docs/performance-multihost.md).
  static constexpr size_t kMaxBytes = 32 << 10;
  // Whether a message of `count` elements of `dtype` is small enough for it.
  static bool Fits(size_t count, DataType dtype) {
    return count * DataTypeSize(dtype) <= kMaxBytes;
  }

  // Reduces `count` elements of `buf` in place across all ranks of `link`; Average is reduced
  // as Sum (the caller scales).
  void Run(Link& link, void* buf, size_t count, DataType dtype, ReduceOp op);

 private:
  // buf = (lower rank's data) op (higher rank's), the peer's data in scratch_.
  void Combine(bool mine_is_lower, uint8_t* buf, size_t count, DataType dtype, ReduceOp op);

  std::vector<uint8_t> scratch_;  // the peer's buffer, reused across calls
};

}  // namespace horovodlike
