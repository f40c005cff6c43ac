#include "ring_reducescatter.h"

#include <algorithm>

#include "../reduce/reduce.h"

namespace horovodlike {
namespace {
constexpr size_t kSegmentBytes = 1 << 20;
}

void RingReducescatter::Run(Link& link, void* buf,
                            const std::vector<size_t>& block_counts, DataType dtype,
                            ReduceOp op) {
  const int n = link.size();
  if (n == 1) return;
  const int rank = link.rank();
  const int right = (rank + 1) % n;
  const int left = (rank - 1 + n) % n;
  const size_t elem = DataTypeSize(dtype);
  std::vector<size_t>& begin = begin_;
  begin.assign(n + 1, 0);
  for (int r = 0; r < n; ++r) begin[r + 1] = begin[r] + block_counts[r];
  auto* data = static_cast<uint8_t*>(buf);
  const size_t segment = std::max<size_t>(1, kSegmentBytes / elem);
  if (scratch_.size() < segment * elem) scratch_.resize(segment * elem);

  // Shifted by one against the allreduce ring so that the last block reduced here is `rank`.
  for (int step = 0; step < n - 1; ++step) {
    const int send_block = (rank - step - 1 + 2 * n) % n;
    const int recv_block = (rank - step - 2 + 2 * n) % n;
    const size_t send_len = block_counts[send_block], recv_len = block_counts[recv_block];
    size_t sent = 0, received = 0;
    while (sent < send_len || received < recv_len) {
      const size_t s = std::min(segment, send_len - sent);
      const size_t r = std::min(segment, recv_len - received);
      link.sendrecv(right, data + (begin[send_block] + sent) * elem, s * elem, left,
                         scratch_.data(), r * elem);
      if (r > 0) {
        ReduceInto(data + (begin[recv_block] + received) * elem, scratch_.data(), r, dtype, op);
      }
      sent += s;
      received += r;
    }
  }
}

}  // namespace horovodlike
