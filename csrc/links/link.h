// A link moves bytes between two ranks and knows nothing of collectives: the algorithms over
// links, and the libraries' own collectives, are the providers of ../collectives/.
//
// Two ways to move bytes, side by side on the same connections:
//   - the ordered stream (sendrecv, send, recv): blocking, untagged, full duplex, no header on
//     the wire. Between two ranks the bytes form one ordered stream: a send need not be matched
//     by a receive of the same size (a collective may send a whole chunk while its peer
//     receives it in segments). The collectives use it, and nothing else does.
//   - tagged messages (isend, irecv): asynchronous, each a whole message matched by (peer,
//     tag) in the order sent, completed through the Request returned. Point-to-point and
//     pipelines use them. No thread of the link moves them: the caller's test(), wait() and
//     progress() do (a waiter reads what arrived for every tag and keeps what is not yet
//     received), so a link that offers them starts no thread per peer.
// How each backend keeps the two apart without a header on the stream is its own business
// (README.md): TCP has a second socket per peer in the same mesh, MPI and Gloo their own tags.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "../common/common.h"

namespace horovodlike {

class HostHierarchy;
class MpiLink;
class ShmLink;
class TcpLink;

// The round bells (shm/shm_link.h inside a host, tcp/network_bell.h between hosts): every
// negotiation round involves every rank of each of a rank's process sets, so a round that has
// no work of its own in a set (its part there is only to keep in step) but has some in another
// set, and waits for a peer that is in no round (its loop asleep until its next cycle), asks
// that peer for one. The
// Runtime turns ringing on for such a negotiation, on the thread that runs it; a wait of that
// thread for a peer that has sent nothing for kRingAfterUs then rings the peer: through the
// shared segment inside a host, or `network` between hosts (null: no bell between hosts).
class PeerBell {
 public:
  virtual ~PeerBell() = default;
  virtual void Ring(int peer) = 0;
  static constexpr int kRingAfterUs = 50;
  // A rank whose rounds took in work of its own this recently is busy: it comes to the next
  // round by itself, and a bell would only cost it two thread wake-ups.
  static constexpr int64_t kBusyNs = 200000;
};
void SetNegotiationRinging(bool on, PeerBell* network);
bool NegotiationRinging();
PeerBell* NegotiationBell();  // the network bell while ringing is on, else null

class Link {
 public:
  // A tagged send or receive in flight. Its buffer must stay valid until it completes (or the
  // link is aborted). Destroying an unfinished send leaves the rest of it to the link (the
  // buffer must stay valid); destroying an unfinished receive withdraws it where the link
  // can (TCP and shared memory: a message meant for it is kept for the next receive of its
  // tag), so its buffer may go.
  class Request {
   public:
    virtual ~Request() = default;
    // Moves the link's tagged transfers along without waiting; true once this one is complete.
    // Throws TransportError when it failed (its peer was lost, the link aborted, a size
    // mismatch), at once and on every later call.
    virtual bool test() = 0;
    // Blocks until complete. Interruptible (common/interrupt.h) and bounded by the peer timeout
    // like the stream's waits; throws TransportError as test() does.
    virtual void wait() = 0;
  };

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

  // Tagged messages (see above); tags are from 0 to 2**31 - 1. A send is written as far as the
  // connection takes at once; the rest goes when a request of this link is tested or waited
  // for. A receive takes one message of exactly n bytes (a message of another size fails it).
  // Links without them (tagged() false) throw TransportError.
  virtual bool tagged() const { return false; }
  virtual std::unique_ptr<Request> isend(int peer, int tag, const void* buf, size_t n);
  virtual std::unique_ptr<Request> irecv(int peer, int tag, void* buf, size_t n);
  // For a caller with several requests: moves every tagged transfer along, waiting at most
  // `timeout_ms` for something to happen (0: no wait). Throws only when the link is aborted;
  // a lost peer fails its own requests.
  virtual void progress(int timeout_ms);
  // progress(), whose wait also ends when descriptor `wake_fd` becomes readable (a link that
  // cannot watch one waits as progress() does).
  virtual void progress_or_readable(int timeout_ms, int wake_fd) {
    (void)wake_fd;
    progress(timeout_ms);
  }
  // What carries the tagged messages, named as name() names links ("tcp", "mpi").
  virtual const char* tagged_name() const { return name(); }

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
  // The TCP mesh this link runs over, or null.
  virtual TcpLink* tcp_mesh() { return nullptr; }
};

}  // namespace horovodlike
