#include "net_plugin/handle.h"

#include <cstring>

#include "common/error.h"

namespace eccl::netplugin {
namespace {

// Layout: magic u32, version u8, address length u8, 2 reserved (zero),
// process u64, listen id u64, token 16 bytes, address (not terminated).
constexpr uint32_t kMagic = 0x484e4345;  // "ECNH"
constexpr uint8_t kVersion = 1;
constexpr size_t kAddressOffset = 40;
constexpr size_t kMaxAddress = kHandleBytes - kAddressOffset;

}  // namespace

void encodeHandle(const ListenHandle& h, void* out) {
  ECCL_CHECK_ARG(h.address.size() <= kMaxAddress,
                 "the address {} is {} bytes; a handle holds {} (set ECCL_SOCKET_IFNAME to an IPv4 interface, or "
                 "ECCL_TRANSPORT to fewer back ends)",
                 h.address, h.address.size(), kMaxAddress);
  auto* b = static_cast<uint8_t*>(out);
  std::memset(b, 0, kHandleBytes);
  std::memcpy(b, &kMagic, 4);
  b[4] = kVersion;
  b[5] = static_cast<uint8_t>(h.address.size());
  std::memcpy(b + 8, &h.process, 8);
  std::memcpy(b + 16, &h.listenId, 8);
  std::memcpy(b + 24, h.token.data(), h.token.size());
  std::memcpy(b + kAddressOffset, h.address.data(), h.address.size());
}

bool decodeHandle(const void* in, ListenHandle* h, std::string* why) {
  const auto* b = static_cast<const uint8_t*>(in);
  uint32_t magic;
  std::memcpy(&magic, b, 4);
  if (magic != kMagic) return *why = "not an eccl listen handle (wrong magic)", false;
  if (b[4] != kVersion) return *why = fmt::format("listen handle version {}, this plugin reads {}", b[4], kVersion), false;
  if (b[5] > kMaxAddress || b[6] || b[7]) return *why = "malformed listen handle (address length)", false;
  std::memcpy(&h->process, b + 8, 8);
  std::memcpy(&h->listenId, b + 16, 8);
  std::memcpy(h->token.data(), b + 24, h->token.size());
  h->address.assign(reinterpret_cast<const char*>(b + kAddressOffset), b[5]);
  if (h->address.find('\0') != std::string::npos) return *why = "malformed listen handle (address)", false;
  return true;
}

}  // namespace eccl::netplugin
