#include "peer_acceptor.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "../../common/common.h"
#include "../../common/env_config.h"
#include "../../common/logging.h"
#include "../rendezvous_client.h"
#include "peer_handshake.h"
#include "socket_util.h"

namespace horovodlike {
namespace {

using Clock = std::chrono::steady_clock;

// A connection must send its first byte this long after it was accepted, and complete its
// handshake this long after its first byte (a rank does both within a round trip).
constexpr auto kHandshakeTimeout = std::chrono::seconds(10);
// Connections kept in their handshake at once: a quarter of the file-descriptor limit, within
// these bounds.
constexpr size_t kMinPending = 16;
constexpr size_t kMaxPending = 1024;
// Accepted in a row before the connections already accepted are served again (and at most half
// the cap, so that a rank whose Hello was not there yet when it was accepted is read before the
// connections accepted after it could push it out).
constexpr size_t kAcceptBatch = 64;
// Out of descriptors with no connection to drop: how long the listener waits.
constexpr auto kListenerPause = std::chrono::milliseconds(50);
// Rejections logged one by one; the rest are counted.
constexpr size_t kLoggedRejections = 8;

size_t PendingCap() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) {
    return kMaxPending;
  }
  return std::clamp<size_t>(static_cast<size_t>(limit.rlim_cur / 4), kMinPending, kMaxPending);
}

std::string PeerAddress(const sockaddr_in& addr) {
  char text[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &addr.sin_addr, text, sizeof(text));
  return std::string(text) + ":" + std::to_string(ntohs(addr.sin_port));
}

// A connection accepted whose handshake is not complete yet.
struct PendingPeer {
  int fd = -1;
  std::string address;
  Clock::time_point last_heard;  // when it was accepted or last sent something
  Clock::time_point deadline;
  ListenerHandshake handshake;
};

class Acceptor {
 public:
  Acceptor(const Config& config, int generation, int listen_fd, std::vector<int>& fds,
           RendezvousClient* rendezvous)
      : config_(config), generation_(generation), listen_fd_(listen_fd), fds_(fds),
        rendezvous_(rendezvous), cap_(PendingCap()) {}
  ~Acceptor();
  void Run(Clock::time_point deadline);

 private:
  bool Done() const;
  void WaitAndServe(Clock::time_point deadline);
  void AcceptSome();
  // Reads what `p` sent and answers it; false once `p` is finished with (accepted or dropped).
  bool Serve(PendingPeer& p);
  void Reject(const PendingPeer& p, const std::string& why);
  void DropQuietest();

  const Config& config_;
  const int generation_;
  const int listen_fd_;
  std::vector<int>& fds_;
  RendezvousClient* rendezvous_;
  const size_t cap_;
  std::vector<PendingPeer> pending_;
  Clock::time_point listener_paused_until_;
  size_t rejected_ = 0;
  size_t dropped_quiet_ = 0;
};

Acceptor::~Acceptor() {
  for (const PendingPeer& p : pending_) ::close(p.fd);
  if (rejected_ > kLoggedRejections) {
    HVDL_LOG(kWarning, "rejected " << rejected_ - kLoggedRejections << " more connections to "
                       "this rank's port (stalled, or not horovodlike peers)");
  }
  if (dropped_quiet_ > 0) {
    HVDL_LOG(kWarning, "dropped " << dropped_quiet_ << " connections to this rank's port that "
                       "had been silent longest when more arrived (at most " << cap_ <<
                       " are kept in their handshake at once): strangers flooding the port?");
  }
}

bool Acceptor::Done() const {
  for (int peer = config_.rank + 1; peer < config_.size; ++peer) {
    if (fds_[peer] < 0 || fds_[peer + config_.size] < 0) return false;
  }
  return true;
}

void Acceptor::Run(Clock::time_point deadline) {
  while (!Done() && Clock::now() < deadline) {
    const auto now = Clock::now();
    for (size_t i = pending_.size(); i-- > 0;) {
      if (now >= pending_[i].deadline) {
        Reject(pending_[i], "no complete handshake in time");
        pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
    WaitAndServe(deadline);
  }
}

void Acceptor::WaitAndServe(Clock::time_point deadline) {
  std::vector<pollfd> polls;
  polls.reserve(pending_.size() + 2);
  polls.push_back({rendezvous_ ? rendezvous_->fd() : -1, POLLIN, 0});
  const bool listening = Clock::now() >= listener_paused_until_;
  polls.push_back({listening ? listen_fd_ : -1, POLLIN, 0});
  auto wake = listening ? deadline : std::min(deadline, listener_paused_until_);
  for (const PendingPeer& p : pending_) {
    polls.push_back({p.fd, POLLIN, 0});
    wake = std::min(wake, p.deadline);
  }
  int rc = ::poll(polls.data(), polls.size(), MillisUntil(wake));
  if (rc < 0 && errno == EINTR) return;
  if (rc < 0) throw TransportError(std::string("poll: ") + std::strerror(errno));
  if (polls[0].revents != 0) rendezvous_->ThrowIfAborted();
  for (size_t i = pending_.size(); i-- > 0;) {
    if (polls[2 + i].revents != 0 && !Serve(pending_[i])) {
      pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  if (polls[1].revents != 0 && !Done()) AcceptSome();
}

void Acceptor::AcceptSome() {
  const size_t batch = std::min(kAcceptBatch, cap_ / 2);
  for (size_t n = 0; n < batch && !Done(); ++n) {
    if (pending_.size() >= cap_) DropQuietest();
    sockaddr_in addr{};
    socklen_t len = sizeof(addr);
    int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len,
                       SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors: a quiet connection makes room, or the listener waits a little.
        if (!pending_.empty()) {
          DropQuietest();
          continue;
        }
        listener_paused_until_ = Clock::now() + kListenerPause;
      }
      return;  // EAGAIN: no one else is waiting
    }
    PendingPeer p;
    p.fd = fd;
    p.address = PeerAddress(addr);
    p.last_heard = Clock::now();
    p.deadline = p.last_heard + kHandshakeTimeout;
    // A rank sends its Hello as soon as it has connected: usually it is here already.
    if (Serve(p)) pending_.push_back(std::move(p));
  }
}

bool Acceptor::Serve(PendingPeer& p) {
  const bool was_started = p.handshake.started();
  std::string why;
  switch (p.handshake.Advance(p.fd, config_, generation_, fds_, &why)) {
    case ListenerHandshake::Step::kAccepted:
      fds_[p.handshake.slot()] = p.fd;
      return false;
    case ListenerHandshake::Step::kRejected:
      Reject(p, why);
      return false;
    case ListenerHandshake::Step::kWaiting:
      break;
  }
  if (p.handshake.started()) {
    p.last_heard = Clock::now();
    if (!was_started) p.deadline = p.last_heard + kHandshakeTimeout;
  }
  return true;
}

void Acceptor::Reject(const PendingPeer& p, const std::string& why) {
  if (++rejected_ <= kLoggedRejections) {
    HVDL_LOG(kWarning, "rejected a connection from " << p.address << ": " << why);
  }
  ::close(p.fd);
}

void Acceptor::DropQuietest() {
  auto quietest = std::min_element(pending_.begin(), pending_.end(),
                                   [](const PendingPeer& a, const PendingPeer& b) {
                                     return a.last_heard < b.last_heard;
                                   });
  if (quietest == pending_.end()) return;
  ::close(quietest->fd);
  pending_.erase(quietest);
  ++dropped_quiet_;
}

}  // namespace

void AcceptPeers(const Config& config, int generation, int listen_fd, std::vector<int>& fds,
                 std::chrono::steady_clock::time_point deadline, RendezvousClient* rendezvous) {
  SetNonBlocking(listen_fd, true);  // accepts in a row until none is left waiting
  Acceptor acceptor(config, generation, listen_fd, fds, rendezvous);
  acceptor.Run(deadline);
}

}  // namespace horovodlike
