#include "membership/unique_id.h"

#include <cstring>

#include "common/error.h"
#include "common/netif.h"
#include "common/params.h"

namespace eccl::membership {
namespace {
constexpr uint32_t kIdMagic = 0x44495545;  // "EUID"
constexpr uint16_t kIdVersion = 1;
}  // namespace

// Layout: magic u32, version u16, family u16, port u16, pad u16, ip[16],
// secret[16], jobId u64; the rest zero.
ecclUniqueId encodeUniqueId(const UniqueIdData& d) {
  ecclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  auto* p = reinterpret_cast<uint8_t*>(id.internal);
  uint16_t family = d.root.storage.ss_family;
  uint16_t port = static_cast<uint16_t>(d.root.port());
  std::memcpy(p + 0, &kIdMagic, 4);
  std::memcpy(p + 4, &kIdVersion, 2);
  std::memcpy(p + 6, &family, 2);
  std::memcpy(p + 8, &port, 2);
  if (family == AF_INET)
    std::memcpy(p + 12, &reinterpret_cast<const sockaddr_in*>(&d.root.storage)->sin_addr, 4);
  else
    std::memcpy(p + 12, &reinterpret_cast<const sockaddr_in6*>(&d.root.storage)->sin6_addr, 16);
  std::memcpy(p + 28, d.secret.data(), 16);
  std::memcpy(p + 44, &d.jobId, 8);
  return id;
}

UniqueIdData decodeUniqueId(const ecclUniqueId& id) {
  const auto* p = reinterpret_cast<const uint8_t*>(id.internal);
  uint32_t magic;
  uint16_t version, family, port;
  std::memcpy(&magic, p, 4);
  std::memcpy(&version, p + 4, 2);
  std::memcpy(&family, p + 6, 2);
  std::memcpy(&port, p + 8, 2);
  if (magic != kIdMagic)
    fail(ecclInvalidArgument, "unique id is malformed (bad magic 0x{:08x}); was it made by ecclGetUniqueId?", magic);
  if (version != kIdVersion) fail(ecclInvalidArgument, "unique id version {} is not supported", version);
  if (family != AF_INET && family != AF_INET6)
    fail(ecclInvalidArgument, "unique id names address family {}", family);
  UniqueIdData d;
  if (family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&d.root.storage);
    a->sin_family = AF_INET;
    std::memcpy(&a->sin_addr, p + 12, 4);
    d.root.len = sizeof(sockaddr_in);
  } else {
    auto* a = reinterpret_cast<sockaddr_in6*>(&d.root.storage);
    a->sin6_family = AF_INET6;
    std::memcpy(&a->sin6_addr, p + 12, 16);
    d.root.len = sizeof(sockaddr_in6);
  }
  d.root.setPort(port);
  std::memcpy(d.secret.data(), p + 28, 16);
  std::memcpy(&d.jobId, p + 44, 8);
  return d;
}

std::string uniqueIdToText(const ecclUniqueId& id) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < 52; ++i) {
    auto b = static_cast<uint8_t>(id.internal[i]);
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

ecclUniqueId uniqueIdFromText(const std::string& text) {
  if (text.size() != 104)
    fail(ecclInvalidArgument, "unique id text has {} characters, expected 104", text.size());
  ecclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  auto nibble = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    fail(ecclInvalidArgument, "unique id text has a non-hex character '{}'", c);
  };
  for (size_t i = 0; i < 52; ++i)
    id.internal[i] = static_cast<char>(nibble(text[2 * i]) << 4 | nibble(text[2 * i + 1]));
  decodeUniqueId(id);  // validate
  return id;
}

}  // namespace eccl::membership
