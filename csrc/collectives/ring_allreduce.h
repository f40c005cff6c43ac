// Ring allreduce: reduce-scatter then allgather around the ring, in place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "../common/common.h"
#include "../links/link.h"

namespace horovodlike {

class RingAllreduce {
 public:
  // Reduces `count` elements of `buf` across all ranks of `link`; every rank ends with the
  // result. Average is reduced as Sum; the caller scales.
  void Run(Link& link, void* buf, size_t count, DataType dtype, ReduceOp op);

 private:
  std::vector<uint8_t> scratch_;  // reused across calls: one incoming segment
};

}  // namespace horovodlike
