#include "socket_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "../../common/common.h"

namespace horovodlike {

int MillisUntil(std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return left.count() < 0 ? 0 : static_cast<int>(std::min<int64_t>(left.count(), 1 << 30));
}

namespace {

bool Resolve(const std::string& host, int port, sockaddr_in* out) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &result) != 0 ||
      result == nullptr) {
    return false;
  }
  std::memcpy(out, result->ai_addr, sizeof(sockaddr_in));
  freeaddrinfo(result);
  return true;
}

void WaitFd(int fd, short events, std::chrono::steady_clock::time_point deadline,
            const std::string& what) {
  pollfd p{fd, events, 0};
  int rc;
  do {
    rc = ::poll(&p, 1, MillisUntil(deadline));
  } while (rc < 0 && errno == EINTR);
  if (rc == 0) throw TransportError(what + ": timed out");
  if (rc < 0) throw TransportError(what + ": " + std::strerror(errno));
}

}  // namespace

namespace {

// One non-blocking connect attempt bounded by the deadline (a blocking connect to a host that
// drops packets could wait minutes). Returns the connected fd, or -1 with `error` set.
int TryConnect(const sockaddr_in& addr, std::chrono::steady_clock::time_point deadline,
               std::string* error) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    *error = std::string("socket: ") + std::strerror(errno);
    return -1;
  }
  int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  if (rc != 0 && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    do {
      rc = ::poll(&p, 1, MillisUntil(deadline));
    } while (rc < 0 && errno == EINTR);
    if (rc == 0) {
      *error = "timed out";
      ::close(fd);
      return -1;
    }
    int so_error = 0;
    socklen_t len = sizeof(so_error);
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len);
    rc = so_error == 0 ? 0 : -1;
    errno = so_error;
  }
  if (rc != 0) {
    *error = std::strerror(errno);
    ::close(fd);
    return -1;
  }
  SetNonBlocking(fd, false);
  SetNoDelay(fd);
  return fd;
}

}  // namespace

int ConnectWithRetry(const std::string& host, int port,
                     std::chrono::steady_clock::time_point deadline, const std::string& what,
                     const std::function<void()>& between_attempts) {
  sockaddr_in addr{};
  if (!Resolve(host, port, &addr)) {
    throw TransportError(what + ": cannot resolve host '" + host + "'");
  }
  std::string last_error = "timed out";
  while (true) {
    int fd = TryConnect(addr, deadline, &last_error);
    if (fd >= 0) return fd;
    if (std::chrono::steady_clock::now() >= deadline) {
      throw TransportError(what + ": cannot connect to " + host + ":" + std::to_string(port) +
                           ": " + last_error);
    }
    if (between_attempts) between_attempts();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

int ConnectOnce(const std::string& host, int port,
                std::chrono::steady_clock::time_point deadline, const std::string& what) {
  sockaddr_in addr{};
  if (!Resolve(host, port, &addr)) {
    throw TransportError(what + ": cannot resolve host '" + host + "'");
  }
  std::string error;
  int fd = TryConnect(addr, deadline, &error);
  if (fd < 0) {
    throw TransportError(what + ": cannot connect to " + host + ":" + std::to_string(port) +
                         ": " + error);
  }
  return fd;
}

int ListenOn(const std::string& address, int* port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw TransportError(std::string("socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  if (inet_pton(AF_INET, address.c_str(), &addr.sin_addr) != 1) {
    ::close(fd);
    throw TransportError("cannot listen on '" + address + "': not an IPv4 address");
  }
  // A long queue (the system caps it at net.core.somaxconn): connections wait there while the
  // rank dials its lower ranks, and strangers filling a short one would keep the higher ranks
  // out.
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(fd, 4096) != 0) {
    std::string err = std::strerror(errno);
    ::close(fd);
    throw TransportError("cannot listen on " + address + ": " + err);
  }
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  *port = ntohs(addr.sin_port);
  return fd;
}

namespace {

// The dotted text of an interface's IPv4 address.
std::string Ipv4Text(const sockaddr* address) {
  char text[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(address)->sin_addr, text,
            sizeof(text));
  return text;
}

}  // namespace

std::string InterfaceAddress(const std::string& interface_name) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) throw InvalidArgument("getifaddrs failed");
  std::string found;
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET) continue;
    if (interface_name != it->ifa_name) continue;
    found = Ipv4Text(it->ifa_addr);
    break;
  }
  freeifaddrs(list);
  if (found.empty()) {
    throw InvalidArgument("network interface '" + interface_name +
                          "' (HOROVOD_GLOO_IFACE / --network-interface) has no IPv4 address");
  }
  return found;
}

std::string FirstNonLoopbackAddress() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "127.0.0.1";
  std::string found = "127.0.0.1";
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET) continue;
    if ((it->ifa_flags & IFF_UP) == 0 || (it->ifa_flags & IFF_LOOPBACK) != 0) continue;
    found = Ipv4Text(it->ifa_addr);
    break;
  }
  freeifaddrs(list);
  return found;
}

std::string LocalAddressToward(const std::string& host, int port) {
  sockaddr_in addr{};
  if (!Resolve(host, port, &addr)) {
    throw TransportError("cannot resolve rendezvous host '" + host + "'");
  }
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (fd >= 0) ::close(fd);
    throw TransportError("no route to rendezvous host '" + host + "'");
  }
  sockaddr_in local{};
  socklen_t len = sizeof(local);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len);
  ::close(fd);
  char text[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text));
  return text;
}

void SetNonBlocking(int fd, bool on) {
  int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

void SetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void WriteAll(int fd, const void* buf, size_t n, std::chrono::steady_clock::time_point deadline,
              const std::string& what) {
  const auto* p = static_cast<const uint8_t*>(buf);
  while (n > 0) {
    WaitFd(fd, POLLOUT, deadline, what);
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      throw TransportError(what + ": " + std::strerror(errno));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void ReadAll(int fd, void* buf, size_t n, std::chrono::steady_clock::time_point deadline,
             const std::string& what) {
  auto* p = static_cast<uint8_t*>(buf);
  while (n > 0) {
    WaitFd(fd, POLLIN, deadline, what);
    ssize_t r = ::recv(fd, p, n, MSG_DONTWAIT);
    if (r == 0) throw TransportError(what + ": connection closed");
    if (r < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      throw TransportError(what + ": " + std::strerror(errno));
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
}

}  // namespace horovodlike
