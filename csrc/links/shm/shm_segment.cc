#include "shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "../../common/common.h"

namespace horovodlike {
namespace {

[[noreturn]] void Fail(const std::string& what, const std::string& name) {
  throw TransportError("shared memory segment " + name + ": " + what + ": " +
                       std::strerror(errno));
}

uint8_t* Map(int fd, size_t bytes, const std::string& name) {
  // MAP_POPULATE: page faults now, at set-up, not in the first collectives.
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) Fail("mmap", name);
  return static_cast<uint8_t*>(p);
}

// Maps the open segment `fd` and closes it, whether the mapping succeeds or throws (the mapping
// outlives the descriptor).
uint8_t* MapAndClose(int fd, size_t bytes, const std::string& name) {
  uint8_t* data = nullptr;
  try {
    data = Map(fd, bytes, name);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return data;
}

}  // namespace

ShmSegment::~ShmSegment() { Reset(); }

ShmSegment::ShmSegment(ShmSegment&& other) noexcept { *this = std::move(other); }

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  if (this != &other) {
    Reset();
    name_ = std::move(other.name_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    owner_linked_ = std::exchange(other.owner_linked_, false);
  }
  return *this;
}

void ShmSegment::Reset() {
  Unlink();
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

void ShmSegment::Unlink() {
  if (owner_linked_) {
    ::shm_unlink(name_.c_str());
    owner_linked_ = false;
  }
}

ShmSegment ShmSegment::Create(const std::string& name, size_t bytes) {
  int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0 && errno == EEXIST) {
    // Left by a killed job that used the same name; names carry the job's secret, so it is ours.
    ::shm_unlink(name.c_str());
    fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  }
  if (fd < 0) Fail("shm_open", name);
  ShmSegment segment;
  segment.name_ = name;
  segment.owner_linked_ = true;
  // posix_fallocate reserves the pages: on a full /dev/shm it fails here, where ftruncate would
  // succeed and a later store would raise SIGBUS.
  int rc = ::ftruncate(fd, static_cast<off_t>(bytes));
  if (rc == 0) rc = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  else rc = errno;
  if (rc != 0) {
    ::close(fd);
    ::shm_unlink(name.c_str());
    errno = rc;
    Fail("reserving " + std::to_string(bytes) + " bytes (is /dev/shm large enough?)", name);
  }
  segment.data_ = MapAndClose(fd, bytes, name);
  segment.size_ = bytes;
  return segment;
}

ShmSegment ShmSegment::Open(const std::string& name, size_t bytes) {
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) Fail("shm_open", name);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < bytes) {
    ::close(fd);
    throw TransportError("shared memory segment " + name + " is smaller than expected");
  }
  ShmSegment segment;
  segment.name_ = name;
  segment.data_ = MapAndClose(fd, bytes, name);
  segment.size_ = bytes;
  return segment;
}

}  // namespace horovodlike
