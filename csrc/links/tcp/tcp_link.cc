#include "tcp_link.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <sstream>

#include "../../common/common.h"
#include "../../common/env_config.h"
#include "../../common/interrupt.h"
#include "../../common/logging.h"
#include "../rendezvous_client.h"
#include "peer_acceptor.h"
#include "peer_handshake.h"
#include "socket_util.h"

namespace horovodlike {
namespace {

constexpr int kSocketBufferBytes = 4 << 20;

std::string JoinRanks(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

std::string Seconds(double seconds) {
  std::ostringstream out;
  out << seconds;
  return out.str();
}

void TuneSocket(int fd) {
  SetNoDelay(fd);
  int size = kSocketBufferBytes;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof(size));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));
}

}  // namespace

std::unique_ptr<TcpLink> TcpLink::Connect(const Config& config, int generation,
                                          const std::string& channel) {
  const double timeout_seconds = config.peer_timeout_seconds;
  if (config.size == 1) {
    if (!config.rendezvous_addr.empty() && config.rendezvous_port > 0) {
      // Started by the launcher: tell it this rank joined, or --start-timeout stops the job.
      const auto deadline = std::chrono::steady_clock::now() +
                            std::chrono::milliseconds(
                                static_cast<int64_t>(config.start_timeout_seconds * 1000));
      RendezvousClient rendezvous(config.rendezvous_addr, config.rendezvous_port,
                                  config.secret_key, deadline);
      rendezvous.Put(channel + "/" + std::to_string(generation) + "/0", "single");
    }
    return std::unique_ptr<TcpLink>(new TcpLink(0, 1, {-1}, {-1}, timeout_seconds));
  }
  if (config.rendezvous_addr.empty() || config.rendezvous_port <= 0) {
    throw InvalidArgument("HOROVOD_SIZE=" + std::to_string(config.size) +
                          " but no rendezvous server is set (HOROVOD_RENDEZVOUS_ADDR/PORT); "
                          "start the job with horovodlikerun");
  }
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(
                            static_cast<int64_t>(config.start_timeout_seconds * 1000));
  const std::string address = config.network_interface.empty()
      ? LocalAddressToward(config.rendezvous_addr, config.rendezvous_port)
      : InterfaceAddress(config.network_interface);
  int port = 0;
  int listen_fd = ListenOn(address, &port);
  const std::string prefix = channel + "/" + std::to_string(generation) + "/";
  std::unique_ptr<RendezvousClient> rendezvous;
  try {
    rendezvous = std::make_unique<RendezvousClient>(config.rendezvous_addr,
                                                    config.rendezvous_port, config.secret_key,
                                                    deadline);
    rendezvous->Put(prefix + std::to_string(config.rank), address + ":" + std::to_string(port));
  } catch (...) {
    ::close(listen_fd);
    throw;
  }
  return ConnectMesh(config, generation, listen_fd, deadline, rendezvous.get(),
                     [&](int peer, std::string* value) {
                       return rendezvous->Get(prefix + std::to_string(peer), value);
                     });
}

std::unique_ptr<TcpLink> TcpLink::ConnectWithAddresses(const Config& config, int generation,
                                                       int listen_fd,
                                                       const std::vector<std::string>& addresses) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(
                            static_cast<int64_t>(config.start_timeout_seconds * 1000));
  return ConnectMesh(config, generation, listen_fd, deadline, nullptr,
                     [&](int peer, std::string* value) {
                       *value = addresses.at(static_cast<size_t>(peer));
                       return true;
                     });
}

std::unique_ptr<TcpLink> TcpLink::ConnectMesh(
    const Config& config, int generation, int listen_fd,
    std::chrono::steady_clock::time_point deadline, RendezvousClient* rendezvous,
    const std::function<bool(int, std::string*)>& address_of) {
  // fds[peer]: the stream's socket; fds[size + peer]: the tagged channel's.
  std::vector<int> fds(2 * static_cast<size_t>(config.size), -1);
  try {
    // Lower ranks are dialled; higher ranks dial us.
    std::vector<int> missing;
    for (int peer = 0; peer < config.rank; ++peer) {
      std::string value;
      if (!address_of(peer, &value)) {
        missing.push_back(peer);
        continue;
      }
      try {
        // The stream first, then the tagged channel: the listener tells them apart by order.
        fds[peer] = DialPeer(config, generation, peer, value, deadline, rendezvous);
        fds[config.size + peer] = DialPeer(config, generation, peer, value, deadline,
                                           rendezvous);
      } catch (const TransportError& e) {
        if (e.peer() >= 0) throw;
        throw TransportError(e.what(), peer, TransportError::Cause::kPeerLost);
      }
    }
    if (!missing.empty()) {
      throw TransportError("ranks " + JoinRanks(missing) + " did not join within " +
                           Seconds(config.start_timeout_seconds) + " s (HOROVOD_START_TIMEOUT)");
    }
    AcceptPeers(config, generation, listen_fd, fds, deadline, rendezvous);
    std::vector<int> absent;
    for (int peer = config.rank + 1; peer < config.size; ++peer) {
      if (fds[peer] < 0 || fds[config.size + peer] < 0) absent.push_back(peer);
    }
    if (!absent.empty()) {
      throw TransportError("ranks " + JoinRanks(absent) + " did not connect within " +
                           Seconds(config.start_timeout_seconds) + " s (HOROVOD_START_TIMEOUT)");
    }
  } catch (...) {
    ::close(listen_fd);
    for (int fd : fds) if (fd >= 0) ::close(fd);
    throw;
  }
  ::close(listen_fd);
  for (int fd : fds) {
    if (fd >= 0) {
      TuneSocket(fd);
      SetNonBlocking(fd, true);
    }
  }
  std::vector<int> tagged(fds.begin() + config.size, fds.end());
  fds.resize(static_cast<size_t>(config.size));
  return std::unique_ptr<TcpLink>(new TcpLink(config.rank, config.size, std::move(fds),
                                              std::move(tagged), config.peer_timeout_seconds));
}

TcpLink::TcpLink(int rank, int size, std::vector<int> fds, std::vector<int> tagged_fds,
                 double timeout_seconds)
    : rank_(rank), size_(size), fds_(std::move(fds)),
      timeout_ms_(static_cast<int>(std::min(timeout_seconds * 1000, 2e9))),
      tagged_(rank, std::move(tagged_fds), timeout_ms_) {}

TcpLink::~TcpLink() {
  for (int fd : fds_) if (fd >= 0) ::close(fd);
}

void TcpLink::abort() {
  aborted_ = true;
  for (int fd : fds_) if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
  tagged_.Abort();
}

std::unique_ptr<Link::Request> TcpLink::isend(int peer, int tag, const void* buf, size_t n) {
  return tagged_.Send(peer, tag, buf, n);
}

std::unique_ptr<Link::Request> TcpLink::irecv(int peer, int tag, void* buf, size_t n) {
  return tagged_.Recv(peer, tag, buf, n);
}

int TcpLink::Fd(int peer) const {
  if (peer < 0 || peer >= size_ || peer == rank_) {
    throw TransportError("no connection to rank " + std::to_string(peer));
  }
  return fds_[peer];
}

void TcpLink::Fail(int peer, const std::string& what, TransportError::Cause cause) {
  if (aborted_) throw TransportError("the link was shut down");
  throw TransportError("lost connection to rank " + std::to_string(peer) + ": " + what, peer,
                       cause);
}

void TcpLink::sendrecv(int to, const void* sbuf, size_t sn, int from, void* rbuf,
                            size_t rn) {
  const int sfd = sn > 0 ? Fd(to) : -1;
  const int rfd = rn > 0 ? Fd(from) : -1;
  const auto* sp = static_cast<const uint8_t*>(sbuf);
  auto* rp = static_cast<uint8_t*>(rbuf);
  // A thread with an interrupt check (common/interrupt.h) sleeps in slices to ask it.
  const bool interruptible = InterruptCheckInstalled();
  std::chrono::steady_clock::time_point idle_since;
  if (interruptible) idle_since = std::chrono::steady_clock::now();
  // A negotiation that rings (link.h): a peer that sends nothing for a moment may be in no
  // round.
  PeerBell* bell = rn > 0 ? NegotiationBell() : nullptr;
  while (sn > 0 || rn > 0) {
    bool progressed = false;
    if (sn > 0) {
      ssize_t w = ::send(sfd, sp, sn, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) {
        sp += w; sn -= static_cast<size_t>(w); progressed = true;
      } else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        Fail(to, std::strerror(errno), TransportError::Cause::kPeerLost);
      }
    }
    if (rn > 0) {
      ssize_t r = ::recv(rfd, rp, rn, MSG_DONTWAIT);
      if (r > 0) {
        rp += r; rn -= static_cast<size_t>(r); progressed = true;
      } else if (r == 0) {
        Fail(from, "the peer closed the connection (it exited or was killed)",
             TransportError::Cause::kPeerLost);
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        Fail(from, std::strerror(errno), TransportError::Cause::kPeerLost);
      }
    }
    if (progressed || (sn == 0 && rn == 0)) {
      if (interruptible) idle_since = std::chrono::steady_clock::now();
      continue;
    }
    pollfd p[2];
    int count = 0;
    if (sn > 0) p[count++] = {sfd, POLLOUT, 0};
    if (rn > 0) p[count++] = {rfd, POLLIN, 0};
    if (bell != nullptr && rn > 0) {
      const timespec moment{0, PeerBell::kRingAfterUs * 1000};
      const int ready = ::ppoll(p, count, &moment, nullptr);
      if (ready == 0) bell->Ring(from);
      bell = nullptr;  // once per wait
      if (ready != 0) continue;
    }
    int slice_ms = timeout_ms_;
    if (interruptible) {
      const auto idle = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::steady_clock::now() - idle_since);
      if (idle >= kInterruptAfter && InterruptRequested()) {
        const int silent = rn > 0 ? from : to;
        throw TransportError(InterruptedWaitMessage(silent), silent,
                             TransportError::Cause::kInterrupted);
      }
      const int left = timeout_ms_ - static_cast<int>(idle.count());
      slice_ms = std::max(0, std::min(left, 100));  // then every 100 ms
    }
    int rc = ::poll(p, count, slice_ms);
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0 && interruptible &&
        std::chrono::steady_clock::now() - idle_since < std::chrono::milliseconds(timeout_ms_)) {
      continue;
    }
    if (rc == 0) {
      int silent = rn > 0 ? from : to;
      Fail(silent, "nothing received or sent for " + Seconds(timeout_ms_ / 1000.0) +
                       " s (HOROVOD_PEER_TIMEOUT_SECONDS); the peer is stopped, hung or "
                       "unreachable", TransportError::Cause::kPeerTimeout);
    }
    if (aborted_) throw TransportError("the link was shut down");
  }
}

}  // namespace horovodlike
