// The job's ranks grouped by host, for collectives that work inside each host first and across
// hosts second (hierarchical allreduce, HOROVOD_HIERARCHICAL_ALLREDUCE=1).
//
// A host here is a group of ranks that share memory (the ShmTransport of per_peer.h): a rank
// without shared memory (alone on its host, or the segment could not be mapped) is a host of its
// own. Every rank tells every other the lowest job rank of its group when the transport
// connects, so all derive the same hosts; a host's local ranks are its members in job rank
// order, as in the ShmTransport.
//
// The cross-host view of a rank joins the ranks with the same local rank on every host when all
// hosts have the same number of ranks; otherwise only the local roots (local rank 0) have one.
// Either way the view of local rank 0 is the view of the roots.
#pragma once

#include <memory>
#include <vector>

#include "shm.h"
#include "subset.h"
#include "transport.h"

namespace horovodlike {

class HostHierarchy {
 public:
  // Tells every rank of `tcp` (the job's mesh, indexed by job rank) this rank's host group
  // (`local`: its shared-memory transport, or null) and whether it asks for the hierarchy
  // (`wanted`), and learns theirs. Every rank of the job must call it at the same time, with
  // `local` outliving the result. Returns null when not every rank asked for it, or when there
  // is nothing to arrange: one host, or one rank per host. Throws TransportError when `tcp`
  // fails or the ranks report groups that do not fit together.
  static std::unique_ptr<HostHierarchy> Build(Transport& tcp, ShmTransport* local,
                                               bool wanted);

  // This host's ranks; null when this rank is alone on its host.
  Transport* local() const { return local_; }
  // The ranks this rank exchanges with across hosts; null when it has no part in that exchange
  // (a rank other than a local root, on uneven hosts).
  Transport* cross() const { return cross_.get(); }
  // Every host runs the same number of ranks.
  bool uniform() const { return uniform_; }
  int hosts() const { return hosts_; }

 private:
  HostHierarchy(Transport* local, std::unique_ptr<SubsetTransport> cross, bool uniform, int hosts)
      : local_(local), cross_(std::move(cross)), uniform_(uniform), hosts_(hosts) {}

  Transport* local_;
  std::unique_ptr<SubsetTransport> cross_;
  bool uniform_;
  int hosts_;
};

}  // namespace horovodlike
