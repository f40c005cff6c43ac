// The job's ranks grouped by host, for collectives that work inside each host first and across
// hosts second (hierarchical allreduce and allgather, HOROVOD_HIERARCHICAL_ALLREDUCE=1 and
// HOROVOD_HIERARCHICAL_ALLGATHER=1).
//
// A host here is a group of ranks that share memory (the ShmLink of per_peer_link.h): a rank
// without shared memory (alone on its host, or the segment could not be mapped) is a host of its
// own. Every rank tells every other the lowest job rank of its group when the link
// connects, so all derive the same hosts; a host's local ranks are its members in job rank
// order, as in the ShmLink.
//
// The cross-host view of a rank joins the ranks with the same local rank on every host when all
// hosts have the same number of ranks; otherwise only the local roots (local rank 0) have one.
// Either way the view of local rank 0 is the view of the roots.
#pragma once

#include <memory>
#include <vector>

#include "shm/shm_link.h"
#include "subset_link.h"
#include "link.h"

namespace horovodlike {

class HostHierarchy {
 public:
  // Which collectives a rank asks to run by host.
  struct Wanted {
    bool allreduce = false;
    bool allgather = false;
  };

  // Tells every rank of `tcp` (the job's mesh, indexed by job rank) this rank's host group
  // (`local`: its shared-memory link, or null) and which collectives it asks to run by
  // host (`wanted`), and learns theirs, in one exchange. Every rank of the job must call it at
  // the same time, with `local` outliving the result. A collective goes by host only when every
  // rank asked for it. Returns null when no collective does, or when there is nothing to
  // arrange: one host, or one rank per host. Throws TransportError when `tcp` fails or the
  // ranks report groups that do not fit together.
  static std::unique_ptr<HostHierarchy> Build(Link& tcp, ShmLink* local,
                                               Wanted wanted);

  // Whether every rank asked for the hierarchical allreduce / allgather.
  bool allreduce() const { return allreduce_; }
  bool allgather() const { return allgather_; }

  // This host's ranks; null when this rank is alone on its host.
  ShmLink* local() const { return local_; }
  // The ranks this rank exchanges with across hosts; null when it has no part in that exchange
  // (a rank other than a local root, on uneven hosts).
  Link* cross() const { return cross_.get(); }
  // Every host runs the same number of ranks.
  bool uniform() const { return uniform_; }
  int hosts() const { return hosts_; }
  // Every host's job ranks, hosts in the order of their lowest rank (the order of the local
  // roots in the cross-host view), each host's ranks in job rank order (its local ranks).
  const std::vector<std::vector<int>>& host_ranks() const { return host_ranks_; }
  // This rank's host: its index in host_ranks(), and its place there (its local rank).
  int host_index() const { return host_index_; }
  int local_rank() const { return local_rank_; }
  // The job's ranks listed host by host (host_ranks() in turn) are in job rank order: each
  // host's ranks are consecutive. The launcher assigns ranks so; mpirun may not.
  bool contiguous() const { return contiguous_; }

 private:
  HostHierarchy() = default;

  ShmLink* local_ = nullptr;
  std::unique_ptr<SubsetLink> cross_;
  bool uniform_ = false;
  int hosts_ = 0;
  bool allreduce_ = false;
  bool allgather_ = false;
  std::vector<std::vector<int>> host_ranks_;
  int host_index_ = 0;
  int local_rank_ = 0;
  bool contiguous_ = true;
};

}  // namespace horovodlike
