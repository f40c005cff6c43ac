// Ring allgather of blocks of different sizes (allgatherv), in place in the output.
#pragma once

#include <cstddef>
#include <vector>

#include "../links/link.h"

namespace horovodlike {

// `out` holds every rank's block, in rank order; on entry this rank's block is already at its
// offset. block_bytes[r] is the size of rank r's block.
void RingAllgatherv(Link& link, void* out, const std::vector<size_t>& block_bytes);

}  // namespace horovodlike
