#include "peer_handshake.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "../../common/common.h"
#include "../../common/env_config.h"
#include "../../common/hmac.h"
#include "../rendezvous_client.h"
#include "socket_util.h"

namespace horovodlike {
namespace {

// Fixed-size messages (the ranks of a job share a byte order):
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
// A listener that closes a connection without answering is dialled this many times in all.
constexpr int kDialAttempts = 5;
constexpr auto kRedialPause = std::chrono::milliseconds(20);

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

bool ClosedByPeer(int error) { return error == ECONNRESET || error == EPIPE; }

// Sends a message of a few bytes, which the socket's empty send buffer always has room for.
// Returns false when the peer has closed the connection.
bool SendSmall(int fd, const void* buf, size_t n, const std::string& what) {
  ssize_t w = ::send(fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (w == static_cast<ssize_t>(n)) return true;
  if (w < 0 && ClosedByPeer(errno)) return false;
  throw TransportError(what + ": " + (w < 0 ? std::strerror(errno) : "short send"));
}

// Reads exactly n bytes before the deadline; throws when the launcher stops the job meanwhile.
// Returns false when the peer closes the connection before the first byte.
bool ReadExact(int fd, void* buf, size_t n, std::chrono::steady_clock::time_point deadline,
               const std::string& what, RendezvousClient* rendezvous) {
  auto* p = static_cast<uint8_t*>(buf);
  const size_t total = n;
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
    if ((r == 0 || (r < 0 && ClosedByPeer(errno))) && n == total) return false;
    if (r == 0) throw TransportError(what + ": the connection was closed");
    if (r < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      throw TransportError(what + ": " + std::strerror(errno));
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// The dialer's side on a connected socket. Returns false when the listener closed the
// connection instead of answering; throws on any other failure.
bool DialerHandshake(int fd, const Config& config, int generation, int peer,
                     const std::string& name, std::chrono::steady_clock::time_point deadline,
                     RendezvousClient* rendezvous) {
  const std::string what = "handshake with " + name;
  Hello hello{kHelloMagic, config.rank, generation, {}};
  RandomBytes(hello.nonce, kNonceBytes);
  if (!SendSmall(fd, &hello, sizeof(hello), what)) return false;
  Challenge challenge{};
  if (!ReadExact(fd, &challenge, sizeof(challenge), deadline, what, rendezvous)) return false;
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
  if (!SendSmall(fd, proof.data(), proof.size(), what)) return false;
  uint32_t accept = 0;
  if (!ReadExact(fd, &accept, sizeof(accept), deadline, what, rendezvous)) return false;
  if (accept != kAcceptMagic) throw TransportError(what + ": the connection was refused");
  return true;
}

}  // namespace

int DialPeer(const Config& config, int generation, int peer, const std::string& address,
             std::chrono::steady_clock::time_point deadline, RendezvousClient* rendezvous) {
  const std::string name = "rank " + std::to_string(peer) + " at " + address;
  auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    throw TransportError(name + ": not a host:port address");
  }
  const std::string host = address.substr(0, colon);
  const int port = std::atoi(address.c_str() + colon + 1);
  auto check_abort = [&] { if (rendezvous) rendezvous->ThrowIfAborted(); };
  for (int attempt = 1;; ++attempt) {
    int fd = ConnectWithRetry(host, port, deadline, "connecting to " + name, check_abort);
    bool answered = false;
    try {
      answered = DialerHandshake(fd, config, generation, peer, name, deadline, rendezvous);
    } catch (...) {
      ::close(fd);
      throw;
    }
    if (answered) return fd;
    ::close(fd);
    if (attempt == kDialAttempts || std::chrono::steady_clock::now() + kRedialPause >= deadline) {
      throw TransportError("handshake with " + name + ": the connection was closed without "
                           "an answer (" + std::to_string(attempt) + " attempts)");
    }
    check_abort();
    std::this_thread::sleep_for(kRedialPause);
  }
}

ListenerHandshake::Step ListenerHandshake::Advance(int fd, const Config& config, int generation,
                                                   const std::vector<int>& connected,
                                                   std::string* why) {
  const size_t need = challenged_ ? kProofBytes : sizeof(Hello);
  ssize_t r = ::recv(fd, message_ + got_, need - got_, MSG_DONTWAIT);
  if (r == 0) {
    *why = "closed before completing the handshake";
    return Step::kRejected;
  }
  if (r < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return Step::kWaiting;
    *why = std::strerror(errno);
    return Step::kRejected;
  }
  started_ = true;
  got_ += static_cast<size_t>(r);
  if (got_ < need) return Step::kWaiting;
  got_ = 0;
  return challenged_ ? OnProof(fd, config, generation, connected, why)
                     : OnHello(fd, config, generation, connected, why);
}

ListenerHandshake::Step ListenerHandshake::OnHello(int fd, const Config& config, int generation,
                                                   const std::vector<int>& connected,
                                                   std::string* why) {
  Hello hello;
  std::memcpy(&hello, message_, sizeof(hello));
  if (hello.magic != kHelloMagic) {
    *why = "not a horovodlike peer handshake";
    return Step::kRejected;
  }
  if (hello.generation != generation) {
    *why = "handshake for init() generation " + std::to_string(hello.generation) +
           ", this rank is at " + std::to_string(generation);
    return Step::kRejected;
  }
  claimed_ = hello.rank;
  if (claimed_ <= config.rank || claimed_ >= config.size ||
      connected[static_cast<size_t>(claimed_ + config.size)] >= 0) {
    *why = "claims rank " + std::to_string(claimed_) + ", which is not due to connect here";
    return Step::kRejected;
  }
  std::memcpy(dialer_nonce_, hello.nonce, kNonceBytes);
  Challenge challenge{kHelloMagic, config.rank, {}, {}};
  RandomBytes(listener_nonce_, kNonceBytes);
  std::memcpy(challenge.nonce, listener_nonce_, kNonceBytes);
  const Sha256Digest proof = PeerProof(config.secret_key, "listener", generation, config.rank,
                                       claimed_, dialer_nonce_, listener_nonce_);
  std::memcpy(challenge.proof, proof.data(), kProofBytes);
  if (::send(fd, &challenge, sizeof(challenge), MSG_NOSIGNAL | MSG_DONTWAIT) !=
      static_cast<ssize_t>(sizeof(challenge))) {
    *why = "could not send the challenge";
    return Step::kRejected;
  }
  challenged_ = true;
  return Step::kWaiting;
}

ListenerHandshake::Step ListenerHandshake::OnProof(int fd, const Config& config, int generation,
                                                   const std::vector<int>& connected,
                                                   std::string* why) {
  const Sha256Digest expected = PeerProof(config.secret_key, "dialer", generation, claimed_,
                                          config.rank, listener_nonce_, dialer_nonce_);
  if (!ConstantTimeEqual(message_, expected.data(), kProofBytes)) {
    *why = "claims rank " + std::to_string(claimed_) +
           " but does not know this job's secret (HOROVOD_SECRET_KEY)";
    return Step::kRejected;
  }
  // A rank dials twice, one connection after the other: the first is its stream, the second
  // its tagged channel (tcp_link.h).
  slot_ = connected[claimed_] < 0 ? claimed_ : claimed_ + config.size;
  if (connected[slot_] >= 0) {
    *why = "rank " + std::to_string(claimed_) + " is connected already";
    return Step::kRejected;
  }
  const uint32_t accept = kAcceptMagic;
  if (::send(fd, &accept, sizeof(accept), MSG_NOSIGNAL | MSG_DONTWAIT) !=
      static_cast<ssize_t>(sizeof(accept))) {
    *why = "could not send the acceptance";
    return Step::kRejected;
  }
  return Step::kAccepted;
}

}  // namespace horovodlike
