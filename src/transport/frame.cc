#include "transport/frame.h"

#include <fmt/format.h>

#include <cstring>

#include "common/crypto.h"
#include "transport/signature.h"

namespace eccl::transport {
namespace {

// Layout (offsets in bytes): 0 magic u32, 4 version u16, 6 type u8, 7 flags u8,
// 8 epoch u32, 12 length u32, 16 commId u64, 24 seq u64, 32 offset u64,
// 40 total u64, 48 tag u32, 52 payload crc32c u32 (zero unless flags has
// kPayloadChecksum), 56 crc32c of the call signature that follows the header
// (zero unless flags has kCallSignature), 60 crc32c of bytes 0..59.
template <typename T>
void put(uint8_t* p, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i));
}
template <typename T>
T get(const uint8_t* p) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return static_cast<T>(v);
}

}  // namespace

void encodeFrame(const FrameHeader& h, uint8_t out[FrameHeader::kSize]) {
  std::memset(out, 0, FrameHeader::kSize);
  put<uint32_t>(out + 0, FrameHeader::kMagic);
  put<uint16_t>(out + 4, FrameHeader::kVersion);
  put<uint8_t>(out + 6, static_cast<uint8_t>(h.type));
  put<uint8_t>(out + 7, h.flags);
  put<uint32_t>(out + 8, h.epoch);
  put<uint32_t>(out + 12, h.length);
  put<uint64_t>(out + 16, h.commId);
  put<uint64_t>(out + 24, h.seq);
  put<uint64_t>(out + 32, h.offset);
  put<uint64_t>(out + 40, h.total);
  put<uint32_t>(out + 48, h.tag);
  put<uint32_t>(out + 52, (h.flags & FrameHeader::kPayloadChecksum) ? h.payloadCrc : 0u);
  put<uint32_t>(out + 56, (h.flags & FrameHeader::kCallSignature) ? h.signatureCrc : 0u);
  put<uint32_t>(out + 60, crc32c(out, 60));
}

std::optional<FrameHeader> decodeFrame(const uint8_t in[FrameHeader::kSize], std::string* why) {
  auto reject = [&](std::string reason) -> std::optional<FrameHeader> {
    if (why) *why = std::move(reason);
    return std::nullopt;
  };
  if (get<uint32_t>(in) != FrameHeader::kMagic)
    return reject(fmt::format("bad magic 0x{:08x}", get<uint32_t>(in)));
  if (get<uint16_t>(in + 4) != FrameHeader::kVersion)
    return reject(fmt::format("unsupported frame version {}", get<uint16_t>(in + 4)));
  uint32_t crc = get<uint32_t>(in + 60);
  if (crc != crc32c(in, 60)) return reject("header checksum mismatch");
  constexpr uint8_t known = FrameHeader::kPayloadChecksum | FrameHeader::kCallSignature | FrameHeader::kRendezvous |
                          FrameHeader::kPrewritten | FrameHeader::kBulkCredit;
  if (in[7] & ~known) return reject(fmt::format("unknown frame flags 0x{:02x}", in[7]));
  if (!(in[7] & FrameHeader::kPayloadChecksum) && get<uint32_t>(in + 52) != 0)
    return reject("a payload checksum without its flag");
  if (!(in[7] & FrameHeader::kCallSignature) && get<uint32_t>(in + 56) != 0)
    return reject("a call signature checksum without its flag");
  FrameHeader h;
  uint8_t type = get<uint8_t>(in + 6);
  if (type < 1 || type > static_cast<uint8_t>(FrameType::kRefused)) return reject(fmt::format("unknown frame type {}", type));
  h.type = static_cast<FrameType>(type);
  h.flags = get<uint8_t>(in + 7);
  h.epoch = get<uint32_t>(in + 8);
  h.length = get<uint32_t>(in + 12);
  h.commId = get<uint64_t>(in + 16);
  h.seq = get<uint64_t>(in + 24);
  h.offset = get<uint64_t>(in + 32);
  h.total = get<uint64_t>(in + 40);
  h.tag = get<uint32_t>(in + 48);
  h.payloadCrc = get<uint32_t>(in + 52);
  h.signatureCrc = get<uint32_t>(in + 56);
  if (h.flags && h.type != FrameType::kData) return reject("flags on a control frame");
  if (h.type == FrameType::kData) {
    if (h.length > FrameHeader::kMaxPayload)
      return reject(fmt::format("payload length {} exceeds the limit {}", h.length,
                                FrameHeader::kMaxPayload));
    if (h.offset > h.total || h.length > h.total - h.offset)
      return reject(fmt::format("chunk [{}, +{}) lies outside a message of {} bytes", h.offset,
                                h.length, h.total));
  } else if (h.length > FrameHeader::kMaxControlPayload) {
    return reject(fmt::format("control payload length {} exceeds the limit {}", h.length,
                              FrameHeader::kMaxControlPayload));
  }
  if ((h.flags & (FrameHeader::kRendezvous | FrameHeader::kPrewritten)) && h.length == 0)
    return reject("an empty rendezvous chunk");
  if ((h.flags & FrameHeader::kRendezvous) && (h.flags & FrameHeader::kPrewritten))
    return reject("a chunk both offered and already written");
  if (h.type >= FrameType::kClearToSend && h.type <= FrameType::kReceiveReleased &&
      h.length != ChunkRef::kBytes)  // the rendezvous frames
    return reject(fmt::format("a chunk reference of {} bytes (not {})", h.length, ChunkRef::kBytes));
  if (h.type == FrameType::kBulkRead && h.length != 8)
    return reject(fmt::format("a bulk read report of {} bytes (not 8)", h.length));
  if (h.type == FrameType::kGoodbye && h.length % (8 + CallSignature::kWireBytes) != 0)
    return reject(fmt::format("a goodbye of {} bytes (not a multiple of {})", h.length, 8 + CallSignature::kWireBytes));
  if (h.type == FrameType::kNotice && h.length < 16)
    return reject("failure notice shorter than its member id and op");
  if (h.type == FrameType::kRevoke && h.length < 12)
    return reject("revocation notice shorter than its op and result code");
  if (h.type == FrameType::kRefused && h.length < 8)
    return reject("refusal notice shorter than its op");
  return h;
}

void markRendezvous(uint8_t frame[FrameHeader::kSize], bool on, uint8_t flag) {
  frame[7] = static_cast<uint8_t>(on ? frame[7] | flag : frame[7] & ~flag);
  put<uint32_t>(frame + 60, crc32c(frame, 60));
}

std::vector<uint8_t> encodeChunkRef(const ChunkRef& c) {
  std::vector<uint8_t> out(ChunkRef::kBytes);
  put<uint32_t>(out.data() + 0, c.epoch);
  put<uint32_t>(out.data() + 4, c.tag);
  put<uint64_t>(out.data() + 8, c.seq);
  put<uint64_t>(out.data() + 16, c.offset);
  put<uint64_t>(out.data() + 24, c.address);
  put<uint32_t>(out.data() + 32, c.key);
  put<uint32_t>(out.data() + 36, c.length);
  put<uint32_t>(out.data() + 40, c.answer);
  return out;
}

ChunkRef decodeChunkRef(const uint8_t in[ChunkRef::kBytes]) {
  ChunkRef c;
  c.epoch = get<uint32_t>(in + 0);
  c.tag = get<uint32_t>(in + 4);
  c.seq = get<uint64_t>(in + 8);
  c.offset = get<uint64_t>(in + 16);
  c.address = get<uint64_t>(in + 24);
  c.key = get<uint32_t>(in + 32);
  c.length = get<uint32_t>(in + 36);
  c.answer = get<uint32_t>(in + 40);
  return c;
}

}  // namespace eccl::transport
