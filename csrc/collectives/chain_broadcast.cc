#include "chain_broadcast.h"

#include <algorithm>
#include <cstdint>

namespace horovodlike {
namespace {
constexpr size_t kSegmentBytes = 1 << 20;
}

void ChainBroadcast(Link& link, void* buf, size_t bytes, int root) {
  const int n = link.size();
  if (n == 1 || bytes == 0) return;
  // Position in the chain, counted from the root.
  const int position = (link.rank() - root + n) % n;
  const int previous = (link.rank() - 1 + n) % n;
  const int next = (link.rank() + 1) % n;
  const bool forwards = position != n - 1;
  auto* data = static_cast<uint8_t*>(buf);
  for (size_t done = 0; done < bytes; done += kSegmentBytes) {
    size_t len = std::min(kSegmentBytes, bytes - done);
    if (position != 0) link.recv(previous, data + done, len);
    if (forwards) link.send(next, data + done, len);
  }
}

}  // namespace horovodlike
