#include "adasum_allreduce.h"

#include "../reduce/reduce.h"

namespace horovodlike {
namespace {

// Element access in double for each floating dtype; the arithmetic is the same for all.
template <typename T>
struct Native {
  using Storage = T;
  static double Load(T v) { return static_cast<double>(v); }
  static T Store(double v) { return static_cast<T>(v); }
};
struct Half {
  using Storage = uint16_t;
  static double Load(uint16_t v) { return HalfToFloat(v); }
  static uint16_t Store(double v) { return FloatToHalf(static_cast<float>(v)); }
};
struct BFloat16 {
  using Storage = uint16_t;
  static double Load(uint16_t v) { return BFloat16ToFloat(v); }
  static uint16_t Store(double v) { return FloatToBFloat16(static_cast<float>(v)); }
};

// out = (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b, a zero vector keeping coefficient 1. No
// threshold on the norms: the rule is scale-free, so vectors near float32's smallest normal
// value, or a pair whose norms differ by 1e30, still average when parallel (Horovod's
// test_adasum_pytorch.py test_stability and test_stability_2 check exactly that).
// `out` is a or b; each element is read before it is written.
template <typename Access>
void Combine(const void* a_buf, const void* b_buf, void* out_buf, size_t count) {
  using S = typename Access::Storage;
  const S* a = static_cast<const S*>(a_buf);
  const S* b = static_cast<const S*>(b_buf);
  S* out = static_cast<S*>(out_buf);
  double dot = 0, a_norm = 0, b_norm = 0;
  for (size_t i = 0; i < count; ++i) {
    const double x = Access::Load(a[i]), y = Access::Load(b[i]);
    dot += x * y;
    a_norm += x * x;
    b_norm += y * y;
  }
  const double a_coefficient = a_norm > 0 ? 1.0 - dot / (2.0 * a_norm) : 1.0;
  const double b_coefficient = b_norm > 0 ? 1.0 - dot / (2.0 * b_norm) : 1.0;
  for (size_t i = 0; i < count; ++i) {
    out[i] = Access::Store(a_coefficient * Access::Load(a[i]) +
                           b_coefficient * Access::Load(b[i]));
  }
}

void CombineTyped(const void* a, const void* b, void* out, size_t count, DataType dtype) {
  switch (dtype) {
    case DataType::kFloat16: return Combine<Half>(a, b, out, count);
    case DataType::kBFloat16: return Combine<BFloat16>(a, b, out, count);
    case DataType::kFloat32: return Combine<Native<float>>(a, b, out, count);
    case DataType::kFloat64: return Combine<Native<double>>(a, b, out, count);
    default: break;
  }
  throw InvalidArgument(std::string("Adasum: unsupported dtype ") + DataTypeName(dtype));
}

}  // namespace

std::string AdasumAllreduce::CheckArguments(const std::string& tensor, DataType dtype, int ranks,
                                            const std::string& where) {
  if (!IsFloatingPoint(dtype)) {
    return "allreduce of '" + tensor + "' with op=Adasum: dtype " + DataTypeName(dtype) +
           " is not supported; Adasum is defined for float16, bfloat16, float32 and float64 "
           "tensors (cast the tensor, or use op=Sum or op=Average)";
  }
  if (ranks < 1 || (ranks & (ranks - 1)) != 0) {
    return "allreduce of '" + tensor + "' with op=Adasum needs a power-of-two number of ranks, "
           "but " + where + " has " + std::to_string(ranks) +
           "; run on 1, 2, 4, 8, ... ranks or use op=Average";
  }
  return "";
}

void AdasumAllreduce::Run(Link& link, void* buf, const size_t* counts,
                          size_t num_tensors, DataType dtype, const std::string& tensor) {
  const int n = link.size();
  const std::string problem = CheckArguments(tensor, dtype, n, "the process set");
  if (!problem.empty()) throw InvalidArgument(problem);
  const int rank = link.rank();
  const size_t elem = DataTypeSize(dtype);
  size_t total = 0;
  for (size_t t = 0; t < num_tensors; ++t) total += counts[t];
  if (n == 1 || total == 0) return;
  if (partner_.size() < total * elem) partner_.resize(total * elem);
  auto* mine = static_cast<uint8_t*>(buf);
  uint8_t* theirs = partner_.data();
  // At distance d the pairs r, r ^ d hold the combination of their groups of d ranks each.
  // Both sides take the lower rank's vector as `a`, so both compute the same bits, and after
  // the last level every rank holds the same result.
  for (int distance = 1; distance < n; distance <<= 1) {
    const int partner = rank ^ distance;
    link.sendrecv(partner, mine, total * elem, partner, theirs, total * elem);
    const bool lower = rank < partner;
    const uint8_t* a = lower ? mine : theirs;
    const uint8_t* b = lower ? theirs : mine;
    size_t offset = 0;
    for (size_t t = 0; t < num_tensors; ++t) {
      const size_t bytes_at = offset * elem;
      CombineTyped(a + bytes_at, b + bytes_at, mine + bytes_at, counts[t], dtype);
      offset += counts[t];
    }
  }
}

}  // namespace horovodlike
