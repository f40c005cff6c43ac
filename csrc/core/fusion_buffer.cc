#include "fusion_buffer.h"

#include <algorithm>
#include <cstdlib>
#include <new>

namespace horovodlike {

void FusionBuffer::FreeDeleter::operator()(uint8_t* p) const { std::free(p); }

void FusionBuffer::Reallocate(size_t bytes) {
  data_.reset();  // the old contents are not needed: free before allocating the new one
  capacity_ = 0;
  if (bytes == 0) return;
  const size_t rounded = AlignUp(bytes);
  void* p = std::aligned_alloc(kAlignment, rounded);
  if (p == nullptr) throw std::bad_alloc();
  data_.reset(static_cast<uint8_t*>(p));
  capacity_ = rounded;
}

void FusionBuffer::Expect(size_t bytes) {
  expected_ = bytes;
  if (bytes > capacity()) Reallocate(bytes);
}

uint8_t* FusionBuffer::Reserve(size_t bytes) {
  window_peak_ = std::max(window_peak_, bytes);
  if (bytes > capacity()) Reallocate(bytes);
  return data_.get();
}

void FusionBuffer::CollectiveStarted(size_t tensor_bytes) {
  if (++window_collectives_ > kWindow) {
    if (std::max({window_peak_, window_bytes_, expected_}) < capacity() / 2) {
      // Down to what may still come at any time; a larger need allocates again.
      Reallocate(expected_);
    }
    window_peak_ = 0;
    window_bytes_ = 0;
    window_collectives_ = 1;
  }
  window_bytes_ += tensor_bytes;
}

}  // namespace horovodlike
