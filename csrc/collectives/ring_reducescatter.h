// Ring reduce-scatter: after it, rank r holds the reduction over all ranks of block r.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "../common/common.h"
#include "../links/link.h"

namespace horovodlike {

class RingReducescatter {
 public:
  // `buf` holds the blocks in rank order, block_counts[r] elements each; it is used as work
  // space, and on return block `rank` of it is fully reduced (Average reduced as Sum).
  void Run(Link& link, void* buf, const std::vector<size_t>& block_counts,
           DataType dtype, ReduceOp op);

 private:
  std::vector<uint8_t> scratch_;
  std::vector<size_t> begin_;  // where each block starts, reused across calls
};

}  // namespace horovodlike
