#include "fusion_buffer.h"

#include <algorithm>
#include <cstdlib>
#include <new>

namespace horovodlike {

void FusionBuffer::FreeDeleter::operator()(uint8_t* p) const { std::free(p); }

uint8_t* FusionBuffer::Reserve(size_t bytes) {
  window_peak_ = std::max(window_peak_, bytes);
  if (bytes > capacity()) {
    const size_t rounded = AlignUp(bytes);
    data_.reset();  // the old contents are not needed: free before allocating the larger one
    capacity_ = 0;
    void* p = std::aligned_alloc(kAlignment, rounded);
    if (p == nullptr) throw std::bad_alloc();
    data_.reset(static_cast<uint8_t*>(p));
    capacity_ = rounded;
  }
  return data_.get();
}

void FusionBuffer::CollectiveDone() {
  if (++window_collectives_ < kWindow) return;
  if (window_peak_ < capacity() / 2) {
    // Freed now and allocated again at the next need, at the size that need asks for.
    data_.reset();
    capacity_ = 0;
  }
  window_peak_ = 0;
  window_collectives_ = 0;
}

}  // namespace horovodlike
