#include "membership/handshake.h"

#include <cstring>
#include <vector>

#include "common/error.h"
#include "common/socket.h"

namespace eccl::membership {
namespace {

constexpr uint32_t kHelloMagic = 0x4F4C4845;  // "EHLO"
constexpr uint16_t kHelloVersion = 1;

Mac proof(const Secret& secret, char side, const uint8_t hello[kHelloBytes], const Nonce& nonce) {
  uint8_t buf[1 + kHelloBytes + sizeof(Nonce)];
  buf[0] = static_cast<uint8_t>(side);
  std::memcpy(buf + 1, hello, kHelloBytes);
  std::memcpy(buf + 1 + kHelloBytes, nonce.data(), nonce.size());
  return hmacSha256(secret, buf, sizeof(buf));
}

}  // namespace

// Layout: magic u32, version u16, purpose u16, jobId u64, from u64, to u64,
// lane u32, pad u32, client nonce[16].
void encodeHello(const Hello& h, const Nonce& nonce, uint8_t out[kHelloBytes]) {
  std::memset(out, 0, kHelloBytes);
  uint16_t purpose = static_cast<uint16_t>(h.purpose);
  std::memcpy(out + 0, &kHelloMagic, 4);
  std::memcpy(out + 4, &kHelloVersion, 2);
  std::memcpy(out + 6, &purpose, 2);
  std::memcpy(out + 8, &h.jobId, 8);
  std::memcpy(out + 16, &h.fromMember, 8);
  std::memcpy(out + 24, &h.toMember, 8);
  std::memcpy(out + 32, &h.lane, 4);
  std::memcpy(out + 40, nonce.data(), 16);
}

bool decodeHello(const uint8_t in[kHelloBytes], Hello* h, std::string* why) {
  uint32_t magic;
  uint16_t version, purpose;
  std::memcpy(&magic, in, 4);
  std::memcpy(&version, in + 4, 2);
  std::memcpy(&purpose, in + 6, 2);
  if (magic != kHelloMagic) {
    *why = fmt::format("not an eccl hello (magic 0x{:08x})", magic);
    return false;
  }
  if (version != kHelloVersion) {
    *why = fmt::format("hello version {} is not supported", version);
    return false;
  }
  if (purpose != static_cast<uint16_t>(Purpose::kBootstrap) &&
      purpose != static_cast<uint16_t>(Purpose::kData)) {
    *why = fmt::format("hello names unknown purpose {}", purpose);
    return false;
  }
  h->purpose = static_cast<Purpose>(purpose);
  std::memcpy(&h->jobId, in + 8, 8);
  std::memcpy(&h->fromMember, in + 16, 8);
  std::memcpy(&h->toMember, in + 24, 8);
  std::memcpy(&h->lane, in + 32, 4);
  return true;
}

Secret sessionKeyOf(const Secret& secret, const uint8_t hello[kHelloBytes], const Nonce& serverNonce) {
  Mac k = proof(secret, 'K', hello, serverNonce);
  Secret key;
  std::memcpy(key.data(), k.data(), key.size());
  return key;
}

void authenticateAsClient(int fd, const Secret& secret, const Hello& hello, Deadline deadline,
                          const std::string& what, Secret* sessionKey) {
  Nonce clientNonce;
  randomBytes(clientNonce.data(), clientNonce.size());
  uint8_t helloBytes[kHelloBytes];
  encodeHello(hello, clientNonce, helloBytes);
  sendAll(fd, helloBytes, kHelloBytes, deadline, what);
  uint8_t reply[sizeof(Nonce) + sizeof(Mac)];
  // A peer that closes here either died or refused our hello (another
  // job's id, a member it does not know); a wrong secret would still have
  // answered. Both are the peer's failure, not proof of an impostor.
  try {
    recvAll(fd, reply, sizeof(reply), deadline, what);
  } catch (const Error& e) {
    fail(e.code(), "{}: the peer closed the connection during authentication (it died, or refused our hello): {}",
         what, e.what());
  }
  Nonce serverNonce;
  Mac serverMac;
  std::memcpy(serverNonce.data(), reply, serverNonce.size());
  std::memcpy(serverMac.data(), reply + serverNonce.size(), serverMac.size());
  // The server's proof covers our fresh nonce, so it cannot be replayed.
  if (!macEqual(serverMac, proof(secret, 'S', helloBytes, serverNonce)))
    fail(ecclAuthError, "{}: the peer failed to prove the job secret", what);
  Mac mine = proof(secret, 'C', helloBytes, serverNonce);
  sendAll(fd, mine.data(), mine.size(), deadline, what);
  // A rejection is an explicit 0 (authenticateAsServer); a closed
  // connection without it is a peer that died mid-handshake.
  uint8_t verdict = 0;
  try {
    recvAll(fd, &verdict, 1, deadline, what);
  } catch (const Error& e) {
    fail(e.code(), "{}: the peer closed the connection before accepting our proof: {}", what, e.what());
  }
  if (verdict != 1) fail(ecclAuthError, "{}: the peer rejected our proof of the job secret (wrong secret?)", what);
  if (sessionKey) *sessionKey = sessionKeyOf(secret, helloBytes, serverNonce);
}

SecretLookup singleJob(const Secret& secret, uint64_t jobId) {
  return [secret, jobId](uint64_t asked) { return asked == jobId ? std::optional<Secret>(secret) : std::nullopt; };
}

ServerHandshake::ServerHandshake(SecretLookup lookup, std::string what)
    : lookup_(std::move(lookup)), what_(std::move(what)) {}

size_t ServerHandshake::needs() const {
  switch (stage_) {
    case Stage::kHello: return kHelloBytes;
    case Stage::kProof: return sizeof(Mac);
    default: return 0;
  }
}

std::vector<uint8_t> ServerHandshake::take(const uint8_t* bytes) {
  if (stage_ == Stage::kHello) {
    std::memcpy(helloBytes_, bytes, kHelloBytes);
    std::string why;
    if (!decodeHello(helloBytes_, &hello_, &why)) fail(ecclAuthError, "{}: {}", what_, why);
    std::optional<Secret> secret = lookup_(hello_.jobId);
    if (!secret) fail(ecclAuthError, "{}: hello for job {:016x}, which this listener does not serve", what_, hello_.jobId);
    secret_ = *secret;
    randomBytes(serverNonce_.data(), serverNonce_.size());
    // Bind the server's proof to the client's nonce (inside helloBytes).
    Mac serverMac = proof(secret_, 'S', helloBytes_, serverNonce_);
    std::vector<uint8_t> reply(serverNonce_.begin(), serverNonce_.end());
    reply.insert(reply.end(), serverMac.begin(), serverMac.end());
    stage_ = Stage::kProof;
    return reply;
  }
  if (stage_ != Stage::kProof) fail(ecclInternalError, "{}: handshake has nothing more to take", what_);
  Mac clientMac;
  std::memcpy(clientMac.data(), bytes, clientMac.size());
  if (!macEqual(clientMac, proof(secret_, 'C', helloBytes_, serverNonce_))) {
    stage_ = Stage::kRefused;
    failed_ = fmt::format("{}: member {} failed to prove the job secret", what_, hello_.fromMember);
    return {0};
  }
  stage_ = Stage::kDone;
  return {1};
}

Secret ServerHandshake::sessionKey() const { return sessionKeyOf(secret_, helloBytes_, serverNonce_); }

Hello authenticateAsServer(int fd, const Secret& secret, uint64_t jobId, Deadline deadline,
                           const std::string& what, Secret* sessionKey) {
  ServerHandshake hs(singleJob(secret, jobId), what);
  uint8_t in[kHelloBytes];
  while (size_t n = hs.needs()) {
    recvAll(fd, in, n, deadline, what);
    std::vector<uint8_t> out = hs.take(in);
    if (!hs.failed().empty()) {
      ::send(fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      fail(ecclAuthError, "{}", hs.failed());
    }
    sendAll(fd, out.data(), out.size(), deadline, what);
  }
  if (sessionKey) *sessionKey = hs.sessionKey();
  return hs.hello();
}

}  // namespace eccl::membership
