// The link chosen per peer: shared memory for ranks on this host, TCP for the others.
//
// The TCP mesh is always connected first: it carries the traffic to other hosts, and the set-up
// of the shared segment (host identities, the segment's name). Ranks count as local when they
// report the same host identity (boot id, the /dev/shm instance and the host name) and can map
// the same segment; HOROVOD_SHM_DISABLE=1 makes every peer use TCP.
//
// With HOROVOD_HIERARCHICAL_ALLREDUCE=1 on a job over several hosts, the link also offers
// the ranks grouped by host (host_hierarchy.h); a rank alone on its host then has no shared
// memory but still takes part in that grouping.
#pragma once

#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "host_hierarchy.h"
#include "shm/shm_link.h"
#include "link.h"

namespace horovodlike {

struct Config;

// The shared memory among the ranks of this host that share it (the host identities exchanged
// over `tcp`, the job's TCP mesh; every rank must call it); null when this rank has no peer on
// its host, shared memory is disabled (HOROVOD_SHM_DISABLE) or cannot be mapped.
std::unique_ptr<ShmLink> ConnectHostSharedMemory(Link& tcp, const Config& config,
                                                 int generation);
// For a link whose tagged messages go through `shm` to the ranks of this host (when not null)
// and `tcp` to the others: progress() over both, and what carries them ("shm", "shm+tcp",
// "tcp").
void ProgressTaggedOnBoth(ShmLink* shm, Link& tcp, int timeout_ms);
const char* TaggedCarrier(const ShmLink* shm, const Link& tcp);

class PerPeerLink : public Link {
 public:
  // Connects TCP, then shared memory among the ranks of each host, then agrees on the host
  // grouping. Returns the plain TCP link when no rank shares this host (or shared memory is
  // disabled or unavailable) and there is no hierarchy to offer.
  static std::unique_ptr<Link> Connect(const Config& config, int generation);
  ~PerPeerLink() override;

  int rank() const override { return tcp_->rank(); }
  int size() const override { return tcp_->size(); }
  void send(int peer, const void* buf, size_t n) override;
  void recv(int peer, void* buf, size_t n) override;
  void sendrecv(int to, const void* sbuf, size_t sn, int from, void* rbuf, size_t rn) override;
  // Tagged messages go as the stream does: through shared memory to the ranks of this host,
  // over the TCP mesh's tagged channel to the others.
  bool tagged() const override { return tcp_->tagged(); }
  std::unique_ptr<Link::Request> isend(int peer, int tag, const void* buf, size_t n) override;
  std::unique_ptr<Link::Request> irecv(int peer, int tag, void* buf, size_t n) override;
  void progress(int timeout_ms) override;
  const char* tagged_name() const override;
  void abort() override;
  const char* name() const override;
  bool interruptible() const override { return tcp_->interruptible(); }
  // For the collective providers: the shared-memory link among the ranks of this host (null
  // when this rank is alone on it), and the ranks grouped by host when the job asked for
  // hierarchical collectives (null otherwise; the same on every rank).
  ShmLink* shared_memory() const override { return shm_.get(); }
  const HostHierarchy* hosts() const override { return hierarchy_.get(); }
  TcpLink* tcp_mesh() override { return tcp_->tcp_mesh(); }

 private:
  PerPeerLink(std::unique_ptr<Link> tcp, std::unique_ptr<ShmLink> shm,
              std::unique_ptr<HostHierarchy> hierarchy);
  // The link that carries traffic to job rank `peer`, and the peer's rank in it.
  Link& Route(int peer, int* routed);
  // Sends on a helper thread while this thread receives: full duplex across two links.
  void MixedSendRecv(Link& st, int to, const void* sbuf, size_t sn, Link& rt, int from,
                     void* rbuf, size_t rn);
  void SenderLoop();

  std::unique_ptr<Link> tcp_;
  std::unique_ptr<ShmLink> shm_;  // null when this rank is alone on its host
  std::vector<int> local_;  // job rank -> rank within shm_, or -1 for TCP
  std::unique_ptr<HostHierarchy> hierarchy_;  // views of tcp_ and shm_: declared after them

  // The helper thread of MixedSendRecv (started on first use).
  struct SendJob {
    Link* link = nullptr;
    int peer = 0;
    const void* buf = nullptr;
    size_t n = 0;
    bool pending = false;
    bool done = false;
    std::exception_ptr error;
  };
  std::mutex sender_mutex_;
  std::condition_variable sender_cv_;
  SendJob job_;
  bool sender_stop_ = false;
  std::thread sender_;
};

}  // namespace horovodlike
