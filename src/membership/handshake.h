// Mutual authentication of a fresh TCP connection by HMAC challenge over the
// job secret: each side proves it knows the secret without sending it, and
// nothing else is read from a peer before it has proved that.
#pragma once

#include <cstdint>
#include <string>

#include "common/clock.h"
#include "common/crypto.h"

namespace eccl::membership {

enum class Purpose : uint16_t { kBootstrap = 1, kData = 2 };  // kBootstrap: the coordinator

struct Hello {
  Purpose purpose = Purpose::kData;
  uint64_t jobId = 0;
  uint64_t fromMember = 0;
  uint64_t toMember = 0;
  uint32_t lane = 0;
};

// Connector side: throws ecclAuthError if the acceptor cannot prove the
// secret or rejects ours; ecclRemoteError or ecclTimeout if it closes or
// goes silent mid-handshake (a dead peer is no impostor).
// Both sides may ask for a session key (bound to this connection's nonces)
// to authenticate every later message on it.
void authenticateAsClient(int fd, const Secret& secret, const Hello& hello, Deadline deadline,
                          const std::string& what, Secret* sessionKey = nullptr);

// Acceptor side: returns the verified hello, or throws ecclAuthError with the reason.
Hello authenticateAsServer(int fd, const Secret& secret, uint64_t jobId, Deadline deadline,
                           const std::string& what, Secret* sessionKey = nullptr);

// Wire codec of the hello message, exposed for tests and the fuzzer.
constexpr size_t kHelloBytes = 56;
void encodeHello(const Hello& h, const Nonce& nonce, uint8_t out[kHelloBytes]);
bool decodeHello(const uint8_t in[kHelloBytes], Hello* h, std::string* why);

}  // namespace eccl::membership
