#include "ring_allgather.h"

#include <cstdint>

namespace horovodlike {

void RingAllgatherv(Link& link, void* out, const std::vector<size_t>& block_bytes) {
  const int n = link.size();
  if (n == 1) return;
  const int rank = link.rank();
  const int right = (rank + 1) % n;
  const int left = (rank - 1 + n) % n;
  // Kept by each thread from call to call: the hot path allocates nothing.
  thread_local std::vector<size_t> offset;
  offset.assign(n + 1, 0);
  for (int r = 0; r < n; ++r) offset[r + 1] = offset[r] + block_bytes[r];
  auto* data = static_cast<uint8_t*>(out);
  for (int step = 0; step < n - 1; ++step) {
    int send_block = (rank - step + n) % n;
    int recv_block = (rank - step - 1 + 2 * n) % n;
    link.sendrecv(right, data + offset[send_block], block_bytes[send_block], left,
                       data + offset[recv_block], block_bytes[recv_block]);
  }
}

}  // namespace horovodlike
