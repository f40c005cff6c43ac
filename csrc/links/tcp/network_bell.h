// The round bell between hosts (links/link.h, core/round_bells.h; ShmLink::RingIfIdle is the
// one inside a host): every negotiation round involves every rank of each of the rank's
// process sets, so a rank whose round waits for a peer on another host that is in no round
// asks that peer for one by a datagram to its bell, instead of waiting for the peer's next
// cycle.
//
// One UDP socket per rank, on the address its TCP connections use; each rank's port and a
// random token are sent to every peer over the TCP mesh (authenticated by its handshake), and a
// bell only answers datagrams that carry its own token. A datagram lost costs what the bell
// saves: the peer comes at its next cycle, as without it.
//
// Off unless HOROVOD_ROUND_BELL=all: across hosts a peer's answer takes longer than the wait
// before ringing, so peers busy with sets of their own are rung too, and such sets paid more
// on the machine measured than idle ones gained (docs/architecture.md has the figures).
#pragma once

#include <netinet/in.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "../link.h"

namespace horovodlike {

class TcpLink;

class NetworkBell : public PeerBell {
 public:
  // Collective over `tcp` (every rank calls it at the same point, `enabled` or not, so that
  // ranks whose settings differ still agree): throws TransportError when the mesh fails;
  // returns nullptr (on this rank only) when not `enabled` or no UDP socket can be opened;
  // such a rank rings none and is rung by none.
  static std::unique_ptr<NetworkBell> Connect(TcpLink& tcp, bool enabled);
  ~NetworkBell() override;

  // Asks job rank `peer` for a round; best effort, never blocks.
  void Ring(int peer) override;
  // Waits up to timeout_ms for this rank's bell; true when it rang (every datagram waiting is
  // read). Wake() ends a wait in this process.
  bool Wait(int timeout_ms);
  void Wake();
  int64_t rings() const { return rings_.load(std::memory_order_relaxed); }

 private:
  NetworkBell(int fd, uint64_t token, std::vector<sockaddr_in> peers,
              std::vector<uint64_t> tokens, int rank);
  int fd_;
  uint64_t token_;                    // this rank's; its bell answers datagrams carrying it
  std::vector<sockaddr_in> peers_;    // each job rank's bell (this rank's own: for Wake)
  std::vector<uint64_t> tokens_;      // each job rank's token
  int rank_;
  std::atomic<int64_t> rings_{0};
};

}  // namespace horovodlike
