// The one buffer fused tensors are packed into: sized ahead for the largest fusion the tensors
// seen before can make, grown to any larger need and reused, and giving memory back when a
// window of collectives needed much less than it holds (one large step must not keep its
// buffer for the rest of the job).
//
// How many tensors a round fuses depends on timing (what happens to be ready). So that a
// steady training loop allocates nothing whatever its rounds carry, the buffer is allocated at
// negotiation time for the most its cached tensors could fuse (Expect), and "needed" counts
// every tensor a window's collectives carried, fused or not, not only the largest fusion.
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
  // Allreduce tensors from this size up are reduced in place even when fused with others: the
  // two copies through the buffer would cost more than a collective of their own.
  static constexpr size_t kDirectAllreduceBytes = 1 << 20;
  // Collectives per window; at its end the buffer shrinks when the window's largest
  // reservation, the bytes of all the tensors it carried and the expected need are all under
  // half of what it holds. Long enough that steps alternating between sizes do not reallocate
  // every time.
  static constexpr int kWindow = 64;

  // A need of this many bytes may come in any round from now on: allocates it now (if the
  // buffer is smaller) and keeps at least that much through later shrinking.
  void Expect(size_t bytes);
  uint8_t* Reserve(size_t bytes);
  // Called once per collective, before its Reserve, whether or not it uses the buffer, with
  // the bytes of the tensors it carries.
  void CollectiveStarted(size_t tensor_bytes);
  // Bytes held now; read by other threads (stats).
  size_t capacity() const { return capacity_.load(std::memory_order_relaxed); }

 private:
  // Replaces the storage with `bytes` (rounded up; none for 0); the contents are not kept.
  void Reallocate(size_t bytes);

  struct FreeDeleter { void operator()(uint8_t* p) const; };
  std::unique_ptr<uint8_t, FreeDeleter> data_;
  std::atomic<size_t> capacity_{0};
  size_t expected_ = 0;
  size_t window_peak_ = 0;
  size_t window_bytes_ = 0;  // of every tensor the window's collectives carried
  int window_collectives_ = 0;
};

}  // namespace horovodlike
