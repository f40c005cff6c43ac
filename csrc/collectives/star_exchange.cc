#include "star_exchange.h"

#include <algorithm>

#include "../common/common.h"

namespace horovodlike {
namespace {
// Control messages are small (requests and responses of a round, well under a megabyte for
// thousands of tensors); a length above this means a corrupt stream.
constexpr uint64_t kMaxControlBytes = 1ULL << 28;

void SendMessage(Link& t, int peer, const std::vector<uint8_t>& message) {
  uint64_t n = message.size();
  t.send(peer, &n, sizeof(n));
  if (n > 0) t.send(peer, message.data(), n);
}

std::vector<uint8_t> RecvMessage(Link& t, int peer) {
  uint64_t n = 0;
  t.recv(peer, &n, sizeof(n));
  if (n > kMaxControlBytes) {
    throw TransportError("control message of " + std::to_string(n) + " bytes from rank " +
                         std::to_string(peer) + " is larger than any valid message");
  }
  std::vector<uint8_t> message(n);
  if (n > 0) t.recv(peer, message.data(), n);
  return message;
}
}  // namespace

std::vector<std::vector<uint8_t>> GatherToRoot(Link& link,
                                               const std::vector<uint8_t>& message, int root) {
  std::vector<std::vector<uint8_t>> all;
  if (link.rank() != root) {
    SendMessage(link, root, message);
    return all;
  }
  all.resize(link.size());
  for (int r = 0; r < link.size(); ++r) {
    all[r] = (r == root) ? message : RecvMessage(link, r);
  }
  return all;
}

void BroadcastFromRoot(Link& link, std::vector<uint8_t>& message, int root) {
  if (link.rank() == root) {
    for (int r = 0; r < link.size(); ++r) {
      if (r != root) SendMessage(link, r, message);
    }
  } else {
    message = RecvMessage(link, root);
  }
}

void BitwiseAndAllreduce(Link& link, std::vector<uint64_t>& bits, int root,
                         std::vector<uint64_t>& scratch, size_t equal_words) {
  const int n = link.size();
  if (n == 1) return;
  const size_t bytes = bits.size() * sizeof(uint64_t);
  const size_t and_words = bits.size() - std::min(equal_words, bits.size());
  // Both combinations are commutative and associative, so every rank ends with the same words.
  auto combine = [&](const std::vector<uint64_t>& other) {
    for (size_t i = 0; i < and_words; ++i) bits[i] &= other[i];
    for (size_t i = and_words; i < bits.size(); ++i) bits[i] = bits[i] == other[i] ? bits[i] : 0;
  };
  if ((n & (n - 1)) == 0) {
    // A power of two: recursive doubling, log2(n) exchanges with one partner at a time, each
    // both ways at once. Two ranks wait for one message instead of the star's two in turn.
    std::vector<uint64_t>& other = scratch;
    other.resize(bits.size());
    for (int distance = 1; distance < n; distance *= 2) {
      const int partner = link.rank() ^ distance;
      link.sendrecv(partner, bits.data(), bytes, partner, other.data(), bytes);
      combine(other);
    }
    return;
  }
  if (link.rank() == root) {
    std::vector<uint64_t>& other = scratch;
    other.resize(bits.size());
    for (int r = 0; r < link.size(); ++r) {
      if (r == root) continue;
      link.recv(r, other.data(), bytes);
      combine(other);
    }
    for (int r = 0; r < link.size(); ++r) {
      if (r != root) link.send(r, bits.data(), bytes);
    }
  } else {
    link.send(root, bits.data(), bytes);
    link.recv(root, bits.data(), bytes);
  }
}

}  // namespace horovodlike
