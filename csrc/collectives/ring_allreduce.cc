#include "ring_allreduce.h"

#include <algorithm>

#include "../reduce/reduce.h"

namespace horovodlike {
namespace {
// Each chunk moves in segments of at most this size, so that reducing one segment overlaps the
// peers' transfer of the next and the scratch buffer stays cache-sized.
constexpr size_t kSegmentBytes = 1 << 20;
}  // namespace

void RingAllreduce::Run(Transport& transport, void* buf, size_t count, DataType dtype,
                        ReduceOp op) {
  const int n = transport.size();
  if (n == 1 || count == 0) return;
  const int rank = transport.rank();
  const int right = (rank + 1) % n;
  const int left = (rank - 1 + n) % n;
  const size_t elem = DataTypeSize(dtype);
  auto* data = static_cast<uint8_t*>(buf);

  // Chunk c covers elements [begin(c), begin(c + 1)); sizes differ by at most one element.
  auto begin = [&](int c) {
    size_t base = count / n, extra = count % n;
    return static_cast<size_t>(c) * base + std::min(static_cast<size_t>(c), extra);
  };
  auto length = [&](int c) { return begin(c + 1) - begin(c); };

  const size_t segment_elems = std::max<size_t>(1, kSegmentBytes / elem);
  if (scratch_.size() < segment_elems * elem) scratch_.resize(segment_elems * elem);

  // Reduce-scatter: after n - 1 steps this rank holds the full reduction of chunk (rank + 1).
  for (int step = 0; step < n - 1; ++step) {
    int send_chunk = (rank - step + n) % n;
    int recv_chunk = (rank - step - 1 + 2 * n) % n;
    size_t send_len = length(send_chunk), recv_len = length(recv_chunk);
    size_t done_send = 0, done_recv = 0;
    while (done_send < send_len || done_recv < recv_len) {
      size_t s = std::min(segment_elems, send_len - done_send);
      size_t r = std::min(segment_elems, recv_len - done_recv);
      transport.sendrecv(right, data + (begin(send_chunk) + done_send) * elem, s * elem, left,
                         scratch_.data(), r * elem);
      if (r > 0) {
        ReduceInto(data + (begin(recv_chunk) + done_recv) * elem, scratch_.data(), r, dtype, op);
      }
      done_send += s;
      done_recv += r;
    }
  }
  // Allgather: pass the finished chunks around the ring, straight into place.
  for (int step = 0; step < n - 1; ++step) {
    int send_chunk = (rank + 1 - step + n) % n;
    int recv_chunk = (rank - step + n) % n;
    transport.sendrecv(right, data + begin(send_chunk) * elem, length(send_chunk) * elem, left,
                       data + begin(recv_chunk) * elem, length(recv_chunk) * elem);
  }
}

}  // namespace horovodlike
