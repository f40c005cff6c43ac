#include "hierarchical_allreduce.h"

#include "chain_broadcast.h"
#include "ring_allgather.h"

namespace horovodlike {

void HierarchicalAllreduce::Run(const HostHierarchy& hosts, AllreduceProvider* host_allreduce,
                                void* buf, size_t count, DataType dtype, ReduceOp op) {
  if (count == 0) return;
  if (hosts.uniform()) {
    AcrossLocalRanks(hosts, buf, count, dtype, op);
  } else {
    ThroughLocalRoots(hosts, host_allreduce, buf, count, dtype, op);
  }
}

void HierarchicalAllreduce::AcrossLocalRanks(const HostHierarchy& hosts, void* buf, size_t count,
                                             DataType dtype, ReduceOp op) {
  Link& local = *hosts.local();
  Link& cross = *hosts.cross();
  const int n = local.size(), me = local.rank();
  const size_t elem = DataTypeSize(dtype);
  // Blocks as even as possible, the first (count % n) one element longer; all the same on every
  // host, so that the ranks with the same local rank reduce the same elements across hosts.
  block_counts_.resize(n);
  block_bytes_.resize(n);
  size_t offset = 0, mine = 0;
  for (int b = 0; b < n; ++b) {
    block_counts_[b] = count / n + (static_cast<size_t>(b) < count % n ? 1 : 0);
    block_bytes_[b] = block_counts_[b] * elem;
    if (b == me) mine = offset;
    offset += block_counts_[b];
  }
  local_reducescatter_.Run(local, buf, block_counts_, dtype, op);
  if (block_counts_[me] > 0) {
    AcrossHosts(cross, static_cast<uint8_t*>(buf) + mine * elem, block_counts_[me], dtype, op);
  }
  RingAllgatherv(local, buf, block_bytes_);
}

void HierarchicalAllreduce::ThroughLocalRoots(const HostHierarchy& hosts,
                                              AllreduceProvider* host_allreduce, void* buf,
                                              size_t count, DataType dtype, ReduceOp op) {
  Link* local = hosts.local();  // null: this rank is alone on its host
  if (local != nullptr) {
    if (host_allreduce != nullptr) {
      host_allreduce->Run(buf, count, dtype, op, 1.0);
    } else {
      local_ring_.Run(*local, buf, count, dtype, op);
    }
  }
  // Only the local roots have a view across hosts.
  if (Link* cross = hosts.cross()) AcrossHosts(*cross, buf, count, dtype, op);
  if (local != nullptr) ChainBroadcast(*local, buf, count * DataTypeSize(dtype), 0);
}

void HierarchicalAllreduce::AcrossHosts(Link& cross, void* buf, size_t count, DataType dtype,
                                        ReduceOp op) {
  if (RecursiveDoublingAllreduce::Fits(count, dtype)) {
    cross_small_.Run(cross, buf, count, dtype, op);
  } else {
    cross_ring_.Run(cross, buf, count, dtype, op);
  }
}

}  // namespace horovodlike
