// The one internal API under every ncclNet_vN adapter: NCCL's plugin
// contract over eccl's transport, for the whole process.
//
// Connections are the transport device's lanes to a remote process, keyed
// by that process (never by NCCL's communicator): a comm is a one-way
// channel over them. closeSend/closeRecv close only the channel; the lanes
// stay pooled, so a re-created communicator reuses them, and a process
// whose lanes to us exist in either direction is reached over those. Lanes
// nobody used for ECCL_NET_POOL_IDLE_MS are closed.
//
// Channel protocol (tags and sequence numbers on the device, see engine.cc):
//  - open: the connector sends an open message over the lanes naming the
//    listen comm and proving its token (HMAC), for new and pooled lanes
//    alike; the listener's accept() hands out the comm or refuses the open;
//    it answers accept or refuse, and no send is taken before the answer;
//  - data (engine_data.cc): sends are numbered per channel and open with a
//    header (tag, size); up to ECCL_NET_EAGER_BYTES the bytes ride in it at
//    once and the receiver copies them into the buffer the tag picks (at
//    most 32 such sends per comm are in flight, so a slow receiver stages a
//    bounded amount); a larger send waits (returns no request) for the
//    receive's clear-to-send, sent by receives with a buffer above the
//    bound, and goes straight into the posted buffer.
//
// Threads: NCCL calls in from its proxy and main threads, and a service
// thread applies device events and control messages every 5 ms; one mutex
// guards the engine. The device's callbacks only queue events under their own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/crypto.h"
#include "eccl.h"
#include "common/mutex.h"
#include "transport/device.h"

namespace eccl::netplugin {

constexpr int kMaxRecvs = 8;
constexpr int kMaxRequests = 32;  // NCCL_NET_MAX_REQUESTS, per comm

struct Link;
struct Channel;
struct ListenComm;
struct PluginRequest;

// Also exported as ecclNetPluginStats (plugin.cc) for tests and tools.
struct EngineStats {
  uint64_t connectionsOpened = 0;  // lanes the device opened (dialed or accepted)
  uint64_t channelsOpened = 0, channelsReused = 0;  // connects over new lanes, over pooled ones
  uint64_t linksOpen = 0;          // processes with pooled lanes
};

// What an engine call reports to its adapter: NCCL's result codes.
enum class Status { kOk = 0, kSystemError = 2, kInternalError = 3, kInvalidArgument = 4, kInvalidUsage = 5,
                    kRemoteError = 6 };

class Engine {
 public:
  // The process's engine, started on first use; never destroyed (NCCL may
  // unload and reload the plugin, and the pool outlives that).
  static Engine& get();
  explicit Engine(const transport::DeviceOptions& options);
  ~Engine();

  // The last failure's message, for the adapter's log line.
  static std::string lastError();

  Status listen(void* handle, ListenComm** comm);
  // *comm stays null until the lanes are up and the open is sent: call again.
  Status connect(const void* handle, Channel** comm);
  Status accept(ListenComm* listen, Channel** comm);  // null: nothing yet
  // *request stays null when the receiver has not asked for this message
  // yet (or 32 are in flight): call again.
  Status isend(Channel* comm, const void* data, size_t size, int tag, PluginRequest** request);
  Status irecv(Channel* comm, int n, void** data, const size_t* sizes, const int* tags, PluginRequest** request);
  // sizes: one per buffer of the request (received bytes), or null.
  Status test(PluginRequest* request, int* done, int* sizes);
  Status closeChannel(Channel* comm);
  Status closeListen(ListenComm* listen);

  EngineStats stats();
  int64_t timeoutMs() const { return timeoutMs_; }

  // Under an eccl job (job.h): asks the coordinator to say when another
  // member of group `uuid` (an NCCL communicator, named by the preload
  // shim) fails; false outside a job. groupFailure: why it broke, if it did.
  bool watchGroup(uint64_t uuid);
  // The boundary-send log, as ecclLog* but keyed by job rank: sends to the
  // configured ranks are copied into a host-memory log, tagged, truncated
  // at durable checkpoints, read back (throw eccl::Error).
  void logConfigure(const ecclLogConfig_t& config);
  void logSetTag(int64_t iteration, int32_t microbatch);
  size_t logTruncate(int64_t iteration);
  void logStats(ecclLogStats_t* out);
  void logRead(int rank, size_t index, ecclLogRecord_t* record, void* buffer, size_t bufferBytes);
  void leaveGroup(uint64_t uuid);
  std::optional<std::string> groupFailure(uint64_t uuid);

 private:
  void configureLogFromEnv();
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t timeoutMs_;
};

}  // namespace eccl::netplugin
