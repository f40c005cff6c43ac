#include "tcp.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "../core/common.h"
#include "../core/env_config.h"
#include "rendezvous_client.h"
#include "socket_util.h"

namespace horovodlike {
namespace {

constexpr uint32_t kHelloMagic = 0x314c5648;  // "HVL1"
constexpr uint32_t kMaxSecretBytes = 1024;
constexpr int kSocketBufferBytes = 4 << 20;

struct Hello {
  uint32_t magic;
  int32_t rank;
  int32_t generation;
  uint32_t secret_bytes;
};

std::string JoinRanks(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

void TuneSocket(int fd) {
  SetNoDelay(fd);
  int size = kSocketBufferBytes;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof(size));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));
}

double PeerTimeoutSeconds() {
  const char* v = std::getenv("HOROVOD_PEER_TIMEOUT_SECONDS");
  if (v == nullptr || v[0] == '\0') return 300.0;
  char* end = nullptr;
  double seconds = std::strtod(v, &end);
  if (*end != '\0' || seconds <= 0) {
    throw InvalidArgument(std::string("HOROVOD_PEER_TIMEOUT_SECONDS='") + v +
                          "' is not a positive number of seconds");
  }
  return seconds;
}

}  // namespace

std::unique_ptr<TcpTransport> TcpTransport::Connect(const Config& config, int generation) {
  const double timeout_seconds = PeerTimeoutSeconds();
  if (config.size == 1) {
    return std::unique_ptr<TcpTransport>(new TcpTransport(0, 1, {-1}, timeout_seconds));
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
  std::vector<int> fds(config.size, -1);
  auto cleanup = [&] {
    ::close(listen_fd);
    for (int fd : fds) if (fd >= 0) ::close(fd);
  };
  try {
    RendezvousClient rendezvous(config.rendezvous_addr, config.rendezvous_port,
                                config.secret_key, deadline);
    const std::string prefix = "addr/" + std::to_string(generation) + "/";
    rendezvous.Put(prefix + std::to_string(config.rank), address + ":" + std::to_string(port));

    // Lower ranks are dialled; higher ranks dial us.
    std::vector<int> missing;
    for (int peer = 0; peer < config.rank; ++peer) {
      std::string value;
      if (!rendezvous.Get(prefix + std::to_string(peer), &value)) {
        missing.push_back(peer);
        continue;
      }
      auto colon = value.rfind(':');
      std::string host = value.substr(0, colon);
      int peer_port = std::atoi(value.c_str() + colon + 1);
      int fd = ConnectWithRetry(host, peer_port, deadline,
                                "connecting to rank " + std::to_string(peer));
      TuneSocket(fd);
      Hello hello{kHelloMagic, config.rank, generation,
                  static_cast<uint32_t>(config.secret_key.size())};
      WriteAll(fd, &hello, sizeof(hello), deadline, "handshake with rank " + std::to_string(peer));
      WriteAll(fd, config.secret_key.data(), config.secret_key.size(), deadline,
               "handshake with rank " + std::to_string(peer));
      fds[peer] = fd;
    }
    if (!missing.empty()) {
      throw TransportError("ranks " + JoinRanks(missing) + " did not join within " +
                           std::to_string(static_cast<int>(config.start_timeout_seconds)) +
                           " s (HOROVOD_START_TIMEOUT)");
    }
    int expected = config.size - 1 - config.rank;
    while (expected > 0) {
      pollfd p{listen_fd, POLLIN, 0};
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now()).count();
      int rc = ::poll(&p, 1, left > 0 ? static_cast<int>(left) : 0);
      if (rc < 0 && errno == EINTR) continue;
      if (rc <= 0) {
        std::vector<int> absent;
        for (int peer = config.rank + 1; peer < config.size; ++peer) {
          if (fds[peer] < 0) absent.push_back(peer);
        }
        throw TransportError("ranks " + JoinRanks(absent) + " did not connect within " +
                             std::to_string(static_cast<int>(config.start_timeout_seconds)) +
                             " s (HOROVOD_START_TIMEOUT)");
      }
      int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      // A connection that does not identify itself as a rank of this job is dropped.
      try {
        auto hello_deadline = std::min(deadline, std::chrono::steady_clock::now() +
                                                     std::chrono::seconds(10));
        Hello hello{};
        ReadAll(fd, &hello, sizeof(hello), hello_deadline, "handshake");
        if (hello.magic != kHelloMagic || hello.rank <= config.rank ||
            hello.rank >= config.size || fds[hello.rank] >= 0 || hello.generation != generation ||
            hello.secret_bytes > kMaxSecretBytes) {
          throw TransportError("bad handshake");
        }
        std::string secret(hello.secret_bytes, '\0');
        ReadAll(fd, secret.data(), secret.size(), hello_deadline, "handshake");
        if (secret != config.secret_key) throw TransportError("wrong secret");
        TuneSocket(fd);
        fds[hello.rank] = fd;
        --expected;
      } catch (const TransportError&) {
        ::close(fd);
      }
    }
  } catch (...) {
    cleanup();
    throw;
  }
  ::close(listen_fd);
  for (int fd : fds) if (fd >= 0) SetNonBlocking(fd, true);
  return std::unique_ptr<TcpTransport>(
      new TcpTransport(config.rank, config.size, std::move(fds), timeout_seconds));
}

TcpTransport::TcpTransport(int rank, int size, std::vector<int> fds, double timeout_seconds)
    : rank_(rank), size_(size), fds_(std::move(fds)),
      timeout_ms_(static_cast<int>(timeout_seconds * 1000)) {}

TcpTransport::~TcpTransport() {
  for (int fd : fds_) if (fd >= 0) ::close(fd);
}

void TcpTransport::abort() {
  aborted_ = true;
  for (int fd : fds_) if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
}

int TcpTransport::Fd(int peer) const {
  if (peer < 0 || peer >= size_ || peer == rank_) {
    throw TransportError("no connection to rank " + std::to_string(peer));
  }
  return fds_[peer];
}

void TcpTransport::Fail(int peer, const std::string& what) {
  if (aborted_) throw TransportError("the transport was shut down");
  throw TransportError("lost connection to rank " + std::to_string(peer) + ": " + what);
}

void TcpTransport::send(int peer, const void* buf, size_t n) {
  sendrecv(peer, buf, n, peer, nullptr, 0);
}

void TcpTransport::recv(int peer, void* buf, size_t n) {
  sendrecv(peer, nullptr, 0, peer, buf, n);
}

void TcpTransport::sendrecv(int to, const void* sbuf, size_t sn, int from, void* rbuf,
                            size_t rn) {
  const int sfd = sn > 0 ? Fd(to) : -1;
  const int rfd = rn > 0 ? Fd(from) : -1;
  const auto* sp = static_cast<const uint8_t*>(sbuf);
  auto* rp = static_cast<uint8_t*>(rbuf);
  while (sn > 0 || rn > 0) {
    bool progressed = false;
    if (sn > 0) {
      ssize_t w = ::send(sfd, sp, sn, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) {
        sp += w; sn -= static_cast<size_t>(w); progressed = true;
      } else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        Fail(to, std::strerror(errno));
      }
    }
    if (rn > 0) {
      ssize_t r = ::recv(rfd, rp, rn, MSG_DONTWAIT);
      if (r > 0) {
        rp += r; rn -= static_cast<size_t>(r); progressed = true;
      } else if (r == 0) {
        Fail(from, "the peer closed the connection (it exited or was killed)");
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        Fail(from, std::strerror(errno));
      }
    }
    if (progressed || (sn == 0 && rn == 0)) continue;
    pollfd p[2];
    int count = 0;
    if (sn > 0) p[count++] = {sfd, POLLOUT, 0};
    if (rn > 0) p[count++] = {rfd, POLLIN, 0};
    int rc = ::poll(p, count, timeout_ms_);
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) {
      int silent = rn > 0 ? from : to;
      Fail(silent, "no progress for " + std::to_string(timeout_ms_ / 1000) +
                       " s (HOROVOD_PEER_TIMEOUT_SECONDS); the peer is stopped or unreachable");
    }
    if (aborted_) throw TransportError("the transport was shut down");
  }
}

}  // namespace horovodlike
