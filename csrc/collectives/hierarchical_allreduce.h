// Hierarchical allreduce: inside each host first, across hosts second, so that the slower links
// between hosts carry less and fewer ranks take part in each exchange over them.
//
// Hosts with equal numbers of ranks (L each):
//   1. ring reduce-scatter inside the host: local rank l owns the host's sum of block l (1/L);
//   2. allreduce of block l across hosts, among the ranks with local rank l: the L local
//      ranks each carry 1/L of the traffic between hosts, at the same time (recursive doubling
//      for small blocks, the ring above);
//   3. ring allgather inside the host.
// Uneven hosts: the host's own allreduce (shared memory), an allreduce across hosts among the
// local roots (recursive doubling or ring, by size), and a broadcast from the root inside the host.
// Each partial result is computed in one order, by one rank or identically by all of a host, and
// is only copied from then on: every rank gets the same bits.
#pragma once

#include <cstddef>
#include <vector>

#include "../common/common.h"
#include "../links/host_hierarchy.h"
#include "provider.h"
#include "recursive_doubling_allreduce.h"
#include "ring_allreduce.h"
#include "ring_reducescatter.h"

namespace horovodlike {

class HierarchicalAllreduce {
 public:
  // In place over every rank of the job; Average is reduced as Sum (the caller scales).
  // `host_allreduce`: the allreduce over hosts.local() (shared memory's own), or null for the
  // ring over it.
  void Run(const HostHierarchy& hosts, AllreduceProvider* host_allreduce, void* buf,
           size_t count, DataType dtype, ReduceOp op);

 private:
  void AcrossLocalRanks(const HostHierarchy& hosts, void* buf, size_t count, DataType dtype,
                        ReduceOp op);
  void ThroughLocalRoots(const HostHierarchy& hosts, AllreduceProvider* host_allreduce,
                         void* buf, size_t count, DataType dtype, ReduceOp op);
  // Across hosts: every rank of `cross` passes the same count.
  void AcrossHosts(Link& cross, void* buf, size_t count, DataType dtype, ReduceOp op);

  // Reused across calls: the rings keep one segment of scratch each.
  RingReducescatter local_reducescatter_;
  RingAllreduce local_ring_;
  RingAllreduce cross_ring_;
  RecursiveDoublingAllreduce cross_small_;  // across hosts up to its kMaxBytes
  std::vector<size_t> block_counts_;
  std::vector<size_t> block_bytes_;
};

}  // namespace horovodlike
