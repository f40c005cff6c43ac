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
constexpr uint64_t kMaxFrameBytes = uint64_t{1} << 48;

struct FrameHeader {
  uint32_t magic = kFrameMagic;
  int32_t tag = 0;
  uint64_t bytes = 0;
};
static_assert(sizeof(FrameHeader) == 16, "wire structs must not be padded");

using Clock = std::chrono::steady_clock;

std::string Seconds(double seconds) {
  std::ostringstream out;
  out << seconds;
  return out.str();
}

bool WouldBlock(int error) { return error == EAGAIN || error == EWOULDBLOCK || error == EINTR; }

}  // namespace

// One request's state, shared by the request and the peer's queues.
struct TaggedChannel::Op {
  int peer = -1;
  int tag = 0;
  const uint8_t* sbuf = nullptr;  // a send's payload
  uint8_t* rbuf = nullptr;        // a receive's buffer
  size_t n = 0;
  FrameHeader header;   // a send's frame header
  size_t written = 0;   // a send's bytes written, header included
  bool done = false;
  bool failed = false;
  std::string error;
  int error_peer = -1;
  TransportError::Cause cause = TransportError::Cause::kOther;

  void Fail(const std::string& what, int who, TransportError::Cause why) {
    if (done || failed) return;
    failed = true;
    error = what;
    error_peer = who;
    cause = why;
  }
};

struct TaggedChannel::Peer {
  int fd = -1;
  std::deque<std::shared_ptr<Op>> sends;                      // in order; the first is written
  std::map<int, std::deque<std::shared_ptr<Op>>> posted;      // receives per tag
  std::map<int, std::deque<std::vector<uint8_t>>> unexpected;  // messages before their receive
  std::vector<uint8_t> in = std::vector<uint8_t>(kInBytes);
  size_t in_begin = 0, in_end = 0;
  bool in_frame = false;  // a frame's header was read, its payload not all
  FrameHeader frame;
  size_t frame_got = 0;
  std::shared_ptr<Op> target;   // the receive the frame fills; null: into `stash`
  std::vector<uint8_t> stash;   // a frame no receive was posted for (or of the wrong size)
  uint8_t* dest = nullptr;
  bool lost = false;
  bool write_broken = false;  // writing failed: sends fail, what arrived is still read
  std::string lost_why;
  TransportError::Cause lost_cause = TransportError::Cause::kPeerLost;
};

class TaggedChannel::TcpRequest : public Link::Request {
 public:
  TcpRequest(TaggedChannel& channel, std::shared_ptr<Op> op)
      : channel_(channel), op_(std::move(op)) {}
  bool test() override {
    std::lock_guard<std::mutex> lock(channel_.mutex_);
    if (!op_->done && !op_->failed) channel_.PumpLocked();
    return Check();
  }
  void wait() override { channel_.Wait(*op_); }

 private:
  bool Check() const {
    if (op_->failed) throw TransportError(op_->error, op_->error_peer, op_->cause);
    return op_->done;
  }
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
  auto op = std::make_shared<Op>();
  op->peer = peer;
  op->tag = tag;
  op->sbuf = static_cast<const uint8_t*>(buf);
  op->n = n;
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
  auto op = std::make_shared<Op>();
  op->peer = peer;
  op->tag = tag;
  op->rbuf = static_cast<uint8_t*>(buf);
  op->n = n;
  std::lock_guard<std::mutex> lock(mutex_);
  Peer& p = peers_[peer];
  auto kept = p.unexpected.find(tag);
  if (kept != p.unexpected.end() && !kept->second.empty()) {
    // Arrived already (also from a peer lost since: a closed socket's data is read first).
    std::vector<uint8_t> message = std::move(kept->second.front());
    kept->second.pop_front();
    if (message.size() != n) {
      op->Fail("a tagged message of " + std::to_string(message.size()) + " bytes from rank " +
               std::to_string(peer) + " for a receive of " + std::to_string(n) + " bytes",
               peer, TransportError::Cause::kOther);
    } else {
      if (n > 0) std::memcpy(op->rbuf, message.data(), n);
      op->done = true;
    }
  } else if (p.lost) {
    op->Fail(p.lost_why, peer, p.lost_cause);
  } else {
    p.posted[tag].push_back(op);
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
  for (auto& [tag, ops] : p.posted) {
    for (auto& op : ops) op->Fail(p.lost_why, peer, cause);
  }
  p.posted.clear();
  if (p.target) p.target->Fail(p.lost_why, peer, cause);
  p.target.reset();
  p.in_frame = false;
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
      op.done = true;
      p.sends.pop_front();
      completed = true;
    }
  }
  return completed;
}

void TaggedChannel::StartFrameLocked(Peer& p) {
  std::memcpy(&p.frame, p.in.data() + p.in_begin, sizeof(FrameHeader));
  p.in_begin += sizeof(FrameHeader);
  p.in_frame = true;
  p.frame_got = 0;
  p.target.reset();
  auto posted = p.posted.find(p.frame.tag);
  if (posted != p.posted.end() && !posted->second.empty()) {
    p.target = posted->second.front();
    posted->second.pop_front();
  }
  const size_t bytes = static_cast<size_t>(p.frame.bytes);
  if (p.target && p.target->n == bytes) {
    p.dest = p.target->rbuf;
  } else {
    p.stash.assign(bytes, 0);  // kept for a later receive, or read to report a mismatch
    p.dest = p.stash.data();
  }
}

void TaggedChannel::FinishFrameLocked(Peer& p) {
  p.in_frame = false;
  if (!p.target) {
    p.unexpected[p.frame.tag].push_back(std::move(p.stash));
    p.stash = {};
    return;
  }
  if (p.target->n != p.frame.bytes) {
    p.target->Fail("a tagged message of " + std::to_string(p.frame.bytes) + " bytes from rank " +
                   std::to_string(p.target->peer) + " for a receive of " +
                   std::to_string(p.target->n) + " bytes", p.target->peer,
                   TransportError::Cause::kOther);
    p.stash = {};
  } else {
    p.target->done = true;
  }
  p.target.reset();
}

bool TaggedChannel::ReadLocked(int peer) {
  Peer& p = peers_[peer];
  while (!p.lost) {
    const size_t buffered = p.in_end - p.in_begin;
    if (!p.in_frame && buffered >= sizeof(FrameHeader)) {
      FrameHeader peek;
      std::memcpy(&peek, p.in.data() + p.in_begin, sizeof(peek));
      if (peek.magic != kFrameMagic || peek.bytes > kMaxFrameBytes || peek.tag < 0) {
        FailPeerLocked(peer, "a corrupt tagged frame", TransportError::Cause::kPeerLost);
        return true;
      }
      StartFrameLocked(p);
    }
    if (p.in_frame) {
      const size_t take = std::min<size_t>(p.frame.bytes - p.frame_got, p.in_end - p.in_begin);
      if (take > 0) std::memcpy(p.dest + p.frame_got, p.in.data() + p.in_begin, take);
      p.frame_got += take;
      p.in_begin += take;
      if (p.frame_got == p.frame.bytes) {
        const bool completes = p.target != nullptr;
        FinishFrameLocked(p);
        // A completed receive ends the round, so that its owner may post the next one before
        // the following frame is read (a payload then lands in place rather than in a copy).
        if (completes) return true;
        continue;
      }
    }
    // Read more: a large rest of a payload straight into place, else into the buffer (less
    // than a header is left in it here).
    const size_t rest = p.in_frame ? p.frame.bytes - p.frame_got : 0;
    const bool direct = rest >= kInBytes / 2;
    if (!direct && p.in_begin > 0) {
      std::memmove(p.in.data(), p.in.data() + p.in_begin, p.in_end - p.in_begin);
      p.in_end -= p.in_begin;
      p.in_begin = 0;
    }
    uint8_t* into = direct ? p.dest + p.frame_got : p.in.data() + p.in_end;
    const size_t room = direct ? rest : p.in.size() - p.in_end;
    const ssize_t r = ::recv(p.fd, into, room, MSG_DONTWAIT);
    if (r > 0) {
      (direct ? p.frame_got : p.in_end) += static_cast<size_t>(r);
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

void TaggedChannel::PollPeers(int timeout_ms) {
  std::vector<pollfd> polls;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Peer& p : peers_) {
      if (p.fd < 0 || p.lost) continue;
      polls.push_back({p.fd, static_cast<short>(POLLIN | (p.sends.empty() ? 0 : POLLOUT)), 0});
    }
  }
  if (polls.empty()) return;
  ::poll(polls.data(), polls.size(), timeout_ms);
}

void TaggedChannel::Progress(int timeout_ms) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (aborted_) throw TransportError("the link was shut down");
    if (PumpLocked() || timeout_ms <= 0) return;
  }
  PollPeers(timeout_ms);
  std::lock_guard<std::mutex> lock(mutex_);
  PumpLocked();
}

void TaggedChannel::Wait(Op& op) {
  auto idle_since = Clock::now();
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!op.done && !op.failed && PumpLocked()) idle_since = Clock::now();
      if (op.failed) throw TransportError(op.error, op.error_peer, op.cause);
      if (op.done) return;
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
