#include "pairwise_alltoall.h"

#include <cstdint>
#include <cstring>

namespace horovodlike {

void PairwiseAlltoall(Link& link, const void* input,
                      const std::vector<size_t>& send_bytes, void* output,
                      const std::vector<size_t>& recv_bytes) {
  const int n = link.size();
  const int rank = link.rank();
  std::vector<size_t> send_offset(n + 1, 0), recv_offset(n + 1, 0);
  for (int r = 0; r < n; ++r) {
    send_offset[r + 1] = send_offset[r] + send_bytes[r];
    recv_offset[r + 1] = recv_offset[r] + recv_bytes[r];
  }
  const auto* in = static_cast<const uint8_t*>(input);
  auto* out = static_cast<uint8_t*>(output);
  if (send_bytes[rank] > 0) {
    std::memcpy(out + recv_offset[rank], in + send_offset[rank], send_bytes[rank]);
  }
  for (int step = 1; step < n; ++step) {
    const int to = (rank + step) % n;
    const int from = (rank - step + n) % n;
    link.sendrecv(to, in + send_offset[to], send_bytes[to], from, out + recv_offset[from],
                       recv_bytes[from]);
  }
}

}  // namespace horovodlike
