#include "gloo_hangup_watcher.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>

namespace horovodlike {

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
    int rc = ::poll(fds.data(), fds.size(), -1);
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return;
    if (fds[0].revents != 0) return;  // asked to stop
    std::vector<int> still;
    for (size_t i = 1; i < fds.size(); ++i) {
      // Nothing is ever sent on these sockets: any event is the peer's end closing.
      if (fds[i].revents != 0) {
        on_hangup_(watched[i - 1]);
      } else {
        still.push_back(watched[i - 1]);
      }
    }
    watched.swap(still);
  }
}

}  // namespace horovodlike
