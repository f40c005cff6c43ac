// A link moves bytes between two ranks and knows nothing of collectives: the algorithms over
// links, and the libraries' own collectives, are the providers of ../collectives/.
// Blocking, point-to-point, full duplex.
// Between two ranks the bytes form one ordered stream: a send need not be matched by a receive of
// the same size (a collective may send a whole chunk while its peer receives it in segments), so
// a backend with message semantics (MPI, Gloo) must buffer or split to honour this.
#pragma once

#include <cstddef>

#include "../common/common.h"

namespace horovodlike {

class HostHierarchy;
class MpiLink;
class ShmLink;

class Link {
 public:
  virtual ~Link() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Sends to `to` while receiving from `from`; never deadlocks when both sides call it at once.
  // Each call moves exactly sn and rn bytes or throws TransportError.
  virtual void sendrecv(int to, const void* sbuf, size_t sn, int from, void* rbuf, size_t rn) = 0;
  // One direction only: sendrecv with nothing the other way, unless a link does better.
  virtual void send(int peer, const void* buf, size_t n) {
    sendrecv(peer, buf, n, peer, nullptr, 0);
  }
  virtual void recv(int peer, void* buf, size_t n) { sendrecv(peer, nullptr, 0, peer, buf, n); }
  // Closes every connection; pending and later calls throw TransportError.
  virtual void abort() = 0;
  // Short name for logs and --check-build ("tcp", "shm", "shm+tcp", "mpi", "gloo").
  virtual const char* name() const { return "unknown"; }
  // Whether its waits that last ask the thread's interrupt check (common/interrupt.h) and throw
  // TransportError (cause kInterrupted) when it says so. A caller's thread runs rounds itself
  // only over links that do.
  virtual bool interruptible() const { return false; }

  // What the link offers the collective providers besides bytes (their registrations check it,
  // collectives/provider_registry.h); null where it has none. The shared-memory link among the
  // ranks of this host, the job's ranks grouped by host (when the job asked for hierarchical
  // collectives), and the MPI link itself, whose communicator runs MPI's own collectives.
  virtual ShmLink* shared_memory() const { return nullptr; }
  virtual const HostHierarchy* hosts() const { return nullptr; }
  virtual MpiLink* mpi() { return nullptr; }
};

}  // namespace horovodlike
