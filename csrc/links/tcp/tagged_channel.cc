#include "tagged_channel.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <sstream>

#include "../../common/interrupt.h"

namespace horovodlike {
namespace {

constexpr uint32_t kFrameMagic = 0x4754564c;  // "LVTG"
constexpr size_t kInBytes = 64 << 10;          // the bulk read buffer per peer

using FrameHeader = TaggedFrameHeader;

using Clock = std::chrono::steady_clock;

std::string Seconds(double seconds) {
  std::ostringstream out;
  out << seconds;
  return out.str();
}

bool WouldBlock(int error) { return error == EAGAIN || error == EWOULDBLOCK || error == EINTR; }

}  // namespace

struct TaggedChannel::Peer {
  int fd = -1;
  std::deque<std::shared_ptr<Op>> sends;  // in order; the first is written
  TaggedInbox inbox;
  std::vector<uint8_t> in = std::vector<uint8_t>(kInBytes);
  size_t in_begin = 0, in_end = 0;
  bool lost = false;
  bool write_broken = false;  // writing failed: sends fail, what arrived is still read
  std::string lost_why;
  TransportError::Cause lost_cause = TransportError::Cause::kPeerLost;
};

class TaggedChannel::TcpRequest : public Link::Request {
 public:
  TcpRequest(TaggedChannel& channel, std::shared_ptr<Op> op)
      : channel_(channel), op_(std::move(op)) {}
  ~TcpRequest() override {
    if (op_->finished()) return;
    std::lock_guard<std::mutex> lock(channel_.mutex_);
    channel_.peers_[op_->peer].inbox.Cancel(op_);
  }
  bool test() override {
    std::lock_guard<std::mutex> lock(channel_.mutex_);
    if (!op_->finished()) channel_.PumpLocked();
    return op_->Check();
  }
  void wait() override { channel_.Wait(*op_); }

 private:
  TaggedChannel& channel_;
  std::shared_ptr<Op> op_;
};

TaggedChannel::TaggedChannel(int rank, std::vector<int> fds, int timeout_ms)
    : rank_(rank), timeout_ms_(timeout_ms), peers_(fds.size()) {
  for (size_t i = 0; i < fds.size(); ++i) peers_[i].fd = fds[i];
}

TaggedChannel::~TaggedChannel() {
  for (Peer& p : peers_) if (p.fd >= 0) ::close(p.fd);
}

void TaggedChannel::Abort() {
  aborted_ = true;
  for (Peer& p : peers_) if (p.fd >= 0) ::shutdown(p.fd, SHUT_RDWR);
}

void TaggedChannel::CheckPeer(int peer) const {
  if (peer < 0 || peer >= static_cast<int>(peers_.size()) || peer == rank_) {
    throw TransportError("no connection to rank " + std::to_string(peer));
  }
}

std::unique_ptr<Link::Request> TaggedChannel::Send(int peer, int tag, const void* buf, size_t n) {
  CheckPeer(peer);
  auto op = TaggedOp::Make(peer, tag, buf, nullptr, n);
  op->header.magic = kFrameMagic;
  op->header.tag = tag;
  op->header.bytes = n;
  std::lock_guard<std::mutex> lock(mutex_);
  Peer& p = peers_[peer];
  if (p.lost || p.write_broken) {
    op->Fail(p.lost_why, peer, p.lost_cause);
  } else {
    p.sends.push_back(op);
    if (p.sends.size() == 1) WriteLocked(peer);  // eager: as far as the socket takes it
  }
  return std::make_unique<TcpRequest>(*this, op);
}

std::unique_ptr<Link::Request> TaggedChannel::Recv(int peer, int tag, void* buf, size_t n) {
  CheckPeer(peer);
  auto op = TaggedOp::Make(peer, tag, nullptr, buf, n);
  std::lock_guard<std::mutex> lock(mutex_);
  Peer& p = peers_[peer];
  p.inbox.Post(op, peer);
  // A message kept from a peer lost since is still delivered; nothing more comes after it.
  if (!op->finished() && p.lost) {
    p.inbox.FailAll(p.lost_why, peer, p.lost_cause);
  }
  return std::make_unique<TcpRequest>(*this, op);
}

void TaggedChannel::FailPeerLocked(int peer, const std::string& what,
                                   TransportError::Cause cause) {
  Peer& p = peers_[peer];
  if (p.lost) return;
  p.lost = true;
  if (!p.write_broken || aborted_) p.lost_why = aborted_ ? std::string("the link was shut down")
                        : "lost connection to rank " + std::to_string(peer) + ": " + what;
  p.lost_cause = cause;
  for (auto& op : p.sends) op->Fail(p.lost_why, peer, cause);
  p.sends.clear();
  p.inbox.FailAll(p.lost_why, peer, cause);
}

bool TaggedChannel::WriteLocked(int peer) {
  Peer& p = peers_[peer];
  bool completed = false;
  while (!p.sends.empty() && !p.lost) {
    Op& op = *p.sends.front();
    const size_t head = sizeof(FrameHeader);
    iovec iov[2];
    int count = 0;
    if (op.written < head) {
      iov[count++] = {reinterpret_cast<uint8_t*>(&op.header) + op.written, head - op.written};
    }
    const size_t sent_payload = op.written > head ? op.written - head : 0;
    if (op.n > sent_payload) {
      iov[count++] = {const_cast<uint8_t*>(op.sbuf) + sent_payload, op.n - sent_payload};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = count;
    const ssize_t w = ::sendmsg(p.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (WouldBlock(errno)) break;
      // The peer is gone, but what it sent before may still be waiting to be read: only the
      // sends fail now; the receives fail once reading reaches the end.
      p.write_broken = true;
      p.lost_why = aborted_ ? std::string("the link was shut down")
                            : "lost connection to rank " + std::to_string(peer) + ": " +
                                  std::strerror(errno);
      p.lost_cause = TransportError::Cause::kPeerLost;
      for (auto& failed : p.sends) failed->Fail(p.lost_why, peer, p.lost_cause);
      p.sends.clear();
      return true;
    }
    op.written += static_cast<size_t>(w);
    if (op.written == head + op.n) {
      op.Complete();
      p.sends.pop_front();
      completed = true;
    }
  }
  return completed;
}

bool TaggedChannel::ReadLocked(int peer) {
  Peer& p = peers_[peer];
  while (!p.lost) {
    const size_t buffered = p.in_end - p.in_begin;
    if (!p.inbox.reading() && buffered >= sizeof(FrameHeader)) {
      FrameHeader frame;
      std::memcpy(&frame, p.in.data() + p.in_begin, sizeof(frame));
      if (frame.magic != kFrameMagic || frame.bytes > kMaxTaggedMessageBytes || frame.tag < 0) {
        FailPeerLocked(peer, "a corrupt tagged frame", TransportError::Cause::kPeerLost);
        return true;
      }
      p.in_begin += sizeof(FrameHeader);
      p.inbox.Start(frame.tag, frame.bytes);
    }
    if (p.inbox.reading()) {
      const size_t take = std::min<size_t>(p.inbox.left(), p.in_end - p.in_begin);
      if (take > 0) std::memcpy(p.inbox.dest(), p.in.data() + p.in_begin, take);
      p.inbox.Advance(take);
      p.in_begin += take;
      if (p.inbox.left() == 0) {
        // A completed receive ends the round, so that its owner may post the next one before
        // the following frame is read (a payload then lands in place rather than in a copy).
        if (p.inbox.Finish(peer)) return true;
        continue;
      }
    }
    // Read more: a large rest of a payload straight into place, else into the buffer (less
    // than a header is left in it here).
    const size_t rest = p.inbox.reading() ? p.inbox.left() : 0;
    const bool direct = rest >= kInBytes / 2;
    if (!direct && p.in_begin > 0) {
      std::memmove(p.in.data(), p.in.data() + p.in_begin, p.in_end - p.in_begin);
      p.in_end -= p.in_begin;
      p.in_begin = 0;
    }
    uint8_t* into = direct ? p.inbox.dest() : p.in.data() + p.in_end;
    const size_t room = direct ? rest : p.in.size() - p.in_end;
    const ssize_t r = ::recv(p.fd, into, room, MSG_DONTWAIT);
    if (r > 0) {
      if (direct) {
        p.inbox.Advance(static_cast<size_t>(r));
      } else {
        p.in_end += static_cast<size_t>(r);
      }
      continue;
    }
    if (r < 0 && WouldBlock(errno)) return false;
    FailPeerLocked(peer, r == 0 ? "the peer closed the connection (it exited or was killed)"
                                : std::strerror(errno), TransportError::Cause::kPeerLost);
    return true;
  }
  return false;
}

bool TaggedChannel::PumpLocked() {
  bool completed = false;
  for (int peer = 0; peer < static_cast<int>(peers_.size()); ++peer) {
    if (peer == rank_ || peers_[peer].fd < 0 || peers_[peer].lost) continue;
    if (WriteLocked(peer)) completed = true;
    if (ReadLocked(peer)) completed = true;
  }
  return completed;
}

void TaggedChannel::PollPeers(int timeout_ms, int wake_fd) {
  std::vector<pollfd> polls;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Peer& p : peers_) {
      if (p.fd < 0 || p.lost) continue;
      polls.push_back({p.fd, static_cast<short>(POLLIN | (p.sends.empty() ? 0 : POLLOUT)), 0});
    }
  }
  if (polls.empty()) return;
  if (wake_fd >= 0) polls.push_back({wake_fd, POLLIN, 0});
  ::poll(polls.data(), polls.size(), timeout_ms);
}

void TaggedChannel::Progress(int timeout_ms, int wake_fd) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (aborted_) throw TransportError("the link was shut down");
    if (PumpLocked() || timeout_ms <= 0) return;
  }
  PollPeers(timeout_ms, wake_fd);
  std::lock_guard<std::mutex> lock(mutex_);
  PumpLocked();
}

void TaggedChannel::Wait(Op& op) {
  auto idle_since = Clock::now();
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!op.finished() && PumpLocked()) idle_since = Clock::now();
      if (op.Check()) return;
      const auto idle = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() -
                                                                              idle_since);
      if (idle >= kInterruptAfter && InterruptRequested()) {
        throw TransportError(InterruptedWaitMessage(op.peer), op.peer,
                             TransportError::Cause::kInterrupted);
      }
      if (idle.count() >= timeout_ms_) {
        // The peer's stream of frames is no longer in step: it fails as a whole.
        FailPeerLocked(op.peer, "nothing received or sent for " + Seconds(timeout_ms_ / 1000.0) +
                                    " s (HOROVOD_PEER_TIMEOUT_SECONDS); the peer is stopped, "
                                    "hung or unreachable", TransportError::Cause::kPeerTimeout);
        continue;
      }
    }
    PollPeers(100);
  }
}

}  // namespace horovodlike
