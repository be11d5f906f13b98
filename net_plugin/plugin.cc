// The exported tables ncclNetPlugin_v8 to ncclNetPlugin_v12: one small
// adapter per version over the engine (engine.h). Each entry point turns an
// engine status into NCCL's result code and, on failure, says why through
// NCCL's own logger (and eccl's).
#include <dlfcn.h>

#include <atomic>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "net_plugin/engine.h"
#include "net_plugin/nccl_net_abi.h"
#include "net_plugin/nic.h"

namespace eccl::netplugin {
namespace {

std::atomic<ncclDebugLogger_t> g_logger{nullptr};
std::atomic<int> g_contexts{0};

ncclResult_t report(Status status, const char* call) {
  if (status == Status::kOk) return ncclSuccess;
  std::string why = Engine::lastError();
  log::warn("net plugin: {}: {}", call, why);
  if (ncclDebugLogger_t logger = g_logger.load())
    logger(NCCL_LOG_WARN, NCCL_NET, __FILE__, __LINE__, "NET/eccl : %s: %s", call, why.c_str());
  return static_cast<ncclResult_t>(status);
}

// Engine::get() can fail (no usable interface): NCCL then hears why.
template <typename F>
ncclResult_t withEngine(const char* call, F&& body) {
  try {
    return report(body(Engine::get()), call);
  } catch (const std::exception& e) {
    log::warn("net plugin: {}: {}", call, e.what());
    if (ncclDebugLogger_t logger = g_logger.load())
      logger(NCCL_LOG_WARN, NCCL_NET, __FILE__, __LINE__, "NET/eccl : %s: %s", call, e.what());
    return ncclSystemError;
  }
}

// NCCL 2.28 dlcloses the plugin with its last communicator (and then
// forgets its name): the pool and its threads must stay, so the library
// keeps itself loaded.
void pinLibrary() {
  static std::atomic<bool> pinned{false};
  if (pinned.exchange(true)) return;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&pinLibrary), &info) && info.dli_fname)
    if (!dlopen(info.dli_fname, RTLD_NOW | RTLD_NODELETE | RTLD_NOLOAD))
      log::warn("net plugin: could not pin {} in memory: {}", info.dli_fname, dlerror());
}

ncclResult_t initCommon(ncclDebugLogger_t logger) {
  if (logger) g_logger = logger;
  pinLibrary();
  return withEngine("init", [](Engine&) { return Status::kOk; });
}

ncclResult_t devices(int* ndev) {
  if (!ndev) return ncclInvalidArgument;
  *ndev = 1;  // one endpoint; its lanes and back ends are eccl's business
  return ncclSuccess;
}

// Fills the fields every version shares; the rest per version.
template <typename Props>
ncclResult_t fillCommon(int dev, Props* props) {
  if (!props || dev != 0) return ncclInvalidArgument;
  const NicFacts& nic = nicFacts();
  std::memset(props, 0, sizeof(*props));
  props->name = const_cast<char*>(nic.name.c_str());
  props->pciPath = nic.pciPath.empty() ? nullptr : const_cast<char*>(nic.pciPath.c_str());
  props->guid = nic.guid;
  props->ptrSupport = NCCL_PTR_HOST;  // NCCL stages device buffers through host memory
  props->regIsGlobal = 1;             // host memory needs no registration
  props->speed = nic.speedMbps;
  props->port = 1;
  props->latency = 0;
  props->maxComms = 1 << 20;
  props->maxRecvs = kMaxRecvs;
  props->netDeviceType = NCCL_NET_DEVICE_HOST;
  props->netDeviceVersion = 0;
  return ncclSuccess;
}

template <typename Props>
ncclResult_t fillSized(int dev, Props* props) {
  ncclResult_t rc = fillCommon(dev, props);
  if (rc != ncclSuccess) return rc;
  props->vProps.ndevs = 1;
  props->vProps.devs[0] = 0;
  props->maxP2pBytes = size_t{1} << 40;
  props->maxCollBytes = size_t{1} << 40;
  return ncclSuccess;
}

ncclResult_t props_v8(int dev, ncclNetProperties_v8_t* p) { return fillCommon(dev, p); }
ncclResult_t props_v9(int dev, ncclNetProperties_v9_t* p) { return fillSized(dev, p); }
ncclResult_t props_v11(int dev, ncclNetProperties_v11_t* p) {
  ncclResult_t rc = fillSized(dev, p);
  if (rc == ncclSuccess) p->maxMultiRequestSize = 1;
  return rc;
}
ncclResult_t props_v12(int dev, ncclNetProperties_v12_t* p) {
  ncclResult_t rc = fillSized(dev, p);
  if (rc == ncclSuccess) p->maxMultiRequestSize = 1, p->railId = -1, p->planeId = -1;
  return rc;
}

ncclResult_t listen(int dev, void* handle, void** listenComm) {
  if (dev != 0) return ncclInvalidArgument;
  return withEngine("listen", [&](Engine& e) { return e.listen(handle, reinterpret_cast<ListenComm**>(listenComm)); });
}

ncclResult_t connect(int dev, void* handle, void** sendComm, ncclNetDeviceHandle_t** sendDevComm) {
  if (sendDevComm) *sendDevComm = nullptr;  // no device offload
  if (dev != 0) return ncclInvalidArgument;
  return withEngine("connect", [&](Engine& e) { return e.connect(handle, reinterpret_cast<Channel**>(sendComm)); });
}

ncclResult_t accept(void* listenComm, void** recvComm, ncclNetDeviceHandle_t** recvDevComm) {
  if (recvDevComm) *recvDevComm = nullptr;
  return withEngine("accept", [&](Engine& e) {
    return e.accept(static_cast<ListenComm*>(listenComm), reinterpret_cast<Channel**>(recvComm));
  });
}

struct MemoryRegion {
  void* data;
  size_t size;
};

ncclResult_t regMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  if (!comm || !mhandle) return ncclInvalidArgument;
  if (type != NCCL_PTR_HOST) {
    log::warn("net plugin: regMr: memory type {} (eccl's plugin takes host memory only: ptrSupport is HOST)", type);
    return ncclInternalError;
  }
  *mhandle = new MemoryRegion{data, size};
  return ncclSuccess;
}

ncclResult_t regMrDmaBuf(void*, void*, size_t, int, uint64_t, int, void**) {
  log::warn("net plugin: regMrDmaBuf: DMA-BUF is not supported (ptrSupport is HOST)");
  return ncclInternalError;
}

ncclResult_t deregMr(void* comm, void* mhandle) {
  if (!comm) return ncclInvalidArgument;
  delete static_cast<MemoryRegion*>(mhandle);
  return ncclSuccess;
}

ncclResult_t isend(void* sendComm, void* data, size_t size, int tag, void** request) {
  return withEngine("isend", [&](Engine& e) {
    return e.isend(static_cast<Channel*>(sendComm), data, size, tag, reinterpret_cast<PluginRequest**>(request));
  });
}

ncclResult_t irecv(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** request) {
  return withEngine("irecv", [&](Engine& e) {
    return e.irecv(static_cast<Channel*>(recvComm), n, data, sizes, tags, reinterpret_cast<PluginRequest**>(request));
  });
}

// Host memory is coherent once received: nothing to flush.
ncclResult_t iflush(void*, int, void**, int*, void**, void** request) {
  if (request) *request = nullptr;
  return ncclSuccess;
}

ncclResult_t test(void* request, int* done, int* sizes) {
  return withEngine("test", [&](Engine& e) { return e.test(static_cast<PluginRequest*>(request), done, sizes); });
}

ncclResult_t closeComm(void* comm) {
  return withEngine("close", [&](Engine& e) { return e.closeChannel(static_cast<Channel*>(comm)); });
}

ncclResult_t closeListen(void* listenComm) {
  return withEngine("closeListen", [&](Engine& e) { return e.closeListen(static_cast<ListenComm*>(listenComm)); });
}

// ---- version adapters ----

ncclResult_t init_v8(ncclDebugLogger_t logger) { return initCommon(logger); }
ncclResult_t init_v10(ncclDebugLogger_t logger, ncclProfilerCallback_t) { return initCommon(logger); }
ncclResult_t init_v11(void** ctx, uint64_t commId, ncclNetCommConfig_t*, ncclDebugLogger_t logger,
                      ncclProfilerCallback_t) {
  if (!ctx) return ncclInvalidArgument;
  ncclResult_t rc = initCommon(logger);
  if (rc != ncclSuccess) return rc;
  // Connections are per process, not per communicator: the context only
  // names the communicator in logs.
  *ctx = reinterpret_cast<void*>(static_cast<uintptr_t>(commId | 1));
  log::info("net plugin: communicator {:016x} starts ({} open)", commId, ++g_contexts);
  return ncclSuccess;
}
ncclResult_t finalize_v11(void* ctx) {
  log::info("net plugin: communicator {:016x} ends ({} open)", reinterpret_cast<uintptr_t>(ctx), --g_contexts);
  return ncclSuccess;
}

ncclResult_t connect_v10(int dev, ncclNetCommConfig_t*, void* handle, void** sendComm,
                         ncclNetDeviceHandle_t** devComm) {
  return connect(dev, handle, sendComm, devComm);
}
ncclResult_t connect_v11(void*, int dev, void* handle, void** sendComm, ncclNetDeviceHandle_t** devComm) {
  return connect(dev, handle, sendComm, devComm);
}
ncclResult_t listen_v11(void*, int dev, void* handle, void** listenComm) { return listen(dev, handle, listenComm); }

ncclResult_t isend_v8(void* comm, void* data, int size, int tag, void*, void** request) {
  if (size < 0) return ncclInvalidArgument;
  return isend(comm, data, static_cast<size_t>(size), tag, request);
}
ncclResult_t isend_v9(void* comm, void* data, size_t size, int tag, void*, void** request) {
  return isend(comm, data, size, tag, request);
}
ncclResult_t isend_v10(void* comm, void* data, size_t size, int tag, void*, void*, void** request) {
  return isend(comm, data, size, tag, request);
}

ncclResult_t irecv_v8(void* comm, int n, void** data, int* sizes, int* tags, void**, void** request) {
  if (n < 1 || n > kMaxRecvs || !sizes) return ncclInvalidArgument;
  size_t wide[kMaxRecvs];
  for (int i = 0; i < n; ++i) {
    if (sizes[i] < 0) return ncclInvalidArgument;
    wide[i] = static_cast<size_t>(sizes[i]);
  }
  return irecv(comm, n, data, wide, tags, request);
}
ncclResult_t irecv_v9(void* comm, int n, void** data, size_t* sizes, int* tags, void**, void** request) {
  return irecv(comm, n, data, sizes, tags, request);
}
ncclResult_t irecv_v10(void* comm, int n, void** data, size_t* sizes, int* tags, void**, void**, void** request) {
  return irecv(comm, n, data, sizes, tags, request);
}

}  // namespace
}  // namespace eccl::netplugin

using namespace eccl::netplugin;

#define ECCL_EXPORT extern "C" __attribute__((visibility("default")))

ECCL_EXPORT const ncclNet_v8_t ncclNetPlugin_v8 = {
    "eccl", init_v8, devices, props_v8, listen, connect, accept, regMr, regMrDmaBuf, deregMr, isend_v8, irecv_v8,
    iflush, test, closeComm, closeComm, closeListen, nullptr, nullptr};

ECCL_EXPORT const ncclNet_v9_t ncclNetPlugin_v9 = {
    "eccl", init_v8, devices, props_v9, listen, connect, accept, regMr, regMrDmaBuf, deregMr, isend_v9, irecv_v9,
    iflush, test, closeComm, closeComm, closeListen, nullptr, nullptr, nullptr};

ECCL_EXPORT const ncclNet_v10_t ncclNetPlugin_v10 = {
    "eccl", init_v10, devices, props_v9, listen, connect_v10, accept, regMr, regMrDmaBuf, deregMr, isend_v10,
    irecv_v10, iflush, test, closeComm, closeComm, closeListen, nullptr, nullptr, nullptr};

ECCL_EXPORT const ncclNet_v11_t ncclNetPlugin_v11 = {
    "eccl", init_v11, devices, props_v11, listen_v11, connect_v11, accept, regMr, regMrDmaBuf, deregMr, isend_v10,
    irecv_v10, iflush, test, closeComm, closeComm, closeListen, nullptr, nullptr, nullptr, finalize_v11, nullptr};

ECCL_EXPORT const ncclNet_v12_t ncclNetPlugin_v12 = {
    "eccl", init_v11, devices, props_v12, listen_v11, connect_v11, accept, regMr, regMrDmaBuf, deregMr, isend_v10,
    irecv_v10, iflush, test, closeComm, closeComm, closeListen, nullptr, nullptr, nullptr, finalize_v11, nullptr};

// Not part of NCCL's interface: the pool's counters, for tests and tools
// (the same figures ECCL_DEBUG=INFO logs). out: connections opened,
// connects over new lanes, connects over pooled lanes, processes pooled.
// Not part of NCCL's interface: the preload shim's way in (one engine per
// process: the shim links this library, and NCCL's dlopen of it later
// finds the same copy). Watch: 1 when watched (an eccl job), 0 outside a
// job, -1 on error. Leave: this process is done with the group (its
// communicator was destroyed or aborted). Failure: 1 and why (truncated
// to whyBytes) when a member of the group failed, else 0.
ECCL_EXPORT int ecclNetPluginWatchGroup(uint64_t uuid) {
  try {
    return Engine::get().watchGroup(uuid) ? 1 : 0;
  } catch (const std::exception&) {
    return -1;
  }
}

ECCL_EXPORT int ecclNetPluginLeaveGroup(uint64_t uuid) {
  try {
    Engine::get().leaveGroup(uuid);
    return 0;
  } catch (const std::exception&) {
    return -1;
  }
}

ECCL_EXPORT int ecclNetPluginGroupFailure(uint64_t uuid, char* why, size_t whyBytes) {
  try {
    std::optional<std::string> failure = Engine::get().groupFailure(uuid);
    if (!failure) return 0;
    if (why && whyBytes) {
      size_t n = std::min(whyBytes - 1, failure->size());
      std::memcpy(why, failure->data(), n);
      why[n] = '\0';
    }
    return 1;
  } catch (const std::exception&) {
    return -1;
  }
}

// The boundary-send log's calls (include/eccl_net.h): ecclLog*'s contract,
// with job ranks for peers.
namespace {

template <typename F>
ecclResult_t logCall(const char* name, F&& body) {
  try {
    body(Engine::get());
    return ecclSuccess;
  } catch (const eccl::Error& e) {
    eccl::log::warn("{}: {}", name, e.what());
    return e.code();
  } catch (const std::exception& e) {
    eccl::log::warn("{}: {}", name, e.what());
    return ecclInternalError;
  }
}

}  // namespace

ECCL_EXPORT ecclResult_t ecclNetLogConfigure(const ecclLogConfig_t* config) {
  return logCall("ecclNetLogConfigure", [&](Engine& e) {
    if (!config) eccl::fail(ecclInvalidArgument, "config is NULL");
    e.logConfigure(*config);
  });
}

ECCL_EXPORT ecclResult_t ecclNetLogSetTag(int64_t iteration, int32_t microbatch) {
  return logCall("ecclNetLogSetTag", [&](Engine& e) { e.logSetTag(iteration, microbatch); });
}

ECCL_EXPORT ecclResult_t ecclNetLogTruncate(int64_t iteration) {
  return logCall("ecclNetLogTruncate", [&](Engine& e) { e.logTruncate(iteration); });
}

ECCL_EXPORT ecclResult_t ecclNetLogStats(ecclLogStats_t* stats) {
  return logCall("ecclNetLogStats", [&](Engine& e) {
    if (!stats) eccl::fail(ecclInvalidArgument, "stats is NULL");
    e.logStats(stats);
  });
}

ECCL_EXPORT ecclResult_t ecclNetLogRead(int rank, size_t index, ecclLogRecord_t* record, void* buffer,
                                        size_t bufferBytes) {
  return logCall("ecclNetLogRead", [&](Engine& e) { e.logRead(rank, index, record, buffer, bufferBytes); });
}

ECCL_EXPORT int ecclNetPluginStats(uint64_t out[4]) {
  try {
    EngineStats s = Engine::get().stats();
    out[0] = s.connectionsOpened, out[1] = s.channelsOpened, out[2] = s.channelsReused, out[3] = s.linksOpen;
    return 0;
  } catch (const std::exception&) {
    return -1;
  }
}
