// Shared by the elementwise kernels (reduce.cc, scale.cc); internal to csrc/reduce/: the
// platform switches, the block sizes, the float16/bfloat16 staging helpers and the run-time
// CPU checks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "half.h"
#include "../common/common.h"

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
namespace reduce_internal {

using half_internal::BFloat16BitsToFloat;
using half_internal::FloatToBFloat16Bits;
using half_internal::FloatToHalfBits;
using half_internal::HalfBitsToFloat;

// Elements per staging block for the float16/bfloat16 kernels (1 KiB of float32 per operand,
// comfortably inside L1).
constexpr size_t kBlock = 256;

// ---------------------------------------------------------------------------------------------
// Reduce loops.
//
// Every loop is strip-mined into spans of a compile-time length plus one shorter tail span: a
// loop with a constant trip count over __restrict pointers is vectorised not only at -O3 but
// also by the "very cheap" vectoriser cost model GCC uses at -O2.

constexpr size_t kSpanBytes = 256;

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
inline bool OsSavesYmm() {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & bit_OSXSAVE)) return false;
  unsigned xcr0_lo, xcr0_hi;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  return (xcr0_lo & 0x6u) == 0x6u;  // XMM and YMM state enabled
}

inline bool CpuidHasF16CAndAvx() {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  return (ecx & bit_F16C) && (ecx & bit_AVX) && OsSavesYmm();
}

inline bool CpuidHasAvx2() {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  return (ebx & bit_AVX2) && OsSavesYmm();
}
#endif

inline bool CpuHasF16C() {
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

inline bool CpuHasAvx2() {
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

#endif  // HVDL_HAVE_X86_DISPATCH

[[noreturn]] inline void ThrowBadDataType(DataType dtype) {
  throw InvalidArgument("unsupported data type " + std::to_string(static_cast<int32_t>(dtype)));
}

[[noreturn]] inline void ThrowBadReduceOp(ReduceOp op) {
  throw InvalidArgument("unsupported reduce op " + std::to_string(static_cast<int32_t>(op)));
}

}  // namespace reduce_internal
}  // namespace horovodlike
