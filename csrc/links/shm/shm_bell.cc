#include "shm_bell.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>

namespace horovodlike {
namespace shm {
namespace {

struct Bell {
  int fd = -1;          // bound to this process's name; receives the rings
  int sender = -1;      // unbound; sends rings to other processes
  uint64_t token = 0;
};

// The abstract address (a leading NUL: no file, gone with the socket) of a process's bell.
socklen_t BellAddress(int pid, uint64_t token, sockaddr_un* address) {
  std::memset(address, 0, sizeof(*address));
  address->sun_family = AF_UNIX;
  const int n = std::snprintf(address->sun_path + 1, sizeof(address->sun_path) - 1,
                              "hvdl-bell-%d-%016llx", pid, static_cast<unsigned long long>(token));
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

Bell Open() {
  Bell bell;
  std::random_device random;
  const uint64_t token = (static_cast<uint64_t>(random()) << 32 | random()) | 1;
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  const int sender = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  sockaddr_un address;
  const socklen_t length = BellAddress(::getpid(), token, &address);
  if (fd < 0 || sender < 0 ||
      ::bind(fd, reinterpret_cast<const sockaddr*>(&address), length) != 0) {
    if (fd >= 0) ::close(fd);
    if (sender >= 0) ::close(sender);
    return bell;
  }
  bell.fd = fd;
  bell.sender = sender;
  bell.token = token;
  return bell;
}

// Opened once per process and kept to its end (a forked child opens its own: the name carries
// the pid).
const Bell& ThisProcess() {
  static std::mutex mutex;
  static Bell bell;
  static int owner = 0;
  std::lock_guard<std::mutex> lock(mutex);
  if (owner != ::getpid()) {
    bell = Open();
    owner = ::getpid();
  }
  return bell;
}

}  // namespace

int PollBellFd() { return ThisProcess().fd; }

uint64_t PollBellToken() { return ThisProcess().token; }

void DrainPollBell() {
  const int fd = ThisProcess().fd;
  if (fd < 0) return;
  char bytes[64];
  while (::recv(fd, bytes, sizeof(bytes), MSG_DONTWAIT) > 0) {
  }
}

bool RingPollBell(int pid, uint64_t token) {
  const int sender = ThisProcess().sender;
  if (sender < 0 || token == 0) return false;
  sockaddr_un address;
  const socklen_t length = BellAddress(pid, token, &address);
  const char ring = 1;
  // A full queue (EAGAIN) already holds a ring: the peer wakes anyway.
  return ::sendto(sender, &ring, 1, MSG_DONTWAIT | MSG_NOSIGNAL,
                  reinterpret_cast<const sockaddr*>(&address), length) == 1 ||
         errno == EAGAIN;
}

}  // namespace shm
}  // namespace horovodlike
