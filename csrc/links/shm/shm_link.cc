#include "shm_link.h"

#include "shm_bell.h"
#include "shm_os.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "../../common/hmac.h"
#include "../../common/interrupt.h"
#include "../../common/logging.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HVDL_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define HVDL_CPU_RELAX() asm volatile("yield" ::: "memory")
#else
#define HVDL_CPU_RELAX() std::atomic_signal_fence(std::memory_order_seq_cst)
#endif

namespace horovodlike {
namespace {

using shm::FutexWait;
using shm::FutexWakeAll;
using shm::ProcessAlive;
using shm::RecordThisProcess;

using Clock = std::chrono::steady_clock;

// When a spinner (see WaitUntil) checks whether other threads wait for a core.
constexpr auto kFirstLoadCheck = std::chrono::microseconds(2);
constexpr auto kLoadCheckInterval = std::chrono::microseconds(50);
// A sleeper wakes this often to check that its peers are alive.
constexpr int kSleepSliceMs = 10;

size_t FloorPowerOfTwo(size_t n) {
  size_t p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

// The segment's name: derived from the job's secret (so that no other job's name collides and
// the name reveals nothing about the secret), the generation and the creating rank.
std::string SegmentName(const std::string& secret, int generation, int leader) {
  const std::string context = "shm-segment/" + std::to_string(generation) + "/" +
                              std::to_string(leader);
  const Sha256Digest mac = HmacSha256(secret, context);
  return "/hvdl-" + ToHex(mac.data(), 12) + "-g" + std::to_string(generation) + "-r" +
         std::to_string(leader);
}

// Sent by the creator to every other member over the bootstrap link.
struct Offer {
  uint32_t ok;
  uint32_t ranks;
  uint64_t nonce;
  uint64_t total_bytes;
  char name[128];
};

struct Geometry {
  size_t channel, chunk, small, tagged;
};

// The geometry asked for, fitted to the number of ranks: the channels shrink with the number of
// pairs and the staging with the number of ranks, so that big hosts stay within a modest
// /dev/shm (Docker's default is 64 MiB).
Geometry FitGeometry(const ShmLink::Options& options, size_t ranks) {
  Geometry g;
  g.channel = FloorPowerOfTwo(std::max<size_t>(
      8 << 10, std::min(options.channel_bytes, (size_t{32} << 20) / (ranks * (ranks - 1)))));
  g.chunk = shm::RoundUp(std::min(options.chunk_bytes,
                                  std::max<size_t>(64 << 10, (size_t{16} << 20) / (2 * ranks))),
                         shm::kPage);
  g.small = std::min(options.small_bytes, g.chunk);
  // Tagged messages (point-to-point) get rings of their own, from a smaller budget.
  g.tagged = FloorPowerOfTwo(std::max<size_t>(
      8 << 10, std::min(options.channel_bytes, (size_t{8} << 20) / (ranks * (ranks - 1)))));
  return g;
}

// Leader: creates and initialises the segment; returns the offer for the members (ok = 0 when
// it could not, and the ranks of this host use TCP).
Offer CreateSegment(const ShmLink::Options& options, int leader, size_t ranks,
                    ShmSegment* segment) {
  Offer offer{};
  try {
    const Geometry g = FitGeometry(options, ranks);
    shm::Layout layout(ranks, g.channel, g.chunk, g.tagged);
    uint64_t nonce = 0;
    RandomBytes(&nonce, sizeof(nonce));
    const std::string name = SegmentName(options.secret, options.generation, leader);
    *segment = ShmSegment::Create(name, layout.total);
    auto* header = reinterpret_cast<shm::SegmentHeader*>(segment->data());
    header->nonce = nonce;
    header->ranks = static_cast<uint32_t>(ranks);
    header->channel_bytes = g.channel;
    header->chunk_bytes = g.chunk;
    header->small_bytes = g.small;
    header->tagged_bytes = g.tagged;
    header->total_bytes = layout.total;
    RecordThisProcess(reinterpret_cast<shm::RankControl*>(segment->data() + layout.controls));
    header->magic.store(shm::kMagic, std::memory_order_release);
    offer.ok = 1;
    offer.ranks = static_cast<uint32_t>(ranks);
    offer.nonce = nonce;
    offer.total_bytes = layout.total;
    std::snprintf(offer.name, sizeof(offer.name), "%s", name.c_str());
  } catch (const std::exception& e) {
    HVDL_LOG(kWarning, "shared memory for the ranks of this host is unavailable (" << e.what()
                       << "); they use TCP instead");
    *segment = ShmSegment();
    offer = Offer{};
  }
  return offer;
}

// Leader: sends the offer, collects whether every member mapped the segment, checks that they
// share this rank's pid namespace, and tells them the outcome, which it returns.
bool LeadAgreement(Link& bootstrap, const std::vector<int>& group, const Offer& offer,
                   ShmSegment& segment) {
  const size_t ranks = group.size();
  for (size_t i = 1; i < ranks; ++i) bootstrap.send(group[i], &offer, sizeof(offer));
  uint8_t all_ok = offer.ok ? 1 : 0;
  for (size_t i = 1; i < ranks; ++i) {
    uint8_t ok = 0;
    bootstrap.recv(group[i], &ok, sizeof(ok));
    all_ok &= ok;
  }
  // Every member has mapped it (or given up): the name is no longer needed.
  segment.Unlink();
  if (all_ok) {
    // Members wrote their pid before acknowledging; check that this rank sees the same
    // processes (same pid namespace), or liveness checks would be wrong.
    auto* controls = reinterpret_cast<shm::RankControl*>(segment.data() +
                                                         shm::Layout(ranks, 0, 0, 0).controls);
    for (size_t i = 1; i < ranks; ++i) {
      if (!ProcessAlive(controls[i].pid, controls[i].start_time)) {
        HVDL_LOG(kWarning, "rank " << group[i] << " runs in another pid namespace; the ranks "
                           "of this host use TCP instead of shared memory");
        all_ok = 0;
      }
    }
  }
  for (size_t i = 1; i < ranks; ++i) bootstrap.send(group[i], &all_ok, sizeof(all_ok));
  return all_ok != 0;
}

// Member `index`: maps the leader's segment and checks that it is the one offered; returns
// whether it could.
bool MapOffer(Offer& offer, size_t ranks, int leader, int index, ShmSegment* segment) {
  if (!offer.ok) return false;
  offer.name[sizeof(offer.name) - 1] = '\0';
  try {
    *segment = ShmSegment::Open(offer.name, offer.total_bytes);
    auto* header = reinterpret_cast<shm::SegmentHeader*>(segment->data());
    shm::Layout layout(ranks, header->channel_bytes, header->chunk_bytes,
                       header->tagged_bytes);
    if (header->magic.load(std::memory_order_acquire) != shm::kMagic ||
        header->nonce != offer.nonce || header->ranks != ranks ||
        layout.total != offer.total_bytes) {
      throw TransportError("the segment is not the one rank " + std::to_string(leader) +
                           " created");
    }
    auto* controls = reinterpret_cast<shm::RankControl*>(segment->data() + layout.controls);
    if (!ProcessAlive(controls[0].pid, controls[0].start_time)) {
      throw TransportError("rank " + std::to_string(leader) + " runs in another pid namespace");
    }
    RecordThisProcess(&controls[index]);
    return true;
  } catch (const std::exception& e) {
    HVDL_LOG(kWarning, "cannot map the shared memory of this host's ranks (" << e.what()
                       << "); they use TCP instead");
    *segment = ShmSegment();
    return false;
  }
}

}  // namespace

// ---------------------------------------------------------------------------------- set-up

std::unique_ptr<ShmLink> ShmLink::Connect(Link& bootstrap, const std::vector<int>& group,
                                          const Options& options) {
  const int me = bootstrap.rank();
  const int leader = group.at(0);
  const auto index = static_cast<int>(std::find(group.begin(), group.end(), me) - group.begin());
  const size_t ranks = group.size();
  if (ranks < 2 || ranks > shm::kMaxRanks || index >= static_cast<int>(ranks)) return nullptr;
  // Only the leader's geometry counts (see the README's Performance section for the knobs):
  // the members read it from the segment.
  ShmSegment segment;
  if (me == leader) {
    const Offer offer = CreateSegment(options, leader, ranks, &segment);
    if (!LeadAgreement(bootstrap, group, offer, segment)) return nullptr;
  } else {
    Offer offer{};
    bootstrap.recv(leader, &offer, sizeof(offer));
    const uint8_t my_ok = MapOffer(offer, ranks, leader, index, &segment) ? 1 : 0;
    bootstrap.send(leader, &my_ok, sizeof(my_ok));
    uint8_t all_ok = 0;
    bootstrap.recv(leader, &all_ok, sizeof(all_ok));
    if (!all_ok) return nullptr;
  }
  return std::unique_ptr<ShmLink>(
      new ShmLink(std::move(segment), group, index, options));
}

ShmLink::ShmLink(ShmSegment segment, std::vector<int> members, int index,
                           const Options& options)
    : segment_(std::move(segment)), members_(std::move(members)), index_(index),
      peer_timeout_(static_cast<int64_t>(options.peer_timeout_seconds * 1000)) {
  const auto* header = reinterpret_cast<const shm::SegmentHeader*>(segment_.data());
  channel_bytes_ = header->channel_bytes;
  chunk_bytes_ = header->chunk_bytes;
  small_bytes_ = header->small_bytes;
  stream_stores_ = options.stream_stores;
  slice_bytes_ = std::max<size_t>(4096, channel_bytes_ / 8);
  layout_ = shm::Layout(members_.size(), channel_bytes_, chunk_bytes_, header->tagged_bytes);
  // The cores the host's ranks may use between them: each rank's mask, recorded before the
  // segment was agreed on. Ranks pinned one to a core (`--bind-to core`, a scheduler's cgroups)
  // count as many cores as ranks, not one.
  uint64_t shared[shm::kCpuWords] = {};
  for (int r = 0; r < size(); ++r) {
    for (size_t w = 0; w < shm::kCpuWords; ++w) shared[w] |= control(r).cpus_allowed[w];
  }
  int cores = 0;
  for (uint64_t word : shared) cores += __builtin_popcountll(word);
  cpus_ = std::max(1, std::min(cores, static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN))));
  // Spinning only pays while every rank of the host has a core to itself; with more ranks than
  // cores a spinner would steal the time of the rank it waits for.
  const bool oversubscribed = size() > cpus_;
  max_spin_ns_ = oversubscribed && !options.spin_given ? 0 : 1000 * options.spin_us;
  yield_ns_ = 1000 * options.yield_us;
  // Runnable threads on the machine, for WaitUntil.
  loadavg_fd_ = ::open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  tagged_ = std::make_unique<ShmTaggedChannel>(*this);
}

ShmLink::~ShmLink() {
  if (loadavg_fd_ >= 0) ::close(loadavg_fd_);
}

shm::RankControl& ShmLink::control(int r) const {
  return reinterpret_cast<shm::RankControl*>(segment_.data() + layout_.controls)[r];
}

shm::ChannelControl& ShmLink::channel(int from, int to) const {
  return reinterpret_cast<shm::ChannelControl*>(segment_.data() + layout_.channels)
      [static_cast<size_t>(from) * members_.size() + to];
}

uint8_t* ShmLink::ring(int from, int to) const {
  return segment_.data() + layout_.rings +
         (static_cast<size_t>(from) * members_.size() + to) * channel_bytes_;
}

uint8_t* ShmLink::staging(int r, uint64_t step) const {
  return segment_.data() + layout_.staging + (static_cast<size_t>(r) * 2 + (step & 1)) * chunk_bytes_;
}

// ---------------------------------------------------------------------------------- waiting

void ShmLink::Notify(int peer) {
  shm::RankControl& c = control(peer);
  // Pairs with the fence in WaitUntil: either the peer sees what was just published, or this
  // sees its sleeping flag and wakes it.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (c.sleeping.load(std::memory_order_relaxed) != 0) {
    c.doorbell.fetch_add(1, std::memory_order_relaxed);
    FutexWakeAll(&c.doorbell);
  }
  if (c.polling.load(std::memory_order_relaxed) != 0 && shm::RingPollBell(c.pid, c.bell_token)) {
    poll_bells_.fetch_add(1, std::memory_order_relaxed);
  }
}

void ShmLink::RoundStarted() { control(index_).in_round.store(1, std::memory_order_relaxed); }

void ShmLink::RoundEnded() { control(index_).in_round.store(0, std::memory_order_relaxed); }

void ShmLink::TookWork(int64_t now_ns) {
  control(index_).work_ns.store(now_ns, std::memory_order_relaxed);
}

bool ShmLink::RingIfIdle(int peer) {
  if (!NegotiationRinging() || peer < 0 || peer == index_ || peer >= size()) return false;
  shm::RankControl& c = control(peer);
  if (c.in_round.load(std::memory_order_relaxed) != 0) return false;
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          Clock::now().time_since_epoch()).count();
  if (now - c.work_ns.load(std::memory_order_relaxed) < PeerBell::kBusyNs) return false;
  c.round_bell.fetch_add(1, std::memory_order_release);
  round_bells_.fetch_add(1, std::memory_order_relaxed);
  // Pairs with the fence in WaitForRoundBell: the listener sees the new value, or this sees it
  // listening and wakes it.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (c.round_listening.load(std::memory_order_relaxed) != 0) FutexWakeAll(&c.round_bell);
  return true;
}

uint32_t ShmLink::round_bell() const {
  return control(index_).round_bell.load(std::memory_order_acquire);
}

uint32_t ShmLink::WaitForRoundBell(uint32_t seen, int timeout_ms) {
  shm::RankControl& mine = control(index_);
  mine.round_listening.store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (mine.round_bell.load(std::memory_order_acquire) == seen) {
    FutexWait(&mine.round_bell, seen, timeout_ms);
  }
  mine.round_listening.store(0, std::memory_order_relaxed);
  return mine.round_bell.load(std::memory_order_acquire);
}

void ShmLink::WakeRoundListener() {
  control(index_).round_bell.fetch_add(1, std::memory_order_release);
  FutexWakeAll(&control(index_).round_bell);
}

void ShmLink::NotifyAll() {
  for (int p = 0; p < size(); ++p) {
    if (p != index_) Notify(p);
  }
}

void ShmLink::FailPeer(int peer, const std::string& what, TransportError::Cause cause) {
  if (aborted_) throw TransportError("the transport was shut down");
  throw TransportError("lost connection to rank " + std::to_string(members_[peer]) + ": " + what,
                       members_[peer], cause);
}

void ShmLink::CheckPeers(bool check_processes, int peer) {
  if (aborted_.load(std::memory_order_relaxed)) {
    throw TransportError("the transport was shut down");
  }
  for (int p = 0; p < size(); ++p) {
    if (p == index_ || (peer >= 0 && p != peer)) continue;
    const shm::RankControl& c = control(p);
    if (c.aborted.load(std::memory_order_acquire) != 0) {
      FailPeer(p, "it stopped after an error", TransportError::Cause::kPeerLost);
    }
    if (check_processes && !ProcessAlive(c.pid, c.start_time)) {
      FailPeer(p, "the process exited or was killed (shared memory peer)",
               TransportError::Cause::kPeerLost);
    }
  }
}

namespace {
// Counts this thread among the rank's sleepers (RankControl::sleeping) while `on`.
struct Asleep {
  std::atomic<uint32_t>& count;
  bool on = false;
  void set(bool value) {
    if (value == on) return;
    if (value) count.fetch_add(1, std::memory_order_relaxed);
    else count.fetch_sub(1, std::memory_order_relaxed);
    on = value;
  }
  ~Asleep() { set(false); }
};
}  // namespace

void ShmLink::FailSilentPeer(int peer) {
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%g", peer_timeout_.count() / 1000.0);
  FailPeer(peer,
           std::string("nothing received or sent for ") + seconds +
               " s (HOROVOD_PEER_TIMEOUT_SECONDS); the peer is stopped, hung or unreachable",
           TransportError::Cause::kPeerTimeout);
}

template <class Ready, class Culprit>
void ShmLink::WaitUntil(const Ready& ready, const Culprit& culprit, int watch) {
  if (ready()) return;
  const auto start = Clock::now();
  // A wait of a negotiation that rings for a peer that is in no round: ring it (link.h).
  bool rang = !NegotiationRinging();
  // A peer in a round or busy is looked at again later (it may go idle without coming).
  auto ring_late = [&](Clock::time_point now) {
    if (rang || now - start < std::chrono::microseconds(PeerBell::kRingAfterUs)) return;
    rang = RingIfIdle(culprit());
  };
  // A peer may write its last bytes and then stop (point-to-point: send, then shut down) in
  // the moment between a look at the ring and a look at the peer: what it wrote is still read,
  // as a closed socket's data is, before its stopping counts.
  auto peers_failed = [&](bool check_processes) {
    try {
      CheckPeers(check_processes, watch);
      return false;
    } catch (const TransportError&) {
      if (aborted_.load(std::memory_order_relaxed) || !ready()) throw;
      return true;
    }
  };
  // 1. Spin while that costs nobody: a peer that is running answers within microseconds, and
  // waking from a futex costs tens (an inter-processor interrupt, in a VM an exit too). But
  // when more threads are runnable than there are cores (the training loops' forward and
  // backward, the peers' own threads, other jobs), a spinner only delays whoever waits for its
  // core, possibly the very peer it waits for: then sleep at once.
  if (max_spin_ns_ > 0) {
    const auto spin_end = start + std::chrono::nanoseconds(max_spin_ns_);
    auto next_check = start + kFirstLoadCheck;
    while (true) {
      for (int i = 0; i < 64; ++i) {
        HVDL_CPU_RELAX();
        if (ready()) return;
      }
      if (peers_failed(false)) return;
      const auto now = Clock::now();
      ring_late(now);
      if (now >= spin_end) break;
      if (now >= next_check) {
        if (CpusOversubscribed()) {
          busy_sleeps_.fetch_add(1, std::memory_order_relaxed);
          break;
        }
        GiveWay(culprit());
        next_check = Clock::now() + kLoadCheckInterval;
      }
    }
  }
  // 1b. With more ranks than cores, a spinner would hold the core its peer needs; a waiter that
  // yields hands it over at once, and sees the peer's answer sooner than a sleeper would.
  if (max_spin_ns_ == 0 && yield_ns_ > 0) {
    const auto yield_end = start + std::chrono::nanoseconds(yield_ns_);
    Clock::time_point now;
    do {
      sched_yield();
      if (ready() || peers_failed(false)) return;
      now = Clock::now();
      ring_late(now);
    } while (now < yield_end);
  }
  // 2. Sleep on the doorbell, in slices, checking the peers between them. `sleeping` counts
  // this rank's sleeping threads (point-to-point has several), so that a peer rings while any
  // of them sleeps.
  shm::RankControl& mine = control(index_);
  Asleep asleep{mine.sleeping};
  sleeps_.fetch_add(1, std::memory_order_relaxed);
  if (!rang) rang = RingIfIdle(culprit());
  auto last_progress_check = start;
  while (true) {
    const uint32_t key = mine.doorbell.load(std::memory_order_acquire);
    asleep.set(true);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (ready()) break;
    if (peers_failed(false)) break;
    // Until the peer is rung, short sleeps: it may go idle without coming.
    long rc = FutexWait(&mine.doorbell, key, rang ? kSleepSliceMs : 1);
    if (rc == 0 || errno == EAGAIN || errno == EINTR) {
      if (ready()) break;
    }
    if (!rang) rang = RingIfIdle(culprit());
    const auto now = Clock::now();
    if (now - last_progress_check >= std::chrono::milliseconds(kSleepSliceMs)) {
      last_progress_check = now;
      asleep.set(false);
      if (peers_failed(true)) break;
      if (now - start >= kInterruptAfter && InterruptRequested()) {
        const int silent = members_[culprit()];
        throw TransportError(InterruptedWaitMessage(silent), silent,
                             TransportError::Cause::kInterrupted);
      }
      if (now - start > peer_timeout_) FailSilentPeer(culprit());
    }
  }
}

void ShmLink::WaitFor(const std::function<bool()>& ready, int peer) {
  WaitUntil(ready, [peer] { return peer; }, peer);
}

int ShmLink::Behind(Progress progress, uint64_t step) const {
  for (int p = 0; p < size(); ++p) {
    if (p != index_ && (control(p).*progress).load(std::memory_order_acquire) < step) return p;
  }
  return -1;
}

void ShmLink::WaitForPeers(Progress progress, uint64_t step) {
  WaitUntil([&] { return Behind(progress, step) < 0; },
            [&] { return std::max(0, Behind(progress, step)); });
}

void ShmLink::CheckUsable() const {
  if (aborted_.load(std::memory_order_relaxed)) throw TransportError("the transport was shut down");
}

void ShmLink::Publish(Progress progress, uint64_t step) {
  (control(index_).*progress).store(step, std::memory_order_release);
  NotifyAll();
}

void ShmLink::abort() {
  aborted_ = true;
  control(index_).aborted.store(1, std::memory_order_release);
  NotifyAll();
  // The loop thread of this process may be asleep on its own doorbell.
  control(index_).doorbell.fetch_add(1, std::memory_order_relaxed);
  FutexWakeAll(&control(index_).doorbell);
}

// ---------------------------------------------------------------------------------- send/recv

size_t ShmLink::TrySend(int to, const uint8_t* buf, size_t n) {
  shm::ChannelControl& c = channel(index_, to);
  const uint64_t head = c.head.load(std::memory_order_relaxed);
  const uint64_t tail = c.tail.load(std::memory_order_acquire);
  const size_t room = channel_bytes_ - static_cast<size_t>(head - tail);
  // Publish in slices so that the receiver starts copying out while this copies in.
  const size_t w = std::min({n, room, slice_bytes_});
  if (w == 0) return 0;
  shm::RingCopyIn(ring(index_, to), channel_bytes_, head, buf, w);
  c.head.store(head + w, std::memory_order_release);
  Notify(to);
  return w;
}

size_t ShmLink::TryRecv(int from, uint8_t* buf, size_t n) {
  shm::ChannelControl& c = channel(from, index_);
  const uint64_t tail = c.tail.load(std::memory_order_relaxed);
  const uint64_t head = c.head.load(std::memory_order_acquire);
  const size_t r = std::min({n, static_cast<size_t>(head - tail), slice_bytes_});
  if (r == 0) return 0;
  shm::RingCopyOut(ring(from, index_), channel_bytes_, tail, buf, r);
  c.tail.store(tail + r, std::memory_order_release);
  Notify(from);
  return r;
}

void ShmLink::sendrecv(int to, const void* sbuf, size_t sn, int from, void* rbuf,
                            size_t rn) {
  if ((sn > 0 && (to < 0 || to >= size() || to == index_)) ||
      (rn > 0 && (from < 0 || from >= size() || from == index_))) {
    throw TransportError("shm: no channel between local ranks " + std::to_string(index_) +
                         " and " + std::to_string(sn > 0 ? to : from));
  }
  if (aborted_.load(std::memory_order_relaxed)) throw TransportError("the transport was shut down");
  const auto* sp = static_cast<const uint8_t*>(sbuf);
  auto* rp = static_cast<uint8_t*>(rbuf);
  while (sn > 0 || rn > 0) {
    bool progressed = false;
    if (sn > 0) {
      size_t w = TrySend(to, sp, sn);
      sp += w;
      sn -= w;
      progressed |= w > 0;
    }
    if (rn > 0) {
      size_t r = TryRecv(from, rp, rn);
      rp += r;
      rn -= r;
      progressed |= r > 0;
    }
    if (progressed || (sn == 0 && rn == 0)) continue;
    WaitUntil([&] {
      if (sn > 0) {
        const shm::ChannelControl& c = channel(index_, to);
        if (c.head.load(std::memory_order_relaxed) - c.tail.load(std::memory_order_acquire) <
            channel_bytes_) {
          return true;
        }
      }
      if (rn > 0) {
        const shm::ChannelControl& c = channel(from, index_);
        if (c.head.load(std::memory_order_acquire) != c.tail.load(std::memory_order_relaxed)) {
          return true;
        }
      }
      return false;
    }, [&] {
      // Blame the side that is not moving: no incoming data first, else no room to send.
      if (rn > 0) {
        const shm::ChannelControl& c = channel(from, index_);
        if (c.head.load(std::memory_order_acquire) == c.tail.load(std::memory_order_relaxed)) {
          return from;
        }
      }
      return sn > 0 ? to : from;
    });
  }
}

}  // namespace horovodlike
