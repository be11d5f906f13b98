// Call signatures: what every rank of a collective (or both ends of a
// point-to-point message) must agree on. The first frame of every message
// carries the sender's; the receiver compares it with its own call, so
// ranks that disagree about a call fail it with both calls named instead of
// exchanging garbage of the same byte count.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "eccl.h"

namespace eccl::transport {

enum class CallKind : uint8_t {
  kNone = 0,
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kAllToAllv,
  kBarrier,
  kSend,
  kRecv,
  kLast = kRecv,
};

struct CallSignature {
  static constexpr size_t kWireBytes = 16;
  CallKind kind = CallKind::kNone;
  int8_t type = -1;    // ecclDataType_t, -1: none
  int8_t op = -1;      // ecclRedOp_t, -1: none
  int32_t root = -1;   // -1: none
  uint64_t count = 0;  // elements per rank as the call states them
  bool operator==(const CallSignature&) const = default;
};

// A send matches a receive of the same type and count; collectives match
// only an identical call.
bool signaturesAgree(const CallSignature& a, const CallSignature& b);
// "allreduce(count 1024, float, sum)", "broadcast(count 8, int32, root 2)".
std::string describe(const CallSignature& s);

void encodeSignature(const CallSignature& s, uint8_t out[CallSignature::kWireBytes]);
// Returns nullopt with `why` set for a kind, type or op out of range.
std::optional<CallSignature> decodeSignature(const uint8_t in[CallSignature::kWireBytes], std::string* why);

// One communicator's collectives, op by op: this rank's signature of each
// recent op against what each peer's frames for the same op carried. A
// peer may be ahead (its signature waits until this rank gets there) or
// behind (compared against the recent history). Not thread-safe: the
// device calls it under its lock.
template <typename PeerId>
class SignatureBook {
 public:
  struct Mismatch {
    PeerId peer;
    uint64_t seq;
    CallSignature mine, theirs;
  };
  // This rank starts collective `seq` of `epoch`.
  std::optional<Mismatch> local(uint32_t epoch, uint64_t seq, const CallSignature& mine) {
    // Calls start in order: a call past the newest needs no search (the
    // search of 16 entries was a tenth of an 8 B allreduce's instructions).
    const bool newest = std::make_pair(epoch, seq) > newest_;
    if (size_t i = newest ? kHistory : indexOf(epoch, seq); i < kHistory) {
      mine_[i].signature = mine;
    } else {
      // Calls start in (epoch, seq) order: the oldest entry is the next slot.
      mine_[next_] = Entry{true, epoch, seq, mine};
      next_ = (next_ + 1) % kHistory;
      newest_ = std::max(newest_, std::make_pair(epoch, seq));
    }
    std::optional<Mismatch> found;
    if (early_.empty()) return found;
    for (auto it = early_.lower_bound({epoch, seq, PeerId{}}); it != early_.end();) {
      auto& [e, s, peer] = it->first;
      if (e != epoch || s != seq) break;
      if (!found && !signaturesAgree(mine, it->second)) found = Mismatch{peer, seq, mine, it->second};
      it = early_.erase(it);
    }
    return found;
  }
  // A peer's first frame of a message of collective `seq` of `epoch`.
  std::optional<Mismatch> remote(uint32_t epoch, uint64_t seq, PeerId from, const CallSignature& theirs) {
    if (size_t i = indexOf(epoch, seq); i < kHistory) {
      if (signaturesAgree(mine_[i].signature, theirs)) return std::nullopt;
      return Mismatch{from, seq, mine_[i].signature, theirs};
    }
    if (std::make_pair(epoch, seq) > newest_) {
      early_.try_emplace({epoch, seq, from}, theirs);
      if (early_.size() > kEarlyLimit) early_.erase(std::prev(early_.end()));
    }
    return std::nullopt;  // older than the history: its receivers checked it
  }
  // This rank's signature of a recent collective, if it has started it.
  std::optional<CallSignature> mine(uint32_t epoch, uint64_t seq) const {
    if (size_t i = indexOf(epoch, seq); i < kHistory) return mine_[i].signature;
    return std::nullopt;
  }
  // This rank's recent collectives of `epoch`, oldest first (what a goodbye
  // carries, so a peer still in one of them can name a disagreement).
  std::vector<std::pair<uint64_t, CallSignature>> recent(uint32_t epoch) const {
    std::vector<std::pair<uint64_t, CallSignature>> out;
    for (size_t i = 0; i < kHistory; ++i) {  // from the oldest slot on
      const Entry& e = mine_[(next_ + i) % kHistory];
      if (e.used && e.epoch == epoch) out.emplace_back(e.seq, e.signature);
    }
    return out;
  }
  // Forgets everything before `epoch` (a new view).
  void beginEpoch(uint32_t epoch) {
    for (Entry& e : mine_)
      if (e.epoch < epoch) e.used = false;
    std::erase_if(early_, [&](auto& kv) { return std::get<0>(kv.first) < epoch; });
  }

 private:
  static constexpr size_t kHistory = 16;
  static constexpr size_t kEarlyLimit = 4096;  // a peer that runs far ahead is checked by others
  struct Entry {
    bool used = false;
    uint32_t epoch = 0;
    uint64_t seq = 0;
    CallSignature signature;
  };
  // Where (epoch, seq) is in the ring; kHistory when it is not.
  size_t indexOf(uint32_t epoch, uint64_t seq) const {
    for (size_t i = 0; i < kHistory; ++i)
      if (mine_[i].used && mine_[i].seq == seq && mine_[i].epoch == epoch) return i;
    return kHistory;
  }

  // The last kHistory calls, a ring: no allocation per call.
  std::array<Entry, kHistory> mine_{};
  size_t next_ = 0;
  std::pair<uint32_t, uint64_t> newest_{0, 0};
  std::map<std::tuple<uint32_t, uint64_t, PeerId>, CallSignature> early_;
};

}  // namespace eccl::transport
