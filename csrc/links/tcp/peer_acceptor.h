// The listener's side of the TCP mesh: accepts the higher ranks on this rank's listening socket.
// One event loop drives every connection's handshake (peer_handshake.h), so a stranger who
// connects and says nothing, or trickles garbage, never holds up another connection. Each one
// has its own deadline, and a cap on connections still in their handshake (from the process's
// file-descriptor limit) is kept by dropping the one heard from least recently, never by
// refusing new ones: a flood of silent connections cannot exhaust the descriptors, nor keep a
// real rank out.
#pragma once

#include <chrono>
#include <vector>

namespace horovodlike {

struct Config;
class RendezvousClient;

// Accepts until every rank above this one has connected twice (fds[rank] set to its stream's
// socket, fds[size + rank] to its tagged channel's) or the deadline has passed (the caller names the ranks still absent). Throws TransportError when the
// launcher stops the job (`rendezvous`, when not null, is watched for that). Does not close
// `listen_fd`.
void AcceptPeers(const Config& config, int generation, int listen_fd, std::vector<int>& fds,
                 std::chrono::steady_clock::time_point deadline, RendezvousClient* rendezvous);

}  // namespace horovodlike
