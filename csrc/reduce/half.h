// Branch-free, inlineable float16 / bfloat16 <-> float32 conversions used by the reduce kernels.
//
// They are written with selects only (no data-dependent branches) so that loops calling them
// auto-vectorise at -O3. Semantics (bit-exact):
//   * HalfBitsToFloat / FloatToHalfBits match NumPy's float16 casts (npy_half): round to nearest
//     even, subnormals kept, overflow to inf, NaN keeps its (truncated) payload and sign and
//     always stays NaN.
//   * BFloat16BitsToFloat / FloatToBFloat16Bits match torch's c10::BFloat16 (round to nearest
//     even; every NaN becomes 0x7FC0).
// Internal header of csrc/reduce; the public entry points are in reduce.h.
#pragma once

#include <cstdint>
#include <cstring>

namespace horovodlike {
namespace half_internal {

#if defined(__GNUC__) || defined(__clang__)
#define HVDL_HALF_INLINE inline __attribute__((always_inline))
#else
#define HVDL_HALF_INLINE inline
#endif

HVDL_HALF_INLINE uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

HVDL_HALF_INLINE float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// All-ones when cond holds, else zero. The conversions below combine their cases with these
// masks instead of ?: so that no compiler turns them into branches: with -ftrapping-math (the
// default) GCC refuses to if-convert a branch that contains a float operation, which would
// keep the loops from vectorising.
HVDL_HALF_INLINE uint32_t Mask(bool cond) { return 0u - static_cast<uint32_t>(cond); }

HVDL_HALF_INLINE uint32_t Blend(uint32_t mask, uint32_t if_set, uint32_t if_clear) {
  return (if_set & mask) | (if_clear & ~mask);
}

// float16 bits -> float32. Normals and inf/NaN are a rebias of the exponent; subnormals are
// produced exactly with one float subtraction (the result is a normal float32, so it is exact
// and unaffected by FTZ/DAZ).
HVDL_HALF_INLINE float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t shifted = static_cast<uint32_t>(h & 0x7fffu) << 13;  // exponent+mantissa
  const uint32_t exp = shifted & 0x0f800000u;
  const uint32_t normal = shifted + ((127u - 15u) << 23);
  // inf/NaN: exponent all ones -> rebias once more so it becomes 0xff.
  const uint32_t infnan = normal + ((128u - 16u) << 23);
  // zero/subnormal: m * 2^-24 == (2^-14 + m * 2^-24) - 2^-14, computed in float.
  const float sub = BitsFloat(normal + (1u << 23)) - BitsFloat(113u << 23);
  uint32_t mag = Blend(Mask(exp == 0x0f800000u), infnan, normal);
  mag = Blend(Mask(exp == 0), FloatBits(sub), mag);
  return BitsFloat(mag | sign);
}

// float32 -> float16 bits, round to nearest even.
HVDL_HALF_INLINE uint16_t FloatToHalfBits(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;

  // NaN: keep the top 10 payload bits, but stay NaN when they are all zero (as NumPy does).
  uint32_t nan = 0x7c00u | ((a & 0x007fffffu) >> 13);
  nan |= static_cast<uint32_t>(nan == 0x7c00u);

  // Normal half range: rebias and round to nearest even on the 13 dropped bits. A carry out of
  // the mantissa correctly bumps the exponent (up to 0x7c00 == inf for 65520 <= |f| < 65536).
  const uint32_t odd = (a >> 13) & 1u;
  const uint32_t norm = (a + 0xc8000fffu + odd) >> 13;  // 0xc8000000 == (15 - 127) << 23 (mod 2^32)

  // Subnormal (or zero) half: add 0.5 in float so that the FPU rounds the value to a multiple of
  // 2^-24 (nearest even), then the low mantissa bits are the half bits. For |f| >= 2^-14 this
  // value is unused.
  const float magic = BitsFloat(126u << 23);  // 0.5
  const uint32_t sub = FloatBits(BitsFloat(a) + magic) - (126u << 23);

  uint32_t r = Blend(Mask(a < (113u << 23)), sub, norm);  // |f| < 2^-14
  r = Blend(Mask(a >= (143u << 23)), 0x7c00u, r);          // |f| >= 65536 (and inf)
  r = Blend(Mask(a > 0x7f800000u), nan, r);                // NaN
  return static_cast<uint16_t>(r | sign);
}

HVDL_HALF_INLINE float BFloat16BitsToFloat(uint16_t b) {
  return BitsFloat(static_cast<uint32_t>(b) << 16);
}

HVDL_HALF_INLINE uint16_t FloatToBFloat16Bits(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(((u & 0x7fffffffu) > 0x7f800000u) ? 0x7fc0u : rounded);
}

}  // namespace half_internal
}  // namespace horovodlike
