#include "shm_tagged.h"

#include <algorithm>
#include <cstring>

#include "shm_bell.h"
#include "shm_link.h"
#include "shm_os.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HVDL_TAG_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define HVDL_TAG_RELAX() asm volatile("yield" ::: "memory")
#else
#define HVDL_TAG_RELAX() std::atomic_signal_fence(std::memory_order_seq_cst)
#endif

namespace horovodlike {
namespace {

constexpr uint32_t kFrameMagic = 0x4754534c;  // "LSTG"
// How often a waiter looks at its peers' processes through /proc.
constexpr auto kProcessCheckInterval = std::chrono::milliseconds(10);

using FrameHeader = TaggedFrameHeader;

using Clock = std::chrono::steady_clock;

}  // namespace

struct ShmTaggedChannel::Peer {
  std::deque<std::shared_ptr<Op>> sends;  // in order; the first is written
  TaggedInbox inbox;
  bool lost = false;
  std::string lost_why;
  TransportError::Cause lost_cause = TransportError::Cause::kPeerLost;
};

class ShmTaggedChannel::ShmRequest : public Link::Request {
 public:
  ShmRequest(ShmTaggedChannel& channel, std::shared_ptr<Op> op)
      : channel_(channel), op_(std::move(op)) {}
  ~ShmRequest() override {
    if (op_->finished()) return;
    std::lock_guard<std::mutex> lock(channel_.mutex_);
    channel_.peers_[op_->peer].inbox.Cancel(op_);
  }
  bool test() override {
    if (!op_->finished()) {
      std::lock_guard<std::mutex> lock(channel_.mutex_);
      if (channel_.PumpLocked()) channel_.WakeOwnWaiters();
      channel_.CheckPeersLocked();
    }
    return op_->Check();
  }
  void wait() override { channel_.Wait(*op_); }

 private:
  ShmTaggedChannel& channel_;
  std::shared_ptr<Op> op_;
};

ShmTaggedChannel::ShmTaggedChannel(ShmLink& link)
    : link_(link), me_(link.rank()), bytes_(link.layout_.tagged_bytes),
      slice_(std::max<size_t>(4096, link.layout_.tagged_bytes / 8)), peers_(link.size()),
      sending_(new std::atomic<bool>[link.size()]), lost_(new std::atomic<bool>[link.size()]),
      last_process_check_(Clock::now()) {
  for (int p = 0; p < link.size(); ++p) {
    sending_[p].store(false);
    lost_[p].store(false);
  }
}

ShmTaggedChannel::~ShmTaggedChannel() = default;

shm::ChannelControl& ShmTaggedChannel::control(int from, int to) const {
  return reinterpret_cast<shm::ChannelControl*>(link_.segment_.data() +
                                                link_.layout_.tagged_channels)
      [static_cast<size_t>(from) * peers_.size() + to];
}

uint8_t* ShmTaggedChannel::ring(int from, int to) const {
  return link_.segment_.data() + link_.layout_.tagged_rings +
         (static_cast<size_t>(from) * peers_.size() + to) * bytes_;
}

std::string ShmTaggedChannel::PeerName(int peer) const {
  return "rank " + std::to_string(link_.members_[peer]);
}

// ---------------------------------------------------------------------------------- posting

std::unique_ptr<Link::Request> ShmTaggedChannel::Send(int peer, int tag, const void* buf,
                                                      size_t n) {
  auto op = TaggedOp::Make(peer, tag, buf, nullptr, n);
  std::lock_guard<std::mutex> lock(mutex_);
  if (link_.aborted_.load(std::memory_order_relaxed)) FailAllLocked("the link was shut down");
  Peer& p = peers_[peer];
  // A peer whose runtime stopped reads nothing more: the send fails now, as a write to a
  // closed socket does.
  if (!p.lost && link_.control(peer).aborted.load(std::memory_order_acquire) != 0) {
    op->Fail("lost connection to " + PeerName(peer) + ": it stopped (shut down, or after an "
             "error)", link_.members_[peer], TransportError::Cause::kPeerLost);
  } else if (p.lost) {
    op->Fail(p.lost_why, link_.members_[peer], p.lost_cause);
  } else {
    p.sends.push_back(op);
    sending_[peer].store(true, std::memory_order_relaxed);
    if (p.sends.size() == 1) WriteLocked(peer);  // eager: as far as the ring takes it
  }
  return std::make_unique<ShmRequest>(*this, op);
}

std::unique_ptr<Link::Request> ShmTaggedChannel::Recv(int peer, int tag, void* buf, size_t n) {
  auto op = TaggedOp::Make(peer, tag, nullptr, buf, n);
  std::lock_guard<std::mutex> lock(mutex_);
  Peer& p = peers_[peer];
  p.inbox.Post(op, link_.members_[peer]);
  // A message kept from a peer lost since is still delivered; nothing more comes after it.
  if (!op->finished() && p.lost) p.inbox.FailAll(p.lost_why, link_.members_[peer], p.lost_cause);
  return std::make_unique<ShmRequest>(*this, op);
}

// ---------------------------------------------------------------------------------- moving

bool ShmTaggedChannel::WriteLocked(int peer) {
  Peer& p = peers_[peer];
  shm::ChannelControl& c = control(me_, peer);
  uint8_t* data = ring(me_, peer);
  bool completed = false;
  while (!p.sends.empty() && !p.lost) {
    Op& op = *p.sends.front();
    const uint64_t head = c.head.load(std::memory_order_relaxed);
    const size_t room = bytes_ - static_cast<size_t>(head - c.tail.load(std::memory_order_acquire));
    uint64_t at = head;
    size_t left = room;
    if (op.header.magic == 0) {  // not written yet
      if (room < sizeof(FrameHeader)) break;
      op.header = {kFrameMagic, op.tag, op.n};
      shm::RingCopyIn(data, bytes_, at, &op.header, sizeof(op.header));
      at += sizeof(op.header);
      left -= sizeof(op.header);
    }
    const size_t w = std::min({op.n - op.written, left, slice_});
    if (w > 0) shm::RingCopyIn(data, bytes_, at, op.sbuf + op.written, w);
    at += w;
    op.written += w;
    if (at == head) break;  // the ring is full
    c.head.store(at, std::memory_order_release);
    link_.Notify(peer);
    if (op.written == op.n) {
      op.Complete();
      p.sends.pop_front();
      completed = true;
    }
  }
  sending_[peer].store(!p.sends.empty(), std::memory_order_relaxed);
  return completed;
}

bool ShmTaggedChannel::ReadLocked(int peer) {
  Peer& p = peers_[peer];
  shm::ChannelControl& c = control(peer, me_);
  const uint8_t* data = ring(peer, me_);
  while (!p.lost) {
    const uint64_t tail = c.tail.load(std::memory_order_relaxed);
    const size_t available = static_cast<size_t>(c.head.load(std::memory_order_acquire) - tail);
    if (available == 0) return false;
    uint64_t at = tail;
    if (!p.inbox.reading()) {
      // Published whole with its first slice: there is all of a header or none.
      FrameHeader frame;
      shm::RingCopyOut(data, bytes_, at, &frame, sizeof(frame));
      if (available < sizeof(frame) || frame.magic != kFrameMagic || frame.tag < 0 ||
          frame.bytes > kMaxTaggedMessageBytes) {
        FailPeerLocked(peer, "lost connection to " + PeerName(peer) + ": a corrupt tagged "
                       "message in shared memory", TransportError::Cause::kPeerLost);
        return true;
      }
      at += sizeof(frame);
      p.inbox.Start(frame.tag, frame.bytes);
    }
    const size_t take = std::min<size_t>({p.inbox.left(),
                                          available - static_cast<size_t>(at - tail), slice_});
    if (take > 0) shm::RingCopyOut(data, bytes_, at, p.inbox.dest(), take);
    p.inbox.Advance(take);
    at += take;
    c.tail.store(at, std::memory_order_release);
    link_.Notify(peer);  // room for its next slice
    // A completed receive ends the round, so that its owner may post the next one before the
    // following message is read (a payload then lands in place rather than in a copy).
    if (p.inbox.left() == 0 && p.inbox.Finish(link_.members_[peer])) return true;
  }
  return false;
}

bool ShmTaggedChannel::PumpLocked() {
  if (link_.aborted_.load(std::memory_order_relaxed)) {
    FailAllLocked("the link was shut down");
    return true;
  }
  bool completed = false;
  for (int peer = 0; peer < static_cast<int>(peers_.size()); ++peer) {
    if (peer == me_ || peers_[peer].lost) continue;
    if (!peers_[peer].sends.empty() && WriteLocked(peer)) completed = true;
    if (ReadLocked(peer)) completed = true;
  }
  return completed;
}

// ---------------------------------------------------------------------------------- failing

void ShmTaggedChannel::FailPeerLocked(int peer, const std::string& why,
                                      TransportError::Cause cause) {
  Peer& p = peers_[peer];
  if (p.lost) return;
  p.lost = true;
  lost_[peer].store(true, std::memory_order_relaxed);
  p.lost_why = why;
  p.lost_cause = cause;
  const int who = link_.members_[peer];
  for (auto& op : p.sends) op->Fail(why, who, cause);
  p.sends.clear();
  sending_[peer].store(false, std::memory_order_relaxed);
  p.inbox.FailAll(why, who, cause);
}

void ShmTaggedChannel::FailAllLocked(const std::string& why) {
  for (int peer = 0; peer < static_cast<int>(peers_.size()); ++peer) {
    if (peer != me_) FailPeerLocked(peer, why, TransportError::Cause::kOther);
  }
}

void ShmTaggedChannel::CheckPeersLocked() {
  const auto now = Clock::now();
  const bool look_at_processes = now - last_process_check_ >= kProcessCheckInterval;
  if (look_at_processes) last_process_check_ = now;
  for (int peer = 0; peer < static_cast<int>(peers_.size()); ++peer) {
    Peer& p = peers_[peer];
    if (peer == me_ || p.lost) continue;
    const shm::RankControl& rc = link_.control(peer);
    std::string why;
    if (rc.aborted.load(std::memory_order_acquire) != 0) {
      why = "it stopped (shut down, or after an error)";
    } else if (look_at_processes && !shm::ProcessAlive(rc.pid, rc.start_time)) {
      why = "the process exited or was killed (shared memory peer)";
    } else {
      continue;
    }
    // What it wrote before it stopped is still read, as a closed socket's data is.
    ReadLocked(peer);
    const shm::ChannelControl& in = control(peer, me_);
    if (in.head.load(std::memory_order_acquire) != in.tail.load(std::memory_order_relaxed)) {
      continue;
    }
    FailPeerLocked(peer, "lost connection to " + PeerName(peer) + ": " + why,
                   TransportError::Cause::kPeerLost);
  }
}

// ---------------------------------------------------------------------------------- waiting

bool ShmTaggedChannel::WorkWaiting() const {
  for (int peer = 0; peer < static_cast<int>(peers_.size()); ++peer) {
    if (peer == me_ || lost_[peer].load(std::memory_order_relaxed)) continue;
    const shm::ChannelControl& in = control(peer, me_);
    if (in.head.load(std::memory_order_acquire) != in.tail.load(std::memory_order_relaxed)) {
      return true;
    }
    if (sending_[peer].load(std::memory_order_relaxed)) {
      const shm::ChannelControl& out = control(me_, peer);
      // A header needs its 16 bytes at once; a payload's slice takes any room.
      if (bytes_ - (out.head.load(std::memory_order_relaxed) -
                    out.tail.load(std::memory_order_acquire)) >= sizeof(FrameHeader)) {
        return true;
      }
    }
  }
  return false;
}

void ShmTaggedChannel::WakeOwnWaiters() {
  shm::RankControl& mine = link_.control(me_);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (mine.sleeping.load(std::memory_order_relaxed) != 0) {
    mine.doorbell.fetch_add(1, std::memory_order_relaxed);
    shm::FutexWakeAll(&mine.doorbell);
  }
}

void ShmTaggedChannel::Wait(Op& op) {
  while (true) {
    if (!op.finished()) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (PumpLocked()) WakeOwnWaiters();
      CheckPeersLocked();
    }
    if (op.Check()) return;
    try {
      link_.WaitFor([&] { return op.finished() || WorkWaiting(); }, op.peer);
    } catch (const TransportError& e) {
      if (e.cause() == TransportError::Cause::kInterrupted) throw;
      std::lock_guard<std::mutex> lock(mutex_);
      if (link_.aborted_.load(std::memory_order_relaxed)) {
        FailAllLocked("the link was shut down");
      } else {
        ReadLocked(op.peer);  // what it wrote before it stopped is still read
        FailPeerLocked(op.peer, e.what(), e.cause());
      }
    }
  }
}

void ShmTaggedChannel::Progress(int timeout_ms) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (link_.aborted_.load(std::memory_order_relaxed)) {
      FailAllLocked("the link was shut down");
      throw TransportError("the link was shut down");
    }
    const bool moved = PumpLocked();
    CheckPeersLocked();
    if (moved) WakeOwnWaiters();
    if (moved || timeout_ms <= 0) return;
  }
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  bool work = false;
  // A running peer answers within microseconds, and a futex wake-up costs tens: spin first,
  // as the stream's waits do, while no thread on the machine waits for a core.
  if (link_.spins() && !link_.CpusOversubscribed()) {
    const auto spin_end = std::min(deadline, Clock::now() + std::chrono::nanoseconds(
                                                                link_.max_spin_ns_));
    while (!work && Clock::now() < spin_end) {
      for (int i = 0; i < 64 && !work; ++i) {
        HVDL_TAG_RELAX();
        work = WorkWaiting();
      }
    }
  }
  if (!work) {
    shm::RankControl& mine = link_.control(me_);
    const uint32_t key = mine.doorbell.load(std::memory_order_acquire);
    mine.sleeping.fetch_add(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                            Clock::now());
    if (!WorkWaiting() && left.count() > 0) {
      shm::FutexWait(&mine.doorbell, key, static_cast<int>(left.count()));
    }
    mine.sleeping.fetch_sub(1, std::memory_order_relaxed);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (PumpLocked()) WakeOwnWaiters();
  CheckPeersLocked();
}

// ---------------------------------------------------------------------------------- the link's

namespace {

void CheckTaggedPeer(const ShmLink& link, int peer) {
  if (peer < 0 || peer >= link.size() || peer == link.rank()) {
    throw TransportError("shm: no tagged channel between local ranks " +
                         std::to_string(link.rank()) + " and " + std::to_string(peer));
  }
}

}  // namespace

std::unique_ptr<Link::Request> ShmLink::isend(int peer, int tag, const void* buf, size_t n) {
  CheckTaggedPeer(*this, peer);
  return tagged_->Send(peer, tag, buf, n);
}

std::unique_ptr<Link::Request> ShmLink::irecv(int peer, int tag, void* buf, size_t n) {
  CheckTaggedPeer(*this, peer);
  return tagged_->Recv(peer, tag, buf, n);
}

void ShmLink::progress(int timeout_ms) { tagged_->Progress(timeout_ms); }

int ShmLink::PollBell() const {
  return control(index_).bell_token != 0 ? shm::PollBellFd() : -1;
}

void ShmLink::SetPolling(bool polling) {
  shm::RankControl& mine = control(index_);
  if (polling) {
    mine.polling.fetch_add(1, std::memory_order_relaxed);
    // Pairs with the fence in Notify: either a peer sees the count and rings, or the
    // caller's look at the channels after this sees what the peer published.
    std::atomic_thread_fence(std::memory_order_seq_cst);
  } else {
    mine.polling.fetch_sub(1, std::memory_order_relaxed);
    shm::DrainPollBell();
  }
}

bool ShmLink::TaggedWorkWaiting() const { return tagged_->WorkWaiting(); }

}  // namespace horovodlike
