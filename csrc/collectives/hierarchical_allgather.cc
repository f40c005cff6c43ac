#include "hierarchical_allgather.h"

#include <cstring>

#include "chain_broadcast.h"
#include "ring_allgather.h"

namespace horovodlike {

void HierarchicalAllgather::Run(const HostHierarchy& hosts, void* out,
                                const std::vector<size_t>& block_bytes) {
  const auto& host_ranks = hosts.host_ranks();
  const int size = static_cast<int>(block_bytes.size());
  const int host_count = static_cast<int>(host_ranks.size());
  const int my_host = hosts.host_index();

  job_offset_.assign(size + 1, 0);
  for (int r = 0; r < size; ++r) job_offset_[r + 1] = job_offset_[r] + block_bytes[r];
  const size_t total = job_offset_[size];

  host_order_offset_.assign(size, 0);
  host_bytes_.assign(host_count, 0);
  size_t offset = 0, my_segment = 0;
  for (int h = 0; h < host_count; ++h) {
    if (h == my_host) my_segment = offset;
    for (int r : host_ranks[h]) {
      host_order_offset_[r] = offset;
      offset += block_bytes[r];
      host_bytes_[h] += block_bytes[r];
    }
  }
  const auto& mine = host_ranks[my_host];
  local_bytes_.resize(mine.size());
  for (size_t l = 0; l < mine.size(); ++l) local_bytes_[l] = block_bytes[mine[l]];

  auto* data = static_cast<uint8_t*>(out);
  const int me = mine[hosts.local_rank()];
  if (!hosts.contiguous()) {
    if (scratch_.size() < total) scratch_.resize(total);
    if (block_bytes[me] > 0) {
      std::memcpy(scratch_.data() + host_order_offset_[me], data + job_offset_[me],
                  block_bytes[me]);
    }
    data = scratch_.data();
  }

  Link* local = hosts.local();  // null: this rank is alone on its host
  if (local != nullptr) RingAllgatherv(*local, data + my_segment, local_bytes_);
  // Only the local roots take part across hosts; on equal hosts the other local ranks have a
  // cross-host view too, but the roots' view is the one in host order.
  if (hosts.local_rank() == 0) RingAllgatherv(*hosts.cross(), data, host_bytes_);
  if (local != nullptr) {
    // The host's own segment is already everywhere on it: only what lies before and after.
    ChainBroadcast(*local, data, my_segment, 0);
    const size_t after = my_segment + host_bytes_[my_host];
    ChainBroadcast(*local, data + after, total - after, 0);
  }

  if (!hosts.contiguous()) {
    auto* result = static_cast<uint8_t*>(out);
    for (int r = 0; r < size; ++r) {
      if (block_bytes[r] > 0) {
        std::memcpy(result + job_offset_[r], data + host_order_offset_[r], block_bytes[r]);
      }
    }
  }
}

}  // namespace horovodlike
