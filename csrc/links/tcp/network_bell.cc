#include "network_bell.h"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "tcp_link.h"

namespace horovodlike {

std::unique_ptr<NetworkBell> NetworkBell::Connect(TcpLink& tcp, bool enabled) {
  const int rank = tcp.rank(), size = tcp.size();
  // This rank's TCP address: the one its peers reach it by.
  sockaddr_in local{};
  socklen_t length = sizeof(local);
  const int any_peer = rank == 0 ? 1 : 0;
  int fd = -1;
  if (enabled &&
      ::getsockname(tcp.socket(any_peer), reinterpret_cast<sockaddr*>(&local), &length) == 0 &&
      local.sin_family == AF_INET) {
    fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    local.sin_port = 0;
    if (fd >= 0 && (::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof(local)) != 0 ||
                    ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) != 0)) {
      ::close(fd);
      fd = -1;
    }
  }
  std::random_device random;
  const uint64_t token = (static_cast<uint64_t>(random()) << 32) ^ random();
  // Port (0: no bell) and token to every peer, in the order of a ring's steps.
  struct Offer {
    uint64_t port;
    uint64_t token;
  } mine{fd >= 0 ? ntohs(local.sin_port) : 0u, token};
  std::vector<Offer> offers(size);
  offers[rank] = mine;
  for (int step = 1; step < size; ++step) {
    const int to = (rank + step) % size, from = (rank - step + size) % size;
    tcp.sendrecv(to, &mine, sizeof(mine), from, &offers[from], sizeof(Offer));
  }
  if (fd < 0) return nullptr;
  std::vector<sockaddr_in> peers(size);
  std::vector<uint64_t> tokens(size);
  for (int p = 0; p < size; ++p) {
    tokens[p] = offers[p].token;
    if (p == rank) {
      peers[p] = local;
      continue;
    }
    sockaddr_in address{};
    socklen_t n = sizeof(address);
    if (offers[p].port == 0 ||
        ::getpeername(tcp.socket(p), reinterpret_cast<sockaddr*>(&address), &n) != 0 ||
        address.sin_family != AF_INET) {
      continue;  // left zeroed: not rung
    }
    address.sin_port = htons(static_cast<uint16_t>(offers[p].port));
    peers[p] = address;
  }
  return std::unique_ptr<NetworkBell>(
      new NetworkBell(fd, token, std::move(peers), std::move(tokens), rank));
}

NetworkBell::NetworkBell(int fd, uint64_t token, std::vector<sockaddr_in> peers,
                         std::vector<uint64_t> tokens, int rank)
    : fd_(fd), token_(token), peers_(std::move(peers)), tokens_(std::move(tokens)),
      rank_(rank) {}

NetworkBell::~NetworkBell() { ::close(fd_); }

void NetworkBell::Ring(int peer) {
  if (peer < 0 || peer >= static_cast<int>(peers_.size()) || peer == rank_ ||
      peers_[peer].sin_port == 0) {
    return;
  }
  ::sendto(fd_, &tokens_[peer], sizeof(uint64_t), MSG_DONTWAIT | MSG_NOSIGNAL,
           reinterpret_cast<const sockaddr*>(&peers_[peer]), sizeof(sockaddr_in));
  rings_.fetch_add(1, std::memory_order_relaxed);
}

void NetworkBell::Wake() {
  ::sendto(fd_, &token_, sizeof(uint64_t), MSG_DONTWAIT | MSG_NOSIGNAL,
           reinterpret_cast<const sockaddr*>(&peers_[rank_]), sizeof(sockaddr_in));
}

bool NetworkBell::Wait(int timeout_ms) {
  pollfd p{fd_, POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) <= 0) return false;
  bool rang = false;
  uint64_t datagram[2];
  while (true) {
    const ssize_t n = ::recv(fd_, datagram, sizeof(datagram), MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      return rang;
    }
    rang |= n == sizeof(uint64_t) && datagram[0] == token_;
  }
}

}  // namespace horovodlike
