#include "fusion_buffer.h"

#include <cstdlib>
#include <new>

namespace horovodlike {

void FusionBuffer::FreeDeleter::operator()(uint8_t* p) const { std::free(p); }

uint8_t* FusionBuffer::Reserve(size_t bytes) {
  if (bytes > capacity_) {
    size_t rounded = AlignUp(bytes);
    void* p = std::aligned_alloc(kAlignment, rounded);
    if (p == nullptr) throw std::bad_alloc();
    data_.reset(static_cast<uint8_t*>(p));
    capacity_ = rounded;
  }
  return data_.get();
}

}  // namespace horovodlike
