#include "recursive_doubling_allreduce.h"

#include <cstring>

#include "../reduce/reduce.h"

namespace horovodlike {

void RecursiveDoublingAllreduce::Combine(bool mine_is_lower, uint8_t* buf, size_t count,
                                         DataType dtype, ReduceOp op) {
  if (mine_is_lower) {
    ReduceInto(buf, scratch_.data(), count, dtype, op);
    return;
  }
  ReduceInto(scratch_.data(), buf, count, dtype, op);
  std::memcpy(buf, scratch_.data(), count * DataTypeSize(dtype));
}

void RecursiveDoublingAllreduce::Run(Link& link, void* buf, size_t count, DataType dtype,
                                     ReduceOp op) {
  const int n = link.size();
  if (n == 1 || count == 0) return;
  const int rank = link.rank();
  const size_t bytes = count * DataTypeSize(dtype);
  auto* data = static_cast<uint8_t*>(buf);
  if (scratch_.size() < bytes) scratch_.resize(bytes);

  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int folded = n - p;  // pairs folded into one rank before the exchanges
  int virtual_rank;
  if (rank < 2 * folded) {
    if (rank % 2 == 0) {
      link.send(rank + 1, data, bytes);
      link.recv(rank + 1, data, bytes);
      return;
    }
    link.recv(rank - 1, scratch_.data(), bytes);
    Combine(false, data, count, dtype, op);
    virtual_rank = rank / 2;
  } else {
    virtual_rank = rank - folded;
  }
  for (int mask = 1; mask < p; mask <<= 1) {
    const int virtual_peer = virtual_rank ^ mask;
    const int peer = virtual_peer < folded ? 2 * virtual_peer + 1 : virtual_peer + folded;
    link.sendrecv(peer, data, bytes, peer, scratch_.data(), bytes);
    Combine(rank < peer, data, count, dtype, op);
  }
  if (rank < 2 * folded) link.send(rank - 1, data, bytes);
}

}  // namespace horovodlike
