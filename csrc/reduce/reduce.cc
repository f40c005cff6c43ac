// Elementwise reduction and scaling kernels (see reduce.h for the contract).
//
// Every (dtype, op) pair gets its own tight loop, instantiated from templates, so that the
// compiler auto-vectorises it (at -O2 as well as -O3, see "Reduce loops"); the dtype/op switch
// happens once per call, never per element. float16 and bfloat16 are widened to float32,
// combined, and rounded back (round to nearest even), in blocks.
//
// On x86-64 a few kernels are picked at run time (checked once):
//   * float16 with F16C: hardware conversions (_mm256_cvtph_ps / _mm256_cvtps_ph);
//   * bfloat16 and integer scaling with AVX2: the same arithmetic in 256-bit vectors.
// Everything else, and every kernel on other architectures, is portable C++; all paths give
// bit-identical results (except for which NaN bit pattern a NaN result has).
#include "reduce.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "half.h"

// Define HOROVODLIKE_REDUCE_PORTABLE_ONLY to build without the x86 F16C path (used by the
// selftest to exercise the portable code on x86 machines).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(HOROVODLIKE_REDUCE_PORTABLE_ONLY)
#define HVDL_HAVE_X86_DISPATCH 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define HVDL_HAVE_X86_DISPATCH 0
#endif

#if defined(__GNUC__) || defined(__clang__)
#define HVDL_INLINE inline __attribute__((always_inline))
#define HVDL_RESTRICT __restrict__
#else
#define HVDL_INLINE inline
#define HVDL_RESTRICT
#endif

namespace horovodlike {

namespace {

using half_internal::BFloat16BitsToFloat;
using half_internal::FloatToBFloat16Bits;
using half_internal::FloatToHalfBits;
using half_internal::HalfBitsToFloat;

// Elements per staging block for the float16/bfloat16 kernels (1 KiB of float32 per operand,
// comfortably inside L1).
constexpr size_t kBlock = 256;

// ---------------------------------------------------------------------------------------------
// Binary operations. Each is a functor with a static Apply so that it inlines into the loops.

// Integer arithmetic in the unsigned type of the same width (at least unsigned int, so that
// uint16 * uint16 does not promote to a signed int that can overflow): wraps modulo 2^n like
// NumPy, with no undefined behaviour.
template <typename T>
struct Wide {
  using U = std::make_unsigned_t<T>;
  using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
};

struct SumOp {
  template <typename T>
  static HVDL_INLINE T Apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      using W = typename Wide<T>::W;
      using U = typename Wide<T>::U;
      return static_cast<T>(static_cast<U>(static_cast<W>(static_cast<U>(a)) +
                                           static_cast<W>(static_cast<U>(b))));
    } else {
      return a + b;
    }
  }
};

struct ProductOp {
  template <typename T>
  static HVDL_INLINE T Apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      using W = typename Wide<T>::W;
      using U = typename Wide<T>::U;
      return static_cast<T>(static_cast<U>(static_cast<W>(static_cast<U>(a)) *
                                           static_cast<W>(static_cast<U>(b))));
    } else {
      return a * b;
    }
  }
};

// Min/Max follow numpy.minimum/maximum: a NaN in either operand gives NaN (the first NaN).
struct MinOp {
  template <typename T>
  static HVDL_INLINE T Apply(T a, T b) {
    T r = (a <= b) ? a : b;  // b when b is NaN
    if constexpr (std::is_floating_point_v<T>) r = (a != a) ? a : r;
    return r;
  }
};

struct MaxOp {
  template <typename T>
  static HVDL_INLINE T Apply(T a, T b) {
    T r = (a >= b) ? a : b;  // b when b is NaN
    if constexpr (std::is_floating_point_v<T>) r = (a != a) ? a : r;
    return r;
  }
};

// bool is stored as one byte; any non-zero byte is true and results are 0/1.
struct OrOp {
  static HVDL_INLINE uint8_t Apply(uint8_t a, uint8_t b) {
    return static_cast<uint8_t>((a | b) != 0);
  }
};

struct AndOp {
  static HVDL_INLINE uint8_t Apply(uint8_t a, uint8_t b) {
    return static_cast<uint8_t>((a != 0) & (b != 0));
  }
};

// ---------------------------------------------------------------------------------------------
// Reduce loops.
//
// Every loop is strip-mined into spans of a compile-time length plus one shorter tail span: a
// loop with a constant trip count over __restrict pointers is vectorised not only at -O3 but
// also by the "very cheap" vectoriser cost model GCC uses at -O2.

constexpr size_t kSpanBytes = 256;

template <typename T, typename Op>
HVDL_INLINE void ReduceSpan(T* HVDL_RESTRICT dst, const T* HVDL_RESTRICT src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = Op::Apply(dst[i], src[i]);
}

template <typename T, typename Op>
void ReduceLoop(T* HVDL_RESTRICT dst, const T* HVDL_RESTRICT src, size_t count) {
  constexpr size_t kSpan = kSpanBytes / sizeof(T);
  size_t i = 0;
  for (; i + kSpan <= count; i += kSpan) ReduceSpan<T, Op>(dst + i, src + i, kSpan);
  ReduceSpan<T, Op>(dst + i, src + i, count - i);
}

// Widen up to kBlock float16/bfloat16 values to float32, combine, round back.
template <typename Op, float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
HVDL_INLINE void Reduce16Span(uint16_t* HVDL_RESTRICT dst, const uint16_t* HVDL_RESTRICT src,
                              size_t n) {
  alignas(64) float a[kBlock];
  alignas(64) float b[kBlock];
  for (size_t i = 0; i < n; ++i) a[i] = ToFloat(dst[i]);
  for (size_t i = 0; i < n; ++i) b[i] = ToFloat(src[i]);
  for (size_t i = 0; i < n; ++i) a[i] = Op::Apply(a[i], b[i]);
  for (size_t i = 0; i < n; ++i) dst[i] = FromFloat(a[i]);
}

// always_inline so that it can be instantiated both for the baseline ISA and inside
// target("avx2") wrappers.
template <typename Op, float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
HVDL_INLINE void ReduceBlocked16Body(uint16_t* HVDL_RESTRICT dst,
                                     const uint16_t* HVDL_RESTRICT src, size_t count) {
  size_t i = 0;
  for (; i + kBlock <= count; i += kBlock) {
    Reduce16Span<Op, ToFloat, FromFloat>(dst + i, src + i, kBlock);
  }
  Reduce16Span<Op, ToFloat, FromFloat>(dst + i, src + i, count - i);
}

// dst[i] = src[i] * factor through float32 for up to kBlock values; dst may equal src (all of
// src is read before dst is written).
template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
HVDL_INLINE void Scale16Span(uint16_t* dst, const uint16_t* src, size_t n, float factor) {
  alignas(64) float a[kBlock];
  for (size_t i = 0; i < n; ++i) a[i] = ToFloat(src[i]) * factor;
  for (size_t i = 0; i < n; ++i) dst[i] = FromFloat(a[i]);
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
HVDL_INLINE void Scale16Body(uint16_t* dst, const uint16_t* src, size_t count, float factor) {
  size_t i = 0;
  for (; i + kBlock <= count; i += kBlock) {
    Scale16Span<ToFloat, FromFloat>(dst + i, src + i, kBlock, factor);
  }
  Scale16Span<ToFloat, FromFloat>(dst + i, src + i, count - i, factor);
}

HVDL_INLINE float HalfToFloatInl(uint16_t h) { return HalfBitsToFloat(h); }
HVDL_INLINE uint16_t FloatToHalfInl(float f) { return FloatToHalfBits(f); }
HVDL_INLINE float BFloat16ToFloatInl(uint16_t b) { return BFloat16BitsToFloat(b); }
HVDL_INLINE uint16_t FloatToBFloat16Inl(float f) { return FloatToBFloat16Bits(f); }

#if HVDL_HAVE_X86_DISPATCH

// Run-time CPU checks, done once. GCC: __builtin_cpu_supports (which also checks that the OS
// saves the AVX state). Clang (14 at least) rejects "f16c" there, so it reads CPUID/XGETBV.
#if defined(__clang__)
bool OsSavesYmm() {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & bit_OSXSAVE)) return false;
  unsigned xcr0_lo, xcr0_hi;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  return (xcr0_lo & 0x6u) == 0x6u;  // XMM and YMM state enabled
}

bool CpuidHasF16CAndAvx() {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  return (ecx & bit_F16C) && (ecx & bit_AVX) && OsSavesYmm();
}

bool CpuidHasAvx2() {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  return (ebx & bit_AVX2) && OsSavesYmm();
}
#endif

bool CpuHasF16C() {
  static const bool has = [] {
#if defined(__clang__)
    return CpuidHasF16CAndAvx();
#else
    __builtin_cpu_init();
    return __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
#endif
  }();
  return has;
}

bool CpuHasAvx2() {
  static const bool has = [] {
#if defined(__clang__)
    return CpuidHasAvx2();
#else
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
#endif
  }();
  return has;
}

#define HVDL_TARGET_AVX __attribute__((target("avx")))
#define HVDL_TARGET_F16C __attribute__((target("f16c,avx")))
#define HVDL_TARGET_AVX2 __attribute__((target("avx2")))

// The ops on 8 floats, same semantics as the scalar Apply (including which NaN is returned).
// Selects are written with and/andnot/or rather than blendv: GCC 12 folds _mm256_blendv_ps into
// a generic vector select that, in a function targeting plain AVX (no 256-bit integer
// compares), it scalarises.
HVDL_TARGET_AVX HVDL_INLINE __m256 Select(__m256 mask, __m256 if_set, __m256 if_clear) {
  return _mm256_or_ps(_mm256_and_ps(mask, if_set), _mm256_andnot_ps(mask, if_clear));
}
HVDL_TARGET_AVX HVDL_INLINE __m256 VecApply(SumOp, __m256 a, __m256 b) {
  return _mm256_add_ps(a, b);
}
HVDL_TARGET_AVX HVDL_INLINE __m256 VecApply(ProductOp, __m256 a, __m256 b) {
  return _mm256_mul_ps(a, b);
}
HVDL_TARGET_AVX HVDL_INLINE __m256 VecApply(MinOp, __m256 a, __m256 b) {
  const __m256 r = Select(_mm256_cmp_ps(a, b, _CMP_LE_OQ), a, b);  // b when b is NaN
  return Select(_mm256_cmp_ps(a, a, _CMP_UNORD_Q), a, r);
}
HVDL_TARGET_AVX HVDL_INLINE __m256 VecApply(MaxOp, __m256 a, __m256 b) {
  const __m256 r = Select(_mm256_cmp_ps(a, b, _CMP_GE_OQ), a, b);
  return Select(_mm256_cmp_ps(a, a, _CMP_UNORD_Q), a, r);
}

// Hides a value from the optimiser. Clang otherwise rewrites cvtps_ph(min(cvtph_ps(a),
// cvtph_ps(b))) into a compare-and-select on the float16 values themselves, which it then
// scalarises (about 20x slower).
#define HVDL_OPAQUE(v) __asm__("" : "+x"(v))

// float16 with F16C: 16 elements per iteration, hardware conversions (round to nearest even).
template <typename Op>
HVDL_TARGET_F16C HVDL_INLINE void ReduceHalfF16CBody(uint16_t* dst, const uint16_t* src,
                                                     size_t n) {  // n % 16 == 0
  for (size_t i = 0; i < n; i += 16) {
    const __m128i* d = reinterpret_cast<const __m128i*>(dst + i);
    const __m128i* s = reinterpret_cast<const __m128i*>(src + i);
    __m256 a0 = _mm256_cvtph_ps(_mm_loadu_si128(d));
    __m256 a1 = _mm256_cvtph_ps(_mm_loadu_si128(d + 1));
    __m256 b0 = _mm256_cvtph_ps(_mm_loadu_si128(s));
    __m256 b1 = _mm256_cvtph_ps(_mm_loadu_si128(s + 1));
    HVDL_OPAQUE(a0);
    HVDL_OPAQUE(a1);
    __m128i r0 = _mm256_cvtps_ph(VecApply(Op{}, a0, b0), _MM_FROUND_TO_NEAREST_INT);
    __m128i r1 = _mm256_cvtps_ph(VecApply(Op{}, a1, b1), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), r0);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i) + 1, r1);
  }
}

// The last partial vector goes through zero-padded copies, so that it gets exactly the same
// arithmetic as the rest.
template <typename Op>
HVDL_TARGET_F16C void ReduceHalfF16C(uint16_t* dst, const uint16_t* src, size_t count) {
  const size_t full = count - count % 16;
  ReduceHalfF16CBody<Op>(dst, src, full);
  if (full < count) {
    const size_t rest = count - full;
    alignas(32) uint16_t d[16] = {};
    alignas(32) uint16_t s[16] = {};
    std::memcpy(d, dst + full, rest * sizeof(uint16_t));
    std::memcpy(s, src + full, rest * sizeof(uint16_t));
    ReduceHalfF16CBody<Op>(d, s, 16);
    std::memcpy(dst + full, d, rest * sizeof(uint16_t));
  }
}

HVDL_TARGET_F16C HVDL_INLINE void ScaleHalfF16CBody(uint16_t* dst, const uint16_t* src,
                                                    size_t n, __m256 f) {  // n % 8 == 0
  for (size_t i = 0; i < n; i += 8) {
    __m256 a = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_mul_ps(a, f), _MM_FROUND_TO_NEAREST_INT));
  }
}

HVDL_TARGET_F16C void ScaleHalfF16C(uint16_t* dst, const uint16_t* src, size_t count,
                                    float factor) {
  const __m256 f = _mm256_set1_ps(factor);
  const size_t full = count - count % 8;
  ScaleHalfF16CBody(dst, src, full, f);
  if (full < count) {
    alignas(32) uint16_t t[8] = {};
    std::memcpy(t, src + full, (count - full) * sizeof(uint16_t));
    ScaleHalfF16CBody(t, t, 8, f);
    std::memcpy(dst + full, t, (count - full) * sizeof(uint16_t));
  }
}

// bfloat16 with AVX2: unpacking 16-bit lanes against zero gives exactly the float bits
// (b << 16), and the rounded results are narrowed back with packus, which undoes the
// unpack's in-lane element order.
HVDL_TARGET_AVX2 HVDL_INLINE __m256i Bf16RoundAvx2(__m256 x) {
  // ((u + 0x7fff + ((u >> 16) & 1)) >> 16), NaN -> 0x7fc0 (as torch's round_to_nearest_even).
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  r = _mm256_or_si256(_mm256_and_si256(nan, _mm256_set1_epi32(0x7fc00000)),
                      _mm256_andnot_si256(nan, r));
  return _mm256_srli_epi32(r, 16);
}

template <typename Op>
HVDL_TARGET_AVX2 HVDL_INLINE void ReduceBFloat16Avx2Body(uint16_t* dst, const uint16_t* src,
                                                         size_t n) {  // n % 16 == 0
  const __m256i zero = _mm256_setzero_si256();
  for (size_t i = 0; i < n; i += 16) {
    const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(dst + i));
    const __m256i s = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256 a0 = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, d));
    const __m256 a1 = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, d));
    const __m256 b0 = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, s));
    const __m256 b1 = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, s));
    const __m256i r = _mm256_packus_epi32(Bf16RoundAvx2(VecApply(Op{}, a0, b0)),
                                          Bf16RoundAvx2(VecApply(Op{}, a1, b1)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), r);
  }
}

template <typename Op>
HVDL_TARGET_AVX2 void ReduceBFloat16Avx2(uint16_t* dst, const uint16_t* src, size_t count) {
  const size_t full = count - count % 16;
  ReduceBFloat16Avx2Body<Op>(dst, src, full);
  if (full < count) {  // padded tail, as in ReduceHalfF16C
    const size_t rest = count - full;
    alignas(32) uint16_t d[16] = {};
    alignas(32) uint16_t s[16] = {};
    std::memcpy(d, dst + full, rest * sizeof(uint16_t));
    std::memcpy(s, src + full, rest * sizeof(uint16_t));
    ReduceBFloat16Avx2Body<Op>(d, s, 16);
    std::memcpy(dst + full, d, rest * sizeof(uint16_t));
  }
}

HVDL_TARGET_AVX2 HVDL_INLINE void ScaleBFloat16Avx2Body(uint16_t* dst, const uint16_t* src,
                                                        size_t n, __m256 f) {  // n % 16 == 0
  const __m256i zero = _mm256_setzero_si256();
  for (size_t i = 0; i < n; i += 16) {
    const __m256i s = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256 a0 = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, s));
    const __m256 a1 = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, s));
    const __m256i r = _mm256_packus_epi32(Bf16RoundAvx2(_mm256_mul_ps(a0, f)),
                                          Bf16RoundAvx2(_mm256_mul_ps(a1, f)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), r);
  }
}

HVDL_TARGET_AVX2 void ScaleBFloat16Avx2(uint16_t* dst, const uint16_t* src, size_t count,
                                        float factor) {
  const __m256 f = _mm256_set1_ps(factor);
  const size_t full = count - count % 16;
  ScaleBFloat16Avx2Body(dst, src, full, f);
  if (full < count) {
    alignas(32) uint16_t t[16] = {};
    std::memcpy(t, src + full, (count - full) * sizeof(uint16_t));
    ScaleBFloat16Avx2Body(t, t, 16, f);
    std::memcpy(dst + full, t, (count - full) * sizeof(uint16_t));
  }
}

#endif  // HVDL_HAVE_X86_DISPATCH

template <typename Op>
void ReduceHalf(uint16_t* dst, const uint16_t* src, size_t count) {
#if HVDL_HAVE_X86_DISPATCH
  if (CpuHasF16C()) {
    ReduceHalfF16C<Op>(dst, src, count);
    return;
  }
#endif
  ReduceBlocked16Body<Op, HalfToFloatInl, FloatToHalfInl>(dst, src, count);
}

template <typename Op>
void ReduceBFloat16(uint16_t* dst, const uint16_t* src, size_t count) {
#if HVDL_HAVE_X86_DISPATCH
  if (CpuHasAvx2()) {
    ReduceBFloat16Avx2<Op>(dst, src, count);
    return;
  }
#endif
  ReduceBlocked16Body<Op, BFloat16ToFloatInl, FloatToBFloat16Inl>(dst, src, count);
}

// ---------------------------------------------------------------------------------------------
// Dispatch helpers.

[[noreturn]] void ThrowBadDataType(DataType dtype) {
  throw InvalidArgument("unsupported data type " + std::to_string(static_cast<int32_t>(dtype)));
}

[[noreturn]] void ThrowBadReduceOp(ReduceOp op) {
  throw InvalidArgument("unsupported reduce op " + std::to_string(static_cast<int32_t>(op)));
}

void CheckOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kAverage:
    case ReduceOp::kSum:
    case ReduceOp::kMin:
    case ReduceOp::kMax:
    case ReduceOp::kProduct:
      return;
    case ReduceOp::kAdasum:  // not elementwise: collectives/adasum_allreduce.h
      break;
  }
  ThrowBadReduceOp(op);
}

template <typename T>
void ReduceTyped(void* dst, const void* src, size_t count, ReduceOp op) {
  T* d = static_cast<T*>(dst);
  const T* s = static_cast<const T*>(src);
  switch (op) {
    case ReduceOp::kAverage:
    case ReduceOp::kSum:
      return ReduceLoop<T, SumOp>(d, s, count);
    case ReduceOp::kMin:
      return ReduceLoop<T, MinOp>(d, s, count);
    case ReduceOp::kMax:
      return ReduceLoop<T, MaxOp>(d, s, count);
    case ReduceOp::kProduct:
      return ReduceLoop<T, ProductOp>(d, s, count);
    case ReduceOp::kAdasum:
      break;
  }
  ThrowBadReduceOp(op);
}

template <template <typename> class Kernel>
void Reduce16(void* dst, const void* src, size_t count, ReduceOp op) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  const uint16_t* s = static_cast<const uint16_t*>(src);
  switch (op) {
    case ReduceOp::kAverage:
    case ReduceOp::kSum:
      return Kernel<SumOp>::Run(d, s, count);
    case ReduceOp::kMin:
      return Kernel<MinOp>::Run(d, s, count);
    case ReduceOp::kMax:
      return Kernel<MaxOp>::Run(d, s, count);
    case ReduceOp::kProduct:
      return Kernel<ProductOp>::Run(d, s, count);
    case ReduceOp::kAdasum:
      break;
  }
  ThrowBadReduceOp(op);
}

template <typename Op>
struct HalfKernel {
  static void Run(uint16_t* d, const uint16_t* s, size_t n) { ReduceHalf<Op>(d, s, n); }
};

template <typename Op>
struct BFloat16Kernel {
  static void Run(uint16_t* d, const uint16_t* s, size_t n) { ReduceBFloat16<Op>(d, s, n); }
};

void ReduceBool(void* dst, const void* src, size_t count, ReduceOp op) {
  uint8_t* d = static_cast<uint8_t*>(dst);
  const uint8_t* s = static_cast<const uint8_t*>(src);
  switch (op) {
    case ReduceOp::kAverage:
    case ReduceOp::kSum:
    case ReduceOp::kMax:
      return ReduceLoop<uint8_t, OrOp>(d, s, count);
    case ReduceOp::kMin:
    case ReduceOp::kProduct:
      return ReduceLoop<uint8_t, AndOp>(d, s, count);
    case ReduceOp::kAdasum:
      break;
  }
  ThrowBadReduceOp(op);
}

// ---------------------------------------------------------------------------------------------
// Scaling.

// double -> integer, truncating toward zero as a C cast does. Results a C cast leaves undefined
// get a defined value: NaN -> 0, and out-of-range values saturate to the int32 range for types
// of up to 32 bits (then wrap modulo 2^n into T, like a C cast int32 -> int8) or to the int64
// range for int64. Written with selects only, so the loops vectorise.
template <typename T>
HVDL_INLINE T ScaleIntElem(T x, double factor) {
  const double v = static_cast<double>(x) * factor;
  if constexpr (sizeof(T) <= 4) {
    constexpr double kLo = -2147483648.0;
    constexpr double kHi = 2147483647.0;
    double c = (v >= kLo) ? v : kLo;
    c = (c <= kHi) ? c : kHi;
    c = (v == v) ? c : 0.0;
    return static_cast<T>(static_cast<std::make_unsigned_t<T>>(
        static_cast<uint32_t>(static_cast<int32_t>(c))));
  } else {
    constexpr double kTwo63 = 9223372036854775808.0;
    const double c = (v >= -kTwo63 && v < kTwo63) ? v : 0.0;
    int64_t i = static_cast<int64_t>(c);
    i = (v >= kTwo63) ? std::numeric_limits<int64_t>::max() : i;
    i = (v < -kTwo63) ? std::numeric_limits<int64_t>::min() : i;
    return static_cast<T>(i);
  }
}

template <typename T>
HVDL_INLINE void ScaleIntSpan(T* HVDL_RESTRICT dst, const T* HVDL_RESTRICT src, size_t n,
                              double factor) {
  for (size_t i = 0; i < n; ++i) dst[i] = ScaleIntElem<T>(src[i], factor);
}

template <typename T>
HVDL_INLINE void ScaleIntBody(T* HVDL_RESTRICT dst, const T* HVDL_RESTRICT src, size_t count,
                              double factor) {
  constexpr size_t kSpan = kSpanBytes / sizeof(T);
  size_t i = 0;
  for (; i + kSpan <= count; i += kSpan) ScaleIntSpan<T>(dst + i, src + i, kSpan, factor);
  ScaleIntSpan<T>(dst + i, src + i, count - i, factor);
}

#if HVDL_HAVE_X86_DISPATCH
// The int -> double -> int conversions are about twice as fast with 256-bit vectors.
template <typename T>
HVDL_TARGET_AVX2 void ScaleIntAvx2(T* HVDL_RESTRICT dst, const T* HVDL_RESTRICT src,
                                   size_t count, double factor) {
  ScaleIntBody<T>(dst, src, count, factor);
}
#endif

template <typename T>
void ScaleIntLoop(T* HVDL_RESTRICT dst, const T* HVDL_RESTRICT src, size_t count,
                  double factor) {
#if HVDL_HAVE_X86_DISPATCH
  if (sizeof(T) <= 4 && CpuHasAvx2()) {  // no vector double -> int64 before AVX-512DQ
    ScaleIntAvx2<T>(dst, src, count, factor);
    return;
  }
#endif
  ScaleIntBody<T>(dst, src, count, factor);
}

template <typename T>
HVDL_INLINE void ScaleFloatSpan(T* HVDL_RESTRICT dst, const T* HVDL_RESTRICT src, size_t n,
                                T factor) {
  for (size_t i = 0; i < n; ++i) dst[i] = src[i] * factor;
}

template <typename T>
void ScaleFloatLoop(T* HVDL_RESTRICT dst, const T* HVDL_RESTRICT src, size_t count, T factor) {
  constexpr size_t kSpan = kSpanBytes / sizeof(T);
  size_t i = 0;
  for (; i + kSpan <= count; i += kSpan) ScaleFloatSpan<T>(dst + i, src + i, kSpan, factor);
  ScaleFloatSpan<T>(dst + i, src + i, count - i, factor);
}

// In-place variants: dst == src would break the __restrict promise of the loops above.
template <typename T>
void ScaleIntInPlace(T* buf, size_t count, double factor) {
  // Through a small stack block (in L1), so that the restrict loop can be reused.
  alignas(64) T tmp[4 * kBlock];
  for (size_t base = 0; base < count; base += 4 * kBlock) {
    const size_t n = std::min(4 * kBlock, count - base);
    ScaleIntLoop<T>(tmp, buf + base, n, factor);
    std::memcpy(buf + base, tmp, n * sizeof(T));
  }
}

template <typename T>
HVDL_INLINE void ScaleFloatInPlaceSpan(T* HVDL_RESTRICT buf, size_t n, T factor) {
  for (size_t i = 0; i < n; ++i) buf[i] *= factor;
}

template <typename T>
void ScaleFloatInPlace(T* HVDL_RESTRICT buf, size_t count, T factor) {
  constexpr size_t kSpan = kSpanBytes / sizeof(T);
  size_t i = 0;
  for (; i + kSpan <= count; i += kSpan) ScaleFloatInPlaceSpan<T>(buf + i, kSpan, factor);
  ScaleFloatInPlaceSpan<T>(buf + i, count - i, factor);
}

void ScaleHalf(uint16_t* dst, const uint16_t* src, size_t count, float factor) {
#if HVDL_HAVE_X86_DISPATCH
  if (CpuHasF16C()) {
    ScaleHalfF16C(dst, src, count, factor);
    return;
  }
#endif
  Scale16Body<HalfToFloatInl, FloatToHalfInl>(dst, src, count, factor);
}

void ScaleBFloat16(uint16_t* dst, const uint16_t* src, size_t count, float factor) {
#if HVDL_HAVE_X86_DISPATCH
  if (CpuHasAvx2()) {
    ScaleBFloat16Avx2(dst, src, count, factor);
    return;
  }
#endif
  Scale16Body<BFloat16ToFloatInl, FloatToBFloat16Inl>(dst, src, count, factor);
}

// Shared by ScaleInPlace (dst == src) and ScaleCopy (disjoint); factor != 1.0.
void ScaleImpl(void* dst, const void* src, size_t count, DataType dtype, double factor,
               bool in_place) {
  switch (dtype) {
    case DataType::kUInt8:
    case DataType::kInt8:
    case DataType::kInt16:
    case DataType::kUInt16:
    case DataType::kInt32:
    case DataType::kInt64:
      break;
    case DataType::kFloat16:
      return ScaleHalf(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), count,
                       static_cast<float>(factor));
    case DataType::kBFloat16:
      return ScaleBFloat16(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src),
                           count, static_cast<float>(factor));
    case DataType::kFloat32:
      if (in_place) {
        return ScaleFloatInPlace(static_cast<float*>(dst), count, static_cast<float>(factor));
      }
      return ScaleFloatLoop(static_cast<float*>(dst), static_cast<const float*>(src), count,
                            static_cast<float>(factor));
    case DataType::kFloat64:
      if (in_place) return ScaleFloatInPlace(static_cast<double*>(dst), count, factor);
      return ScaleFloatLoop(static_cast<double*>(dst), static_cast<const double*>(src), count,
                            factor);
    case DataType::kBool:
      if (!in_place && count > 0) std::memcpy(dst, src, count);
      return;
    default:
      ThrowBadDataType(dtype);
  }
  // Integers.
#define HVDL_SCALE_INT(ENUM, T)                                                        \
  case DataType::ENUM:                                                                 \
    if (in_place) return ScaleIntInPlace<T>(static_cast<T*>(dst), count, factor);      \
    return ScaleIntLoop<T>(static_cast<T*>(dst), static_cast<const T*>(src), count, factor);
  switch (dtype) {
    HVDL_SCALE_INT(kUInt8, uint8_t)
    HVDL_SCALE_INT(kInt8, int8_t)
    HVDL_SCALE_INT(kInt16, int16_t)
    HVDL_SCALE_INT(kUInt16, uint16_t)
    HVDL_SCALE_INT(kInt32, int32_t)
    HVDL_SCALE_INT(kInt64, int64_t)
    default:
      ThrowBadDataType(dtype);
  }
#undef HVDL_SCALE_INT
}

size_t ElementSize(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8:
    case DataType::kInt8:
    case DataType::kBool:
      return 1;
    case DataType::kInt16:
    case DataType::kUInt16:
    case DataType::kFloat16:
    case DataType::kBFloat16:
      return 2;
    case DataType::kInt32:
    case DataType::kFloat32:
      return 4;
    case DataType::kInt64:
    case DataType::kFloat64:
      return 8;
  }
  ThrowBadDataType(dtype);
}

}  // namespace

// -------------------------------------------------------------------------------------------
// Public entry points.

void ReduceInto(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op) {
  CheckOp(op);
  switch (dtype) {
    case DataType::kUInt8:
      return ReduceTyped<uint8_t>(dst, src, count, op);
    case DataType::kInt8:
      return ReduceTyped<int8_t>(dst, src, count, op);
    case DataType::kInt16:
      return ReduceTyped<int16_t>(dst, src, count, op);
    case DataType::kUInt16:
      return ReduceTyped<uint16_t>(dst, src, count, op);
    case DataType::kInt32:
      return ReduceTyped<int32_t>(dst, src, count, op);
    case DataType::kInt64:
      return ReduceTyped<int64_t>(dst, src, count, op);
    case DataType::kFloat16:
      return Reduce16<HalfKernel>(dst, src, count, op);
    case DataType::kBFloat16:
      return Reduce16<BFloat16Kernel>(dst, src, count, op);
    case DataType::kFloat32:
      return ReduceTyped<float>(dst, src, count, op);
    case DataType::kFloat64:
      return ReduceTyped<double>(dst, src, count, op);
    case DataType::kBool:
      return ReduceBool(dst, src, count, op);
  }
  ThrowBadDataType(dtype);
}

void ScaleInPlace(void* buf, size_t count, DataType dtype, double factor) {
  ElementSize(dtype);  // validates dtype
  if (factor == 1.0 || count == 0) return;
  ScaleImpl(buf, buf, count, dtype, factor, /*in_place=*/true);
}

void ScaleCopy(void* dst, const void* src, size_t count, DataType dtype, double factor) {
  const size_t elem = ElementSize(dtype);  // validates dtype
  if (count == 0) return;
  if (factor == 1.0) {
    std::memcpy(dst, src, count * elem);
    return;
  }
  ScaleImpl(dst, src, count, dtype, factor, /*in_place=*/false);
}

float HalfToFloat(uint16_t h) { return HalfBitsToFloat(h); }

uint16_t FloatToHalf(float f) { return FloatToHalfBits(f); }

float BFloat16ToFloat(uint16_t b) { return BFloat16BitsToFloat(b); }

uint16_t FloatToBFloat16(float f) { return FloatToBFloat16Bits(f); }

}  // namespace horovodlike
