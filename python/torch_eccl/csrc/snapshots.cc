// ProcessGroupEccl's peer-memory snapshot calls: each runs on the driver
// thread, where every call on the communicator runs.
#include <cstring>

#include "process_group.h"
#include "tensors.h"

namespace torch_eccl {

void ProcessGroupEccl::logConfigure(int64_t capacityBytes, const std::vector<int>& peers, int whenFull) {
  runNow("log_configure", [&] {
    ecclLogConfig_t cfg{};
    cfg.size = sizeof(cfg);
    cfg.capacityBytes = static_cast<size_t>(std::max<int64_t>(0, capacityBytes));
    cfg.whenFull = static_cast<ecclLogFullPolicy_t>(whenFull);
    cfg.peers = peers.empty() ? nullptr : peers.data();
    cfg.numPeers = static_cast<int>(peers.size());
    check(ecclLogConfigure(comm_, &cfg), "log_configure");
  });
}

void ProcessGroupEccl::logSetTag(int64_t iteration, int32_t microbatch) {
  runNow("log_set_tag", [&] { check(ecclLogSetTag(comm_, iteration, microbatch), "log_set_tag"); });
}

void ProcessGroupEccl::logTruncate(int64_t iteration) {
  runNow("log_truncate", [&] { check(ecclLogTruncate(comm_, iteration), "log_truncate"); });
}

void ProcessGroupEccl::logDiscard(int64_t fromIteration) {
  runNow("log_discard", [&] { check(ecclLogDiscard(comm_, fromIteration), "log_discard"); });
}

void ProcessGroupEccl::logReplay(int peer, int64_t fromIteration, int64_t toIteration) {
  runNow("log_replay", [&] { check(ecclLogReplay(comm_, peer, fromIteration, toIteration), "log_replay"); });
}

void ProcessGroupEccl::snapshotConfigure(int replicas, int64_t maxInFlightBytes) {
  runNow("snapshot_configure", [&] {
    ecclSnapshotConfig_t cfg{};
    cfg.size = sizeof(cfg);
    cfg.replicas = replicas;
    cfg.replicasSet = replicas >= 0 ? 1 : 0;
    if (replicas < 0) cfg.replicas = 0;
    cfg.maxInFlightBytes = static_cast<size_t>(std::max<int64_t>(0, maxInFlightBytes));
    check(ecclSnapshotConfigure(comm_, &cfg), "snapshot_configure");
  });
}

void ProcessGroupEccl::snapshotPut(int64_t version, const std::string& name, const at::Tensor& t) {
  checkTensor(t, "snapshot_put");
  runNow("snapshot_put", [&] {
    Flat f(t, true);
    check(ecclSnapshotPut(comm_, version, name.c_str(), f.data(), f.bytes()), "snapshot_put");
  });
}

void ProcessGroupEccl::snapshotCommit(int64_t version) {
  runNow("snapshot_commit", [&] { check(ecclSnapshotCommit(comm_, version), "snapshot_commit"); });
}

void ProcessGroupEccl::snapshotWait(int64_t version, int64_t timeoutMs) {
  runNow("snapshot_wait", [&] { check(ecclSnapshotWait(comm_, version, timeoutMs), "snapshot_wait"); });
}

int64_t ProcessGroupEccl::snapshotCommitted() {
  int64_t version = -1;
  runNow("snapshot_committed", [&] { check(ecclSnapshotCommitted(comm_, &version), "snapshot_committed"); });
  return version;
}

std::vector<std::tuple<std::string, int64_t, int64_t>> ProcessGroupEccl::snapshotList() {
  std::vector<std::tuple<std::string, int64_t, int64_t>> out;
  runNow("snapshot_list", [&] {
    int count = 0;
    check(ecclSnapshotList(comm_, nullptr, 0, &count), "snapshot_list");
    std::vector<ecclSnapshotEntry_t> entries(static_cast<size_t>(count));
    check(ecclSnapshotList(comm_, entries.data(), count, &count), "snapshot_list");
    for (int i = 0; i < count && i < static_cast<int>(entries.size()); ++i)
      out.emplace_back(std::string(entries[i].name, strnlen(entries[i].name, sizeof(entries[i].name))),
                       entries[i].version, static_cast<int64_t>(entries[i].bytes));
  });
  return out;
}

int64_t ProcessGroupEccl::snapshotGet(const std::string& name, at::Tensor& t) {
  checkTensor(t, "snapshot_get");
  int64_t version = -1;
  runNow("snapshot_get", [&] {
    Flat f(t, false);
    check(ecclSnapshotGet(comm_, name.c_str(), f.data(), f.bytes(), &version), "snapshot_get");
    f.writeBack();
  });
  return version;
}

std::vector<std::tuple<int, std::string, int64_t, int64_t>> ProcessGroupEccl::snapshotListHeld() {
  std::vector<std::tuple<int, std::string, int64_t, int64_t>> out;
  runNow("snapshot_list_held", [&] {
    int count = 0;
    check(ecclSnapshotListHeld(comm_, nullptr, 0, &count), "snapshot_list_held");
    std::vector<ecclSnapshotHeldEntry_t> entries(static_cast<size_t>(count));
    check(ecclSnapshotListHeld(comm_, entries.data(), count, &count), "snapshot_list_held");
    for (int i = 0; i < count && i < static_cast<int>(entries.size()); ++i)
      out.emplace_back(entries[i].owner, std::string(entries[i].name, strnlen(entries[i].name, sizeof(entries[i].name))),
                       entries[i].version, static_cast<int64_t>(entries[i].bytes));
  });
  return out;
}

int64_t ProcessGroupEccl::snapshotGetHeld(int owner, const std::string& name, at::Tensor& t) {
  checkTensor(t, "snapshot_get_held");
  int64_t version = -1;
  runNow("snapshot_get_held", [&] {
    Flat f(t, false);
    check(ecclSnapshotGetHeld(comm_, owner, name.c_str(), f.data(), f.bytes(), &version), "snapshot_get_held");
    f.writeBack();
  });
  return version;
}

int64_t ProcessGroupEccl::snapshotRestore() {
  int64_t version = -1;
  runNow("snapshot_restore", [&] { check(ecclSnapshotRestore(comm_, &version), "snapshot_restore"); });
  return version;
}

int ProcessGroupEccl::snapshotRestoreState() {
  ecclSnapshotRestoreState_t state = ecclSnapshotRestoreOk;
  runNow("snapshot_restore_state",
         [&] { check(ecclSnapshotRestoreState(comm_, &state), "snapshot_restore_state"); });
  return static_cast<int>(state);
}

void ProcessGroupEccl::snapshotPersist(const std::string& directory) {
  runNow("snapshot_persist", [&] { check(ecclSnapshotPersist(comm_, directory.c_str()), "snapshot_persist"); });
}

int64_t ProcessGroupEccl::snapshotPersistWait(int64_t timeoutMs) {
  int64_t version = -1;
  runNow("snapshot_persist_wait",
         [&] { check(ecclSnapshotPersistWait(comm_, timeoutMs, &version), "snapshot_persist_wait"); });
  return version;
}

int64_t ProcessGroupEccl::snapshotLoad(const std::string& directory) {
  int64_t version = -1;
  runNow("snapshot_load", [&] { check(ecclSnapshotLoad(comm_, directory.c_str(), &version), "snapshot_load"); });
  return version;
}

}  // namespace torch_eccl
