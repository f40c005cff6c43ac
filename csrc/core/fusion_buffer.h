// The one buffer fused tensors are packed into: grows to the largest need and is reused, and
// gives memory back when a window of collectives needed much less than it holds (one large
// step must not keep its buffer for the rest of the job).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace horovodlike {

class FusionBuffer {
 public:
  // Offsets of packed tensors are aligned to this many bytes.
  static constexpr size_t kAlignment = 64;
  static size_t AlignUp(size_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }
  // Collectives per window; at its end the buffer shrinks to the window's largest need when
  // that is under half of what it holds. Long enough that steps alternating between sizes do
  // not reallocate every time.
  static constexpr int kWindow = 64;

  uint8_t* Reserve(size_t bytes);
  // Called once per collective, whether or not it used the buffer.
  void CollectiveDone();
  // Bytes held now; read by other threads (stats).
  size_t capacity() const { return capacity_.load(std::memory_order_relaxed); }

 private:
  struct FreeDeleter { void operator()(uint8_t* p) const; };
  std::unique_ptr<uint8_t, FreeDeleter> data_;
  std::atomic<size_t> capacity_{0};
  size_t window_peak_ = 0;
  int window_collectives_ = 0;
};

}  // namespace horovodlike
