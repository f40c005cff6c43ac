// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104): the job's connections prove that they know
// its secret (HOROVOD_SECRET_KEY) by answering a fresh random nonce, so the secret itself never
// crosses the wire.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace horovodlike {

using Sha256Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  void Update(const void* data, size_t n);
  void Update(const std::string& s) { Update(s.data(), s.size()); }
  // The digest of everything passed to Update; the object must not be used afterwards.
  Sha256Digest Finish();

 private:
  void Compress(const uint8_t* block);
  uint32_t state_[8];
  uint8_t block_[64];
  size_t block_used_ = 0;
  uint64_t total_bytes_ = 0;
};

Sha256Digest HmacSha256(const std::string& key, const std::string& message);

// Compares without an early exit, so the time taken does not reveal where two MACs differ.
bool ConstantTimeEqual(const uint8_t* a, const uint8_t* b, size_t n);

std::string ToHex(const uint8_t* data, size_t n);
// False when `hex` is not exactly 2 * n hexadecimal digits.
bool FromHex(const std::string& hex, uint8_t* out, size_t n);

// n bytes from the kernel's random generator (getrandom); throws std::runtime_error if it fails.
void RandomBytes(void* out, size_t n);

}  // namespace horovodlike
