// A named POSIX shared-memory segment (shm_open + mmap), mapped by the ranks of one host.
// The creator unlinks the name as soon as every member has mapped it, so nothing is left in
// /dev/shm after the job, even when a rank is killed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace horovodlike {

class ShmSegment {
 public:
  ShmSegment() = default;
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;

  // Creates `name` (mode 0600, replacing a stale segment of the same name) of `bytes` bytes,
  // zero-filled, and maps it. Throws TransportError.
  static ShmSegment Create(const std::string& name, size_t bytes);
  // Maps an existing segment; throws TransportError when it is missing or smaller than `bytes`.
  static ShmSegment Open(const std::string& name, size_t bytes);

  // Removes the name; the mappings stay valid until every process unmaps them.
  void Unlink();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  void Reset();
  std::string name_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool owner_linked_ = false;  // created by this process and not yet unlinked
};

}  // namespace horovodlike
