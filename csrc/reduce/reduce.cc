// Elementwise reduction kernels (see reduce.h for the contract; scaling is in scale.cc).
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

#include "kernel_support.h"

namespace horovodlike {

namespace {

using namespace reduce_internal;

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

#if HVDL_HAVE_X86_DISPATCH

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

float HalfToFloat(uint16_t h) { return HalfBitsToFloat(h); }

uint16_t FloatToHalf(float f) { return FloatToHalfBits(f); }

float BFloat16ToFloat(uint16_t b) { return BFloat16BitsToFloat(b); }

uint16_t FloatToBFloat16(float f) { return FloatToBFloat16Bits(f); }

}  // namespace horovodlike
