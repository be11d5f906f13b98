#include "common/crypto.h"

#include <isa-l/crc.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "common/error.h"

namespace eccl {

namespace {

// By default OpenSSL frees its global state from an atexit handler. A
// process that calls exit() with a communicator alive still has its
// coordinator and progress threads running then, and their next HMAC took
// a freed lock (SIGSEGV at exit, 4 runs in 10). Initialising OpenSSL
// without that handler, when this library loads, leaves the state to the
// operating system like the rest of the process.
[[maybe_unused]] const bool kOpenSslWithoutAtexit = OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, nullptr) == 1;

}  // namespace

void randomBytes(void* out, size_t n) {
  if (RAND_bytes(static_cast<unsigned char*>(out), static_cast<int>(n)) != 1)
    fail(ecclSystemError, "OpenSSL RAND_bytes failed to produce {} random bytes", n);
}

Mac hmacSha256(const Secret& key, const void* data, size_t n) {
  Mac mac{};
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
            static_cast<const unsigned char*>(data), n, mac.data(), &len) ||
      len != mac.size())
    fail(ecclSystemError, "OpenSSL HMAC-SHA256 failed");
  return mac;
}

Digest sha256(const void* data, size_t n) {
  Digest d{};
  unsigned int len = 0;
  if (!EVP_Digest(data, n, d.data(), &len, EVP_sha256(), nullptr) || len != d.size())
    fail(ecclSystemError, "OpenSSL SHA-256 failed");
  return d;
}

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (!ctx_ || !EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr)) {
    EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_));
    fail(ecclSystemError, "OpenSSL SHA-256 failed to start");
  }
}

Sha256::Sha256(const Sha256& other) : ctx_(EVP_MD_CTX_new()) {
  if (!ctx_ || !EVP_MD_CTX_copy_ex(static_cast<EVP_MD_CTX*>(ctx_), static_cast<const EVP_MD_CTX*>(other.ctx_))) {
    EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_));
    fail(ecclSystemError, "OpenSSL SHA-256 failed to copy its state");
  }
}

Sha256::~Sha256() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }

void Sha256::update(const void* data, size_t n) {
  if (n && !EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data, n)) fail(ecclSystemError, "OpenSSL SHA-256 failed");
}

Digest Sha256::finish() {
  Digest d{};
  unsigned int len = 0;
  if (!EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), d.data(), &len) || len != d.size())
    fail(ecclSystemError, "OpenSSL SHA-256 failed");
  return d;
}

bool macEqual(const Mac& a, const Mac& b) { return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0; }

uint32_t crc32c(const void* data, size_t n, uint32_t seed) {
  // ISA-L's crc32_iscsi takes and returns the raw register; invert on both
  // sides to get the standard CRC32C (check value 0xE3069283 for "123456789").
  return ~crc32_iscsi(static_cast<unsigned char*>(const_cast<void*>(data)), static_cast<int>(n),
                      ~seed);
}

void releaseThreadCryptoState() { OPENSSL_thread_stop(); }

}  // namespace eccl
