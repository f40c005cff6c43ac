#include "gloo_hangup_watcher.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>

namespace horovodlike {
namespace {
// A peer that closed while its last bytes are still unread is looked at again after this.
constexpr int kUnreadRecheckMs = 10;
}  // namespace

GlooHangupWatcher::GlooHangupWatcher(std::vector<int> peer_sockets,
                                     std::function<void(int rank)> on_hangup)
    : peer_sockets_(std::move(peer_sockets)), on_hangup_(std::move(on_hangup)) {
  if (::pipe2(wake_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) {
    wake_pipe_[0] = wake_pipe_[1] = -1;
    return;  // no watcher: failures are then found by the peer timeout alone
  }
  thread_ = std::thread([this] { Run(); });
}

GlooHangupWatcher::~GlooHangupWatcher() {
  if (thread_.joinable()) {
    char byte = 0;
    while (::write(wake_pipe_[1], &byte, 1) < 0 && errno == EINTR) {
    }
    thread_.join();
  }
  for (int fd : wake_pipe_) if (fd >= 0) ::close(fd);
}

void GlooHangupWatcher::Run() {
  std::vector<int> watched;  // ranks still connected
  for (int rank = 0; rank < static_cast<int>(peer_sockets_.size()); ++rank) {
    if (peer_sockets_[rank] >= 0) watched.push_back(rank);
  }
  while (!watched.empty()) {
    std::vector<pollfd> fds;
    fds.push_back({wake_pipe_[0], POLLIN, 0});
    for (int rank : watched) fds.push_back({peer_sockets_[rank], POLLRDHUP, 0});
    int timeout_ms = 1000;
    int rc = ::poll(fds.data(), fds.size(), timeout_ms);
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return;
    if (fds[0].revents != 0) return;  // asked to stop
    std::vector<int> still;
    bool unread = false;
    for (size_t i = 1; i < fds.size(); ++i) {
      const int rank = watched[i - 1];
      const short events = fds[i].revents;
      bool gone = (events & (POLLHUP | POLLERR | POLLNVAL)) != 0;
      if (!gone && (events & POLLRDHUP) != 0) {
        // Closed for writing by the peer: gone once Gloo has read what came before the close.
        int pending = 0;
        if (::ioctl(fds[i].fd, FIONREAD, &pending) != 0 || pending == 0) {
          gone = true;
        } else {
          unread = true;
        }
      }
      if (gone) {
        on_hangup_(rank);
      } else {
        still.push_back(rank);
      }
    }
    watched.swap(still);
    // A socket closed for writing stays "ready", so poll would return at once: wait a little.
    if (unread) ::usleep(kUnreadRecheckMs * 1000);
  }
}

}  // namespace horovodlike
