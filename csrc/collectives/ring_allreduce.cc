#include "ring_allreduce.h"

#include <algorithm>

#include "../reduce/reduce.h"

namespace horovodlike {
namespace {
// Each chunk moves in segments of at most this size, so that reducing one segment overlaps the
// peers' transfer of the next and the scratch buffer stays cache-sized.
constexpr size_t kSegmentBytes = 1 << 20;
}  // namespace

void RingAllreduce::Run(Link& link, void* buf, size_t count, DataType dtype,
                        ReduceOp op) {
  const int n = link.size();
  if (n == 1 || count == 0) return;
  const int rank = link.rank();
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
  // The outgoing chunk of a step was finished in the step before, so its bytes may run ahead
  // of the incoming ones: each call sends half a segment beyond the segment it receives. While
  // this rank reduces segment j, the right neighbour already receives the start of segment
  // j + 1 instead of waiting for this rank's next call. (Deadlock-free like the plain ring:
  // every rank sends at least what its neighbour's matching call expects.)
  const size_t lead_elems = segment_elems / 2;
  for (int step = 0; step < n - 1; ++step) {
    const int send_chunk = (rank - step + n) % n;
    const int recv_chunk = (rank - step - 1 + 2 * n) % n;
    const size_t send_len = length(send_chunk), recv_len = length(recv_chunk);
    uint8_t* const send_base = data + begin(send_chunk) * elem;
    uint8_t* const recv_base = data + begin(recv_chunk) * elem;
    size_t sent = 0, received = 0;
    while (received < recv_len || sent < send_len) {
      const size_t r = std::min(segment_elems, recv_len - received);
      const size_t target = received + r >= recv_len
          ? send_len
          : std::min(send_len, received + r + lead_elems);
      const size_t s = target > sent ? target - sent : 0;
      link.sendrecv(right, send_base + sent * elem, s * elem, left, scratch_.data(),
                         r * elem);
      if (r > 0) ReduceInto(recv_base + received * elem, scratch_.data(), r, dtype, op);
      sent += s;
      received += r;
    }
  }
  // Allgather: pass the finished chunks around the ring, straight into place.
  for (int step = 0; step < n - 1; ++step) {
    int send_chunk = (rank + 1 - step + n) % n;
    int recv_chunk = (rank - step + n) % n;
    link.sendrecv(right, data + begin(send_chunk) * elem, length(send_chunk) * elem, left,
                       data + begin(recv_chunk) * elem, length(recv_chunk) * elem);
  }
}

}  // namespace horovodlike
