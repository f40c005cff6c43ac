// Hierarchical allgather (allgatherv): inside each host first, across hosts second, so that
// only one rank per host sends over the slower links between hosts, and each host's data
// crosses them once per other host rather than once per rank.
//
//   1. ring allgatherv inside the host: every local rank holds the host's blocks (its segment);
//   2. ring allgatherv of whole host segments across hosts, among the local roots;
//   3. chain broadcast inside the host, from the local root, of the other hosts' segments.
//
// The steps work on the job's blocks laid out host by host. When each host's ranks are
// consecutive in job rank order (as the launcher assigns them), that is the output itself;
// otherwise a scratch buffer in host order, copied into job rank order at the end. Every byte
// is only copied, so the result equals the flat ring's exactly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "../links/host_hierarchy.h"

namespace horovodlike {

class HierarchicalAllgather {
 public:
  // Over every rank of the job. `out` holds every rank's block in job rank order, this rank's
  // already at its offset; block_bytes[r] is the size of job rank r's block.
  void Run(const HostHierarchy& hosts, void* out, const std::vector<size_t>& block_bytes);

 private:
  // Reused across calls: running one allocates nothing once the sizes have been seen.
  std::vector<uint8_t> scratch_;           // blocks in host order, for hosts not in rank order
  std::vector<size_t> job_offset_;         // job rank r's block in the output
  std::vector<size_t> host_order_offset_;  // job rank r's block in host order
  std::vector<size_t> local_bytes_;        // this host's blocks, by local rank
  std::vector<size_t> host_bytes_;         // each host's segment, by host
};

}  // namespace horovodlike
