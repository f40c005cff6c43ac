// Ranks on the same host exchange through one shared-memory segment instead of the loopback:
//   - send/recv: a single-producer single-consumer byte ring per ordered pair of ranks, so both
//     directions of a pair move at once (sendrecv never deadlocks) and a large message streams
//     through the ring in slices the receiver copies out while the sender writes the next;
//   - staging: two slots per rank, and per-rank progress counters, that an algorithm reading
//     the peers' data in place uses (the shared-memory allreduce, collectives/shm/);
//   - waiting: spin (bounded, and only while no thread on the machine waits for a core),
//     then sleep on a futex in the segment (the "doorbell") that the other side rings only when
//     this rank is asleep; no spinning at all with more ranks on the host than the cores their
//     affinity masks allow between them. A spinner that finds the peer it waits for on its own
//     CPU yields to it, and moves to a free CPU if they keep meeting there (two spinners on one
//     core are several times slower than anything else, and the scheduler rarely parts them).
// A peer that dies cannot close anything here, so every sleep is cut into short slices and
// between them the peers' processes are checked through /proc (pid + start time, against pid
// reuse), as is the "aborted" flag a peer sets when its runtime stops: a dead peer, or one that
// stopped after an error, is a TransportError within tens of milliseconds; a peer that is alive
// but makes no progress (SIGSTOP, a hang) fails after the peer timeout, as over TCP.
//
// Ranks are numbered within the host's group (0..size-1); members() maps them to job ranks.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "shm_layout.h"
#include "shm_segment.h"
#include "shm_tagged.h"
#include "../link.h"

namespace horovodlike {

class ShmLink : public Link {
 public:
  struct Options {
    std::string secret;          // the job's secret; a hash of it names the segment
    int generation = 0;          // init() count: a re-init gets a fresh segment
    double peer_timeout_seconds = 300;
    // Geometry asked for (the creator's counts; Config's shm_* fields say what each is).
    size_t channel_bytes = 1 << 20;
    size_t chunk_bytes = 1 << 20;
    size_t small_bytes = 64 << 10;
    int64_t spin_us = 2000;
    bool spin_given = false;  // spin even with more ranks than cores
    int64_t yield_us = 500;   // with more ranks than cores: yield this long before sleeping
    std::string stream_stores = "auto";  // HOROVOD_SHM_STREAM_STORES: auto, on, off
  };

  // Maps one segment shared by `group` (job ranks on this host, ascending, this rank included),
  // talking over `bootstrap` (the job's TCP mesh, indexed by job rank) to agree on it. Every rank
  // of `group` must call this at the same time. Ranks that cannot map the segment (another
  // /dev/shm, another pid namespace, no space) are left out on every side; returns nullptr when
  // this rank is left with no peer. Throws TransportError only when `bootstrap` fails.
  static std::unique_ptr<ShmLink> Connect(Link& bootstrap, const std::vector<int>& group,
                                               const Options& options);
  ~ShmLink() override;

  int rank() const override { return index_; }
  int size() const override { return static_cast<int>(members_.size()); }
  // Job ranks of this group, in group order.
  const std::vector<int>& members() const { return members_; }

  void sendrecv(int to, const void* sbuf, size_t sn, int from, void* rbuf, size_t rn) override;
  void abort() override;
  const char* name() const override { return "shm"; }
  // Tagged messages through rings of their own (shm_tagged.h), beside the stream's.
  bool tagged() const override { return true; }
  std::unique_ptr<Request> isend(int peer, int tag, const void* buf, size_t n) override;
  std::unique_ptr<Request> irecv(int peer, int tag, void* buf, size_t n) override;
  void progress(int timeout_ms) override;
  bool interruptible() const override { return true; }

  // The staging area. Rank r's slot for `step` (two per rank, by step parity), staging_bytes()
  // long; messages up to small_bytes() are best staged whole (HOROVOD_SHM_SMALL_BYTES).
  uint8_t* staging(int r, uint64_t step) const;
  size_t staging_bytes() const { return chunk_bytes_; }
  size_t small_bytes() const { return small_bytes_; }
  // How the allreduce writes the slots (HOROVOD_SHM_STREAM_STORES; collectives/shm/slot_stores.h).
  const std::string& stream_stores() const { return stream_stores_; }
  // The choice the link's first rank learned for them (a bit per size class), and its setting.
  uint32_t stream_choice() const {
    return control(0).stream_stores.load(std::memory_order_relaxed);
  }
  void set_stream_choice(uint32_t bits) {
    control(index_).stream_stores.store(bits, std::memory_order_relaxed);
  }
  // A counter per rank that an algorithm advances as it goes (staged, reduced, released).
  using Progress = std::atomic<uint64_t> shm::RankControl::*;
  // Sets this rank's `progress` counter to `step` and wakes sleeping peers.
  void Publish(Progress progress, uint64_t step);
  // Waits until every other rank's `progress` counter reached `step`; throws TransportError as
  // send/recv do (aborted, a peer stopped or died, the peer timeout).
  void WaitForPeers(Progress progress, uint64_t step);
  // Whether every other rank has published at least `step` for `progress` (no waiting).
  bool PeersReached(Progress progress, uint64_t step) const { return Behind(progress, step) < 0; }
  // The round bell inside a host (link.h's PeerBell says when a negotiation rings): a wait
  // of such a negotiation for a peer of the host that has not answered within kRingAfterUs,
  // is in no round itself (RoundStarted until RoundEnded) and has taken in no work of its own
  // for PeerBell::kBusyNs (TookWork) rings that peer's bell, once per wait; the peer's
  // listener (WaitForRoundBell) then wakes its loop.
  void TookWork(int64_t now_ns);
  void RoundStarted();
  void RoundEnded();
  int64_t round_bells() const { return round_bells_.load(std::memory_order_relaxed); }
  // Poll bells this rank rang: a peer of the host slept in poll() for its other connections.
  int64_t poll_bells() const { return poll_bells_.load(std::memory_order_relaxed); }
  // This rank's round bell, and a sleep while it still reads `seen` (at most timeout_ms);
  // returns its value then. WakeRoundListener ends such a sleep in this process.
  uint32_t round_bell() const;
  uint32_t WaitForRoundBell(uint32_t seen, int timeout_ms);
  void WakeRoundListener();
  // For a thread that waits for tagged messages from this link's peers and, in poll(), from
  // peers on other hosts (per_peer_link.h): its poll bell's descriptor (-1: none, then only the
  // poll's own timeout ends such a sleep), and its polling count, which makes the peers ring
  // the bell when they publish something for this rank (shm_bell.h; false drains the bell).
  // TaggedWorkWaiting: whether a tagged pump would move something now.
  int PollBell() const;
  void SetPolling(bool polling);
  bool TaggedWorkWaiting() const;
  // Throws TransportError once abort() was called.
  void CheckUsable() const;
  // How this rank waits (_core.stats()): whether it spins before sleeping, the cores the host's
  // ranks may use between them, and how often a spinner moved off a peer's CPU.
  bool spins() const { return max_spin_ns_ > 0; }
  // Whether a wait now gives up its core at once (it does not spin: more ranks on the host
  // than cores, or more runnable threads than cores at the last look), so that a meeting of
  // the ranks costs a thread switch rather than a cache line's trip.
  bool WaitsGiveWay() const { return !spins() || CpusOversubscribed(); }
  int host_cores() const { return cpus_; }
  int cpu_moves() const { return moves_.load(std::memory_order_relaxed); }
  // Waits that went to sleep, and of those the ones that stopped spinning early because more
  // threads were runnable than the host's ranks have cores.
  int64_t sleeps() const { return sleeps_.load(std::memory_order_relaxed); }
  int64_t busy_sleeps() const { return busy_sleeps_.load(std::memory_order_relaxed); }

 private:
  friend class ShmTaggedChannel;
  ShmLink(ShmSegment segment, std::vector<int> members, int index, const Options& options);

  shm::RankControl& control(int r) const;
  shm::ChannelControl& channel(int from, int to) const;
  uint8_t* ring(int from, int to) const;

  // Copies what fits of buf into the ring to `to`; returns the bytes moved.
  size_t TrySend(int to, const uint8_t* buf, size_t n);
  size_t TryRecv(int from, uint8_t* buf, size_t n);
  // Rings `peer`'s round bell when this thread's negotiation rings and `peer` is in no round.
  bool RingIfIdle(int peer);  // whether it rang
  // Wakes `peer` if it sleeps (call after publishing what it may wait for).
  void Notify(int peer);
  void NotifyAll();
  // Returns once ready() holds; throws TransportError when this link is aborted, a peer
  // stopped or died, or nothing happened for the peer timeout (then naming culprit(), the peer
  // it waits for). With `watch` >= 0 only that peer's stopping or dying ends the wait.
  template <class Ready, class Culprit>
  void WaitUntil(const Ready& ready, const Culprit& culprit, int watch = -1);
  // WaitUntil for the tagged channel, blaming and watching `peer`.
  void WaitFor(const std::function<bool()>& ready, int peer);
  // Throws when this link was aborted or a peer stopped or died; only `peer` is looked at
  // when it is >= 0.
  void CheckPeers(bool check_processes, int peer = -1);
  // Whether more threads are runnable on this machine than this process may use cores
  // (/proc/loadavg, read at most every kLoadRefreshNs by whichever waiter asks first: the read
  // costs more than a short wait, and a waiter reading it misses its peer's answer meanwhile).
  bool CpusOversubscribed() const;
  // Publishes this thread's CPU, and says whether `peer` last waited on the same one; moves
  // this thread to a free CPU when that keeps happening.
  bool SharesCpuWith(int peer);
  // Called now and then while spinning for `peer`: yields the CPU when the peer may need it.
  void GiveWay(int peer);
  void MoveToFreeCpu(int cpu);
  // The first other rank whose `progress` is below `step`, or -1.
  int Behind(Progress progress, uint64_t step) const;
  [[noreturn]] void FailPeer(int peer, const std::string& what, TransportError::Cause cause);
  // FailPeer for a peer silent for the peer timeout.
  [[noreturn]] void FailSilentPeer(int peer);

  ShmSegment segment_;
  std::vector<int> members_;
  int index_;
  size_t channel_bytes_;
  size_t slice_bytes_;  // a sender publishes at least this often, so the receiver can start
  size_t chunk_bytes_;
  size_t small_bytes_;
  std::string stream_stores_;
  shm::Layout layout_;
  int64_t max_spin_ns_;  // HOROVOD_SHM_SPIN_US; 0 with more ranks on this host than cores
  int64_t yield_ns_;     // HOROVOD_SHM_YIELD_US; used only where max_spin_ns_ is 0
  int loadavg_fd_ = -1;
  mutable std::atomic<int64_t> load_read_ns_{INT64_MIN / 2};  // when loadavg_fd_ was last read
  mutable std::atomic<bool> oversubscribed_{false};            // what it said then
  int cpus_ = 1;  // the cores the host's ranks may use between them (their masks' union)
  std::atomic<int64_t> last_shared_cpu_ns_{0};
  std::atomic<int> shared_cpu_meetings_{0};
  std::atomic<int> moves_{0};
  std::atomic<int64_t> sleeps_{0};
  std::atomic<int64_t> busy_sleeps_{0};
  std::atomic<int64_t> round_bells_{0};
  std::atomic<int64_t> poll_bells_{0};
  std::chrono::milliseconds peer_timeout_;
  std::atomic<bool> aborted_{false};
  std::unique_ptr<ShmTaggedChannel> tagged_;  // declared last: it uses the rest
};

}  // namespace horovodlike
