#include "tcp_link.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>

#include "../../common/common.h"
#include "../../common/env_config.h"
#include "../../common/hmac.h"
#include "../../common/interrupt.h"
#include "../../common/logging.h"
#include "../rendezvous_client.h"
#include "socket_util.h"

namespace horovodlike {
namespace {

constexpr int kSocketBufferBytes = 4 << 20;

// The peer handshake. Fixed-size messages (the ranks of a job share a byte order):
//   dialer -> listener   Hello     {magic, dialer rank, generation, dialer nonce}
//   listener -> dialer   Challenge {magic, listener rank, listener nonce, listener proof}
//   dialer -> listener   Proof     {dialer proof}
//   listener -> dialer   Accept    {accept magic}
// A proof is HMAC-SHA256(secret, first nonce || second nonce || context), the context naming
// the role, the generation and both ranks (PeerProof). The listener proves itself first, so an
// impostor listening at a rank's address learns nothing but a nonce; a dialer that cannot
// prove itself is dropped without taking the slot of the rank it claims.
constexpr uint32_t kHelloMagic = 0x324c5648;   // "HVL2"
constexpr uint32_t kAcceptMagic = 0x4b4f5648;  // "HVOK"
constexpr size_t kNonceBytes = 32;
constexpr size_t kProofBytes = 32;
// Connections still in their handshake; more are left waiting in the listen backlog.
constexpr size_t kMaxPendingHandshakes = 64;
constexpr auto kHandshakeTimeout = std::chrono::seconds(10);

struct Hello {
  uint32_t magic;
  int32_t rank;
  int32_t generation;
  uint8_t nonce[kNonceBytes];
};
struct Challenge {
  uint32_t magic;
  int32_t rank;
  uint8_t nonce[kNonceBytes];
  uint8_t proof[kProofBytes];
};
static_assert(sizeof(Hello) == 44 && sizeof(Challenge) == 72, "wire structs must not be padded");

Sha256Digest PeerProof(const std::string& secret, const char* role, int generation, int from,
                       int to, const uint8_t* first_nonce, const uint8_t* second_nonce) {
  std::string message(reinterpret_cast<const char*>(first_nonce), kNonceBytes);
  message.append(reinterpret_cast<const char*>(second_nonce), kNonceBytes);
  message += std::string("horovodlike peer ") + role + " generation " +
             std::to_string(generation) + " from rank " + std::to_string(from) + " to rank " +
             std::to_string(to);
  return HmacSha256(secret, message);
}

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

int MillisUntil(std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1 << 30));
}

void TuneSocket(int fd) {
  SetNoDelay(fd);
  int size = kSocketBufferBytes;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof(size));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));
}

std::string PeerAddress(const sockaddr_in& addr) {
  char text[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &addr.sin_addr, text, sizeof(text));
  return std::string(text) + ":" + std::to_string(ntohs(addr.sin_port));
}

// Reads exactly n bytes before the deadline; throws when the launcher stops the job meanwhile.
void ReadExact(int fd, void* buf, size_t n, std::chrono::steady_clock::time_point deadline,
               const std::string& what, RendezvousClient* rendezvous) {
  auto* p = static_cast<uint8_t*>(buf);
  while (n > 0) {
    // Without a rendezvous server (addresses exchanged over MPI) the second entry is ignored.
    pollfd polls[2] = {{fd, POLLIN, 0}, {rendezvous ? rendezvous->fd() : -1, POLLIN, 0}};
    int rc = ::poll(polls, 2, MillisUntil(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) throw TransportError(what + ": " + std::strerror(errno));
    if (polls[1].revents != 0) rendezvous->ThrowIfAborted();
    if (rc == 0) throw TransportError(what + ": timed out");
    if (polls[0].revents == 0) continue;
    ssize_t r = ::recv(fd, p, n, MSG_DONTWAIT);
    if (r == 0) throw TransportError(what + ": the connection was closed");
    if (r < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      throw TransportError(what + ": " + std::strerror(errno));
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
}

// Connects to a lower rank at `address` ("host:port") and runs the dialer's side of the
// handshake.
int DialPeer(const Config& config, int generation, int peer, const std::string& address,
             std::chrono::steady_clock::time_point deadline, RendezvousClient* rendezvous) {
  const std::string name = "rank " + std::to_string(peer) + " at " + address;
  auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    throw TransportError(name + ": not a host:port address");
  }
  const std::string host = address.substr(0, colon);
  const int port = std::atoi(address.c_str() + colon + 1);
  int fd = ConnectWithRetry(host, port, deadline, "connecting to " + name,
                            [&] { if (rendezvous) rendezvous->ThrowIfAborted(); });
  const std::string what = "handshake with " + name;
  try {
    TuneSocket(fd);
    Hello hello{kHelloMagic, config.rank, generation, {}};
    RandomBytes(hello.nonce, kNonceBytes);
    WriteAll(fd, &hello, sizeof(hello), deadline, what);
    Challenge challenge{};
    ReadExact(fd, &challenge, sizeof(challenge), deadline, what, rendezvous);
    const Sha256Digest expected = PeerProof(config.secret_key, "listener", generation, peer,
                                            config.rank, hello.nonce, challenge.nonce);
    if (challenge.magic != kHelloMagic || challenge.rank != peer ||
        !ConstantTimeEqual(challenge.proof, expected.data(), kProofBytes)) {
      throw TransportError(name + " did not prove that it knows this job's secret "
                           "(HOROVOD_SECRET_KEY): whatever listens there is not rank " +
                           std::to_string(peer) + " of this job");
    }
    const Sha256Digest proof = PeerProof(config.secret_key, "dialer", generation, config.rank,
                                         peer, challenge.nonce, hello.nonce);
    WriteAll(fd, proof.data(), proof.size(), deadline, what);
    uint32_t accept = 0;
    ReadExact(fd, &accept, sizeof(accept), deadline, what, rendezvous);
    if (accept != kAcceptMagic) throw TransportError(what + ": the connection was refused");
  } catch (...) {
    ::close(fd);
    throw;
  }
  return fd;
}

// A connection accepted by the listener whose handshake is not complete yet.
struct PendingPeer {
  int fd = -1;
  std::string address;
  std::chrono::steady_clock::time_point deadline;
  bool challenged = false;  // the Hello was read and the Challenge sent
  Hello hello{};
  uint8_t nonce[kNonceBytes] = {};
  uint8_t proof[kProofBytes] = {};
  size_t got = 0;  // bytes of the message being read
};

// Reads what `p` has sent and answers it. Returns false (with `why`) to drop the connection;
// sets *verified to the peer's rank once it has proved itself and been accepted.
bool AdvanceHandshake(PendingPeer& p, const Config& config, int generation,
                      const std::vector<int>& fds, std::string* why, int* verified) {
  uint8_t* target = p.challenged ? p.proof : reinterpret_cast<uint8_t*>(&p.hello);
  const size_t need = p.challenged ? kProofBytes : sizeof(Hello);
  ssize_t r = ::recv(p.fd, target + p.got, need - p.got, MSG_DONTWAIT);
  if (r == 0) {
    *why = "closed before completing the handshake";
    return false;
  }
  if (r < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return true;
    *why = std::strerror(errno);
    return false;
  }
  p.got += static_cast<size_t>(r);
  if (p.got < need) return true;
  p.got = 0;
  const int claimed = p.hello.rank;
  if (!p.challenged) {
    if (p.hello.magic != kHelloMagic) {
      *why = "not a horovodlike peer handshake";
      return false;
    }
    if (p.hello.generation != generation) {
      *why = "handshake for init() generation " + std::to_string(p.hello.generation) +
             ", this rank is at " + std::to_string(generation);
      return false;
    }
    if (claimed <= config.rank || claimed >= config.size || fds[claimed] >= 0) {
      *why = "claims rank " + std::to_string(claimed) + ", which is not due to connect here";
      return false;
    }
    Challenge challenge{kHelloMagic, config.rank, {}, {}};
    RandomBytes(p.nonce, kNonceBytes);
    std::memcpy(challenge.nonce, p.nonce, kNonceBytes);
    const Sha256Digest proof = PeerProof(config.secret_key, "listener", generation, config.rank,
                                         claimed, p.hello.nonce, p.nonce);
    std::memcpy(challenge.proof, proof.data(), kProofBytes);
    // A fresh socket's send buffer always has room for these few bytes.
    if (::send(p.fd, &challenge, sizeof(challenge), MSG_NOSIGNAL | MSG_DONTWAIT) !=
        static_cast<ssize_t>(sizeof(challenge))) {
      *why = "could not send the challenge";
      return false;
    }
    p.challenged = true;
    return true;
  }
  const Sha256Digest expected = PeerProof(config.secret_key, "dialer", generation, claimed,
                                          config.rank, p.nonce, p.hello.nonce);
  if (!ConstantTimeEqual(p.proof, expected.data(), kProofBytes)) {
    *why = "claims rank " + std::to_string(claimed) +
           " but does not know this job's secret (HOROVOD_SECRET_KEY)";
    return false;
  }
  if (fds[claimed] >= 0) {
    *why = "rank " + std::to_string(claimed) + " is connected already";
    return false;
  }
  const uint32_t accept = kAcceptMagic;
  if (::send(p.fd, &accept, sizeof(accept), MSG_NOSIGNAL | MSG_DONTWAIT) !=
      static_cast<ssize_t>(sizeof(accept))) {
    *why = "could not send the acceptance";
    return false;
  }
  *verified = claimed;
  return true;
}

// Accepts the higher ranks on `listen_fd`, several handshakes at a time, so that a stranger who
// connects and says nothing (or garbage) delays no one.
void AcceptPeers(const Config& config, int generation, int listen_fd, std::vector<int>& fds,
                 std::chrono::steady_clock::time_point deadline, RendezvousClient* rendezvous) {
  std::vector<PendingPeer> pending;
  auto drop = [&](size_t i, const std::string& why) {
    HVDL_LOG(kWarning, "rejected a connection from " << pending[i].address << ": " << why);
    ::close(pending[i].fd);
    pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
  };
  try {
    int expected = config.size - 1 - config.rank;
    while (expected > 0) {
      const auto now = std::chrono::steady_clock::now();
      for (size_t i = pending.size(); i-- > 0;) {
        if (now >= pending[i].deadline) drop(i, "no complete handshake in time");
      }
      if (now >= deadline) {
        std::vector<int> absent;
        for (int peer = config.rank + 1; peer < config.size; ++peer) {
          if (fds[peer] < 0) absent.push_back(peer);
        }
        throw TransportError("ranks " + JoinRanks(absent) + " did not connect within " +
                             Seconds(config.start_timeout_seconds) +
                             " s (HOROVOD_START_TIMEOUT)");
      }
      std::vector<pollfd> polls;
      polls.push_back({rendezvous ? rendezvous->fd() : -1, POLLIN, 0});
      polls.push_back({listen_fd, static_cast<short>(
                                      pending.size() < kMaxPendingHandshakes ? POLLIN : 0), 0});
      auto wake = deadline;
      for (const PendingPeer& p : pending) {
        polls.push_back({p.fd, POLLIN, 0});
        wake = std::min(wake, p.deadline);
      }
      int rc = ::poll(polls.data(), polls.size(), MillisUntil(wake));
      if (rc < 0 && errno == EINTR) continue;
      if (rc < 0) throw TransportError(std::string("poll: ") + std::strerror(errno));
      if (polls[0].revents != 0) rendezvous->ThrowIfAborted();
      for (size_t i = pending.size(); i-- > 0;) {
        if (polls[2 + i].revents == 0) continue;
        std::string why;
        int verified = -1;
        if (!AdvanceHandshake(pending[i], config, generation, fds, &why, &verified)) {
          drop(i, why);
        } else if (verified >= 0) {
          fds[verified] = pending[i].fd;
          pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
          --expected;
        }
      }
      if (polls[1].revents & POLLIN) {
        sockaddr_in addr{};
        socklen_t len = sizeof(addr);
        int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len,
                           SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd >= 0) {
          PendingPeer p;
          p.fd = fd;
          p.address = PeerAddress(addr);
          p.deadline = std::min(deadline, std::chrono::steady_clock::now() + kHandshakeTimeout);
          pending.push_back(std::move(p));
        }
      }
    }
  } catch (...) {
    for (const PendingPeer& p : pending) ::close(p.fd);
    throw;
  }
  for (const PendingPeer& p : pending) ::close(p.fd);
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
    return std::unique_ptr<TcpLink>(new TcpLink(0, 1, {-1}, timeout_seconds));
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
  std::vector<int> fds(config.size, -1);
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
        fds[peer] = DialPeer(config, generation, peer, value, deadline, rendezvous);
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
  } catch (...) {
    ::close(listen_fd);
    for (int fd : fds) if (fd >= 0) ::close(fd);
    throw;
  }
  ::close(listen_fd);
  for (int peer = 0; peer < config.size; ++peer) {
    if (fds[peer] >= 0) {
      TuneSocket(fds[peer]);
      SetNonBlocking(fds[peer], true);
    }
  }
  return std::unique_ptr<TcpLink>(
      new TcpLink(config.rank, config.size, std::move(fds), config.peer_timeout_seconds));
}

TcpLink::TcpLink(int rank, int size, std::vector<int> fds, double timeout_seconds)
    : rank_(rank), size_(size), fds_(std::move(fds)),
      timeout_ms_(static_cast<int>(std::min(timeout_seconds * 1000, 2e9))) {}

TcpLink::~TcpLink() {
  for (int fd : fds_) if (fd >= 0) ::close(fd);
}

void TcpLink::abort() {
  aborted_ = true;
  for (int fd : fds_) if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
}

int TcpLink::Fd(int peer) const {
  if (peer < 0 || peer >= size_ || peer == rank_) {
    throw TransportError("no connection to rank " + std::to_string(peer));
  }
  return fds_[peer];
}

void TcpLink::Fail(int peer, const std::string& what, TransportError::Cause cause) {
  if (aborted_) throw TransportError("the transport was shut down");
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
    if (aborted_) throw TransportError("the transport was shut down");
  }
}

}  // namespace horovodlike
