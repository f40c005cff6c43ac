// ShmAllreduce: an allreduce in which every rank reads the others' data straight
// from shared memory, with no messages.
//
// The buffer is cut into chunks that fit in a staging slot; each chunk is a "step" numbered the
// same on every rank. Each rank publishes, per step, three counters in its RankControl:
//   staged    its input for the step is in its staging slot;
//   reduced   (sliced algorithm) its slice of the step is reduced, in its buffer and its slot;
//   released  it has read everything it needs from the other ranks' slots for the step.
// Each rank owns two slots (double buffering, by step parity); it writes a slot for step s only
// once every peer has released step s - 2, the last one to use that slot.
//
// Sliced algorithm (large messages): chunk c is cut into one slice per rank. Rank r
//   A  copies every slice but its own into its slot                      -> staged = s
//   B  adds the other ranks' copies of slice r into its own buffer, and
//      copies the reduced slice r into its slot                          -> reduced = s
//   C  copies each other slice p, reduced by rank p, out of p's slot     -> released = s
// and overlaps A of chunk c + 1 with the others finishing B of chunk c. Each rank reads and
// writes its private buffer once; the staging traffic stays in the cache when chunks are small.
//
// One-round algorithm (small messages): every rank stages its whole input, and every rank adds
// all inputs in rank order itself: one wait instead of two, the same bits on every rank.
#include <algorithm>
#include <chrono>
#include <cstring>

#include "../../reduce/reduce.h"
#include "shm_allreduce.h"

namespace horovodlike {
namespace {

// mine[i] += theirs[i] and out[i] = the sum, in one pass: the reduced slice goes to this rank's
// buffer and to its staging slot together (the common two-rank Sum of float32 / float64).
// Scaled, the sum is rounded to T before it is multiplied, as ScaleInPlace would after.
template <class T>
void AddAndCopy(T* __restrict__ mine, const T* __restrict__ theirs, T* __restrict__ out,
                size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const T v = mine[i] + theirs[i];
    mine[i] = v;
    out[i] = v;
  }
}
template <class T>
void AddScaleAndCopy(T* __restrict__ mine, const T* __restrict__ theirs, T* __restrict__ out,
                     size_t n, T scale) {
  for (size_t i = 0; i < n; ++i) {
    const T sum = mine[i] + theirs[i];
    const T v = sum * scale;
    mine[i] = v;
    out[i] = v;
  }
}

// Reduces the other ranks' copies of this rank's slice into `mine` (in rank order), scales it,
// and copies the result to `out`, with streaming stores when `stream` (slot_stores.h).
void ReduceSlice(uint8_t* mine, const uint8_t* const* theirs, int count_theirs, uint8_t* out,
                 size_t count, DataType dtype, ReduceOp op, double scale, bool stream) {
  const bool sum = op == ReduceOp::kSum || op == ReduceOp::kAverage;
  if (count_theirs == 1 && sum && stream && dtype == DataType::kFloat32) {
    AddAndStream(reinterpret_cast<float*>(mine), reinterpret_cast<const float*>(theirs[0]),
                 reinterpret_cast<float*>(out), count, static_cast<float>(scale));
  } else if (count_theirs == 1 && sum && stream && dtype == DataType::kFloat64) {
    AddAndStream(reinterpret_cast<double*>(mine), reinterpret_cast<const double*>(theirs[0]),
                 reinterpret_cast<double*>(out), count, scale);
  } else if (count_theirs == 1 && sum && dtype == DataType::kFloat32) {
    auto* m = reinterpret_cast<float*>(mine);
    auto* t = reinterpret_cast<const float*>(theirs[0]);
    auto* o = reinterpret_cast<float*>(out);
    if (scale == 1.0) {
      AddAndCopy(m, t, o, count);
    } else {
      AddScaleAndCopy(m, t, o, count, static_cast<float>(scale));
    }
  } else if (count_theirs == 1 && sum && dtype == DataType::kFloat64) {
    auto* m = reinterpret_cast<double*>(mine);
    auto* t = reinterpret_cast<const double*>(theirs[0]);
    auto* o = reinterpret_cast<double*>(out);
    if (scale == 1.0) {
      AddAndCopy(m, t, o, count);
    } else {
      AddScaleAndCopy(m, t, o, count, scale);
    }
  } else {
    for (int i = 0; i < count_theirs; ++i) ReduceInto(mine, theirs[i], count, dtype, op);
    ScaleInPlace(mine, count, dtype, scale);
    if (stream) {
      StreamCopy(out, mine, count * DataTypeSize(dtype));
    } else {
      std::memcpy(out, mine, count * DataTypeSize(dtype));
    }
  }
}

}  // namespace

void ShmAllreduce::Run(void* buf, size_t count, DataType dtype, ReduceOp op, double scale) {
  staged_step_ = 0;
  offered_step_ = 0;
  if (count == 0 || link_.size() == 1) {
    ScaleInPlace(buf, count, dtype, scale);
    return;
  }
  link_.CheckUsable();
  const size_t elem = DataTypeSize(dtype);
  auto* data = static_cast<uint8_t*>(buf);
  if (count * elem <= link_.small_bytes()) {
    OneRound(data, count, elem, dtype, op);
    ScaleInPlace(data, count, dtype, scale);
  } else {
    Sliced(data, count, elem, dtype, op, scale);
  }
}

void ShmAllreduce::OneRound(uint8_t* data, size_t count, size_t elem, DataType dtype,
                            ReduceOp op) {
  const size_t bytes = count * elem;
  const uint64_t step = ++step_;
  if (step > 2) link_.WaitForPeers(&shm::RankControl::released, step - 2);
  // From a few pages, the slot's stores are chosen as Sliced's are (slot_stores.h): a peer on
  // a core that shares no cache with this one reads them faster from memory.
  const bool learns = bytes >= SlotStores::kOneRoundFrom;
  const bool stream = learns && stores_.Streams(bytes, link_.stream_choice(), true);
  using Clock = std::chrono::steady_clock;
  const auto began = learns && link_.rank() == 0 ? Clock::now() : Clock::time_point{};
  if (stream) {
    StreamCopy(link_.staging(link_.rank(), step), data, bytes);
  } else {
    std::memcpy(link_.staging(link_.rank(), step), data, bytes);
  }
  const auto staged = began != Clock::time_point{} ? Clock::now() : Clock::time_point{};
  link_.Publish(&shm::RankControl::staged, step);
  link_.WaitForPeers(&shm::RankControl::staged, step);
  const auto all_staged = staged != Clock::time_point{} ? Clock::now() : Clock::time_point{};
  ReduceStaged(data, count, dtype, op, step);
  if (all_staged != Clock::time_point{}) {
    // Rank 0 learns from its own staging and its reading of the others' slots, not from the
    // wait for their arrival.
    const auto spent = (staged - began) + (Clock::now() - all_staged);
    link_.set_stream_choice(stores_.Took(
        stream, bytes, std::chrono::duration_cast<std::chrono::nanoseconds>(spent).count(),
        true));
  }
}

void ShmAllreduce::ReduceStaged(uint8_t* data, size_t count, DataType dtype, ReduceOp op,
                                uint64_t step) {
  // x0 + x1 + ... in rank order on every rank, so that every rank gets the same bits.
  if (link_.rank() != 0) std::memcpy(data, link_.staging(0, step), count * DataTypeSize(dtype));
  for (int p = 1; p < link_.size(); ++p) ReduceInto(data, link_.staging(p, step), count, dtype, op);
  link_.Publish(&shm::RankControl::released, step);
}

void* ShmAllreduce::StagingFor(size_t count, DataType dtype, ReduceOp op) {
  staged_step_ = 0;
  offered_step_ = 0;
  const size_t bytes = count * DataTypeSize(dtype);
  // Not where Run would take another path (the sliced algorithm, or streaming stores, which
  // would need a fence before the negotiation's message), nor before a free slot.
  if (count == 0 || link_.size() == 1 || op == ReduceOp::kAdasum || bytes > link_.small_bytes() ||
      bytes >= SlotStores::kOneRoundFrom) {
    return nullptr;
  }
  // Where the ranks spin, the meeting it saves costs a cache line's trip, no more than the
  // look-ups that come with it (benchmarks/results/compare-early-staging-np2.txt); where a
  // wait gives up the core, it saves a thread switch.
  if (!link_.WaitsGiveWay()) return nullptr;
  const uint64_t step = step_ + 1;
  if (step > 2 && !link_.PeersReached(&shm::RankControl::released, step - 2)) return nullptr;
  offered_step_ = step;
  staged_bytes_ = bytes;
  return link_.staging(link_.rank(), step);
}

uint64_t ShmAllreduce::Staged() {
  staged_step_ = offered_step_;
  offered_step_ = 0;
  return staged_step_;
}

bool ShmAllreduce::RunStaged(void* buf, size_t count, DataType dtype, ReduceOp op, double scale,
                             uint64_t token) {
  const uint64_t step = step_ + 1;
  // Every rank holds the same token and the same step_ (they count the same calls), so every
  // rank takes the same branch. The staged_ checks hold wherever the tokens matched.
  if (token != step || staged_step_ != step || staged_bytes_ != count * DataTypeSize(dtype)) {
    staged_step_ = 0;
    Run(buf, count, dtype, op, scale);
    return false;
  }
  staged_step_ = 0;
  link_.CheckUsable();
  step_ = step;
  // Every peer's input for the step is in its slot: its negotiation message, read before this,
  // was written after it.
  link_.Publish(&shm::RankControl::staged, step);
  auto* data = static_cast<uint8_t*>(buf);
  ReduceStaged(data, count, dtype, op, step);
  ScaleInPlace(data, count, dtype, scale);
  return true;
}

void ShmAllreduce::Sliced(uint8_t* data, size_t count, size_t elem, DataType dtype, ReduceOp op,
                          double scale) {
  const int n = link_.size();
  const size_t chunk_elems = link_.staging_bytes() / elem;
  const size_t chunks = (count + chunk_elems - 1) / chunk_elems;
  // Slices start on cache lines, so that no two ranks write one line of a slot.
  const size_t align = std::max<size_t>(1, shm::kLine / elem);
  const uint64_t first_step = step_ + 1;
  step_ += chunks;
  const bool stream = stores_.Streams(count * elem, link_.stream_choice());
  // What the stores cost: the first chunk's staging, then everything after every rank staged
  // it (not the waits for the peers' arrival before; slot_stores.h).
  using Clock = std::chrono::steady_clock;
  Clock::duration spent{};
  Clock::time_point all_staged;

  auto chunk_len = [&](size_t c) { return std::min(chunk_elems, count - c * chunk_elems); };
  auto bound = [&](size_t len, int s) {
    return std::min(len, shm::RoundUp(len * static_cast<size_t>(s) / n, align));
  };

  auto stage = [&](size_t c) {
    const uint64_t step = first_step + c;
    if (step > 2) link_.WaitForPeers(&shm::RankControl::released, step - 2);
    const auto began = c == 0 ? Clock::now() : Clock::time_point{};
    const size_t len = chunk_len(c);
    uint8_t* src = data + c * chunk_elems * elem;
    uint8_t* slot = link_.staging(link_.rank(), step);
    for (int s = 0; s < n; ++s) {
      if (s == link_.rank()) continue;
      const size_t b = bound(len, s), e = bound(len, s + 1);
      if (e <= b) continue;
      if (stream) {
        StreamCopy(slot + b * elem, src + b * elem, (e - b) * elem);
      } else {
        std::memcpy(slot + b * elem, src + b * elem, (e - b) * elem);
      }
    }
    if (c == 0) spent = Clock::now() - began;
    link_.Publish(&shm::RankControl::staged, step);
  };
  auto reduce = [&](size_t c) {
    const uint64_t step = first_step + c;
    link_.WaitForPeers(&shm::RankControl::staged, step);
    if (c == 0) all_staged = Clock::now();
    const size_t len = chunk_len(c);
    const size_t b = bound(len, link_.rank()), e = bound(len, link_.rank() + 1);
    if (e > b) {
      const uint8_t* theirs[shm::kMaxRanks];
      int count_theirs = 0;
      for (int p = 0; p < n; ++p) {
        if (p != link_.rank()) theirs[count_theirs++] = link_.staging(p, step) + b * elem;
      }
      ReduceSlice(data + (c * chunk_elems + b) * elem, theirs, count_theirs,
                  link_.staging(link_.rank(), step) + b * elem, e - b, dtype, op, scale, stream);
    }
    link_.Publish(&shm::RankControl::reduced, step);
  };
  auto gather = [&](size_t c) {
    const uint64_t step = first_step + c;
    link_.WaitForPeers(&shm::RankControl::reduced, step);
    const size_t len = chunk_len(c);
    uint8_t* dst = data + c * chunk_elems * elem;
    for (int p = 0; p < n; ++p) {
      if (p == link_.rank()) continue;
      const size_t b = bound(len, p), e = bound(len, p + 1);
      if (e > b) std::memcpy(dst + b * elem, link_.staging(p, step) + b * elem, (e - b) * elem);
    }
    link_.Publish(&shm::RankControl::released, step);
  };

  stage(0);
  for (size_t c = 0; c < chunks; ++c) {
    reduce(c);
    if (c + 1 < chunks) stage(c + 1);
    gather(c);
  }
  if (link_.rank() == 0) {
    spent += Clock::now() - all_staged;
    link_.set_stream_choice(stores_.Took(
        stream, count * elem, std::chrono::duration_cast<std::chrono::nanoseconds>(spent).count()));
  }
}

}  // namespace horovodlike
