// The layout of the shared-memory segment of one host's ranks (see shm_link.h). Every region starts
// on a page; everything two processes write is on its own cache line.
//
//   SegmentHeader                       written once by the creator, before any member maps it
//   RankControl[ranks]                  doorbell, sleepers, allreduce progress, liveness
//   ChannelControl[ranks][ranks]        head/tail of the byte ring from rank i to rank j
//   ring data[ranks][ranks]             channel_bytes each (the diagonal is unused)
//   staging[ranks][2]                   chunk_bytes each: the native allreduce's double buffer
//   ChannelControl[ranks][ranks]        head/tail of the tagged-message ring from rank i to rank j
//   tagged ring data[ranks][ranks]      tagged_bytes each (point-to-point, shm_tagged.h)
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace horovodlike {
namespace shm {

constexpr uint64_t kMagic = 0x35484d534c445648ULL;  // "HVDLSMH5"
constexpr size_t kPage = 4096;
constexpr size_t kLine = 64;
// Larger groups use TCP: the channels grow with the square of the ranks.
constexpr size_t kMaxRanks = 256;
// CPUs a rank's affinity mask is recorded for (kCpuWords x 64).
constexpr size_t kCpuWords = 16;

static_assert(std::atomic<uint64_t>::is_always_lock_free, "needs lock-free 64-bit atomics");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "needs lock-free 32-bit atomics");
static_assert(sizeof(std::atomic<uint32_t>) == 4, "futex words are 32 bits");

struct SegmentHeader {
  std::atomic<uint64_t> magic;  // stored last (release): the rest is valid once it is set
  uint64_t nonce;               // random, sent to the members over TCP: proves the right segment
  uint32_t ranks;
  uint32_t reserved;
  uint64_t channel_bytes;       // power of two
  uint64_t chunk_bytes;         // one staging slot
  uint64_t small_bytes;         // allreduces up to this size use the one-round algorithm
  uint64_t tagged_bytes;        // one tagged-message ring, power of two
  uint64_t total_bytes;
};

struct alignas(kLine) RankControl {
  // Others write: bumped (and futex-woken) when this rank sleeps and something it may wait for
  // changed.
  alignas(kLine) std::atomic<uint32_t> doorbell;
  // The owner writes: how many of its threads are about to sleep or sleeping on its doorbell;
  // and how many in poll() on its other connections, woken by its poll bell (shm_bell.h).
  // One line, which a peer's Notify reads whole.
  alignas(kLine) std::atomic<uint32_t> sleeping;
  std::atomic<uint32_t> polling;
  // The owner writes: the shared-memory allreduce's steps (collectives/shm/), and liveness.
  alignas(kLine) std::atomic<uint64_t> staged;    // last step whose input is in staging
  std::atomic<uint64_t> reduced;                  // last step whose slice is reduced in staging
  std::atomic<uint64_t> released;                 // last step whose peers' staging it has read
  std::atomic<uint32_t> aborted;                  // set when this rank's link stopped
  int32_t pid;                                    // for liveness checks through /proc
  uint64_t start_time;                            // /proc/<pid>/stat field 22, against pid reuse
  uint64_t bell_token;                            // its poll bell's (shm_bell.h); 0: none
  // Others write: bumped to ask the owner for a negotiation round at once (a peer's
  // negotiation waits for this rank, which is in no round: the round bell, links/link.h).
  alignas(kLine) std::atomic<uint32_t> round_bell;
  // The owner writes: 1 while its bell listener is about to sleep or sleeps on round_bell;
  // whether it is in a negotiation round, and when (CLOCK_MONOTONIC, ns) a round of its last
  // took in work of its own.
  alignas(kLine) std::atomic<uint32_t> round_listening;
  std::atomic<uint32_t> in_round;
  std::atomic<int64_t> work_ns;
  // The owner writes (the host's first rank's is read by all): a bit per size class, set when
  // the shared-memory allreduce's slots are best written with streaming stores
  // (collectives/shm/slot_stores.h).
  alignas(kLine) std::atomic<uint32_t> stream_stores;
  // The owner writes: the CPU its latest spinning thread ran on (-1 before any), so that a
  // peer spinning on the same CPU gives way instead of spinning out its time slice.
  alignas(kLine) std::atomic<int32_t> cpu;
  // Written once, before the segment is agreed on: the CPUs the owner's process may run on
  // (a bit per CPU), so that every rank counts the cores the host's ranks share.
  uint64_t cpus_allowed[kCpuWords];
};

struct ChannelControl {
  alignas(kLine) std::atomic<uint64_t> head;  // bytes written so far (the sender writes)
  alignas(kLine) std::atomic<uint64_t> tail;  // bytes read so far (the receiver writes)
};

inline size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Copies n bytes into, or out of, a ring of `size` bytes (a power of two) at byte position
// `at` (a running count), wrapping at its end.
inline void RingCopyIn(uint8_t* ring, size_t size, uint64_t at, const void* src, size_t n) {
  const size_t pos = static_cast<size_t>(at) & (size - 1);
  const size_t first = n < size - pos ? n : size - pos;
  std::memcpy(ring + pos, src, first);
  if (n > first) std::memcpy(ring, static_cast<const uint8_t*>(src) + first, n - first);
}

inline void RingCopyOut(const uint8_t* ring, size_t size, uint64_t at, void* dst, size_t n) {
  const size_t pos = static_cast<size_t>(at) & (size - 1);
  const size_t first = n < size - pos ? n : size - pos;
  std::memcpy(dst, ring + pos, first);
  if (n > first) std::memcpy(static_cast<uint8_t*>(dst) + first, ring, n - first);
}

// Offsets of each region for a given geometry; identical in every process.
struct Layout {
  size_t ranks = 0, channel_bytes = 0, chunk_bytes = 0, tagged_bytes = 0;
  size_t controls = 0, channels = 0, rings = 0, staging = 0, tagged_channels = 0,
         tagged_rings = 0, total = 0;

  Layout() = default;
  Layout(size_t ranks_, size_t channel_bytes_, size_t chunk_bytes_, size_t tagged_bytes_)
      : ranks(ranks_), channel_bytes(channel_bytes_), chunk_bytes(chunk_bytes_),
        tagged_bytes(tagged_bytes_) {
    const size_t channel_controls = RoundUp(ranks * ranks * sizeof(ChannelControl), kPage);
    controls = RoundUp(sizeof(SegmentHeader), kPage);
    channels = controls + RoundUp(ranks * sizeof(RankControl), kPage);
    rings = channels + channel_controls;
    staging = rings + ranks * ranks * channel_bytes;
    tagged_channels = staging + ranks * 2 * chunk_bytes;
    tagged_rings = tagged_channels + channel_controls;
    total = tagged_rings + ranks * ranks * tagged_bytes;
  }
};

}  // namespace shm
}  // namespace horovodlike
