// Alltoall by pairwise exchange: in step s every rank sends to rank + s and receives from
// rank - s, so each pair of ranks talks exactly once and no rank waits on a busy peer.
#pragma once

#include <cstddef>
#include <vector>

#include "../links/link.h"

namespace horovodlike {

// send_bytes[j]: bytes of `input` (packed in rank order) destined to rank j;
// recv_bytes[j]: bytes arriving from rank j, written to `output` packed in rank order.
void PairwiseAlltoall(Link& link, const void* input,
                      const std::vector<size_t>& send_bytes, void* output,
                      const std::vector<size_t>& recv_bytes);

}  // namespace horovodlike
