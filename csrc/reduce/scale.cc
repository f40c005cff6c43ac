// Scaling kernels: dst = src * factor per dtype, in place or into a copy (see reduce.h for the
// contract). Integers go through double and truncate toward zero; float16/bfloat16 through
// float32. As in reduce.cc, x86 gets F16C/AVX2 paths picked at run time, bit-identical to the
// portable ones.
#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kernel_support.h"
#include "reduce.h"

namespace horovodlike {
namespace {

using namespace reduce_internal;

#if HVDL_HAVE_X86_DISPATCH

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

}  // namespace horovodlike
