// The plugin's registration with eccl's coordinator. Under a job (an
// eccl-run launch, or ECCL_UNIQUE_ID exported by the user's launcher) the
// process joins as its rank, so the coordinator learns of its death at
// once (its connection closes) and tells every other process: their
// plugin comms to it fail then, not at their deadline, and the preload
// shim marks each NCCL communicator that had it as a member.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "common/mutex.h"

namespace eccl::membership {
class CoordClient;
}

namespace eccl::netplugin {

class JobLink {
 public:
  // Called on the coordinator client's thread: must only record or call
  // the device (never the engine's lock holders' waits).
  using OnProcessFailed = std::function<void(uint64_t process, const std::string& why)>;

  // Joins the job of ECCL_UNIQUE_ID as rank ECCL_RANK (else RANK) of
  // ECCL_NRANKS (else WORLD_SIZE). Null when there is no job, or the
  // coordinator refuses or cannot be reached: one log line says why, and
  // the plugin works on without it (failures are then found by the
  // transport's own liveness checks).
  static std::unique_ptr<JobLink> join(uint64_t self, const std::string& address, OnProcessFailed onFailed);
  ~JobLink();

  // Asks to hear when another member of group `uuid` fails.
  void watchGroup(uint64_t uuid);
  void leaveGroup(uint64_t uuid);
  // The process exits in order: the coordinator announces no failure.
  void leaveJob();
  // Why group `uuid` broke, if it did.
  std::optional<std::string> groupFailure(uint64_t uuid);

  // The job rank a process holds in the latest view this process has
  // heard of (none before the job forms, or for a process not in it).
  std::optional<int> rankOf(uint64_t process);
  // Whether a view has arrived yet (before it, rankOf knows nobody).
  bool formed();
  int nranks() const { return nranks_; }

 private:
  JobLink() = default;
  std::unique_ptr<membership::CoordClient> client_;
  Mutex mu_;
  std::map<uint64_t, std::string> broken_ ECCL_GUARDED_BY(mu_);
  std::map<uint64_t, int> ranks_ ECCL_GUARDED_BY(mu_);  // process -> job rank
  int nranks_ = 0;
};

}  // namespace eccl::netplugin
