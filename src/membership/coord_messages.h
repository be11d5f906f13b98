// The membership coordinator's wire protocol. Every message travels sealed
// (coord_channel.h): authenticated with a per-connection key derived from
// the job secret, numbered against replay. One struct carries every kind;
// each kind uses the fields its comment names.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/crypto.h"

namespace eccl::membership {

enum class CoordKind : uint32_t {
  kJoin = 1,       // member -> coord: role, rank, nranks, member, address, pid,
                   // policy (standbys: 1 = prepare eagerly); uuid 1: resuming (an
                   // earlier coordinator of the job admitted it; epoch: its view's)
  kView = 2,       // coord -> member: epoch, rank (-1: standby), entries, text (why);
                   // policy kViewDelta: nranks, and only the entries that changed since the
                   // view of epoch `pid`, their ranks in members, `member` the view's checksum
  kHeartbeat = 3,  // both ways
  kReport = 4,     // member -> coord: epoch, members (the failed), neededFrom, text (what it saw), policy
  kFailed = 5,     // coord -> members: epoch, members (failed so far), neededFrom, text
  kRecover = 6,    // member -> coord: epoch, policy
  kError = 7,      // coord -> member: text (the request it answers failed); policy:
                   // kErrorMemberUnknown when it refuses a resume it holds no admission for
  kEvicted = 8,    // coord -> member: text; the connection closes after it
  kLeave = 9,      // member -> coord: orderly exit, no failure
  kStatusQuery = 10,
  kStatus = 11,    // coord -> tool: text (human-readable view, standbys, health)
  // Two-phase reconfiguration (expected migration, grow):
  kPrepare = 12,       // coord -> members, joiners: epoch (next), entries (next view),
                       // rank (leaving rank, -1 for grow), members (leavers), text
  kPrepared = 13,      // member -> coord: epoch; its part of the delta is open
  kPrepareReady = 14,  // coord -> members: epoch; every member of the next view is prepared
  kPrepareFailed = 15, // coord -> members: epoch, text; the old view stays
  kSwitchover = 16,    // member -> coord: epoch; at a collective boundary, ready to switch
  kMigrate = 17,       // member or tool -> coord: rank to move to a standby
  kGrow = 18,          // member -> coord: epoch, nranks (how many standbys to append)
  kStandbys = 19,      // coord -> members: entries (eagerly preparing standbys)
  // The switchover's in-band vote (docs/elastic.md): members of the next view
  // tell the outcome of their vote; the coordinator only settles split votes.
  kSwitched = 20,      // member -> coord: epoch (next); every member voted yes, it is in that view now
  kSwitchFailed = 21,  // member -> coord: epoch, text; its vote missed someone, it waits for the decision
  // A membership named outright (c10d's reconfigure): every member named in
  // `members` asks with the same list and uuid; the view becomes that list.
  kReconfigure = 22,   // member or standby -> coord: epoch (its view, 0 for a standby), uuid, members (rank order)
  // Groups the coordinator does not form, only watches (an NCCL communicator
  // under the preload shim): members name one by a uuid they agree on, and
  // each hears when another member of it fails.
  kGroup = 23,         // member -> coord: uuid, policy (0: joins that group, 1: leaves it in order)
  kGroupFailed = 24,   // coord -> member: uuid, members (the failed), text
  // A launcher: the process meant to be `rank` ended before it registered
  // (text: how). Before the job forms an idle standby takes the rank.
  kRankExited = 25,    // tool -> coord: rank, text
};

enum class Role : uint32_t { kRank = 1, kStandby = 2, kTool = 3 };

// kJoin's uuid when a member comes back to the job's new coordinator.
constexpr uint64_t kJoinResuming = 1;

struct ViewEntry {
  uint64_t member = 0;
  std::string address;
  bool operator==(const ViewEntry&) const = default;
};

// A view's entries encoded once for every member it goes to: the
// coordinator sends one view to thousands of members, and encoding, hashing
// and copying it for each made formation quadratic in work on its one
// thread. The wire starts with the entries, so the hash of these bytes is
// where every message carrying them continues from (coord_channel.h).
struct EncodedEntries {
  std::vector<ViewEntry> entries;
  std::vector<uint8_t> bytes;  // their wire form
  Sha256 hashed;               // SHA-256 fed `bytes`
};
std::shared_ptr<const EncodedEntries> encodeEntries(std::vector<ViewEntry> entries);

struct CoordMessage {
  CoordKind kind = CoordKind::kHeartbeat;
  Role role = Role::kRank;
  int64_t rank = -1;
  uint32_t nranks = 0;
  uint32_t epoch = 0;
  uint32_t policy = 0;
  uint64_t member = 0;
  uint64_t pid = 0;
  uint64_t uuid = 0;  // kReconfigure: the caller's name for the new membership
  std::string address;
  std::string text;
  std::vector<ViewEntry> entries;  // indexed by rank
  // Sending only: when set, the entries on the wire (and `entries` is empty).
  std::shared_ptr<const EncodedEntries> encoded;
  const std::vector<ViewEntry>& viewEntries() const { return encoded ? encoded->entries : entries; }
  std::vector<uint64_t> members;
  // kReport, kFailed: per entry of members, 0 where it failed; where it left
  // in order, the first collective (sequence number, of `epoch` for
  // kFailed) that needed it: earlier ones still get what it sent. Empty: all 0.
  std::vector<uint64_t> neededFrom;
  uint64_t neededFromOf(size_t i) const { return i < neededFrom.size() ? neededFrom[i] : 0; }
};

// kReport's policy: the reporter saw the members close their lanes on it.
// Weaker evidence than silence: a live member closes the lanes of one it
// judged failed, so the coordinator first waits to hear from the accused.
constexpr uint32_t kReportPeerClosed = 1;

// kError's policy: a resume refused because this coordinator holds no
// state of the member's admission (its predecessor died before replicating
// it). A member not yet placed in a view joins afresh.
constexpr uint32_t kErrorMemberUnknown = 1;

// kView's policy: the whole view, or the ranks that changed since the
// member's last view (a REPLACE changes one entry of thousands).
constexpr uint32_t kViewWhole = 0;
constexpr uint32_t kViewDelta = 1;

// A view's checksum, over its member ids in rank order.
uint64_t viewChecksum(const std::vector<ViewEntry>& entries);

// What a member keeps of the last view it was sent, to apply a delta to.
struct HeldView {
  uint32_t epoch = 0;
  std::vector<ViewEntry> entries;
};
// Makes `view` whole (a delta is applied to `held`) and keeps it in `held`.
// False, naming why, when a delta does not apply: another base epoch, a
// rank out of range, or a result whose checksum differs.
bool takeView(HeldView* held, CoordMessage* view, std::string* why);

constexpr size_t kMaxMessageBytes = 1 << 20;
constexpr size_t kMaxAddressBytes = 512;
constexpr size_t kMaxCoordText = 4096;
constexpr size_t kMaxCoordEntries = 1 << 16;

std::vector<uint8_t> encodeCoordMessage(const CoordMessage& m);
// What follows the entries on the wire (encodeCoordMessage is the entries'
// bytes, then these).
std::vector<uint8_t> encodeCoordMessageAfterEntries(const CoordMessage& m);
std::optional<CoordMessage> decodeCoordMessage(const uint8_t* p, size_t n, std::string* why);
const char* coordKindName(CoordKind kind);

}  // namespace eccl::membership
