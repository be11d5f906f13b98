// Secrets, randomness and checksums, all from well-kept libraries
// (OpenSSL for HMAC-SHA256 and random bytes, ISA-L for CRC32C).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace eccl {

using Secret = std::array<uint8_t, 16>;
using Nonce = std::array<uint8_t, 16>;
using Mac = std::array<uint8_t, 32>;

using Digest = std::array<uint8_t, 32>;

void randomBytes(void* out, size_t n);
Mac hmacSha256(const Secret& key, const void* data, size_t n);
// Constant-time comparison, so a forger learns nothing from timing.
bool macEqual(const Mac& a, const Mac& b);
Digest sha256(const void* data, size_t n);

// SHA-256 fed in parts. A copy goes on from where the original stands, so
// a prefix shared by many messages is hashed once.
class Sha256 {
 public:
  Sha256();
  Sha256(const Sha256& other);
  Sha256& operator=(const Sha256&) = delete;
  ~Sha256();
  void update(const void* data, size_t n);
  Digest finish();  // once; the object is spent after it

 private:
  void* ctx_;  // EVP_MD_CTX
};

uint32_t crc32c(const void* data, size_t n, uint32_t seed = 0);
// Frees OpenSSL's per-thread state; every thread of ours that used the
// functions above calls it before it ends.
void releaseThreadCryptoState();

}  // namespace eccl
