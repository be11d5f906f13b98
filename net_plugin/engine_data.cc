// The engine's data path: isend, irecv and test over a channel.
//
// Every send is numbered on its channel and opens with a header frame
// (its tag and size). Up to the channel's eager bound the bytes ride in
// that frame at once, and the receiver copies them from a staging buffer
// into the buffer the tag picks: a small message costs one trip, not a
// clear-to-send and then the bytes. A larger send waits for the receive's
// clear-to-send (sent only by receives with a buffer above the bound) and
// goes straight into the posted buffer. Both sides match a group's buffers
// by tag in send order, so they agree on the buffer without asking.
#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "net_plugin/engine.h"
#include "net_plugin/engine_state.h"

namespace eccl::netplugin {
namespace {

// Why a channel can carry nothing more, or empty.
std::string channelFailure(const Channel& c) {
  if (!c.failure.empty()) return c.failure;
  if (!c.link->failure.empty()) return c.link->failure;
  if (auto it = c.link->refused.find(c.id); c.sender && it != c.link->refused.end()) return it->second;
  return {};
}

// The buffer of a group that send `send` takes: the first one not taken by
// an earlier send of the group whose tag matches (-1: none matches).
int bufferFor(const int32_t* bufferTags, int n, const int32_t* sendTags, uint64_t firstSend, uint64_t send) {
  uint32_t taken = 0;
  for (uint64_t j = firstSend; j <= send; ++j) {
    int32_t tag = sendTags[j % kMaxRecvs];
    for (int i = 0; i < n; ++i) {
      if (bufferTags[i] != tag || (taken & (1u << i))) continue;
      taken |= 1u << i;
      if (j == send) return i;
      break;
    }
  }
  return -1;
}

void throwIfFailed(const RequestPtr& r) {
  if (r && r->state.load() == Request::kFailed)
    throw Error(r->code == ecclInvalidUsage ? ecclInvalidUsage : ecclRemoteError, r->error);
}

bool isPending(const RequestPtr& r) { return r && r->state.load() == Request::kPending; }

// Drops the clear-to-sends of groups whose sends have all gone, without
// waiting for any: eager sends never need them, but must not let them pile up.
void dropPassedClearToSends(Channel& comm) {
  while (!comm.cts.empty()) {
    auto& [request, cts] = comm.cts.front();
    if (request->state.load() != Request::kDone || cts->firstSend + static_cast<uint64_t>(cts->n) > comm.sends) return;
    comm.cts.pop_front();
  }
}

}  // namespace

const ClearToSend* Engine::Impl::clearToSendLocked(Channel& comm, uint64_t send) {
  Link& link = *comm.link;
  for (;;) {
    while (comm.cts.size() < static_cast<size_t>(kCtsAhead)) {
      auto cts = std::make_unique<ClearToSend>();
      RequestPtr r =
          device->irecv(link.peer, kCtsSeq | comm.ctsPosted, comm.id | kCtsTag, cts.get(), sizeof(ClearToSend));
      comm.cts.emplace_back(std::move(r), std::move(cts));
      comm.ctsPosted++;
    }
    auto& [request, cts] = comm.cts.front();
    if (request->state.load() == Request::kPending) device->poll();
    if (request->state.load() == Request::kPending) return nullptr;  // the receiver has not asked yet
    if (request->state.load() == Request::kFailed) fail(ecclRemoteError, "isend: {}", request->error);
    if (cts->n < 1 || cts->n > kMaxRecvs)
      fail(ecclRemoteError, "isend: malformed clear-to-send from process {:016x} ({} buffers)", link.process, cts->n);
    if (cts->firstSend + static_cast<uint64_t>(cts->n) <= send) {  // an earlier group's
      comm.cts.pop_front();
      continue;
    }
    if (cts->firstSend > send)
      fail(ecclInvalidUsage,
           "isend: send {} is larger than the eager bound ({} bytes), but every buffer of the receive it meets "
           "fits under it",
           send, comm.eagerBytes);
    return cts.get();
  }
}


Status Engine::isend(Channel* comm, const void* data, size_t size, int tag, PluginRequest** request) {
  return guarded([&] {
    ECCL_CHECK_ARG(comm && request && comm->sender, "isend: not a send comm");
    ECCL_CHECK_ARG(data || size == 0, "isend: null data for {} bytes", size);
    *request = nullptr;
    // Opens, refusals and failures are applied by the service thread: the
    // data path reads only its own requests.
    MutexLock lock(impl_->mu);
    if (std::string why = channelFailure(*comm); !why.empty()) fail(ecclRemoteError, "isend: {}", why);
    if (comm->inflight >= kMaxRequests) return;
    Link& link = *comm->link;
    if (!comm->accepted) {
      // The first sends wait for the listener's answer to the open.
      if (!link.accepted.count(comm->id)) impl_->pumpLocked(/*reap=*/false);
      if (std::string why = channelFailure(*comm); !why.empty()) fail(ecclRemoteError, "isend: {}", why);
      if (!link.accepted.erase(comm->id)) return;  // NCCL calls again
      comm->accepted = true;
    }
    const uint64_t send = comm->sends;
    const bool eager = size <= comm->eagerBytes;
    const ClearToSend* cts = nullptr;
    int buffer = -1;
    if (!eager) {
      cts = impl_->clearToSendLocked(*comm, send);
      if (!cts) return;  // NCCL calls again
      comm->recentTags[send % kMaxRecvs] = tag;
      buffer = bufferFor(cts->tags, cts->n, comm->recentTags, cts->firstSend, send);
      if (buffer < 0)
        fail(ecclInvalidUsage, "isend: tag {} matches no buffer of the receive it meets (group {}: {} buffers)", tag,
             cts->group, cts->n);
      if (size > cts->sizes[buffer])
        fail(ecclInvalidUsage, "isend: {} bytes for a receive of {} (tag {})", size, cts->sizes[buffer], tag);
    }
    // A logged send reserves its record first: a full log fails it (error
    // policy) or holds it back until a truncate (block: NCCL calls again).
    bool unknownYet = false;
    std::optional<int> loggedRank = impl_->loggedRankLocked(link.process, &unknownYet);
    if (unknownYet) return;  // whether to log it is known once the job's view arrives: NCCL calls again
    log::LogStore::Reservation reservation;
    if (loggedRank) {
      try {
        reservation = impl_->sendLog.reserve(1, *loggedRank, ecclUint8, size, Clock::now(),
                                             fmt::format("isend to job rank {}", *loggedRank));
      } catch (const Error& e) {
        bool fits = size <= impl_->sendLog.store()->capacity();
        if (e.code() == ecclLogFull && impl_->logPolicy == ecclLogOnFullBlock && fits) return;
        throw;
      }
    }
    auto req = std::make_unique<PluginRequest>();
    req->channel = comm;
    req->n = 1;
    const size_t frameBytes = sizeof(EagerHeader) + (eager ? size : 0);
    req->staging = std::make_unique_for_overwrite<uint8_t[]>(frameBytes);
    EagerHeader header{tag, eager ? 1u : 0u, size};
    std::memcpy(req->staging.get(), &header, sizeof(header));
    if (eager && size > 0) std::memcpy(req->staging.get() + sizeof(header), data, size);
    try {
      req->headers[0] = impl_->device->isend(link.peer, kSendSeq | send, comm->id, req->staging.get(), frameBytes);
      if (!eager)
        req->parts[0] =
            impl_->device->isend(link.peer, kDataSeq | (cts->group * kMaxRecvs + buffer), comm->id, data, size);
    } catch (...) {
      if (loggedRank) impl_->sendLog.abandon(reservation);
      throw;
    }
    if (loggedRank)
      impl_->sendLog.copy(eager ? req->headers[0].get() : req->parts[0].get(), reservation, data, size, [] {});
    comm->recentTags[send % kMaxRecvs] = tag;
    comm->sends++;
    dropPassedClearToSends(*comm);
    comm->inflight++;
    comm->requests.push_back(req.get());
    *request = req.release();
  });
}

Status Engine::irecv(Channel* comm, int n, void** data, const size_t* sizes, const int* tags,
                     PluginRequest** request) {
  return guarded([&] {
    ECCL_CHECK_ARG(comm && request && !comm->sender, "irecv: not a receive comm");
    ECCL_CHECK_ARG(n >= 1 && n <= kMaxRecvs, "irecv: {} buffers; 1 to {} can be grouped", n, kMaxRecvs);
    ECCL_CHECK_ARG(data && sizes && tags, "irecv: null buffers, sizes or tags");
    for (int i = 0; i < n; ++i)
      ECCL_CHECK_ARG(data[i] || sizes[i] == 0, "irecv: null buffer {} of {} bytes", i, sizes[i]);
    *request = nullptr;
    MutexLock lock(impl_->mu);
    if (std::string why = channelFailure(*comm); !why.empty()) fail(ecclRemoteError, "irecv: {}", why);
    if (comm->inflight >= kMaxRequests) return;
    Link& link = *comm->link;
    auto req = std::make_unique<PluginRequest>();
    req->channel = comm;
    req->n = n;
    const uint64_t group = comm->nextGroup++;
    const uint64_t firstSend = comm->nextSend;
    comm->nextSend += static_cast<uint64_t>(n);
    uint64_t largest = 0;
    for (int i = 0; i < n; ++i) {
      req->buffers[i] = data[i];
      req->capacities[i] = sizes[i];
      req->tags[i] = tags[i];
      largest = std::max<uint64_t>(largest, sizes[i]);
    }
    // Each of the group's sends opens with a header (with the bytes, up to
    // the eager bound): staged here, applied in send order by test().
    req->slotCapacity = sizeof(EagerHeader) + static_cast<size_t>(std::min(largest, comm->eagerBytes));
    req->staging = std::make_unique_for_overwrite<uint8_t[]>(req->slotCapacity * static_cast<size_t>(n));
    for (int j = 0; j < n; ++j)
      req->headers[j] = impl_->device->irecvUpTo(link.peer, kSendSeq | (firstSend + static_cast<uint64_t>(j)),
                                                 comm->id, req->staging.get() + req->slotCapacity * j, req->slotCapacity);
    // Buffers a larger send can fill are posted and announced.
    bool announce = false;
    for (int i = 0; i < n; ++i) {
      if (sizes[i] <= comm->eagerBytes) continue;
      req->parts[i] = impl_->device->irecvUpTo(link.peer, kDataSeq | (group * kMaxRecvs + static_cast<uint64_t>(i)),
                                               comm->id, data[i], sizes[i]);
      announce = true;
    }
    if (announce) {
      req->ctsMessage = std::make_unique<ClearToSend>();
      ClearToSend& cts = *req->ctsMessage;
      cts.group = group;
      cts.firstSend = firstSend;
      cts.n = n;
      std::copy(tags, tags + n, cts.tags);
      std::copy(sizes, sizes + n, cts.sizes);
      req->ctsSend =
          impl_->device->isend(link.peer, kCtsSeq | comm->ctsSent++, comm->id | kCtsTag, &cts, sizeof(cts));
    }
    comm->inflight++;
    comm->requests.push_back(req.get());
    *request = req.release();
  });
}

void Engine::Impl::applyHeadersLocked(PluginRequest& request) {
  const Link& link = *request.channel->link;
  for (; request.applied < request.n; ++request.applied) {
    const RequestPtr& frame = request.headers[request.applied];
    if (isPending(frame)) return;
    throwIfFailed(frame);
    const uint8_t* bytes = request.staging.get() + request.slotCapacity * static_cast<size_t>(request.applied);
    EagerHeader header;
    if (frame->bytes < sizeof(header))
      fail(ecclRemoteError, "irecv: a {}-byte send header from process {:016x}", frame->bytes, link.process);
    std::memcpy(&header, bytes, sizeof(header));
    if (frame->bytes != sizeof(header) + (header.eager ? header.size : 0))
      fail(ecclRemoteError, "irecv: a malformed send header from process {:016x} ({} bytes for a {}-byte send)",
           link.process, frame->bytes, header.size);
    int buffer = -1;
    for (int i = 0; i < request.n && buffer < 0; ++i)
      if (request.tags[i] == header.tag && !(request.taken & (1u << i))) buffer = i;
    if (buffer < 0)
      fail(ecclInvalidUsage, "irecv: a send with tag {} from process {:016x} matches no buffer of this receive",
           header.tag, link.process);
    request.taken |= 1u << buffer;
    if (header.size > request.capacities[buffer])
      fail(ecclInvalidUsage, "irecv: a send of {} bytes for a buffer of {} (tag {})", header.size,
           request.capacities[buffer], header.tag);
    if (!header.eager) {
      if (!request.parts[buffer])
        fail(ecclRemoteError, "irecv: process {:016x} sent {} bytes past the eager bound into an unannounced buffer",
             link.process, header.size);
      continue;
    }
    if (header.size > 0) std::memcpy(request.buffers[buffer], bytes + sizeof(header), header.size);
    request.received[buffer] = header.size;
    request.eagerTaken |= 1u << buffer;
    if (request.parts[buffer]) {
      device->cancel(request.parts[buffer], "an eager send filled the buffer");
      request.parts[buffer].reset();
    }
  }
}

Status Engine::test(PluginRequest* request, int* done, int* sizes) {
  return guarded([&] {
    ECCL_CHECK_ARG(request && done, "test: null request or done");
    // NCCL's proxy thread calls test in a loop: it moves the bytes itself
    // rather than waiting for the device's progress thread to wake.
    impl_->device->poll();
    MutexLock lock(impl_->mu);
    *done = 0;
    Channel& comm = *request->channel;
    // Pending, or throws the first failure (NCCL gives up on the whole
    // communicator at the first one).
    auto pending = [&]() ECCL_REQUIRES(impl_->mu) {
      if (!comm.sender) impl_->applyHeadersLocked(*request);
      bool any = !comm.sender && request->applied < request->n;
      for (const RequestPtr* r : {&request->ctsSend, &request->headers[0]}) {
        throwIfFailed(*r);
        any = any || isPending(*r);
      }
      for (int i = 0; i < request->n; ++i) {
        throwIfFailed(request->parts[i]);
        any = any || isPending(request->parts[i]);
      }
      return any;
    };
    try {
      if (pending()) {
        // A stopped process never closes its lanes: a liveness ping finds it.
        if (impl_->device->checkAlive(comm.link->peer, timeoutMs_)) return;
        // The device read everything the peer sent before it failed, and
        // failed what was left: the states are final now.
        if (pending()) {
          impl_->pumpLocked();
          fail(ecclRemoteError, "process {:016x} failed: {}", comm.link->process,
               comm.link->failure.empty() ? "its lanes are gone" : comm.link->failure);
        }
      }
    } catch (const Error&) {
      impl_->settleLocked(*request, false);
      throw;
    }
    impl_->settleLocked(*request, true);
    if (sizes)
      for (int i = 0; i < request->n; ++i)
        sizes[i] = static_cast<int>(comm.sender ? (request->parts[0] ? request->parts[0]->bytes
                                                                      : request->headers[0]->bytes - sizeof(EagerHeader))
                                    : (request->eagerTaken & (1u << i)) ? request->received[i]
                                                                        : request->parts[i]->bytes);
    *done = 1;
    comm.inflight--;
    std::erase(comm.requests, request);
    delete request;
  });
}

}  // namespace eccl::netplugin
