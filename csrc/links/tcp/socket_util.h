// Thin POSIX socket helpers shared by the TCP link and the rendezvous client.
#pragma once

#include <chrono>
#include <functional>
#include <string>

namespace horovodlike {

// Connects to host:port, retrying until the deadline; throws TransportError with `what`.
// `between_attempts` (optional) runs after each failed attempt and may throw to give up.
int ConnectWithRetry(const std::string& host, int port,
                     std::chrono::steady_clock::time_point deadline, const std::string& what,
                     const std::function<void()>& between_attempts = {});
// A single attempt, bounded by the deadline.
int ConnectOnce(const std::string& host, int port,
                std::chrono::steady_clock::time_point deadline, const std::string& what);
// Listening TCP socket bound to `address` (IPv4) on an ephemeral port; returns fd and port.
int ListenOn(const std::string& address, int* port);
// The IPv4 address of a named interface, or throws InvalidArgument.
std::string InterfaceAddress(const std::string& interface_name);
// The IPv4 address of the first interface that is up and not loopback; 127.0.0.1 if none.
std::string FirstNonLoopbackAddress();
// The local IPv4 address the kernel would use to reach `host`.
std::string LocalAddressToward(const std::string& host, int port);
// Milliseconds left until the deadline, for poll(): 0 once it has passed.
int MillisUntil(std::chrono::steady_clock::time_point deadline);
void SetNonBlocking(int fd, bool on);
void SetNoDelay(int fd);
// Blocking exact-size I/O with a deadline (for set-up only; the data path has its own loops).
void WriteAll(int fd, const void* buf, size_t n, std::chrono::steady_clock::time_point deadline,
              const std::string& what);
void ReadAll(int fd, void* buf, size_t n, std::chrono::steady_clock::time_point deadline,
             const std::string& what);

}  // namespace horovodlike
