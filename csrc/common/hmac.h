// SHA-256 and HMAC-SHA256, computed by OpenSSL's libcrypto: the job's connections prove that
// they know its secret (HOROVOD_SECRET_KEY) by answering a fresh random nonce, so the secret
// itself never crosses the wire.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace horovodlike {

using Sha256Digest = std::array<uint8_t, 32>;

Sha256Digest Sha256(const void* data, size_t n);
inline Sha256Digest Sha256(const std::string& s) { return Sha256(s.data(), s.size()); }

Sha256Digest HmacSha256(const std::string& key, const std::string& message);

// Compares without an early exit, so the time taken does not reveal where two MACs differ.
bool ConstantTimeEqual(const uint8_t* a, const uint8_t* b, size_t n);

std::string ToHex(const uint8_t* data, size_t n);
// False when `hex` is not exactly 2 * n hexadecimal digits.
bool FromHex(const std::string& hex, uint8_t* out, size_t n);

// n bytes from the kernel's random generator (getrandom); throws std::runtime_error if it fails.
void RandomBytes(void* out, size_t n);

}  // namespace horovodlike
