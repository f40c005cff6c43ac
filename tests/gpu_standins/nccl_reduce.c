/* The stand-in NCCL's arithmetic: the reductions per dtype, elementwise, as NCCL computes
 * them (16-bit floats in float, rounded to nearest even after each operation, as NumPy). */
#include "nccl_internal.h"

#include <math.h>
#include <string.h>

const size_t g_type_size[T_NUM] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};

static float h2f(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, f;
  if (exp == 0) {
    if (man == 0) {
      f = sign;
    } else {
      int e = -1;
      do {
        e++;
        man <<= 1;
      } while (!(man & 0x400u));
      f = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    f = sign | 0x7f800000u | (man << 13);
  } else {
    f = sign | ((exp + 112) << 23) | (man << 13);
  }
  float out;
  memcpy(&out, &f, 4);
  return out;
}

/* Round to nearest even, as NumPy's float -> half. */
static uint16_t f2h(float value) {
  uint32_t f;
  memcpy(&f, &value, 4);
  uint16_t sign = (uint16_t)((f & 0x80000000u) >> 16);
  uint32_t f_exp = f & 0x7f800000u, f_sig;
  if (f_exp >= 0x47800000u) {
    if (f_exp == 0x7f800000u && (f & 0x007fffffu)) {
      uint16_t r = (uint16_t)(0x7c00u + ((f & 0x007fffffu) >> 13));
      if (r == 0x7c00u) r++;
      return (uint16_t)(sign + r);
    }
    return (uint16_t)(sign + 0x7c00u);
  }
  if (f_exp <= 0x38000000u) {
    if (f_exp < 0x33000000u) return sign;
    f_exp >>= 23;
    f_sig = 0x00800000u + (f & 0x007fffffu);
    f_sig >>= (113 - f_exp);
    if (((f_sig & 0x00003fffu) != 0x00001000u) || (f & 0x000007ffu)) f_sig += 0x00001000u;
    return (uint16_t)(sign + (uint16_t)(f_sig >> 13));
  }
  uint16_t h_exp = (uint16_t)((f_exp - 0x38000000u) >> 13);
  f_sig = f & 0x007fffffu;
  if ((f_sig & 0x00003fffu) != 0x00001000u) f_sig += 0x00001000u;
  return (uint16_t)(sign + h_exp + (uint16_t)(f_sig >> 13));
}

static float bf2f(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint16_t f2bf(float value) {
  uint32_t u;
  memcpy(&u, &value, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* acc = first ? pre(x) : acc (op) pre(x), elementwise; pre multiplies by the scalar for
 * R_PREMUL. Integers wrap around; 16-bit floats compute in float and round to nearest even
 * after each operation. */
#define INT_LOOP(T, UT)                                                             \
  do {                                                                              \
    T* a = acc;                                                                     \
    const T* b = x;                                                                 \
    T s;                                                                            \
    memcpy(&s, scalar, sizeof s);                                                   \
    for (size_t i = 0; i < count; i++) {                                            \
      T v = red == R_PREMUL ? (T)((UT)b[i] * (UT)s) : b[i];                         \
      if (first) {                                                                  \
        a[i] = v;                                                                   \
        continue;                                                                   \
      }                                                                             \
      switch (red) {                                                                \
        case R_PROD: a[i] = (T)((UT)a[i] * (UT)v); break;                           \
        case R_MAX: a[i] = v > a[i] ? v : a[i]; break;                              \
        case R_MIN: a[i] = v < a[i] ? v : a[i]; break;                              \
        default: a[i] = (T)((UT)a[i] + (UT)v); break;                               \
      }                                                                             \
    }                                                                               \
  } while (0)

#define FLOAT_LOOP(T, MAXF, MINF)                                                   \
  do {                                                                              \
    T* a = acc;                                                                     \
    const T* b = x;                                                                 \
    T s;                                                                            \
    memcpy(&s, scalar, sizeof s);                                                   \
    for (size_t i = 0; i < count; i++) {                                            \
      T v = red == R_PREMUL ? b[i] * s : b[i];                                      \
      if (first) {                                                                  \
        a[i] = v;                                                                   \
        continue;                                                                   \
      }                                                                             \
      switch (red) {                                                                \
        case R_PROD: a[i] = a[i] * v; break;                                        \
        case R_MAX: a[i] = MAXF(a[i], v); break;                                    \
        case R_MIN: a[i] = MINF(a[i], v); break;                                    \
        default: a[i] = a[i] + v; break;                                            \
      }                                                                             \
    }                                                                               \
  } while (0)

#define HALF_LOOP(TO_F, FROM_F)                                                     \
  do {                                                                              \
    uint16_t* a = acc;                                                              \
    const uint16_t* b = x;                                                          \
    uint16_t sbits;                                                                 \
    memcpy(&sbits, scalar, sizeof sbits);                                           \
    float s = TO_F(sbits);                                                          \
    for (size_t i = 0; i < count; i++) {                                            \
      uint16_t v = red == R_PREMUL ? FROM_F(TO_F(b[i]) * s) : b[i];                 \
      if (first) {                                                                  \
        a[i] = v;                                                                   \
        continue;                                                                   \
      }                                                                             \
      float fa = TO_F(a[i]), fv = TO_F(v);                                          \
      switch (red) {                                                                \
        case R_PROD: a[i] = FROM_F(fa * fv); break;                                 \
        case R_MAX: a[i] = FROM_F(fmaxf(fa, fv)); break;                            \
        case R_MIN: a[i] = FROM_F(fminf(fa, fv)); break;                            \
        default: a[i] = FROM_F(fa + fv); break;                                     \
      }                                                                             \
    }                                                                               \
  } while (0)

void accumulate(void* acc, const void* x, size_t count, int dtype, int red,
                const unsigned char* scalar, int first) {
  switch (dtype) {
    case T_INT8: INT_LOOP(int8_t, uint8_t); break;
    case T_UINT8: INT_LOOP(uint8_t, uint8_t); break;
    case T_INT32: INT_LOOP(int32_t, uint32_t); break;
    case T_UINT32: INT_LOOP(uint32_t, uint32_t); break;
    case T_INT64: INT_LOOP(int64_t, uint64_t); break;
    case T_UINT64: INT_LOOP(uint64_t, uint64_t); break;
    case T_F32: FLOAT_LOOP(float, fmaxf, fminf); break;
    case T_F64: FLOAT_LOOP(double, fmax, fmin); break;
    case T_F16: HALF_LOOP(h2f, f2h); break;
    case T_BF16: HALF_LOOP(bf2f, f2bf); break;
  }
}

/* ncclAvg on integers: the sum divided by the rank count, rounding toward zero. */
#define DIV_LOOP(T)                                    \
  do {                                                 \
    T* a = acc;                                        \
    for (size_t i = 0; i < count; i++) a[i] = (T)(a[i] / (T)n); \
  } while (0)

void divide(void* acc, size_t count, int dtype, int n) {
  switch (dtype) {
    case T_INT8: DIV_LOOP(int8_t); break;
    case T_UINT8: DIV_LOOP(uint8_t); break;
    case T_INT32: DIV_LOOP(int32_t); break;
    case T_UINT32: DIV_LOOP(uint32_t); break;
    case T_INT64: DIV_LOOP(int64_t); break;
    case T_UINT64: DIV_LOOP(uint64_t); break;
  }
}

/* The scalar 1/n in the type, as NCCL computes it for ncclAvg on floating-point types. */
void avg_scalar(int dtype, int n, unsigned char* out) {
  memset(out, 0, 8);
  float f = (float)(1.0 / n);
  double d = 1.0 / n;
  uint16_t h;
  switch (dtype) {
    case T_F32: memcpy(out, &f, 4); break;
    case T_F64: memcpy(out, &d, 8); break;
    case T_F16: h = f2h(f); memcpy(out, &h, 2); break;
    case T_BF16: h = f2bf(f); memcpy(out, &h, 2); break;
  }
}

int is_float(int dtype) {
  return dtype == T_F16 || dtype == T_F32 || dtype == T_F64 || dtype == T_BF16;
}
