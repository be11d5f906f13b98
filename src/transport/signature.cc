#include "transport/signature.h"

#include <fmt/format.h>

#include <cstring>

#include "common/types.h"

namespace eccl::transport {
namespace {

const char* kindName(CallKind k) {
  static const char* names[] = {"(none)", "allreduce", "broadcast", "reduce",       "allgather",   "reducescatter", "alltoall",
                                "alltoallv", "barrier", "send", "recv"};
  auto i = static_cast<size_t>(k);
  return i < sizeof(names) / sizeof(names[0]) ? names[i] : "invalid";
}

bool isP2p(CallKind k) { return k == CallKind::kSend || k == CallKind::kRecv; }

}  // namespace

bool signaturesAgree(const CallSignature& a, const CallSignature& b) {
  if (isP2p(a.kind) || isP2p(b.kind))
    return a.kind != b.kind && isP2p(a.kind) && isP2p(b.kind) && a.type == b.type && a.count == b.count;
  return a == b;
}

std::string describe(const CallSignature& s) {
  std::string out = fmt::format("{}(count {}", kindName(s.kind), s.count);
  if (s.type >= 0) out += fmt::format(", {}", typeName(static_cast<ecclDataType_t>(s.type)));
  if (s.op >= 0) out += fmt::format(", {}", opName(static_cast<ecclRedOp_t>(s.op)));
  if (s.root >= 0) out += fmt::format(", root {}", s.root);
  return out + ")";
}

void encodeSignature(const CallSignature& s, uint8_t out[CallSignature::kWireBytes]) {
  std::memset(out, 0, CallSignature::kWireBytes);
  out[0] = static_cast<uint8_t>(s.kind);
  out[1] = static_cast<uint8_t>(s.type);
  out[2] = static_cast<uint8_t>(s.op);
  auto root = static_cast<uint32_t>(s.root);
  for (int i = 0; i < 4; ++i) out[4 + i] = static_cast<uint8_t>(root >> (8 * i));
  for (int i = 0; i < 8; ++i) out[8 + i] = static_cast<uint8_t>(s.count >> (8 * i));
}

std::optional<CallSignature> decodeSignature(const uint8_t in[CallSignature::kWireBytes], std::string* why) {
  auto reject = [&](std::string reason) -> std::optional<CallSignature> {
    if (why) *why = std::move(reason);
    return std::nullopt;
  };
  CallSignature s;
  if (in[0] == 0 || in[0] > static_cast<uint8_t>(CallKind::kLast))
    return reject(fmt::format("call signature of unknown kind {}", in[0]));
  s.kind = static_cast<CallKind>(in[0]);
  s.type = static_cast<int8_t>(in[1]);
  s.op = static_cast<int8_t>(in[2]);
  if (s.type < -1 || s.type >= ecclNumTypes) return reject(fmt::format("call signature with data type {}", s.type));
  if (s.op < -1 || s.op >= ecclNumOps) return reject(fmt::format("call signature with reduction op {}", s.op));
  if (in[3] != 0) return reject("call signature padding is not zero");
  uint32_t root = 0;
  for (int i = 0; i < 4; ++i) root |= static_cast<uint32_t>(in[4 + i]) << (8 * i);
  s.root = static_cast<int32_t>(root);
  if (s.root < -1) return reject(fmt::format("call signature with root {}", s.root));
  for (int i = 0; i < 8; ++i) s.count |= static_cast<uint64_t>(in[8 + i]) << (8 * i);
  return s;
}

}  // namespace eccl::transport
