// How the shared-memory allreduce writes its staging slots (shm_allreduce.cc): with ordinary
// stores, or with streaming (non-temporal) stores that go to memory and leave the writer's
// caches alone.
//
// A slot is written by one rank and read by its peers. With ordinary stores the lines stay in
// the writer's cache and each reader fetches them from there: fast while the two cores share a
// last-level cache, slow when they do not (two sockets, or two dies without a shared cache),
// where every line crosses the interconnect as a cache-to-cache transfer. Streaming stores send
// the lines to memory, from which the readers load them at memory speed wherever they run: a
// little slower than a shared cache, much faster than cache-to-cache across sockets. A virtual
// machine's CPUs may be placed either way and moved while a job runs, so the choice is made
// while it runs (kAuto): the link's first rank times both ways now and then and keeps a running
// time per byte of each, and publishes which is faster (ShmLink::stream_choice); every rank
// follows it, so that all write the same way. The tries fall on the same calls on every rank
// (the calls' count is the same on all).
#pragma once

#include <cstddef>
#include <cstdint>

namespace horovodlike {

// dst = src for `bytes` bytes, dst's lines written with streaming stores where the machine has
// them (x86-64), else memcpy. Ends with a store fence: the bytes are visible to other cores
// before anything this thread stores after it (the release of the step's counter).
void StreamCopy(uint8_t* dst, const uint8_t* src, size_t bytes);

// mine[i] = (mine[i] + theirs[i]) x scale, and out[i] the same, out written with streaming
// stores (as StreamCopy); the same bits as the ordinary loop (sum rounded to T, then scaled).
void AddAndStream(float* mine, const float* theirs, float* out, size_t n, float scale);
void AddAndStream(double* mine, const double* theirs, double* out, size_t n, double scale);

class SlotStores {
 public:
  enum class Mode { kAuto, kOrdinary, kStreaming };
  // Whether this machine has streaming stores (x86-64); without them every mode is ordinary.
  static bool Available();

  explicit SlotStores(Mode mode) : mode_(mode) {}
  // Whether an allreduce of `bytes` streams its slot stores; `choice`: the link's first rank's
  // published choice (a bit per size class; what Took returned there); `one_round`: the
  // one-round algorithm's run (a class of its own) rather than the sliced one's.
  bool Streams(size_t bytes, uint32_t choice, bool one_round = false);
  // On the link's first rank: how long a run of `bytes` that Streams() answered took, its
  // waits for the peers' arrival left out (its first chunk's staging, then everything after
  // every rank had staged it). Returns the choice to publish.
  uint32_t Took(bool streamed, size_t bytes, int64_t ns, bool one_round = false);

  // Each size class of the sliced algorithm (a factor of 4 from 64 KiB, the last from 64 MiB
  // up) learns on its own: the costs per byte differ with the size, and the better way may
  // too. The one-round algorithm's messages from kOneRoundFrom bytes are one more class
  // (kOneRoundClass): below it a message is a few cache lines, whose way of writing matters
  // less than the meeting itself.
  static constexpr int kClasses = 6;
  static constexpr int kOneRoundClass = kClasses;
  static constexpr size_t kOneRoundFrom = size_t{16} << 10;
  // In each class, runs 0 and 1 try each way untimed (the first runs touch fresh pages and
  // cold caches), runs 2 and 3 time each; after that every kTryEvery-th run uses ordinary
  // stores and the one kTryEvery / 2 later streaming ones, whatever is faster: how soon a
  // change of placement is seen.
  static constexpr uint64_t kTryEvery = 32;
  // The other way is taken when it is this much faster than the one in use: timings of single
  // runs vary by more than the ways differ by chance (the ways differ by 1.5x to 3x).
  static constexpr double kSwitchMargin = 1.2;

 private:
  struct Learned {
    uint64_t runs = 0;                      // runs so far, the same on every rank
    double ns_per_byte[2] = {-1.0, -1.0};   // [0] ordinary, [1] streaming; -1 not yet
    bool streaming = false;                 // the way in use
  };
  static int ClassOf(size_t bytes, bool one_round);
  static void Learn(Learned& l, bool streamed, size_t bytes, int64_t ns);

  const Mode mode_;
  Learned classes_[kClasses + 1];
};

}  // namespace horovodlike
