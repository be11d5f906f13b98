// Mutual authentication of a fresh TCP connection by HMAC challenge over the
// job secret: each side proves it knows the secret without sending it, and
// nothing else is read from a peer before it has proved that.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

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

constexpr size_t kHelloBytes = 56;

// Connector side: throws ecclAuthError if the acceptor cannot prove the
// secret or rejects ours; ecclRemoteError or ecclTimeout if it closes or
// goes silent mid-handshake (a dead peer is no impostor).
// Both sides may ask for a session key (bound to this connection's nonces)
// to authenticate every later message on it.
void authenticateAsClient(int fd, const Secret& secret, const Hello& hello, Deadline deadline,
                          const std::string& what, Secret* sessionKey = nullptr);

// The acceptor's side as a state machine over bytes, with no I/O of its
// own, so one thread can run many handshakes at once and a peer that stays
// silent or trickles bytes holds up nobody (HandshakeGate drives it).
// needs() is how many bytes to read next; take() consumes exactly that many
// and returns what to send back. After a wrong proof it returns the refusal
// byte and failed() holds the reason; a malformed hello throws ecclAuthError.
// Which secret a hello's job id must prove; nullopt: no such job here.
// Listeners that serve one job take (secret, jobId); one that serves many
// keys (the NCCL plugin: a fresh token per listen handle) takes a lookup.
using SecretLookup = std::function<std::optional<Secret>(uint64_t jobId)>;
SecretLookup singleJob(const Secret& secret, uint64_t jobId);

class ServerHandshake {
 public:
  ServerHandshake(SecretLookup lookup, std::string what);
  size_t needs() const;
  std::vector<uint8_t> take(const uint8_t* bytes);
  bool done() const { return stage_ == Stage::kDone; }
  const std::string& failed() const { return failed_; }
  const Hello& hello() const { return hello_; }
  Secret sessionKey() const;  // once done()

 private:
  enum class Stage { kHello, kProof, kDone, kRefused };
  SecretLookup lookup_;
  Secret secret_{};  // the hello's job's, once the hello is in
  std::string what_, failed_;
  Stage stage_ = Stage::kHello;
  uint8_t helloBytes_[kHelloBytes];
  Hello hello_;
  Nonce serverNonce_;
};

// Acceptor side, blocking: returns the verified hello, or throws ecclAuthError with the reason.
Hello authenticateAsServer(int fd, const Secret& secret, uint64_t jobId, Deadline deadline,
                           const std::string& what, Secret* sessionKey = nullptr);

// Wire codec of the hello message, exposed for tests and the fuzzer.
void encodeHello(const Hello& h, const Nonce& nonce, uint8_t out[kHelloBytes]);
bool decodeHello(const uint8_t in[kHelloBytes], Hello* h, std::string* why);

}  // namespace eccl::membership
