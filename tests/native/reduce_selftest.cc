// Standalone check program for csrc/reduce/reduce.cc. Not part of the product.
//
// Build and run (from the repository root):
//   built and run by tests/test_reduce_kernels.py
//   /tmp/reduce_selftest            # all checks + timings
//   /tmp/reduce_selftest --quick    # skip the exhaustive 2^32 float sweeps and the timings
//   /tmp/reduce_selftest --bench    # timings only
// To exercise the portable (non-F16C) float16 path on an x86 machine, add
//   -DHOROVODLIKE_REDUCE_PORTABLE_ONLY
// to the command line (it must apply to reduce.cc).
//
// The kernels are compared against deliberately naive references written independently of
// reduce.cc/half.h (double arithmetic, binary search for rounding, 128-bit integer products).
// reduce.cc needs nothing from csrc/core/common.cc, so this program links without it.
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "half.h"
#include "reduce.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define SELFTEST_X86 1
#else
#define SELFTEST_X86 0
#endif

#if SELFTEST_X86
#include <cpuid.h>
// F16C present (and usable: AVX state saved by the OS)? Checked with CPUID so that the selftest
// builds with clang too (clang 14's __builtin_cpu_supports does not know "f16c").
static bool HaveF16C() {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  if (!(ecx & bit_F16C) || !(ecx & bit_AVX) || !(ecx & bit_OSXSAVE)) return false;
  unsigned lo, hi;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & 0x6u) == 0x6u;
}

// Hardware conversions used as an independent reference (only called when F16C is present).
__attribute__((target("f16c"))) static float HwHalfToFloat(uint16_t h) { return _cvtsh_ss(h); }

__attribute__((target("f16c,avx"))) static void HwFloatToHalfBlock(const float* in, uint16_t* out,
                                                                   size_t n) {  // n % 8 == 0
  for (size_t i = 0; i < n; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
}
#endif

using namespace horovodlike;

namespace {

int g_failures = 0;
int g_checks = 0;

#define CHECK(cond, ...)                                  \
  do {                                                    \
    ++g_checks;                                           \
    if (!(cond)) {                                        \
      if (++g_failures <= 30) {                           \
        std::printf("FAIL %s:%d: ", __FILE__, __LINE__);  \
        std::printf(__VA_ARGS__);                         \
        std::printf("\n");                                \
      }                                                   \
    }                                                     \
  } while (0)

uint32_t F2U(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float U2F(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint64_t D2U(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}

// ------------------------------------------------------------------------------------------
// Reference conversions.

bool RefHalfIsNaN(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }
bool RefBf16IsNaN(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0; }

// Value of a non-NaN half, in double (exact). For h == 0x7c00 with the formula for normals we
// would get 65536; RefHalfMagnitude is used for rounding with that "next after max" value.
double RefHalfMagnitude(uint16_t h) {  // h without sign, 0..0x7c00
  int e = (h >> 10) & 31;
  int m = h & 1023;
  if (e == 0) return std::ldexp(static_cast<double>(m), -24);
  return std::ldexp(static_cast<double>(1024 + m), e - 25);
}

float RefHalfToFloat(uint16_t h) {
  const bool neg = (h & 0x8000) != 0;
  const uint16_t a = h & 0x7fff;
  if (a > 0x7c00) {  // NaN: NumPy keeps sign and payload (shifted into the top mantissa bits)
    return U2F((neg ? 0x80000000u : 0u) | 0x7f800000u | (static_cast<uint32_t>(a & 0x3ff) << 13));
  }
  double v = (a == 0x7c00) ? std::numeric_limits<double>::infinity() : RefHalfMagnitude(a);
  return static_cast<float>(neg ? -v : v);
}

uint16_t RefFloatToHalf(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (std::isnan(f)) {
    uint32_t payload = (F2U(f) & 0x7fffff) >> 13;
    if (payload == 0) payload = 1;
    return static_cast<uint16_t>(sign | 0x7c00 | payload);
  }
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return sign | 0x7c00;  // >= midpoint(65504, 65536): rounds to inf (tie->even)
  // Largest h with value <= a.
  int lo = 0, hi = 0x7bff;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (RefHalfMagnitude(static_cast<uint16_t>(mid)) <= a) lo = mid; else hi = mid - 1;
  }
  const double below = RefHalfMagnitude(static_cast<uint16_t>(lo));
  if (below == a) return static_cast<uint16_t>(sign | lo);
  const double above = RefHalfMagnitude(static_cast<uint16_t>(lo + 1));
  const double midpoint = (below + above) / 2;  // exact in double
  int r;
  if (a < midpoint) r = lo;
  else if (a > midpoint) r = lo + 1;
  else r = (lo & 1) ? lo + 1 : lo;
  return static_cast<uint16_t>(sign | r);
}

float RefBf16ToFloat(uint16_t b) {
  // sign * 1.m * 2^(e-127), built arithmetically except for inf/NaN.
  const bool neg = (b & 0x8000) != 0;
  const int e = (b >> 7) & 0xff;
  const int m = b & 0x7f;
  if (e == 0xff) return U2F(static_cast<uint32_t>(b) << 16);
  double v = (e == 0) ? std::ldexp(static_cast<double>(m), -133)
                      : std::ldexp(static_cast<double>(128 + m), e - 134);
  return static_cast<float>(neg ? -v : v);
}

uint16_t RefFloatToBf16(float f) {
  if (std::isnan(f)) return 0x7fc0;  // torch: every NaN -> 0x7FC0
  const uint32_t u = F2U(f);
  uint32_t top = u >> 16;
  const uint32_t rest = u & 0xffff;
  if (rest > 0x8000 || (rest == 0x8000 && (top & 1))) ++top;  // carries into exponent/inf
  return static_cast<uint16_t>(top);
}

// ------------------------------------------------------------------------------------------
// Conversion tests.

void TestHalfToFloatAll() {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float got = HalfToFloat(static_cast<uint16_t>(h));
    const float want = RefHalfToFloat(static_cast<uint16_t>(h));
    CHECK(F2U(got) == F2U(want), "HalfToFloat(0x%04x) = 0x%08x, want 0x%08x", h, F2U(got),
          F2U(want));
    const float inl = half_internal::HalfBitsToFloat(static_cast<uint16_t>(h));
    CHECK(F2U(inl) == F2U(want), "HalfBitsToFloat(0x%04x)", h);
    // Round trip, NaN payloads included.
    const uint16_t back = FloatToHalf(got);
    CHECK(back == h, "round trip 0x%04x -> 0x%08x -> 0x%04x", h, F2U(got), back);
  }
#if SELFTEST_X86
  if (HaveF16C()) {
    // Hardware agrees for every non-NaN pattern.
    int mismatches = 0;
    for (uint32_t h = 0; h < 65536; ++h) {
      if (RefHalfIsNaN(static_cast<uint16_t>(h))) continue;
      float hw = HwHalfToFloat(static_cast<uint16_t>(h));
      if (F2U(hw) != F2U(HalfToFloat(static_cast<uint16_t>(h)))) ++mismatches;
    }
    CHECK(mismatches == 0, "HalfToFloat vs F16C: %d mismatches", mismatches);
  }
#endif
}

void CheckFloatToHalf(float f) {
  const uint16_t got = FloatToHalf(f);
  const uint16_t want = RefFloatToHalf(f);
  CHECK(got == want, "FloatToHalf(%.9g [0x%08x]) = 0x%04x, want 0x%04x", f, F2U(f), got, want);
}

void CheckFloatToBf16(float f) {
  const uint16_t got = FloatToBFloat16(f);
  const uint16_t want = RefFloatToBf16(f);
  CHECK(got == want, "FloatToBFloat16(%.9g [0x%08x]) = 0x%04x, want 0x%04x", f, F2U(f), got,
        want);
}

void TestFloatToHalfTricky(std::mt19937_64& rng) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> vals = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.996f, 65520.0f,
                             65535.0f, 65536.0f, 1e6f, 3.4028235e38f, -3.4028235e38f, inf, -inf,
                             1e-45f, -1e-45f, 1.17549435e-38f, 5.9604645e-8f /*2^-24*/,
                             2.9802322e-8f /*2^-25: tie -> 0*/, 2.9802326e-8f, 8.940697e-8f,
                             6.1035156e-5f /*2^-14*/, 6.097555e-5f /*max subnormal*/, 0.1f, 1.0f / 3};
  // Every half value, the midpoints between neighbours, and the floats right next to them.
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const double v = RefHalfMagnitude(static_cast<uint16_t>(h));
    const double mid = (v + RefHalfMagnitude(static_cast<uint16_t>(h + 1))) / 2;
    for (double x : {v, mid}) {
      const float fx = static_cast<float>(x);  // exact: at most 12 significant bits
      for (float y : {fx, std::nextafter(fx, inf), std::nextafter(fx, -inf)}) {
        vals.push_back(y);
        vals.push_back(-y);
      }
    }
  }
  // NaNs with assorted payloads (quiet/signalling, low bits only, both signs).
  for (uint32_t payload : {0x400000u, 0x000001u, 0x001fffu, 0x002000u, 0x7fffffu, 0x200000u,
                           0x123456u, 0x400001u}) {
    vals.push_back(U2F(0x7f800000u | payload));
    vals.push_back(U2F(0xff800000u | payload));
  }
  // Random bit patterns and random values in the half range.
  std::uniform_real_distribution<float> unit(-70000.0f, 70000.0f);
  for (int i = 0; i < 2000000; ++i) {
    vals.push_back(U2F(static_cast<uint32_t>(rng())));
    vals.push_back(unit(rng));
    vals.push_back(unit(rng) * 1e-9f);
  }
  for (float f : vals) {
    CheckFloatToHalf(f);
    CheckFloatToBf16(f);
  }
  std::printf("  float->half/bfloat16 vs reference on %zu tricky+random values\n", vals.size());
}

void TestBf16ToFloatAll() {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float got = BFloat16ToFloat(static_cast<uint16_t>(b));
    const float want = RefBf16ToFloat(static_cast<uint16_t>(b));
    CHECK(F2U(got) == F2U(want), "BFloat16ToFloat(0x%04x) = 0x%08x, want 0x%08x", b, F2U(got),
          F2U(want));
    const uint16_t back = FloatToBFloat16(got);
    const uint16_t want_back =
        RefBf16IsNaN(static_cast<uint16_t>(b)) ? uint16_t{0x7fc0} : static_cast<uint16_t>(b);
    CHECK(back == want_back, "bf16 round trip 0x%04x -> 0x%04x", b, back);
  }
}

// Every one of the 2^32 float bit patterns. float->bfloat16 against the reference; float->half
// against the F16C hardware conversion (non-NaN) and the NumPy NaN rule.
void TestExhaustive() {
  const auto t0 = std::chrono::steady_clock::now();
  constexpr uint32_t kChunk = 1u << 16;
  std::vector<float> in(kChunk);
  std::vector<uint16_t> half_out(kChunk), bf_out(kChunk), hw_out(kChunk);
  uint64_t bad_half = 0, bad_bf = 0;
  bool have_hw = false;
#if SELFTEST_X86
  have_hw = HaveF16C();
#endif
  for (uint64_t base = 0; base < (1ull << 32); base += kChunk) {
    for (uint32_t i = 0; i < kChunk; ++i) in[i] = U2F(static_cast<uint32_t>(base + i));
    for (uint32_t i = 0; i < kChunk; ++i) half_out[i] = half_internal::FloatToHalfBits(in[i]);
    for (uint32_t i = 0; i < kChunk; ++i) bf_out[i] = half_internal::FloatToBFloat16Bits(in[i]);
#if SELFTEST_X86
    if (have_hw) HwFloatToHalfBlock(in.data(), hw_out.data(), kChunk);
#endif
    for (uint32_t i = 0; i < kChunk; ++i) {
      const uint32_t u = static_cast<uint32_t>(base + i);
      if (bf_out[i] != RefFloatToBf16(in[i])) {
        if (++bad_bf <= 5) std::printf("  bf16 mismatch at 0x%08x\n", u);
      }
      const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
      uint16_t want;
      if (nan) {
        want = RefFloatToHalf(in[i]);
      } else if (have_hw) {
        want = hw_out[i];
      } else {
        continue;  // no independent fast reference; covered by TestFloatToHalfTricky
      }
      if (half_out[i] != want) {
        if (++bad_half <= 5) std::printf("  half mismatch at 0x%08x: 0x%04x want 0x%04x\n", u,
                                         half_out[i], want);
      }
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(bad_bf == 0, "exhaustive float->bfloat16: %" PRIu64 " mismatches", bad_bf);
  CHECK(bad_half == 0, "exhaustive float->half: %" PRIu64 " mismatches", bad_half);
  std::printf("  exhaustive 2^32 floats: bfloat16 vs reference, half vs %s: %" PRIu64
              " + %" PRIu64 " mismatches (%.1f s)\n",
              have_hw ? "F16C hardware (+NumPy NaN rule)" : "NumPy NaN rule only", bad_bf,
              bad_half, s);
}

// ------------------------------------------------------------------------------------------
// Reference reduce / scale.

const DataType kAllTypes[] = {DataType::kUInt8,   DataType::kInt8,     DataType::kInt16,
                              DataType::kInt32,   DataType::kInt64,    DataType::kFloat16,
                              DataType::kBFloat16, DataType::kFloat32, DataType::kFloat64,
                              DataType::kBool,     DataType::kUInt16};
const ReduceOp kAllOps[] = {ReduceOp::kAverage, ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax,
                            ReduceOp::kProduct};

size_t SizeOf(DataType t) {
  switch (t) {
    case DataType::kUInt8: case DataType::kInt8: case DataType::kBool: return 1;
    case DataType::kInt16: case DataType::kUInt16: case DataType::kFloat16:
    case DataType::kBFloat16: return 2;
    case DataType::kInt32: case DataType::kFloat32: return 4;
    case DataType::kInt64: case DataType::kFloat64: return 8;
  }
  return 0;
}

const char* TypeName(DataType t) {
  switch (t) {
    case DataType::kUInt8: return "uint8";
    case DataType::kInt8: return "int8";
    case DataType::kInt16: return "int16";
    case DataType::kUInt16: return "uint16";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kFloat16: return "float16";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kBool: return "bool";
  }
  return "?";
}

const char* OpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kAverage: return "average";
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kProduct: return "product";
  }
  return "?";
}

// Integer reference: exact result in __int128, then reduced modulo 2^bits into T.
__extension__ typedef __int128 Int128;
__extension__ typedef unsigned __int128 UInt128;

template <typename T>
T RefIntOp(T a, T b, ReduceOp op) {
  Int128 x = a, y = b, r = 0;
  switch (op) {
    case ReduceOp::kAverage: case ReduceOp::kSum: r = x + y; break;
    case ReduceOp::kProduct: r = x * y; break;
    case ReduceOp::kMin: r = x < y ? x : y; break;
    case ReduceOp::kMax: r = x > y ? x : y; break;
  }
  UInt128 m = static_cast<UInt128>(r);
  m &= (static_cast<UInt128>(1) << (8 * sizeof(T))) - 1;
  std::make_unsigned_t<T> low = static_cast<std::make_unsigned_t<T>>(m);
  T out;
  std::memcpy(&out, &low, sizeof(T));
  return out;
}

template <typename F>
F RefFloatOp(F a, F b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kAverage: case ReduceOp::kSum: return a + b;
    case ReduceOp::kProduct: return a * b;
    case ReduceOp::kMin:
      if (std::isnan(a)) return a;
      if (std::isnan(b)) return b;
      return (b < a) ? b : a;
    case ReduceOp::kMax:
      if (std::isnan(a)) return a;
      if (std::isnan(b)) return b;
      return (b > a) ? b : a;
  }
  return a;
}

uint8_t RefBoolOp(uint8_t a, uint8_t b, ReduceOp op) {
  const bool x = a != 0, y = b != 0;
  switch (op) {
    case ReduceOp::kAverage: case ReduceOp::kSum: case ReduceOp::kMax: return (x || y) ? 1 : 0;
    case ReduceOp::kMin: case ReduceOp::kProduct: return (x && y) ? 1 : 0;
  }
  return 0;
}

// ------------------------------------------------------------------------------------------
// Random data.

template <typename T>
T Pick(std::mt19937_64& rng, const std::vector<T>& v) {
  return v[rng() % v.size()];
}

void FillRandom(std::mt19937_64& rng, DataType t, void* p, size_t n) {
  switch (t) {
    case DataType::kUInt8: case DataType::kInt8: case DataType::kInt16: case DataType::kUInt16:
    case DataType::kInt32: case DataType::kInt64: {
      auto* b = static_cast<uint8_t*>(p);
      const size_t sz = SizeOf(t);
      for (size_t i = 0; i < n; ++i) {
        uint64_t r = rng();
        if (rng() % 4 == 0) r = (r % 7) - 3;  // some small values, including negatives
        std::memcpy(b + i * sz, &r, sz);      // little endian: low bytes
      }
      return;
    }
    case DataType::kBool: {
      auto* b = static_cast<uint8_t*>(p);
      for (size_t i = 0; i < n; ++i) b[i] = Pick<uint8_t>(rng, {0, 0, 1, 1, 2, 255, 0x80});
      return;
    }
    case DataType::kFloat16: case DataType::kBFloat16: {
      auto* h = static_cast<uint16_t*>(p);
      const bool is_half = t == DataType::kFloat16;
      std::uniform_real_distribution<float> val(-300.0f, 300.0f);
      for (size_t i = 0; i < n; ++i) {
        switch (rng() % 4) {
          case 0: h[i] = static_cast<uint16_t>(rng()); break;  // any pattern: NaN/inf/subnormal
          case 1: {
            // subnormal / tiny and huge magnitudes
            uint16_t m = static_cast<uint16_t>(rng() & (is_half ? 0x83ff : 0x807f));
            if (rng() & 1) m |= is_half ? 0x7800 : 0x7f00;
            h[i] = m;
            break;
          }
          default: {
            float f = val(rng);
            h[i] = is_half ? RefFloatToHalf(f) : RefFloatToBf16(f);
          }
        }
      }
      return;
    }
    case DataType::kFloat32: {
      auto* f = static_cast<float*>(p);
      const float inf = std::numeric_limits<float>::infinity();
      const std::vector<float> special = {0.0f, -0.0f, inf, -inf,
                                          std::numeric_limits<float>::quiet_NaN(), 1e-45f,
                                          -3e-39f, 3.4e38f, -3.4e38f, 1.0f};
      std::normal_distribution<float> nd(0.0f, 100.0f);
      for (size_t i = 0; i < n; ++i) {
        const unsigned k = rng() % 8;
        f[i] = k == 0 ? Pick(rng, special) : k == 1 ? U2F(static_cast<uint32_t>(rng())) : nd(rng);
      }
      return;
    }
    case DataType::kFloat64: {
      auto* d = static_cast<double*>(p);
      const double inf = std::numeric_limits<double>::infinity();
      const std::vector<double> special = {0.0, -0.0, inf, -inf,
                                           std::numeric_limits<double>::quiet_NaN(), 5e-324,
                                           -1e-310, 1.7e308, -1.7e308, 1.0};
      std::normal_distribution<double> nd(0.0, 100.0);
      for (size_t i = 0; i < n; ++i) {
        const unsigned k = rng() % 8;
        uint64_t r = rng();
        double x;
        std::memcpy(&x, &r, 8);
        d[i] = k == 0 ? Pick(rng, special) : k == 1 ? x : nd(rng);
      }
      return;
    }
  }
}

// Expected result of one element (as raw bytes) and whether the float result is NaN.
struct Expected {
  uint64_t bits = 0;
  bool nan = false;
};

Expected RefReduceElem(DataType t, const uint8_t* a, const uint8_t* b, ReduceOp op) {
  Expected e;
  switch (t) {
#define INT_CASE(ENUM, T)                              \
  case DataType::ENUM: {                               \
    T x, y;                                            \
    std::memcpy(&x, a, sizeof(T));                     \
    std::memcpy(&y, b, sizeof(T));                     \
    T r = RefIntOp<T>(x, y, op);                       \
    std::memcpy(&e.bits, &r, sizeof(T));               \
    return e;                                          \
  }
    INT_CASE(kUInt8, uint8_t)
    INT_CASE(kInt8, int8_t)
    INT_CASE(kInt16, int16_t)
    INT_CASE(kUInt16, uint16_t)
    INT_CASE(kInt32, int32_t)
    INT_CASE(kInt64, int64_t)
#undef INT_CASE
    case DataType::kBool:
      e.bits = RefBoolOp(*a, *b, op);
      return e;
    case DataType::kFloat16: case DataType::kBFloat16: {
      uint16_t x, y;
      std::memcpy(&x, a, 2);
      std::memcpy(&y, b, 2);
      const bool half = t == DataType::kFloat16;
      const float fx = half ? RefHalfToFloat(x) : RefBf16ToFloat(x);
      const float fy = half ? RefHalfToFloat(y) : RefBf16ToFloat(y);
      const float r = RefFloatOp(fx, fy, op);
      e.nan = std::isnan(r);
      e.bits = half ? RefFloatToHalf(r) : RefFloatToBf16(r);
      return e;
    }
    case DataType::kFloat32: {
      float x, y;
      std::memcpy(&x, a, 4);
      std::memcpy(&y, b, 4);
      const float r = RefFloatOp(x, y, op);
      e.nan = std::isnan(r);
      e.bits = F2U(r);
      return e;
    }
    case DataType::kFloat64: {
      double x, y;
      std::memcpy(&x, a, 8);
      std::memcpy(&y, b, 8);
      const double r = RefFloatOp(x, y, op);
      e.nan = std::isnan(r);
      e.bits = D2U(r);
      return e;
    }
  }
  return e;
}

bool IsNaNBits(DataType t, uint64_t bits) {
  switch (t) {
    case DataType::kFloat16: return RefHalfIsNaN(static_cast<uint16_t>(bits));
    case DataType::kBFloat16: return RefBf16IsNaN(static_cast<uint16_t>(bits));
    case DataType::kFloat32: return std::isnan(U2F(static_cast<uint32_t>(bits)));
    case DataType::kFloat64: {
      double d;
      std::memcpy(&d, &bits, 8);
      return std::isnan(d);
    }
    default: return false;
  }
}

void TestReduce(std::mt19937_64& rng) {
  const size_t sizes[] = {0, 1, 3, 7, 8, 9, 15, 16, 31, 255, 256, 257, 511, 1000, 4097, 70001};
  for (DataType t : kAllTypes) {
    const size_t sz = SizeOf(t);
    for (ReduceOp op : kAllOps) {
      size_t elems = 0;
      int bad = 0;
      for (size_t n : sizes) {
        for (size_t misalign : {size_t{0}, size_t{1}}) {  // element offset to test unaligned starts
          std::vector<uint8_t> a((n + misalign) * sz + 1), b((n + misalign) * sz + 1);
          FillRandom(rng, t, a.data(), n + misalign);
          FillRandom(rng, t, b.data(), n + misalign);
          uint8_t* pa = a.data() + misalign * sz;
          uint8_t* pb = b.data() + misalign * sz;
          std::vector<uint8_t> orig(pa, pa + n * sz);
          const uint8_t guard_a = a.back();
          ReduceInto(pa, pb, n, t, op);
          CHECK(a.back() == guard_a, "%s %s n=%zu wrote past the end", TypeName(t), OpName(op),
                n);
          for (size_t i = 0; i < n; ++i) {
            Expected e = RefReduceElem(t, orig.data() + i * sz, pb + i * sz, op);
            uint64_t got = 0;
            std::memcpy(&got, pa + i * sz, sz);
            const bool ok = e.nan ? IsNaNBits(t, got) : got == e.bits;
            if (!ok && ++bad <= 3) {
              uint64_t x = 0, y = 0;
              std::memcpy(&x, orig.data() + i * sz, sz);
              std::memcpy(&y, pb + i * sz, sz);
              CHECK(false, "ReduceInto %s %s n=%zu i=%zu: 0x%" PRIx64 " op 0x%" PRIx64
                    " = 0x%" PRIx64 ", want 0x%" PRIx64 "%s", TypeName(t), OpName(op), n, i, x,
                    y, got, e.bits, e.nan ? " (NaN)" : "");
            }
          }
          elems += n;
        }
      }
      CHECK(bad == 0, "ReduceInto %s %s: %d mismatches", TypeName(t), OpName(op), bad);
      (void)elems;
    }
  }
  // count == 0 touches nothing (null pointers allowed).
  for (DataType t : kAllTypes) {
    for (ReduceOp op : kAllOps) ReduceInto(nullptr, nullptr, 0, t, op);
    ScaleInPlace(nullptr, 0, t, 0.5);
    ScaleCopy(nullptr, nullptr, 0, t, 0.5);
    ScaleCopy(nullptr, nullptr, 0, t, 1.0);
  }
  // dst == src (reducing a buffer with itself) must also work elementwise.
  {
    std::vector<float> v = {1.0f, -2.0f, 3.5f, 0.0f, 1e30f};
    ReduceInto(v.data(), v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
    CHECK(v[0] == 2.0f && v[1] == -4.0f && v[2] == 7.0f && v[3] == 0.0f && v[4] == 2e30f,
          "ReduceInto with dst == src");
  }
  std::printf("  ReduceInto: %zu dtypes x %zu ops, %zu sizes, aligned+misaligned\n",
              sizeof(kAllTypes) / sizeof(kAllTypes[0]), sizeof(kAllOps) / sizeof(kAllOps[0]),
              sizeof(sizes) / sizeof(sizes[0]));
}

// Reference scale of one element: truncation toward zero; NaN -> 0; saturation to the int32
// range for types of up to 32 bits (then wrapped into T) and to the int64 range for int64.
template <typename T>
T RefScaleInt(T x, double factor) {
  if (factor == 1.0) return x;  // documented no-op (matters for int64 beyond 2^53)
  const double v = static_cast<double>(x) * factor;
  const double lo = sizeof(T) <= 4 ? -2147483648.0 : -9223372036854775808.0;
  const double hi_excl = sizeof(T) <= 4 ? 2147483648.0 : 9223372036854775808.0;
  int64_t i;
  if (std::isnan(v)) i = 0;
  else if (v >= hi_excl) i = sizeof(T) <= 4 ? INT32_MAX : INT64_MAX;
  else if (v < lo) i = sizeof(T) <= 4 ? INT32_MIN : INT64_MIN;
  else i = static_cast<int64_t>(std::trunc(v));
  const uint64_t u = static_cast<uint64_t>(i);
  T out;
  std::memcpy(&out, &u, sizeof(T));  // low bytes (little endian): wraps modulo 2^n
  return out;
}

Expected RefScaleElem(DataType t, const uint8_t* a, double factor) {
  Expected e;
  switch (t) {
#define INT_CASE(ENUM, T)                    \
  case DataType::ENUM: {                     \
    T x;                                     \
    std::memcpy(&x, a, sizeof(T));           \
    T r = RefScaleInt<T>(x, factor);         \
    std::memcpy(&e.bits, &r, sizeof(T));     \
    return e;                                \
  }
    INT_CASE(kUInt8, uint8_t)
    INT_CASE(kInt8, int8_t)
    INT_CASE(kInt16, int16_t)
    INT_CASE(kUInt16, uint16_t)
    INT_CASE(kInt32, int32_t)
    INT_CASE(kInt64, int64_t)
#undef INT_CASE
    case DataType::kBool:
      e.bits = *a;
      return e;
    case DataType::kFloat16: case DataType::kBFloat16: {
      uint16_t x;
      std::memcpy(&x, a, 2);
      const bool half = t == DataType::kFloat16;
      if (factor == 1.0) {
        e.bits = x;
        return e;
      }
      const float r = (half ? RefHalfToFloat(x) : RefBf16ToFloat(x)) * static_cast<float>(factor);
      e.nan = std::isnan(r);
      e.bits = half ? RefFloatToHalf(r) : RefFloatToBf16(r);
      return e;
    }
    case DataType::kFloat32: {
      float x;
      std::memcpy(&x, a, 4);
      if (factor == 1.0) {
        e.bits = F2U(x);
        return e;
      }
      const float r = x * static_cast<float>(factor);
      e.nan = std::isnan(r);
      e.bits = F2U(r);
      return e;
    }
    case DataType::kFloat64: {
      double x;
      std::memcpy(&x, a, 8);
      if (factor == 1.0) {
        e.bits = D2U(x);
        return e;
      }
      const double r = x * factor;
      e.nan = std::isnan(r);
      e.bits = D2U(r);
      return e;
    }
  }
  return e;
}

void TestScale(std::mt19937_64& rng) {
  const double factors[] = {1.0, 0.5, 0.25, 1.0 / 3, 1.0 / 7, 0.0, -1.0, -0.5, 2.0, 3.0,
                            1e10, -1e20, 1e300, 1.0 / 65536,
                            std::numeric_limits<double>::infinity(),
                            std::numeric_limits<double>::quiet_NaN()};
  const size_t sizes[] = {0, 1, 5, 8, 255, 256, 257, 1000, 9999};
  for (DataType t : kAllTypes) {
    const size_t sz = SizeOf(t);
    int bad = 0;
    for (double factor : factors) {
      for (size_t n : sizes) {
        std::vector<uint8_t> src(n * sz + 1), buf, dst(n * sz + 1, 0xcd);
        FillRandom(rng, t, src.data(), n);
        if (t == DataType::kInt32 || t == DataType::kInt64) {
          // also exercise integer values near the extremes
          if (n > 0) {
            if (t == DataType::kInt32) {
              const int32_t ext[] = {INT32_MIN, INT32_MAX, -1, 0};
              std::memcpy(src.data(), &ext[rng() % 4], 4);
            } else {
              const int64_t ext[] = {INT64_MIN, INT64_MAX, -1, 0};
              std::memcpy(src.data(), &ext[rng() % 4], 8);
            }
          }
        }
        buf = src;
        ScaleInPlace(buf.data(), n, t, factor);
        ScaleCopy(dst.data(), src.data(), n, t, factor);
        CHECK(dst.back() == 0xcd, "ScaleCopy wrote past the end");
        for (size_t i = 0; i < n; ++i) {
          Expected e = RefScaleElem(t, src.data() + i * sz, factor);
          uint64_t got_in = 0, got_copy = 0;
          std::memcpy(&got_in, buf.data() + i * sz, sz);
          std::memcpy(&got_copy, dst.data() + i * sz, sz);
          for (uint64_t got : {got_in, got_copy}) {
            const bool ok = e.nan ? IsNaNBits(t, got) : got == e.bits;
            if (!ok && ++bad <= 3) {
              uint64_t x = 0;
              std::memcpy(&x, src.data() + i * sz, sz);
              CHECK(false, "Scale %s factor=%g n=%zu i=%zu: 0x%" PRIx64 " -> 0x%" PRIx64
                    " (in place 0x%" PRIx64 "), want 0x%" PRIx64, TypeName(t), factor, n, i, x,
                    got_copy, got_in, e.bits);
            }
          }
        }
      }
    }
    CHECK(bad == 0, "Scale %s: %d mismatches", TypeName(t), bad);
  }
  std::printf("  ScaleInPlace/ScaleCopy: %zu dtypes x %zu factors\n",
              sizeof(kAllTypes) / sizeof(kAllTypes[0]), sizeof(factors) / sizeof(factors[0]));
}

void TestInvalid() {
  float a[4] = {0, 0, 0, 0}, b[4] = {0, 0, 0, 0};
  auto expect_throw = [](const char* what, auto fn) {
    bool threw = false;
    try {
      fn();
    } catch (const InvalidArgument&) {
      threw = true;
    }
    CHECK(threw, "%s did not throw InvalidArgument", what);
  };
  expect_throw("ReduceInto(bad dtype)", [&] {
    ReduceInto(a, b, 4, static_cast<DataType>(42), ReduceOp::kSum);
  });
  expect_throw("ReduceInto(bad dtype, count 0)", [&] {
    ReduceInto(a, b, 0, static_cast<DataType>(-1), ReduceOp::kSum);
  });
  expect_throw("ReduceInto(bad op)", [&] {
    ReduceInto(a, b, 4, DataType::kFloat32, static_cast<ReduceOp>(9));
  });
  expect_throw("ReduceInto(float16, bad op)", [&] {
    ReduceInto(a, b, 4, DataType::kFloat16, static_cast<ReduceOp>(-3));
  });
  expect_throw("ScaleInPlace(bad dtype)", [&] {
    ScaleInPlace(a, 4, static_cast<DataType>(12), 0.5);
  });
  expect_throw("ScaleCopy(bad dtype)", [&] {
    ScaleCopy(a, b, 4, static_cast<DataType>(13), 1.0);
  });
  std::printf("  invalid dtype/op -> InvalidArgument\n");
}

// ------------------------------------------------------------------------------------------
// Timing.

double NowSec() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void Bench() {
  const size_t n = size_t{16} << 20;  // 16 Mi elements
  const int reps = 7;
  std::printf("\nTiming on %zu elements (best of %d; GB/s counts 2 reads + 1 write = 3 x buffer"
              " bytes, 1 GB = 1e9 B):\n", n, reps);
  {
    const size_t bytes = n * 4;
    std::vector<uint8_t> a(bytes, 1), b(bytes, 2);
    double best = 1e9;
    for (int r = 0; r < reps; ++r) {
      const double t0 = NowSec();
      std::memcpy(a.data(), b.data(), bytes);
      __asm__ __volatile__("" : : "r"(a.data()) : "memory");  // keep the copy
      best = std::min(best, NowSec() - t0);
    }
    std::printf("  %-9s %-8s %8.2f ms  %7.2f GB/s (memcpy of 64 MiB, 2 x bytes: baseline)\n",
                "memcpy", "", best * 1e3, 2.0 * static_cast<double>(bytes) / best / 1e9);
  }
  struct Case { DataType t; ReduceOp op; };
  std::vector<Case> cases = {
      {DataType::kFloat32, ReduceOp::kSum},   {DataType::kFloat32, ReduceOp::kMax},
      {DataType::kFloat32, ReduceOp::kProduct},
      {DataType::kFloat16, ReduceOp::kSum},   {DataType::kFloat16, ReduceOp::kMin},
      {DataType::kBFloat16, ReduceOp::kSum},  {DataType::kBFloat16, ReduceOp::kMax},
      {DataType::kFloat64, ReduceOp::kSum},   {DataType::kInt32, ReduceOp::kSum},
      {DataType::kInt64, ReduceOp::kSum},     {DataType::kInt64, ReduceOp::kProduct},
      {DataType::kInt8, ReduceOp::kProduct},  {DataType::kUInt8, ReduceOp::kSum},
      {DataType::kInt16, ReduceOp::kProduct}, {DataType::kBool, ReduceOp::kSum},
  };
  std::mt19937_64 rng(7);
  for (const Case& c : cases) {
    const size_t bytes = n * SizeOf(c.t);
    std::vector<uint8_t> a(bytes), b(bytes);
    // Benign values so that repeated reductions stay finite.
    if (c.t == DataType::kFloat16 || c.t == DataType::kBFloat16) {
      auto* pa = reinterpret_cast<uint16_t*>(a.data());
      auto* pb = reinterpret_cast<uint16_t*>(b.data());
      const bool half = c.t == DataType::kFloat16;
      for (size_t i = 0; i < n; ++i) {
        pa[i] = half ? 0x3c00 : 0x3f80;  // 1.0
        pb[i] = half ? 0x0000 : 0x0000;  // 0.0
      }
    } else if (c.t == DataType::kFloat32) {
      std::vector<float> ones(n, 1.0f);
      std::memcpy(a.data(), ones.data(), bytes);
      std::memcpy(b.data(), ones.data(), bytes);
    } else {
      FillRandom(rng, c.t, a.data(), n);
      FillRandom(rng, c.t, b.data(), n);
    }
    double best = 1e9;
    ReduceInto(a.data(), b.data(), n, c.t, c.op);  // warm-up
    for (int r = 0; r < reps; ++r) {
      const double t0 = NowSec();
      ReduceInto(a.data(), b.data(), n, c.t, c.op);
      best = std::min(best, NowSec() - t0);
    }
    std::printf("  %-9s %-8s %8.2f ms  %7.2f GB/s  (%.2f Gelem/s)\n", TypeName(c.t),
                OpName(c.op), best * 1e3, 3.0 * static_cast<double>(bytes) / best / 1e9,
                static_cast<double>(n) / best / 1e9);
  }
  // Scaling (the Average division).
  for (DataType t : {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16,
                     DataType::kInt32}) {
    const size_t bytes = n * SizeOf(t);
    std::vector<uint8_t> a(bytes, 0), b(bytes, 0);
    double best_in = 1e9, best_copy = 1e9;
    for (int r = 0; r < reps; ++r) {
      double t0 = NowSec();
      ScaleInPlace(a.data(), n, t, 0.25);
      best_in = std::min(best_in, NowSec() - t0);
      t0 = NowSec();
      ScaleCopy(b.data(), a.data(), n, t, 0.25);
      best_copy = std::min(best_copy, NowSec() - t0);
    }
    std::printf("  %-9s %-8s %8.2f ms  %7.2f GB/s (ScaleInPlace, 2 x bytes)\n", TypeName(t),
                "scale", best_in * 1e3, 2.0 * static_cast<double>(bytes) / best_in / 1e9);
    std::printf("  %-9s %-8s %8.2f ms  %7.2f GB/s (ScaleCopy, 2 x bytes)\n", TypeName(t),
                "scale", best_copy * 1e3, 2.0 * static_cast<double>(bytes) / best_copy / 1e9);
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    if (std::strcmp(argv[i], "--bench") == 0) {  // timings only
      Bench();
      return 0;
    }
  }
#if SELFTEST_X86
  std::printf("reduce selftest (x86-64, F16C %s)\n",
              HaveF16C() ? "present" : "absent");
#else
  std::printf("reduce selftest (portable)\n");
#endif
  std::mt19937_64 rng(12345);
  std::printf("conversions:\n");
  TestHalfToFloatAll();
  std::printf("  all 65536 half patterns: HalfToFloat vs reference, round trip exact\n");
  TestBf16ToFloatAll();
  std::printf("  all 65536 bfloat16 patterns: BFloat16ToFloat vs reference, round trip exact\n");
  TestFloatToHalfTricky(rng);
  if (!quick) TestExhaustive();
  std::printf("kernels:\n");
  TestReduce(rng);
  TestScale(rng);
  TestInvalid();
  std::printf("\n%d checks, %d failures\n", g_checks, g_failures);
  if (!quick) Bench();
  std::printf("%s\n", g_failures == 0 ? "PASS" : "FAIL");
  return g_failures == 0 ? 0 : 1;
}
