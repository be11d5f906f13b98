// What a member recorded of its own calls for the standbys' sandboxes
// (ecclCommSandboxRecord): each call's signature and output, so a standby
// replaying the same step sees real values where a one-rank group has none
// (an allreduce's sum, a broadcast from another rank). On the wire a
// recording is three messages: a fixed announcement saying how large the
// other two are, the call table, and the outputs (checksummed).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "transport/signature.h"

namespace eccl::sandbox {

struct RecordedCall {
  transport::CallSignature signature;
  bool hasOutput = false;  // false: past the byte cap, or a call with no output
  uint64_t offset = 0, bytes = 0;  // where its output lies in Recording::outputs
};

struct Recording {
  int rank = -1, nranks = 0;  // the recording member's place when it recorded
  std::vector<RecordedCall> calls;
  std::vector<uint8_t> outputs;
  // Whether the output of `call` depends on which rank made it (a
  // reducescatter's block, an alltoall's row, a reduce's root, a receive):
  // such an output answers only a sandbox of the same rank.
  static bool rankDependent(transport::CallKind kind);
};

constexpr uint32_t kMaxRecordedCalls = 1 << 16;

// A rank's recording while it is made: calls in the order they were made,
// each output copied as the call returns; a receive's slot waits for its
// request to complete. Outputs past `capBytes` are left out (the call is
// kept by signature).
class RecordingBuilder {
 public:
  RecordingBuilder(int rank, int nranks, int calls, size_t capBytes);
  bool full() const { return slots_.size() == wanted_; }
  bool complete() const { return full() && pending_.empty(); }
  void add(const transport::CallSignature& s, const void* out, size_t bytes);
  // A receive posted into `out`: its output is taken by fill(request).
  void addPending(const transport::CallSignature& s, const void* request, const void* out, size_t bytes);
  // `request` (a receive added here) completed; false if it is not one.
  bool fill(const void* request);
  Recording take();

 private:
  struct Slot {
    transport::CallSignature signature;
    bool hasOutput = false;
    std::vector<uint8_t> output;
  };
  struct Pending {
    size_t slot;
    const void* out;
    size_t bytes;
  };
  bool reserve(size_t bytes);
  Recording meta_;
  size_t wanted_, capBytes_, bytes_ = 0;
  std::vector<Slot> slots_;
  std::map<const void*, Pending> pending_;
};
constexpr size_t kAnnounceBytes = 24;

struct Announce {
  uint32_t calls = 0;
  uint64_t tableBytes = 0, outputBytes = 0;
};

void encodeAnnounce(const Announce& a, uint8_t out[kAnnounceBytes]);
// nullopt with `why` for a wrong magic or sizes beyond the limits.
std::optional<Announce> decodeAnnounce(const uint8_t in[kAnnounceBytes], size_t maxOutputBytes, std::string* why);
std::vector<uint8_t> encodeTable(const Recording& r);
// Fills r's rank, nranks and calls from `table`; nullopt-like false with
// `why` when it is malformed or its calls do not tile `outputBytes`.
bool decodeTable(const std::vector<uint8_t>& table, const Announce& a, Recording* r, std::string* why);

}  // namespace eccl::sandbox
