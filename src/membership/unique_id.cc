#include "membership/unique_id.h"

#include <cstring>

#include "common/error.h"
#include "common/netif.h"
#include "common/params.h"

namespace eccl::membership {
namespace {
constexpr uint32_t kIdMagic = 0x44495545;  // "EUID"
constexpr uint16_t kIdVersion = 1;         // one coordinator
constexpr uint16_t kIdVersionSpares = 2;   // and the addresses of its spares
constexpr size_t kHeaderBytes = 52;
constexpr size_t kSparesAt = 56;           // after a count u8, a family u8, pad u16

size_t addressBytes(int family) { return family == AF_INET ? 6 : 18; }  // ip, port

size_t encodedBytes(const ecclUniqueId& id) {
  uint16_t version;
  std::memcpy(&version, id.internal + 4, 2);
  if (version != kIdVersionSpares) return kHeaderBytes;
  auto count = static_cast<uint8_t>(id.internal[52]);
  auto family = static_cast<uint8_t>(id.internal[53]) == 6 ? AF_INET6 : AF_INET;
  return kSparesAt + count * addressBytes(family);
}

void putAddress(uint8_t* p, const SockAddr& a) {
  uint16_t port = static_cast<uint16_t>(a.port());
  if (a.storage.ss_family == AF_INET) {
    std::memcpy(p, &reinterpret_cast<const sockaddr_in*>(&a.storage)->sin_addr, 4);
    std::memcpy(p + 4, &port, 2);
  } else {
    std::memcpy(p, &reinterpret_cast<const sockaddr_in6*>(&a.storage)->sin6_addr, 16);
    std::memcpy(p + 16, &port, 2);
  }
}

SockAddr getAddress(const uint8_t* p, int family) {
  SockAddr a;
  uint16_t port;
  if (family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&a.storage);
    in->sin_family = AF_INET;
    std::memcpy(&in->sin_addr, p, 4);
    std::memcpy(&port, p + 4, 2);
    a.len = sizeof(sockaddr_in);
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&a.storage);
    in6->sin6_family = AF_INET6;
    std::memcpy(&in6->sin6_addr, p, 16);
    std::memcpy(&port, p + 16, 2);
    a.len = sizeof(sockaddr_in6);
  }
  a.setPort(port);
  return a;
}

}  // namespace

size_t maxSpareCoordinators(int family) { return (sizeof(ecclUniqueId) - kSparesAt) / addressBytes(family); }

std::vector<SockAddr> UniqueIdData::coordinators() const {
  std::vector<SockAddr> all{root};
  all.insert(all.end(), spares.begin(), spares.end());
  return all;
}

// Layout: magic u32, version u16, family u16, port u16, pad u16, ip[16],
// secret[16], jobId u64; version 2 adds at 52 the number of spares u8 and
// their family u8 (4 or 6), and from 56 each spare's ip and port u16; the
// rest zero.
ecclUniqueId encodeUniqueId(const UniqueIdData& d) {
  ecclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  auto* p = reinterpret_cast<uint8_t*>(id.internal);
  uint16_t family = d.root.storage.ss_family;
  uint16_t port = static_cast<uint16_t>(d.root.port());
  const uint16_t version = d.spares.empty() ? kIdVersion : kIdVersionSpares;
  std::memcpy(p + 0, &kIdMagic, 4);
  std::memcpy(p + 4, &version, 2);
  std::memcpy(p + 6, &family, 2);
  std::memcpy(p + 8, &port, 2);
  if (family == AF_INET)
    std::memcpy(p + 12, &reinterpret_cast<const sockaddr_in*>(&d.root.storage)->sin_addr, 4);
  else
    std::memcpy(p + 12, &reinterpret_cast<const sockaddr_in6*>(&d.root.storage)->sin6_addr, 16);
  std::memcpy(p + 28, d.secret.data(), 16);
  std::memcpy(p + 44, &d.jobId, 8);
  if (d.spares.empty()) return id;
  const int spareFamily = d.spares[0].storage.ss_family;
  if (d.spares.size() > maxSpareCoordinators(spareFamily))
    fail(ecclInvalidArgument, "a unique id holds at most {} spare coordinators of this address family ({} given)",
         maxSpareCoordinators(spareFamily), d.spares.size());
  p[52] = static_cast<uint8_t>(d.spares.size());
  p[53] = spareFamily == AF_INET6 ? 6 : 4;
  for (size_t i = 0; i < d.spares.size(); ++i) {
    if (d.spares[i].storage.ss_family != spareFamily)
      fail(ecclInvalidArgument, "spare coordinators {} and {} differ in address family", d.spares[0].str(),
           d.spares[i].str());
    putAddress(p + kSparesAt + i * addressBytes(spareFamily), d.spares[i]);
  }
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
  if (version != kIdVersion && version != kIdVersionSpares)
    fail(ecclInvalidArgument, "unique id version {} is not supported", version);
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
  if (version == kIdVersionSpares) {
    const uint8_t count = p[52], familyTag = p[53];
    if (familyTag != 4 && familyTag != 6) fail(ecclInvalidArgument, "unique id names spare family tag {}", familyTag);
    const int spareFamily = familyTag == 6 ? AF_INET6 : AF_INET;
    if (count == 0 || count > maxSpareCoordinators(spareFamily))
      fail(ecclInvalidArgument, "unique id names {} spare coordinators (1 to {} fit)", count,
           maxSpareCoordinators(spareFamily));
    for (size_t i = 0; i < count; ++i) d.spares.push_back(getAddress(p + kSparesAt + i * addressBytes(spareFamily), spareFamily));
  }
  return d;
}

// Only the bytes in use: 104 characters for a single coordinator.
std::string uniqueIdToText(const ecclUniqueId& id) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < std::min(encodedBytes(id), sizeof(id.internal)); ++i) {
    auto b = static_cast<uint8_t>(id.internal[i]);
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

ecclUniqueId uniqueIdFromText(const std::string& text) {
  if (text.size() < 2 * kHeaderBytes || text.size() > 2 * sizeof(ecclUniqueId) || text.size() % 2 != 0)
    fail(ecclInvalidArgument, "unique id text has {} characters, expected an even number from {} to {}", text.size(),
         2 * kHeaderBytes, 2 * sizeof(ecclUniqueId));
  ecclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  auto nibble = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    fail(ecclInvalidArgument, "unique id text has a non-hex character '{}'", c);
  };
  for (size_t i = 0; i < text.size() / 2; ++i)
    id.internal[i] = static_cast<char>(nibble(text[2 * i]) << 4 | nibble(text[2 * i + 1]));
  decodeUniqueId(id);  // validate
  if (encodedBytes(id) * 2 != text.size())
    fail(ecclInvalidArgument, "unique id text has {} characters; the id it spells takes {}", text.size(),
         encodedBytes(id) * 2);
  return id;
}

}  // namespace eccl::membership
