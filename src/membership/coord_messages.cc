#include "membership/coord_messages.h"

#include "membership/wire.h"
#include "common/error.h"

namespace eccl::membership {

const char* coordKindName(CoordKind kind) {
  switch (kind) {
    case CoordKind::kJoin: return "join";
    case CoordKind::kView: return "view";
    case CoordKind::kHeartbeat: return "heartbeat";
    case CoordKind::kReport: return "report";
    case CoordKind::kFailed: return "failed";
    case CoordKind::kRecover: return "recover";
    case CoordKind::kError: return "error";
    case CoordKind::kEvicted: return "evicted";
    case CoordKind::kLeave: return "leave";
    case CoordKind::kStatusQuery: return "status query";
    case CoordKind::kStatus: return "status";
    case CoordKind::kPrepare: return "prepare";
    case CoordKind::kPrepared: return "prepared";
    case CoordKind::kPrepareReady: return "prepare ready";
    case CoordKind::kPrepareFailed: return "prepare failed";
    case CoordKind::kSwitchover: return "switchover";
    case CoordKind::kMigrate: return "migrate";
    case CoordKind::kGrow: return "grow";
    case CoordKind::kStandbys: return "standbys";
    case CoordKind::kSwitched: return "switched";
    case CoordKind::kSwitchFailed: return "switch-failed";
    case CoordKind::kReconfigure: return "reconfigure";
    case CoordKind::kGroup: return "group";
    case CoordKind::kGroupFailed: return "group failed";
    case CoordKind::kRankExited: return "rank exited before registering";
  }
  return "unknown";
}

namespace {

void writeEntries(WireWriter& w, const std::vector<ViewEntry>& entries) {
  w.u32(static_cast<uint32_t>(entries.size()));
  for (const auto& e : entries) {
    w.u64(e.member);
    w.str(e.address);
  }
}

}  // namespace

std::shared_ptr<const EncodedEntries> encodeEntries(std::vector<ViewEntry> entries) {
  auto out = std::make_shared<EncodedEntries>();
  WireWriter w;
  writeEntries(w, entries);
  out->entries = std::move(entries);
  out->bytes = w.take();
  out->hashed.update(out->bytes.data(), out->bytes.size());
  return out;
}

std::vector<uint8_t> encodeCoordMessageAfterEntries(const CoordMessage& m) {
  WireWriter w;
  w.u32(static_cast<uint32_t>(m.kind));
  w.u32(static_cast<uint32_t>(m.role));
  w.i64(m.rank);
  w.u32(m.nranks);
  w.u32(m.epoch);
  w.u32(m.policy);
  w.u64(m.member);
  w.u64(m.pid);
  w.u64(m.uuid);
  w.str(m.address);
  w.str(m.text);
  w.u32(static_cast<uint32_t>(m.members.size()));
  for (uint64_t id : m.members) w.u64(id);
  w.u32(static_cast<uint32_t>(m.neededFrom.size()));
  for (uint64_t seq : m.neededFrom) w.u64(seq);
  return w.take();
}

uint64_t viewChecksum(const std::vector<ViewEntry>& entries) {
  uint32_t crc = 0;
  for (const ViewEntry& e : entries) crc = crc32c(&e.member, sizeof(e.member), crc);
  return crc;
}

bool takeView(HeldView* held, CoordMessage* view, std::string* why) {
  if (view->policy == kViewDelta) {
    if (held->epoch == 0 || held->epoch != view->pid) {
      *why = fmt::format("the coordinator sent epoch {} as changes to epoch {}, and this member holds epoch {}",
                         view->epoch, view->pid, held->epoch);
      return false;
    }
    if (view->members.size() != view->entries.size() || view->nranks > kMaxCoordEntries) {
      *why = fmt::format("the coordinator's changes for epoch {} are malformed ({} ranks, {} entries)", view->epoch,
                         view->members.size(), view->entries.size());
      return false;
    }
    std::vector<ViewEntry> whole = held->entries;
    whole.resize(view->nranks);
    for (size_t i = 0; i < view->members.size(); ++i) {
      if (view->members[i] >= whole.size()) {
        *why = fmt::format("the coordinator's changes for epoch {} name rank {} of {}", view->epoch, view->members[i],
                           whole.size());
        return false;
      }
      whole[view->members[i]] = std::move(view->entries[i]);
    }
    if (viewChecksum(whole) != view->member) {
      *why = fmt::format("epoch {} built from the coordinator's changes to epoch {} fails its checksum", view->epoch,
                         view->pid);
      return false;
    }
    view->entries = std::move(whole);
    view->members.clear();
    view->policy = kViewWhole;
    view->pid = 0;
    view->member = 0;
  }
  held->epoch = view->epoch;
  held->entries = view->entries;
  return true;
}

std::vector<uint8_t> encodeCoordMessage(const CoordMessage& m) {
  std::vector<uint8_t> out;
  if (m.encoded) {
    out = m.encoded->bytes;
  } else {
    WireWriter w;
    writeEntries(w, m.entries);
    out = w.take();
  }
  auto rest = encodeCoordMessageAfterEntries(m);
  out.insert(out.end(), rest.begin(), rest.end());
  return out;
}

std::optional<CoordMessage> decodeCoordMessage(const uint8_t* p, size_t n, std::string* why) {
  WireReader r(p, n);
  CoordMessage m;
  uint32_t kind, role, count;
  if (!r.u32(&count) || count > kMaxCoordEntries) {
    *why = "coordinator message has a malformed view";
    return std::nullopt;
  }
  for (uint32_t i = 0; i < count; ++i) {
    ViewEntry e;
    if (!r.u64(&e.member) || !r.str(&e.address, kMaxAddressBytes)) {
      *why = fmt::format("view entry {} is malformed", i);
      return std::nullopt;
    }
    m.entries.push_back(std::move(e));
  }
  if (!r.u32(&kind) || !r.u32(&role) || !r.i64(&m.rank) || !r.u32(&m.nranks) || !r.u32(&m.epoch) ||
      !r.u32(&m.policy) || !r.u64(&m.member) || !r.u64(&m.pid) || !r.u64(&m.uuid) || !r.str(&m.address, kMaxAddressBytes) ||
      !r.str(&m.text, kMaxCoordText)) {
    *why = "coordinator message header is truncated or a field is too long";
    return std::nullopt;
  }
  if (kind < 1 || kind > static_cast<uint32_t>(CoordKind::kRankExited)) {
    *why = fmt::format("unknown coordinator message kind {}", kind);
    return std::nullopt;
  }
  if (role < 1 || role > static_cast<uint32_t>(Role::kTool)) {
    *why = fmt::format("unknown member role {}", role);
    return std::nullopt;
  }
  m.kind = static_cast<CoordKind>(kind);
  m.role = static_cast<Role>(role);
  if (!r.u32(&count) || count > kMaxCoordEntries) {
    *why = "coordinator message has a malformed member list";
    return std::nullopt;
  }
  for (uint32_t i = 0; i < count; ++i) {
    uint64_t id;
    if (!r.u64(&id)) {
      *why = fmt::format("member list entry {} is truncated", i);
      return std::nullopt;
    }
    m.members.push_back(id);
  }
  if (!r.u32(&count) || (count != 0 && count != m.members.size())) {
    *why = "coordinator message has a malformed neededFrom list (neither empty nor one per member)";
    return std::nullopt;
  }
  for (uint32_t i = 0; i < count; ++i) {
    uint64_t seq;
    if (!r.u64(&seq)) {
      *why = fmt::format("neededFrom entry {} is truncated", i);
      return std::nullopt;
    }
    m.neededFrom.push_back(seq);
  }
  if (!r.atEnd()) {
    *why = "coordinator message has trailing bytes";
    return std::nullopt;
  }
  return m;
}

}  // namespace eccl::membership
