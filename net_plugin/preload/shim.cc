// libeccl-preload.so: LD_PRELOAD it under an unmodified NCCL program.
// NCCL exports each call twice, ncclX as a weak alias of pncclX; the shim
// defines the ncclX that make or end communicators and forwards each to
// NCCL's pncclX. Around them it selects eccl's net plugin (unless the
// user chose another) and has eccl's coordinator watch each communicator,
// so ncclCommGetAsyncError reports ncclRemoteError once a member's
// failure is announced (PyTorch's watchdog then aborts within its poll).
#include <dlfcn.h>

#include <cstdlib>
#include <string>

#include "common/log.h"
// The net plugin's own entry points (libnccl-net-eccl.so, which the shim
// links: NCCL's later dlopen of the plugin finds this same copy).
#include "eccl_net.h"
#include "net_plugin/preload/comm_watch.h"
#include "net_plugin/preload/nccl_api_abi.h"

namespace {

using eccl::preload::CommWatch;

CommWatch& watch() {
  static CommWatch* w = new CommWatch({
      [](uint64_t uuid) {
        const char* job = std::getenv("ECCL_UNIQUE_ID");
        return job && *job && ecclNetPluginWatchGroup(uuid) == 1;
      },
      [](uint64_t uuid) { ecclNetPluginLeaveGroup(uuid); },
      [](uint64_t uuid) -> std::optional<std::string> {
        char why[1024];
        if (ecclNetPluginGroupFailure(uuid, why, sizeof(why)) != 1) return std::nullopt;
        return std::string(why);
      },
  });
  return *w;
}

// NCCL's pncclX: the next definition after ours, or libnccl's own where a
// framework loaded it privately (RTLD_LOCAL, as Python extensions are).
void* resolve(const char* name) {
  if (void* f = dlsym(RTLD_NEXT, name)) return f;
  for (const char* lib : {"libnccl.so.2", "libnccl.so"})
    if (void* h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD))
      if (void* f = dlsym(h, name)) return f;
  return nullptr;
}

ncclResult_t missing(const char* name) {
  eccl::log::warn("eccl preload: NCCL's {} is not loaded (no libnccl in this process, or one older than the call)",
                  name);
  return ncclInternalError;
}

// Unless the user chose another, NCCL loads eccl's net plugin; it reads
// the variable when its first communicator is made.
void chooseEcclNet() { setenv("NCCL_NET_PLUGIN", "eccl", /*overwrite=*/0); }

bool made(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

}  // namespace

// The real call, resolved once it can be.
#define ECCL_REAL(fn)                                                       \
  static decltype(&fn) real_##fn = nullptr;                                \
  if (!real_##fn) real_##fn = reinterpret_cast<decltype(&fn)>(resolve("p" #fn)); \
  if (!real_##fn) return missing("p" #fn)

extern "C" {

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  ECCL_REAL(ncclCommInitRank);
  chooseEcclNet();
  ncclResult_t r = real_ncclCommInitRank(comm, nranks, commId, rank);
  if (made(r) && comm) watch().made(*comm, CommWatch::uuidOfIds(&commId, sizeof(commId)));
  return r;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config) {
  ECCL_REAL(ncclCommInitRankConfig);
  chooseEcclNet();
  ncclResult_t r = real_ncclCommInitRankConfig(comm, nranks, commId, rank, config);
  if (made(r) && comm) watch().made(*comm, CommWatch::uuidOfIds(&commId, sizeof(commId)));
  return r;
}

ncclResult_t ncclCommInitRankScalable(ncclComm_t* comm, int nranks, int myrank, int nId, ncclUniqueId* commIds,
                                      ncclConfig_t* config) {
  ECCL_REAL(ncclCommInitRankScalable);
  chooseEcclNet();
  ncclResult_t r = real_ncclCommInitRankScalable(comm, nranks, myrank, nId, commIds, config);
  if (made(r) && comm && commIds && nId > 0)
    watch().made(*comm, CommWatch::uuidOfIds(commIds, sizeof(ncclUniqueId) * static_cast<size_t>(nId)));
  return r;
}

// Every member is in this process: no other process can fail under it.
ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  ECCL_REAL(ncclCommInitAll);
  chooseEcclNet();
  return real_ncclCommInitAll(comms, ndev, devlist);
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  ECCL_REAL(ncclCommSplit);
  std::optional<uint64_t> uuid = watch().childUuid(comm, 'S', color);
  ncclResult_t r = real_ncclCommSplit(comm, color, key, newcomm, config);
  if (made(r) && newcomm && *newcomm && uuid) watch().made(*newcomm, *uuid);
  return r;
}

ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm,
                            ncclConfig_t* config, int shrinkFlags) {
  ECCL_REAL(ncclCommShrink);
  std::optional<uint64_t> uuid = watch().childUuid(comm, 'K', 0);
  ncclResult_t r = real_ncclCommShrink(comm, excludeRanksList, excludeRanksCount, newcomm, config, shrinkFlags);
  if (made(r) && newcomm && *newcomm && uuid) watch().made(*newcomm, *uuid);
  return r;
}

// Existing members name the grown communicator from their parent; a new
// rank has only the grow's unique id (docs/nccl.md: its group is watched
// apart from the existing members').
ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank, ncclComm_t* newcomm,
                          ncclConfig_t* config) {
  ECCL_REAL(ncclCommGrow);
  chooseEcclNet();
  std::optional<uint64_t> uuid;
  if (comm) uuid = watch().childUuid(comm, 'G', 0);
  else if (uniqueId) uuid = CommWatch::uuidOfIds(uniqueId, sizeof(*uniqueId));
  ncclResult_t r = real_ncclCommGrow(comm, nRanks, uniqueId, rank, newcomm, config);
  if (made(r) && newcomm && *newcomm && uuid) watch().made(*newcomm, *uuid);
  return r;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  ECCL_REAL(ncclCommGetAsyncError);
  ncclResult_t r = real_ncclCommGetAsyncError(comm, asyncError);
  if (r == ncclSuccess && asyncError)
    *asyncError = static_cast<ncclResult_t>(watch().asyncError(comm, *asyncError));
  return r;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  ECCL_REAL(ncclCommDestroy);
  watch().destroyed(comm);
  return real_ncclCommDestroy(comm);
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  ECCL_REAL(ncclCommAbort);
  watch().destroyed(comm);
  return real_ncclCommAbort(comm);
}

}  // extern "C"
