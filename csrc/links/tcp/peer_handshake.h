// The handshake that opens each connection of the TCP mesh: both ranks prove that they know the
// job's secret, the listener first. The dialer's side is one blocking call; the listener's side
// is a state machine fed as bytes arrive, so that one listener serves many connections at once
// (peer_acceptor.h).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace horovodlike {

struct Config;
class RendezvousClient;

// Connects to the lower rank `peer` at `address` ("host:port") and runs the dialer's side of the
// handshake; returns the connected socket. A listener that closes the connection without an
// answer (one shedding idle connections under a flood of strangers) is dialled again, a few
// times. Throws TransportError; `rendezvous`, when not null, is watched for the launcher
// stopping the job.
int DialPeer(const Config& config, int generation, int peer, const std::string& address,
             std::chrono::steady_clock::time_point deadline, RendezvousClient* rendezvous);

// The listener's side of one connection.
class ListenerHandshake {
 public:
  enum class Step { kWaiting, kAccepted, kRejected };
  // Reads what the dialer has sent on the non-blocking socket `fd` and answers it. kAccepted:
  // the dialer proved that it is rank claimed_rank(), and the connection fills slot() of
  // `connected` (two sockets per rank: [rank] its stream, [size + rank] its tagged channel,
  // -1 where none yet; a rank's first connection is its stream); kRejected: drop the
  // connection, *why says why.
  Step Advance(int fd, const Config& config, int generation, const std::vector<int>& connected,
               std::string* why);
  int claimed_rank() const { return claimed_; }
  int slot() const { return slot_; }
  // Whether the dialer has sent anything yet.
  bool started() const { return started_; }

 private:
  Step OnHello(int fd, const Config& config, int generation, const std::vector<int>& connected,
               std::string* why);
  Step OnProof(int fd, const Config& config, int generation, const std::vector<int>& connected,
               std::string* why);

  static constexpr size_t kMaxMessageBytes = 44;  // the Hello; the Proof is 32
  uint8_t message_[kMaxMessageBytes] = {};
  size_t got_ = 0;            // bytes of the message being read
  bool challenged_ = false;   // the Hello was read and the Challenge sent
  bool started_ = false;
  int claimed_ = -1;
  int slot_ = -1;
  uint8_t dialer_nonce_[32] = {};
  uint8_t listener_nonce_[32] = {};
};

}  // namespace horovodlike
