// The built-in link: a full mesh of TCP connections, addresses exchanged through the
// launcher's rendezvous server. Two sockets per pair of ranks, both opened by the same set-up
// and handshake: the stream's (sendrecv, no header) and the tagged channel's (isend/irecv,
// tagged_channel.h), so that neither needs to tell the other's bytes apart.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../link.h"
#include "tagged_channel.h"

namespace horovodlike {

struct Config;
class RendezvousClient;

class TcpLink : public Link {
 public:
  // Listens, publishes this rank's address under generation `generation`, connects the mesh.
  // Throws TransportError naming the ranks that did not show up before the start timeout.
  // `channel` names the mesh in the rendezvous (a Gloo job's liveness mesh has its own).
  static std::unique_ptr<TcpLink> Connect(const Config& config, int generation,
                                          const std::string& channel = "addr");
  // The same mesh where every rank's "host:port" is known already (exchanged over MPI in a job
  // that mpirun started without the launcher): `listen_fd` (taken over) listens at this rank's
  // entry of `addresses`, and config.secret_key is the same on every rank.
  static std::unique_ptr<TcpLink> ConnectWithAddresses(const Config& config, int generation,
                                                       int listen_fd,
                                                       const std::vector<std::string>& addresses);
  ~TcpLink() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void sendrecv(int to, const void* sbuf, size_t sn, int from, void* rbuf, size_t rn) override;
  void abort() override;
  bool tagged() const override { return true; }
  std::unique_ptr<Link::Request> isend(int peer, int tag, const void* buf, size_t n) override;
  std::unique_ptr<Link::Request> irecv(int peer, int tag, void* buf, size_t n) override;
  void progress(int timeout_ms) override { tagged_.Progress(timeout_ms); }
  void progress_or_readable(int timeout_ms, int wake_fd) override {
    tagged_.Progress(timeout_ms, wake_fd);
  }
  const char* name() const override { return "tcp"; }
  bool interruptible() const override { return true; }
  TcpLink* tcp_mesh() override { return this; }
  // The connected socket to `peer` (-1 for this rank), for a watcher that only polls it.
  int socket(int peer) const { return fds_[peer]; }
  // How long a peer may stay silent from now on; set before the link is shared between threads
  // (a mesh over MPI for point-to-point alone is set up under the peer timeout, then may stay
  // idle for ever).
  void set_timeout_seconds(double seconds) {
    timeout_ms_ = static_cast<int>(std::min(seconds * 1000, 2e9));
    tagged_.set_timeout_ms(timeout_ms_);
  }

 private:
  TcpLink(int rank, int size, std::vector<int> fds, std::vector<int> tagged_fds,
          double timeout_seconds);
  // Dials the lower ranks (`address_of` returns false for one that never published) and
  // accepts the higher ones on `listen_fd` (closed in any case); `rendezvous`, when not null,
  // is watched for the launcher stopping the job.
  static std::unique_ptr<TcpLink> ConnectMesh(
      const Config& config, int generation, int listen_fd,
      std::chrono::steady_clock::time_point deadline, RendezvousClient* rendezvous,
      const std::function<bool(int, std::string*)>& address_of);
  [[noreturn]] void Fail(int peer, const std::string& what, TransportError::Cause cause);
  int Fd(int peer) const;

  int rank_;
  int size_;
  std::vector<int> fds_;  // fds_[peer]; -1 for this rank
  int timeout_ms_;        // no progress on a peer for this long is a failure
  std::atomic<bool> aborted_{false};
  TaggedChannel tagged_;
};

}  // namespace horovodlike
