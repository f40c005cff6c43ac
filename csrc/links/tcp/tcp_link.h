// The built-in link: one TCP connection per pair of ranks (a full mesh), addresses
// exchanged through the launcher's rendezvous server.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "../link.h"

namespace horovodlike {

struct Config;

class TcpLink : public Link {
 public:
  // Listens, publishes this rank's address under generation `generation`, connects the mesh.
  // Throws TransportError naming the ranks that did not show up before the start timeout.
  // `channel` names the mesh in the rendezvous, so that a job can connect a second, independent
  // one (point-to-point traffic has its own, see core/point_to_point.h).
  static std::unique_ptr<TcpLink> Connect(const Config& config, int generation,
                                          const std::string& channel = "addr");
  ~TcpLink() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void send(int peer, const void* buf, size_t n) override;
  void recv(int peer, void* buf, size_t n) override;
  void sendrecv(int to, const void* sbuf, size_t sn, int from, void* rbuf, size_t rn) override;
  void abort() override;
  const char* name() const override { return "tcp"; }
  // The connected socket to `peer` (-1 for this rank), for a watcher that only polls it.
  int socket(int peer) const { return fds_[peer]; }

 private:
  TcpLink(int rank, int size, std::vector<int> fds, double timeout_seconds);
  [[noreturn]] void Fail(int peer, const std::string& what, TransportError::Cause cause);
  int Fd(int peer) const;

  int rank_;
  int size_;
  std::vector<int> fds_;  // fds_[peer]; -1 for this rank
  int timeout_ms_;        // no progress on a peer for this long is a failure
  std::atomic<bool> aborted_{false};
};

}  // namespace horovodlike
