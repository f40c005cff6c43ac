// Elementwise kernels, per dtype. float16 and bfloat16 are computed in float32.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../common/common.h"

namespace horovodlike {

// dst[i] = dst[i] (op) src[i] for i < count. Average reduces as Sum (scaling is separate).
// bool: Sum and Max are logical or, Min and Product logical and.
void ReduceInto(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op);

// buf[i] *= factor, computed in double for float64 and integers (truncating toward zero for
// integers, as a C cast does) and in float32 for the other floating types. A factor of 1.0 is
// a no-op. bool is left unchanged.
void ScaleInPlace(void* buf, size_t count, DataType dtype, double factor);

// dst[i] = src[i] * factor (a copy when factor is 1.0); dst and src do not overlap.
void ScaleCopy(void* dst, const void* src, size_t count, DataType dtype, double factor);

// IEEE half and bfloat16 conversions (round to nearest even), exposed for tests and kernels.
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float BFloat16ToFloat(uint16_t b);
uint16_t FloatToBFloat16(float f);

}  // namespace horovodlike
