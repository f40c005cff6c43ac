#include "subset_link.h"

#include <algorithm>
#include <string>

namespace horovodlike {

SubsetLink::SubsetLink(Link& parent, std::vector<int> members)
    : parent_(parent), members_(std::move(members)) {
  auto it = std::find(members_.begin(), members_.end(), parent_.rank());
  if (it == members_.end()) throw InvalidArgument("this rank is not a member of the set");
  rank_ = static_cast<int>(it - members_.begin());
}

int SubsetLink::Global(int peer) const {
  if (peer < 0 || peer >= size()) {
    throw TransportError("rank " + std::to_string(peer) + " is not in the process set");
  }
  return members_[peer];
}

void SubsetLink::send(int peer, const void* buf, size_t n) {
  parent_.send(Global(peer), buf, n);
}

void SubsetLink::recv(int peer, void* buf, size_t n) {
  parent_.recv(Global(peer), buf, n);
}

void SubsetLink::sendrecv(int to, const void* sbuf, size_t sn, int from, void* rbuf,
                               size_t rn) {
  parent_.sendrecv(Global(to), sbuf, sn, Global(from), rbuf, rn);
}

}  // namespace horovodlike
