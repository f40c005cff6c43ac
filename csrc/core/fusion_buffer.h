// The one buffer fused allreduces are packed into; grows to the largest need and is reused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace horovodlike {

class FusionBuffer {
 public:
  // Offsets of packed tensors are aligned to this many bytes.
  static constexpr size_t kAlignment = 64;
  static size_t AlignUp(size_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }

  uint8_t* Reserve(size_t bytes);
  size_t capacity() const { return capacity_; }

 private:
  struct FreeDeleter { void operator()(uint8_t* p) const; };
  std::unique_ptr<uint8_t, FreeDeleter> data_;
  size_t capacity_ = 0;
};

}  // namespace horovodlike
