// Streaming stores for the shared-memory allreduce's slots, and the choice between them and
// ordinary ones (slot_stores.h).
#include "slot_stores.h"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HVDL_STREAMING 1
#include <emmintrin.h>
#else
#define HVDL_STREAMING 0
#endif

namespace horovodlike {
namespace {

constexpr uintptr_t kVector = 16;

bool Aligned(const void* p) { return (reinterpret_cast<uintptr_t>(p) & (kVector - 1)) == 0; }

void Fence() {
#if HVDL_STREAMING
  _mm_sfence();
#endif
}

template <class T>
void AddScalar(T* mine, const T* theirs, T* out, size_t i, T scale) {
  const T sum = mine[i] + theirs[i];
  const T v = scale == T(1) ? sum : sum * scale;
  mine[i] = v;
  out[i] = v;
}

}  // namespace

bool SlotStores::Available() { return HVDL_STREAMING != 0; }

void StreamCopy(uint8_t* dst, const uint8_t* src, size_t bytes) {
  size_t i = 0;
#if HVDL_STREAMING
  const size_t head = std::min(bytes, (kVector - reinterpret_cast<uintptr_t>(dst) % kVector) %
                                          kVector);
  std::memcpy(dst, src, head);
  i = head;
  for (; i + 4 * kVector <= bytes; i += 4 * kVector) {
    const auto* s = reinterpret_cast<const __m128i*>(src + i);
    auto* d = reinterpret_cast<__m128i*>(dst + i);
    const __m128i a = _mm_loadu_si128(s), b = _mm_loadu_si128(s + 1);
    const __m128i c = _mm_loadu_si128(s + 2), e = _mm_loadu_si128(s + 3);
    _mm_stream_si128(d, a);
    _mm_stream_si128(d + 1, b);
    _mm_stream_si128(d + 2, c);
    _mm_stream_si128(d + 3, e);
  }
#endif
  std::memcpy(dst + i, src + i, bytes - i);
  Fence();
}

namespace {

#if HVDL_STREAMING
// The SSE2 operations on 4 floats or 2 doubles, by overload, for AddAndStreamAll.
__m128 Splat(float x) { return _mm_set1_ps(x); }
__m128d Splat(double x) { return _mm_set1_pd(x); }
__m128 Load(const float* p) { return _mm_loadu_ps(p); }
__m128d Load(const double* p) { return _mm_loadu_pd(p); }
__m128 Add(__m128 a, __m128 b) { return _mm_add_ps(a, b); }
__m128d Add(__m128d a, __m128d b) { return _mm_add_pd(a, b); }
__m128 Mul(__m128 a, __m128 b) { return _mm_mul_ps(a, b); }
__m128d Mul(__m128d a, __m128d b) { return _mm_mul_pd(a, b); }
void Store(float* p, __m128 v) { _mm_storeu_ps(p, v); }
void Store(double* p, __m128d v) { _mm_storeu_pd(p, v); }
void Stream(float* p, __m128 v) { _mm_stream_ps(p, v); }
void Stream(double* p, __m128d v) { _mm_stream_pd(p, v); }
#endif

template <class T>
void AddAndStreamAll(T* mine, const T* theirs, T* out, size_t n, T scale) {
  size_t i = 0;
#if HVDL_STREAMING
  for (; i < n && !Aligned(out + i); ++i) AddScalar(mine, theirs, out, i, scale);
  constexpr size_t lanes = kVector / sizeof(T);
  const auto factor = Splat(scale);
  const bool scaled = scale != T(1);
  for (; i + lanes <= n; i += lanes) {
    auto v = Add(Load(mine + i), Load(theirs + i));
    if (scaled) v = Mul(v, factor);
    Store(mine + i, v);
    Stream(out + i, v);
  }
#endif
  for (; i < n; ++i) AddScalar(mine, theirs, out, i, scale);
  Fence();
}

}  // namespace

void AddAndStream(float* mine, const float* theirs, float* out, size_t n, float scale) {
  AddAndStreamAll(mine, theirs, out, n, scale);
}

void AddAndStream(double* mine, const double* theirs, double* out, size_t n, double scale) {
  AddAndStreamAll(mine, theirs, out, n, scale);
}

int SlotStores::ClassOf(size_t bytes, bool one_round) {
  if (one_round) return kOneRoundClass;
  int c = 0;
  for (size_t limit = size_t{256} << 10; bytes >= limit && c + 1 < kClasses; limit <<= 2) ++c;
  return c;
}

bool SlotStores::Streams(size_t bytes, uint32_t choice, bool one_round) {
  if (!Available() || mode_ == Mode::kOrdinary) return false;
  if (mode_ == Mode::kStreaming) return true;
  const int c = ClassOf(bytes, one_round);
  const uint64_t run = classes_[c].runs++;
  if (run < 4) return run % 2 == 1;
  if (run % kTryEvery == 0) return false;
  if (run % kTryEvery == kTryEvery / 2) return true;
  return (choice >> c) & 1;
}

uint32_t SlotStores::Took(bool streamed, size_t bytes, int64_t ns, bool one_round) {
  Learned& l = classes_[ClassOf(bytes, one_round)];
  // Not the untimed first runs (Streams counted this one already).
  if (mode_ == Mode::kAuto && bytes > 0 && l.runs > 2) Learn(l, streamed, bytes, ns);
  uint32_t choice = 0;
  for (int c = 0; c <= kOneRoundClass; ++c) {
    if (classes_[c].streaming) choice |= 1u << c;
  }
  return choice;
}

void SlotStores::Learn(Learned& l, bool streamed, size_t bytes, int64_t ns) {
  const double now = static_cast<double>(ns) / static_cast<double>(bytes);
  double& mean = l.ns_per_byte[streamed ? 1 : 0];
  // The way in use is timed on every run and smoothed, a run at most twice as slow as the mean
  // counted (one preempted run does not turn the choice; a slower placement does, in a few
  // runs). The other way is timed only on its tries, whose latest time is the best guess of
  // what it would take now (the placement may have changed since the one before).
  const bool in_use = l.streaming == streamed;
  mean = mean < 0 || !in_use ? now : mean + 0.25 * (std::min(now, 2 * mean) - mean);
  const double ordinary = l.ns_per_byte[0], streaming = l.ns_per_byte[1];
  if (ordinary < 0 || streaming < 0) return;
  if (l.streaming ? ordinary * kSwitchMargin < streaming : streaming * kSwitchMargin < ordinary) {
    l.streaming = !l.streaming;
  }
}

}  // namespace horovodlike
