// What the preload shim knows of each NCCL communicator it saw made: the
// uuid its members agree on for it (a hash of its unique ids, or derived
// from its parent for split, shrink and grow), watched through eccl's
// coordinator, so ncclCommGetAsyncError can report a member's failure as
// soon as the coordinator announces it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "common/mutex.h"

namespace eccl::preload {

// Where group news comes from: the net plugin's job link in the shim, a
// test's own in the unit test.
struct GroupSource {
  std::function<bool(uint64_t uuid)> watch;  // false: no eccl job
  std::function<void(uint64_t uuid)> leave;
  std::function<std::optional<std::string>(uint64_t uuid)> failure;
};

class CommWatch {
 public:
  explicit CommWatch(GroupSource source) : source_(std::move(source)) {}

  // FNV-1a over the unique ids every member passed.
  static uint64_t uuidOfIds(const void* ids, size_t bytes);

  // A communicator made by a root call (init) or from `parent`: every
  // member makes the same split, shrink and grow calls on a parent in the
  // same order, so (parent, kind, how many before, color) names the child
  // alike everywhere. Returns the uuid to pass to made(). Unknown parent:
  // nullopt (the child goes unwatched).
  std::optional<uint64_t> childUuid(const void* parent, char kind, int color);
  void made(const void* comm, uint64_t uuid);
  void destroyed(const void* comm);

  // Why the communicator's group broke, when it did; the first time for a
  // comm also logs it.
  std::optional<std::string> failure(const void* comm);
  // What ncclCommGetAsyncError reports, given NCCL's own answer (result
  // codes as NCCL's): a broken group turns success or "in progress" into
  // ncclRemoteError; NCCL's own errors stand.
  int asyncError(const void* comm, int ncclAnswer);
  static constexpr int kNcclSuccess = 0, kNcclRemoteError = 6, kNcclInProgress = 7;

 private:
  struct Entry {
    uint64_t uuid = 0;
    uint64_t children = 0;  // split, shrink and grow calls on it so far
    bool watched = false;
    bool reported = false;
  };
  GroupSource source_;
  Mutex mu_;
  std::map<const void*, Entry> comms_ ECCL_GUARDED_BY(mu_);
};

}  // namespace eccl::preload
