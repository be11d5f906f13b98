// Peer-memory snapshots' entry points (docs/snapshots.md).
#include <cstring>
#include <vector>

#include "api/guard.h"
#include "api/stream_calls.h"
#include "common/params.h"
#include "gpu/cuda_driver.h"
#include "snapshot/snapshots.h"

using namespace eccl;

namespace {

snapshot::Snapshots& snapshots(ecclComm_t comm, const char* fn) {
  api::impl(comm, fn);
  if (!comm->snapshots) fail(ecclInvalidUsage, "{}: call ecclSnapshotConfigure first", fn);
  return *comm->snapshots;
}

std::string nameArg(const char* name, const char* fn) {
  if (!name) fail(ecclInvalidArgument, "{}: name is NULL", fn);
  return std::string(name, strnlen(name, ECCL_SNAPSHOT_NAME_BYTES));
}

}  // namespace

extern "C" {

ecclResult_t ecclSnapshotConfigure(ecclComm_t comm, const ecclSnapshotConfig_t* config) {
  return api::guarded(comm, "ecclSnapshotConfigure", [&] {
    Communicator& c = api::impl(comm, "ecclSnapshotConfigure");
    ecclSnapshotConfig_t cfg{};
    if (config) {
      if (config->size < sizeof(size_t) || config->size > sizeof(ecclSnapshotConfig_t))
        fail(ecclInvalidArgument, "ecclSnapshotConfigure: config->size={} is not a valid struct size", config->size);
      std::memcpy(&cfg, config, config->size);
    }
    snapshot::Config settings;
    settings.replicas = cfg.replicas || cfg.replicasSet ? cfg.replicas : static_cast<int>(params::snapshotReplicas());
    settings.maxInFlightBytes =
        cfg.maxInFlightBytes ? cfg.maxInFlightBytes : static_cast<size_t>(params::snapshotInFlightBytes());
    api::Entered entered(comm, c.callerRole());
    const bool startingOver = comm->snapshots != nullptr;
    if (startingOver) {
      snapshot::Snapshots& old = *comm->snapshots;
      {
        SharedCallerTurn same(old.callerRole());  // the role entered above, named through the snapshots
        if (!old.mayStartOver())
          fail(ecclInvalidUsage,
               "ecclSnapshotConfigure: snapshots are configured already (again only after the view shrank or an "
               "ecclSnapshotRestore found shards in no memory or a shrunken view; after a replacement every rank "
               "calls ecclSnapshotRestore)");
      }
      // Starting over (a shrunken view, or state lost): checked first, so a refused
      // configure keeps the copies the caller may still read.
      snapshot::Snapshots::checkConfig(settings, c.size());
      comm->snapshots.reset();
    }
    auto created = std::make_unique<snapshot::Snapshots>(c);
    {
      CallerTurn same(created->callerRole());  // likewise
      created->configure(settings, startingOver);
    }
    comm->snapshots = std::move(created);
  });
}

ecclResult_t ecclSnapshotPut(ecclComm_t comm, int64_t version, const char* name, const void* buff, size_t bytes) {
  return api::guarded(comm, "ecclSnapshotPut", [&] {
    auto& s = snapshots(comm, "ecclSnapshotPut");
    std::string n = nameArg(name, "ecclSnapshotPut");
    if (!buff && bytes) fail(ecclInvalidArgument, "ecclSnapshotPut: '{}': buff is NULL with {} bytes", n, bytes);
    const bool device = bytes && gpu::isDeviceMemory(buff);
    s.put(version, n, bytes, [&](uint8_t* to) {
      if (device) gpu::copyToHost(to, buff, bytes, "ecclSnapshotPut");
      else std::memcpy(to, buff, bytes);
    });
  });
}

ecclResult_t ecclSnapshotCommit(ecclComm_t comm, int64_t version) {
  return api::guarded(comm, "ecclSnapshotCommit", [&] { snapshots(comm, "ecclSnapshotCommit").commit(version); });
}

ecclResult_t ecclSnapshotWait(ecclComm_t comm, int64_t version, int64_t timeoutMs) {
  return api::guarded(comm, "ecclSnapshotWait", [&] { snapshots(comm, "ecclSnapshotWait").wait(version, timeoutMs); });
}

ecclResult_t ecclSnapshotCommitted(ecclComm_t comm, int64_t* version) {
  return api::guarded(comm, "ecclSnapshotCommitted", [&] {
    if (!version) fail(ecclInvalidArgument, "ecclSnapshotCommitted: version is NULL");
    *version = snapshots(comm, "ecclSnapshotCommitted").committed();
  });
}

ecclResult_t ecclSnapshotList(ecclComm_t comm, ecclSnapshotEntry_t* entries, int capacity, int* count) {
  return api::guarded(comm, "ecclSnapshotList", [&] {
    if (!count) fail(ecclInvalidArgument, "ecclSnapshotList: count is NULL");
    if (capacity < 0 || (capacity > 0 && !entries))
      fail(ecclInvalidArgument, "ecclSnapshotList: capacity={} with entries={}", capacity,
           static_cast<const void*>(entries));
    auto all = snapshots(comm, "ecclSnapshotList").list();
    *count = static_cast<int>(all.size());
    for (int i = 0; i < capacity && i < *count; ++i) {
      ecclSnapshotEntry_t& e = entries[i];
      std::memset(e.name, 0, sizeof(e.name));
      std::memcpy(e.name, all[static_cast<size_t>(i)].first.data(), all[static_cast<size_t>(i)].first.size());
      e.version = all[static_cast<size_t>(i)].second.version;
      e.bytes = all[static_cast<size_t>(i)].second.bytes;
    }
  });
}

ecclResult_t ecclSnapshotGet(ecclComm_t comm, const char* name, void* buff, size_t bytes, int64_t* version) {
  return api::guarded(comm, "ecclSnapshotGet", [&] {
    auto& s = snapshots(comm, "ecclSnapshotGet");
    std::string n = nameArg(name, "ecclSnapshotGet");
    if (!buff && bytes) fail(ecclInvalidArgument, "ecclSnapshotGet: buff is NULL with {} bytes", bytes);
    const bool device = bytes && gpu::isDeviceMemory(buff);
    api::Entered entered(comm, s.callerRole());
    int64_t v = s.get(n, bytes, [&](const uint8_t* from) {
      if (device) gpu::copyToDevice(buff, from, bytes, "ecclSnapshotGet");
      else std::memcpy(buff, from, bytes);
    });
    if (version) *version = v;
  });
}

ecclResult_t ecclSnapshotListHeld(ecclComm_t comm, ecclSnapshotHeldEntry_t* entries, int capacity, int* count) {
  return api::guarded(comm, "ecclSnapshotListHeld", [&] {
    if (!count) fail(ecclInvalidArgument, "ecclSnapshotListHeld: count is NULL");
    if (capacity < 0 || (capacity > 0 && !entries))
      fail(ecclInvalidArgument, "ecclSnapshotListHeld: capacity={} with entries={}", capacity,
           static_cast<const void*>(entries));
    auto all = snapshots(comm, "ecclSnapshotListHeld").listHeld();
    *count = static_cast<int>(all.size());
    for (int i = 0; i < capacity && i < *count; ++i) {
      const auto& held = all[static_cast<size_t>(i)];
      ecclSnapshotHeldEntry_t& e = entries[i];
      std::memset(&e, 0, sizeof(e));
      e.owner = held.owner;
      std::memcpy(e.name, held.name.data(), held.name.size());
      e.version = held.entry.version;
      e.bytes = held.entry.bytes;
    }
  });
}

ecclResult_t ecclSnapshotGetHeld(ecclComm_t comm, int owner, const char* name, void* buff, size_t bytes,
                                 int64_t* version) {
  return api::guarded(comm, "ecclSnapshotGetHeld", [&] {
    auto& s = snapshots(comm, "ecclSnapshotGetHeld");
    std::string n = nameArg(name, "ecclSnapshotGetHeld");
    if (!buff && bytes) fail(ecclInvalidArgument, "ecclSnapshotGetHeld: buff is NULL with {} bytes", bytes);
    const bool device = bytes && gpu::isDeviceMemory(buff);
    int64_t v = s.getHeld(owner, n, bytes, [&](const uint8_t* from) {
      if (device) gpu::copyToDevice(buff, from, bytes, "ecclSnapshotGetHeld");
      else std::memcpy(buff, from, bytes);
    });
    if (version) *version = v;
  });
}

ecclResult_t ecclSnapshotRestore(ecclComm_t comm, int64_t* version) {
  return api::guarded(comm, "ecclSnapshotRestore", [&] {
    auto& s = snapshots(comm, "ecclSnapshotRestore");
    api::Entered entered(comm, s.callerRole());
    int64_t v = s.restore();
    if (version) *version = v;
  });
}

ecclResult_t ecclSnapshotRestoreState(ecclComm_t comm, ecclSnapshotRestoreState_t* state) {
  return api::guarded(comm, "ecclSnapshotRestoreState", [&] {
    if (!state) fail(ecclInvalidArgument, "ecclSnapshotRestoreState: state is NULL");
    using Verdict = snapshot::Snapshots::RestoreVerdict;
    switch (snapshots(comm, "ecclSnapshotRestoreState").lastRestore()) {
      case Verdict::kOk: *state = ecclSnapshotRestoreOk; break;
      case Verdict::kShardsLost: *state = ecclSnapshotRestoreShardsLost; break;
      case Verdict::kViewShrank: *state = ecclSnapshotRestoreViewShrank; break;
    }
  });
}

ecclResult_t ecclSnapshotPersist(ecclComm_t comm, const char* directory) {
  return api::guarded(comm, "ecclSnapshotPersist", [&] {
    if (!directory) fail(ecclInvalidArgument, "ecclSnapshotPersist: directory is NULL");
    snapshots(comm, "ecclSnapshotPersist").persist(directory);
  });
}

ecclResult_t ecclSnapshotPersistWait(ecclComm_t comm, int64_t timeoutMs, int64_t* version) {
  return api::guarded(comm, "ecclSnapshotPersistWait", [&] {
    int64_t v = snapshots(comm, "ecclSnapshotPersistWait").waitPersisted(timeoutMs);
    if (version) *version = v;
  });
}

ecclResult_t ecclSnapshotLoad(ecclComm_t comm, const char* directory, int64_t* version) {
  return api::guarded(comm, "ecclSnapshotLoad", [&] {
    if (!directory) fail(ecclInvalidArgument, "ecclSnapshotLoad: directory is NULL");
    auto& s = snapshots(comm, "ecclSnapshotLoad");
    api::Entered entered(comm, s.callerRole());
    int64_t v = s.load(directory);
    if (version) *version = v;
  });
}

}  // extern "C"
