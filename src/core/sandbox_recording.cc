#include "core/sandbox_recording.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "membership/wire.h"

namespace eccl::sandbox {

namespace {
constexpr uint32_t kMagic = 0x58425345;  // "ESBX"
constexpr size_t kCallWireBytes = transport::CallSignature::kWireBytes + 1 + 8;
}  // namespace

bool Recording::rankDependent(transport::CallKind kind) {
  using K = transport::CallKind;
  return kind == K::kReduce || kind == K::kReduceScatter || kind == K::kAllToAll || kind == K::kAllToAllv ||
         kind == K::kRecv;
}

RecordingBuilder::RecordingBuilder(int rank, int nranks, int calls, size_t capBytes)
    : wanted_(static_cast<size_t>(calls)), capBytes_(capBytes) {
  meta_.rank = rank;
  meta_.nranks = nranks;
}

bool RecordingBuilder::reserve(size_t bytes) {
  if (bytes == 0 || bytes > capBytes_ - std::min(capBytes_, bytes_)) return false;
  bytes_ += bytes;
  return true;
}

void RecordingBuilder::add(const transport::CallSignature& s, const void* out, size_t bytes) {
  Slot slot{s, out && reserve(bytes), {}};
  if (slot.hasOutput) slot.output.assign(static_cast<const uint8_t*>(out), static_cast<const uint8_t*>(out) + bytes);
  slots_.push_back(std::move(slot));
}

void RecordingBuilder::addPending(const transport::CallSignature& s, const void* request, const void* out,
                                  size_t bytes) {
  bool kept = out && reserve(bytes);
  slots_.push_back({s, kept, {}});
  if (kept) pending_[request] = {slots_.size() - 1, out, bytes};
}

bool RecordingBuilder::fill(const void* request) {
  auto it = pending_.find(request);
  if (it == pending_.end()) return false;
  const auto* out = static_cast<const uint8_t*>(it->second.out);
  slots_[it->second.slot].output.assign(out, out + it->second.bytes);
  pending_.erase(it);
  return true;
}

Recording RecordingBuilder::take() {
  Recording r = meta_;
  for (Slot& s : slots_) {
    r.calls.push_back({s.signature, s.hasOutput, r.outputs.size(), s.hasOutput ? s.output.size() : 0});
    r.outputs.insert(r.outputs.end(), s.output.begin(), s.output.end());
  }
  return r;
}

void encodeAnnounce(const Announce& a, uint8_t out[kAnnounceBytes]) {
  std::memcpy(out, &kMagic, 4);
  std::memcpy(out + 4, &a.calls, 4);
  std::memcpy(out + 8, &a.tableBytes, 8);
  std::memcpy(out + 16, &a.outputBytes, 8);
}

std::optional<Announce> decodeAnnounce(const uint8_t in[kAnnounceBytes], size_t maxOutputBytes, std::string* why) {
  uint32_t magic;
  Announce a;
  std::memcpy(&magic, in, 4);
  std::memcpy(&a.calls, in + 4, 4);
  std::memcpy(&a.tableBytes, in + 8, 8);
  std::memcpy(&a.outputBytes, in + 16, 8);
  if (magic != kMagic) {
    *why = fmt::format("not a sandbox recording (magic {:#x})", magic);
    return std::nullopt;
  }
  if (a.calls == 0 || a.calls > kMaxRecordedCalls || a.tableBytes != 8 + a.calls * kCallWireBytes) {
    *why = fmt::format("{} calls in a table of {} bytes (at most {} calls)", a.calls, a.tableBytes, kMaxRecordedCalls);
    return std::nullopt;
  }
  if (a.outputBytes > maxOutputBytes) {
    *why = fmt::format("{} bytes of outputs, more than ECCL_SANDBOX_RECORD_BYTES ({})", a.outputBytes, maxOutputBytes);
    return std::nullopt;
  }
  return a;
}

std::vector<uint8_t> encodeTable(const Recording& r) {
  membership::WireWriter w;
  w.u32(static_cast<uint32_t>(r.rank));
  w.u32(static_cast<uint32_t>(r.nranks));
  for (const RecordedCall& c : r.calls) {
    uint8_t sig[transport::CallSignature::kWireBytes];
    transport::encodeSignature(c.signature, sig);
    for (uint8_t b : sig) w.u8(b);
    w.u8(c.hasOutput ? 1 : 0);
    w.u64(c.hasOutput ? c.bytes : 0);
  }
  return w.take();
}

bool decodeTable(const std::vector<uint8_t>& table, const Announce& a, Recording* r, std::string* why) {
  if (table.size() != a.tableBytes) {
    *why = fmt::format("a call table of {} bytes where {} were announced", table.size(), a.tableBytes);
    return false;
  }
  membership::WireReader in(table.data(), table.size());
  uint32_t rank = 0, nranks = 0;
  in.u32(&rank);
  in.u32(&nranks);
  if (nranks == 0 || rank >= nranks || nranks > (1u << 24)) {
    *why = fmt::format("recorded as rank {} of {}", rank, nranks);
    return false;
  }
  r->rank = static_cast<int>(rank);
  r->nranks = static_cast<int>(nranks);
  r->calls.clear();
  uint64_t at = 0;
  for (uint32_t i = 0; i < a.calls; ++i) {
    uint8_t sig[transport::CallSignature::kWireBytes];
    for (uint8_t& b : sig) in.u8(&b);
    uint8_t has = 0;
    uint64_t bytes = 0;
    in.u8(&has);
    in.u64(&bytes);
    auto signature = transport::decodeSignature(sig, why);
    if (!signature) {
      *why = fmt::format("call {}: {}", i, *why);
      return false;
    }
    if (has > 1 || bytes > a.outputBytes - at) {
      *why = fmt::format("call {} ({}) claims {} bytes past the {} announced", i, transport::describe(*signature), bytes,
                         a.outputBytes);
      return false;
    }
    r->calls.push_back({*signature, has == 1, at, bytes});
    at += bytes;
  }
  if (at != a.outputBytes) {
    *why = fmt::format("the calls' outputs add up to {} bytes, {} were announced", at, a.outputBytes);
    return false;
  }
  return true;
}

}  // namespace eccl::sandbox
