// The Gloo link: point-to-point over Gloo's TCP pairs, a full mesh connected through the
// launcher's rendezvous server. Selected with HOROVOD_CPU_OPERATIONS=gloo (horovodlikerun
// --gloo); compiled only when CMake finds Gloo.
//
// A peer that goes away is noticed through a TCP mesh of our own beside Gloo's pairs, whose
// stream sockets carry nothing and are only watched (gloo_hangup_watcher.h): Gloo's pairs do
// not report a peer that closed its connection. The same mesh's tagged channel carries the
// link's tagged messages. Gloo's own collectives are not used as providers: a wait
// inside them can only end by its timeout, while our ring's waits are ours to wake.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gloo_hangup_watcher.h"
#include "../link.h"
#include "../shm/shm_link.h"
#include "../tcp/tcp_link.h"

namespace gloo {
class Context;
namespace transport {
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo

namespace horovodlike {

struct Config;

class GlooLink : public Link {
 public:
  // Creates a TCP device on this rank's address, publishes it under generation `generation`
  // and connects the mesh. Throws TransportError naming the ranks that did not show up.
  static std::unique_ptr<GlooLink> Connect(const Config& config, int generation);
  ~GlooLink() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void sendrecv(int to, const void* sbuf, size_t sn, int from, void* rbuf, size_t rn) override;
  // Wakes a pending wait and closes every pair: the peers' pending and later calls fail too.
  void abort() override;
  // Tagged messages go through shared memory to the ranks of this host and over the TCP mesh
  // beside Gloo's pairs (its tagged channel) to the others (README.md says why not Gloo's own
  // slots).
  bool tagged() const override { return liveness_ != nullptr; }
  std::unique_ptr<Link::Request> isend(int peer, int tag, const void* buf, size_t n) override;
  std::unique_ptr<Link::Request> irecv(int peer, int tag, void* buf, size_t n) override;
  void progress(int timeout_ms) override;
  const char* tagged_name() const override;
  const char* name() const override { return "gloo"; }

 private:
  GlooLink(int rank, int size, std::shared_ptr<gloo::Context> context,
           std::chrono::milliseconds timeout, std::unique_ptr<TcpLink> liveness,
           std::unique_ptr<ShmLink> shm);
  // `peer`'s rank in shm_, or -1 when it is not on this host.
  int Local(int peer) const;
  void CheckUsable(int peer);
  [[noreturn]] void Fail(const std::string& what, int peer, TransportError::Cause cause);
  // The watcher's report: later calls with `peer` fail, and so does a wait on it now.
  void OnHangup(int peer);
  // Starts a send to, or receive from, `peer` of n bytes at data.
  std::unique_ptr<gloo::transport::UnboundBuffer> Post(bool send, int peer, void* data,
                                                       size_t n);
  // Waits for a posted transfer; throws TransportError when it fails, times out, or is woken
  // by abort() or the watcher.
  void Await(std::unique_ptr<gloo::transport::UnboundBuffer>& buffer, bool send, int peer);
  void ForgetPending();
  void TakeFromInbox(int peer, char*& rp, size_t& rn);

  int rank_;
  int size_;
  std::shared_ptr<gloo::Context> context_;  // null for a job of one
  std::chrono::milliseconds timeout_;       // no progress for this long is a failure
  std::atomic<bool> aborted_{false};
  struct Pending {
    gloo::transport::UnboundBuffer* buffer;
    int peer;
    bool send;
  };
  std::mutex pending_mutex_;     // guards what follows against abort() and the watcher
  std::vector<Pending> pending_;  // transfers posted and not yet waited for
  std::vector<std::string> lost_;  // lost_[peer]: why that peer is gone; empty while it is not
  // Per peer: bytes of a frame not yet handed to a receive, and the size of the frame's
  // second message when it is still to come.
  struct Inbox {
    std::vector<char> bytes;
    size_t offset = 0;
    size_t payload_left = 0;
  };
  std::vector<Inbox> inbox_;
  std::vector<char> send_header_;  // the frame header being sent
  std::vector<char> recv_header_;  // the frame header being received
  std::unique_ptr<TcpLink> liveness_;  // null for a job of one
  std::unique_ptr<ShmLink> shm_;       // tagged messages to this host's ranks; may be null
  std::vector<int> local_;             // job rank -> rank in shm_, or -1
  std::unique_ptr<GlooHangupWatcher> watcher_;  // last member: it calls back into this one
};

}  // namespace horovodlike
