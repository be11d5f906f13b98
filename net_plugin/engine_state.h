// The engine's state, shared by its files (engine.cc: channels over the
// device; engine_job.cc: the job, its groups and the send log). Internal.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/crypto.h"
#include "common/error.h"
#include "common/mutex.h"
#include "log/sender_log.h"
#include "net_plugin/engine.h"
#include "net_plugin/job.h"
#include "transport/device.h"
#include "transport/frame.h"

namespace eccl::netplugin {

using transport::Device;
using transport::MemberId;
using transport::Request;
using transport::RequestPtr;

// Device addressing. Every message of the plugin is point to point; the
// kind sits under the p2p bit so the sequences never meet:
//   control (open, refuse): tag 0, a counter per direction of a link;
//   clear-to-send number c of channel ch (receive groups with a buffer
//     larger than the eager bound): tag ch | kCtsTag, seq c;
//   send number k of channel ch: tag ch, seq kSendSeq | k, an EagerHeader
//     and, up to the eager bound, the bytes;
//   bytes of a larger send into group g, buffer i: tag ch, seq g * kMaxRecvs + i.
constexpr uint64_t kControlSeq = transport::FrameHeader::kP2pBit | (1ull << 56);
constexpr uint64_t kCtsSeq = transport::FrameHeader::kP2pBit | (2ull << 56);
constexpr uint64_t kDataSeq = transport::FrameHeader::kP2pBit | (3ull << 56);
constexpr uint64_t kSendSeq = transport::FrameHeader::kP2pBit | (4ull << 56);
constexpr uint32_t kControlTag = 0;
constexpr uint32_t kCtsTag = 1u << 31;
constexpr uint64_t kCommId = 0x504c4e4c43434545;  // every plugin device's frames: "EECCLNLP"
constexpr int kCtsAhead = kMaxRequests;           // clear-to-send receives a sender keeps posted

// kClosing / kCloseOk / kStay: idle pooled lanes are closed only when both
// sides agree (engine.cc, reapIdleLocked), so a reap never crosses a new comm.
// kAccept / kRefuse answer an open.
enum class ControlType : uint32_t { kOpen = 1, kRefuse = 2, kClosing = 3, kCloseOk = 4, kStay = 5, kAccept = 6 };

struct ControlMessage {
  uint32_t type = 0;
  uint32_t channel = 0;
  uint64_t listenId = 0;
  uint64_t from = 0, to = 0;  // the processes, as the proof binds them
  uint64_t eagerBytes = 0;    // an open: the channel's eager bound (the connector's)
  Mac proof{};
};
static_assert(sizeof(ControlMessage) == 72);
constexpr uint64_t kMaxEagerBytes = 4u << 20;  // a receive stages this much per buffer at most

// A receive group's buffers, for sends larger than the eager bound: the
// group takes sends [firstSend, firstSend + n) of its channel.
struct ClearToSend {
  uint64_t group = 0;
  uint64_t firstSend = 0;
  int32_t n = 0;
  int32_t reserved = 0;
  int32_t tags[kMaxRecvs] = {};
  uint64_t sizes[kMaxRecvs] = {};
};

// Every send's first frame: its tag and size, and its bytes when it is
// eager; a larger send's bytes follow into the buffer its clear-to-send named.
struct EagerHeader {
  int32_t tag = 0;
  uint32_t eager = 0;
  uint64_t size = 0;
};
static_assert(sizeof(EagerHeader) == 16);

// A remote process and the lanes to it (one device peer).
struct Link {
  MemberId peer = 0;     // the device's name for it (inbound or outbound)
  uint64_t incarnation = 0;  // of that device peer: a fresh dial is a new one
  uint64_t process = 0;  // the remote process's own id
  bool lanesUp = false;  // once, so opens count as new or pooled
  uint32_t nextChannel = 1;
  uint64_t controlSent = 0, controlExpected = 0;
  RequestPtr controlRecv;
  ControlMessage controlIn;
  std::vector<std::unique_ptr<ControlMessage>> controlOut;  // alive until their sends complete
  std::vector<RequestPtr> controlOutRequests;
  int channels = 0;
  Clock::time_point idleSince = Clock::now();
  // Closing idle lanes: we asked (kAsked, since closeAsked), or agreed to
  // the other side's ask (kAgreed: they go when its goodbye comes).
  enum class Closing { kNo, kAsked, kAgreed } closing = Closing::kNo;
  Clock::time_point closeAsked{};
  bool closeNow = false;  // we asked and the other side agreed
  std::string failure;                    // the process failed or went away
  bool released = false;  // the device peer let go of, once failed (a fresh dial waits for it)
  std::map<uint32_t, std::string> refused;  // our channels the listener refused
  std::set<uint32_t> accepted;              // and those it accepted, until they learn it
};

struct Channel {
  Link* link = nullptr;
  uint32_t id = 0;
  bool sender = false;
  uint64_t eagerBytes = 0;  // sends up to this size carry their bytes in their header frame
  bool accepted = false;    // a sender: the listener honoured the open
  int inflight = 0;
  std::string failure;  // refused, or closed under it
  // Sender: sends numbered from 0; the tags of the last kMaxRecvs (a
  // group's buffers are matched by tag in send order); clear-to-send
  // receives posted, in order, up to number ctsPosted.
  uint64_t sends = 0;
  int32_t recentTags[kMaxRecvs] = {};
  uint64_t ctsPosted = 0;
  std::deque<std::pair<RequestPtr, std::unique_ptr<ClearToSend>>> cts;
  // Receiver: groups and sends taken so far, clear-to-sends sent.
  uint64_t nextGroup = 0, nextSend = 0, ctsSent = 0;
  std::vector<PluginRequest*> requests;  // in flight, NCCL's until test() says done
};

struct ListenComm {
  uint64_t listenId = 0;
  Secret token{};
  std::deque<Channel*> ready;
};

struct PluginRequest {
  Channel* channel = nullptr;
  int n = 0;
  // Bytes into the posted buffers (a receive: buffer i, null where none
  // may come; a send: the bytes of a larger send, after its header).
  RequestPtr parts[kMaxRecvs];
  RequestPtr ctsSend;  // a receive's clear-to-send
  std::unique_ptr<ClearToSend> ctsMessage;
  // A send: its header (and eager bytes). A receive: the headers of its
  // sends, in send order, into `staging`, each slotCapacity apart.
  RequestPtr headers[kMaxRecvs];
  std::unique_ptr<uint8_t[]> staging;
  size_t slotCapacity = 0;
  // A receive's buffers; which are taken (by tag, in send order) and by
  // how many bytes; how many headers are applied.
  void* buffers[kMaxRecvs] = {};
  uint64_t capacities[kMaxRecvs] = {};
  int32_t tags[kMaxRecvs] = {};
  uint32_t taken = 0, eagerTaken = 0;
  uint64_t received[kMaxRecvs] = {};
  int applied = 0;
};

// The last failure's message on this thread (Engine::lastError), and its
// NCCL result; an engine call runs its body under guarded().
extern thread_local std::string t_lastError;
Status fromError(const Error& e);

template <typename F>
Status guarded(F&& body) {
  try {
    body();
    return Status::kOk;
  } catch (const Error& e) {
    return fromError(e);
  } catch (const std::bad_alloc&) {
    t_lastError = "out of memory";
    return Status::kSystemError;
  } catch (const std::exception& e) {
    t_lastError = e.what();
    return Status::kInternalError;
  }
}

struct Engine::Impl {
  std::unique_ptr<Device> device;
  std::unique_ptr<JobLink> job;  // null outside an eccl job
  // The boundary-send log: sends to chosen job ranks, teed (docs/nccl.md).
  log::SenderLog sendLog ECCL_GUARDED_BY(mu);
  ecclLogFullPolicy_t logPolicy ECCL_GUARDED_BY(mu) = ecclLogOnFullError;
  uint32_t lanes = 1;
  int64_t poolIdleMs = 60000;
  uint64_t eagerBytes = 32768;
  Mutex mu;
  std::map<MemberId, std::unique_ptr<Link>> links ECCL_GUARDED_BY(mu);
  std::vector<std::unique_ptr<Link>> retired ECCL_GUARDED_BY(mu);  // replaced, still named by comms
  std::map<uint64_t, ListenComm*> listens ECCL_GUARDED_BY(mu);
  // The live listen comms' tokens, for the device's handshake gate: under
  // a leaf lock of their own, so a dial is answered however busy the
  // engine's lock is (NCCL calls accept in a tight loop while it waits).
  Mutex tokensMu;
  std::map<uint64_t, Secret> tokens ECCL_GUARDED_BY(tokensMu);
  EngineStats stats ECCL_GUARDED_BY(mu);
  // Filled by the device's callbacks (under the device's lock): a leaf mutex.
  std::mutex eventsMu;
  std::vector<MemberId> arrived;
  std::vector<std::pair<MemberId, std::string>> failed;

  Link& addLinkLocked(MemberId peer, uint64_t process) ECCL_REQUIRES(mu);
  // Whether lanes to `process` are being closed by agreement: a connect
  // waits for the outcome (the lanes stay, or go and it dials anew).
  bool closingLinkToLocked(uint64_t process) ECCL_REQUIRES(mu);
  void sendControlTypeLocked(Link& link, ControlType type) ECCL_REQUIRES(mu);
  // The job rank of `process` when sends to it are logged; *wait: nobody
  // can tell yet (the job's first view has not arrived).
  std::optional<int> loggedRankLocked(uint64_t process, bool* wait) ECCL_REQUIRES(mu);
  // A send request's record is kept (it completed) or dropped.
  void settleLocked(PluginRequest& request, bool ok) ECCL_REQUIRES(mu);
  // The clear-to-send that names the buffers of send `send` of a channel
  // (null: not come yet); earlier ones are let go of.
  const ClearToSend* clearToSendLocked(Channel& comm, uint64_t send) ECCL_REQUIRES(mu);
  // A receive's headers that came, applied in send order: eager bytes
  // copied, buffers taken by tag. Throws a peer's failure or a misuse.
  void applyHeadersLocked(PluginRequest& request) ECCL_REQUIRES(mu);
  Link* linkToLocked(uint64_t process) ECCL_REQUIRES(mu);
  // reap=false keeps links with no channel that failed (a caller about to
  // read one's failure holds a pointer to it).
  void pumpLocked(bool reap = true) ECCL_REQUIRES(mu);
  void postControlRecvLocked(Link& link) ECCL_REQUIRES(mu);
  void sendControlLocked(Link& link, const ControlMessage& m) ECCL_REQUIRES(mu);
  void onControlLocked(Link& link, const ControlMessage& m) ECCL_REQUIRES(mu);
  void reapIdleLocked() ECCL_REQUIRES(mu);
};

}  // namespace eccl::netplugin
