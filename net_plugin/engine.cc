#include "net_plugin/engine.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "common/params.h"
#include "net_plugin/engine_state.h"
#include "net_plugin/handle.h"
#include "transport/backend.h"

namespace eccl::netplugin {
namespace {

Mac openProof(const Secret& token, const ControlMessage& m) {
  ControlMessage bound = m;
  bound.proof = {};
  return hmacSha256(token, &bound, sizeof(bound));
}

}  // namespace

thread_local std::string t_lastError;

Status fromError(const Error& e) {
  t_lastError = e.what();
  switch (e.code()) {
    case ecclInvalidArgument: return Status::kInvalidArgument;
    case ecclInvalidUsage: return Status::kInvalidUsage;
    case ecclSystemError: return Status::kSystemError;
    case ecclInternalError: return Status::kInternalError;
    case ecclLogFull: return Status::kSystemError;  // this process's log, not a peer
    default: return Status::kRemoteError;  // a peer failed, timed out, refused us, or left
  }
}

Engine& Engine::get() {
  // Built once and never freed: the pool must outlive every communicator,
  // and NCCL may unload the plugin while another one still uses it.
  static Engine* engine = [] {
    transport::DeviceOptions o;
    do randomBytes(&o.self, sizeof(o.self));
    while ((o.self & ~Device::kInboundPeerBit) == 0);
    o.self &= ~Device::kInboundPeerBit;
    o.commId = kCommId;
    o.lanes = static_cast<int>(params::socketsPerPeer());
    o.stripeMinBytes = params::stripeMinBytes();
    o.handshakeTimeoutMs = std::min<int64_t>(params::handshakeTimeoutMs(), params::timeoutMs());
    o.ifname = params::socketIfname();
    o.pinProgressThread = false;  // NCCL places its own threads
    if (std::string choice = params::transport(); choice != "auto") o.backends = transport::parseBackendList(choice);
    o.ringBytes = static_cast<size_t>(params::shmRingBytes());
    o.peersFromConnections = true;
    o.zeroCopy = false;  // NCCL cancels requests in flight (its comms close with them)
    return new Engine(o);
  }();
  return *engine;
}

Engine::Engine(const transport::DeviceOptions& options) : impl_(std::make_unique<Impl>()), timeoutMs_(params::timeoutMs()) {
  Impl* impl = impl_.get();
  impl->poolIdleMs = params::netPoolIdleMs();
  impl->eagerBytes = static_cast<uint64_t>(std::clamp<int64_t>(params::netEagerBytes(), 0, kMaxEagerBytes));
  if (impl->eagerBytes != static_cast<uint64_t>(params::netEagerBytes()))
    log::warn("net plugin: ECCL_NET_EAGER_BYTES={} is outside 0..{}; using {}", params::netEagerBytes(),
              kMaxEagerBytes, impl->eagerBytes);
  impl->lanes = static_cast<uint32_t>(options.lanes);
  transport::DeviceOptions o = options;
  // Dials prove a live listen comm's token (tokens: a leaf lock).
  o.acceptSecrets = [impl](uint64_t listenId) -> std::optional<Secret> {
    MutexLock lock(impl->tokensMu);
    auto it = impl->tokens.find(listenId);
    return it == impl->tokens.end() ? std::nullopt : std::optional<Secret>(it->second);
  };
  impl->device = transport::createDevice(o);
  impl->device->setEpoch(1);
  impl->device->onPeerArrived = [impl](MemberId peer, uint64_t) {
    std::lock_guard<std::mutex> lock(impl->eventsMu);
    impl->arrived.push_back(peer);
  };
  impl->device->onPeerFailure = [impl](MemberId peer, ecclResult_t, const std::string& why, uint64_t, transport::FailureEvidence) {
    std::lock_guard<std::mutex> lock(impl->eventsMu);
    impl->failed.emplace_back(peer, why);
  };
  log::info("net plugin: process {:016x} at {}", o.self, impl->device->address());
  // The coordinator's word that a process died fails our lanes to it at
  // once (in either direction), and with them every comm over them.
  impl->job = JobLink::join(o.self, impl->device->address(), [impl](uint64_t process, const std::string& why) {
    std::string reason = fmt::format("the job's coordinator: {}", why);
    impl->device->failPeer(process, ecclRemoteError, reason);
    impl->device->failPeer(Device::inboundPeer(process), ecclRemoteError, reason);
  });
  if (params::netLogBytes() > 0) configureLogFromEnv();
  // A process that exits in order (exit(), not a crash) says so, or the
  // others would take its closed coordinator connection for a failure
  // and fail their last receives from it. A child forked later (a data
  // loader's worker) inherits the handler but not the registration.
  static const pid_t registered = getpid();
  if (impl->job)
    std::atexit([] {
      if (getpid() == registered) Engine::get().impl_->job->leaveJob();
    });
  // Opens and refusals must be answered, and idle lanes closed, even while
  // this process makes no plugin call (its NCCL is busy elsewhere, or done
  // with the peer): a service thread pumps every few milliseconds. The
  // engine is never destroyed, so neither is the thread's state.
  std::thread([impl] {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      MutexLock lock(impl->mu);
      try {
        impl->pumpLocked();
      } catch (const std::exception& e) {  // one pass lost, never the process
        log::warn("net plugin: service thread: {}", e.what());
      }
    }
  }).detach();
}

Engine::~Engine() = default;

std::string Engine::lastError() { return t_lastError; }

Link& Engine::Impl::addLinkLocked(MemberId peer, uint64_t process) {
  auto& slot = links[peer];
  // A failed link that comms still name stays until they close.
  if (slot && slot->channels > 0) retired.push_back(std::move(slot));
  slot = std::make_unique<Link>();
  slot->peer = peer;
  slot->process = process;
  slot->incarnation = device->peerIncarnation(peer);
  log::trace("net plugin: link to process {:016x} via peer {:016x}", process, peer);
  postControlRecvLocked(*slot);
  stats.linksOpen = links.size();
  return *slot;
}

// Lanes to a process in either direction serve any channel to it, unless
// they are being closed.
Link* Engine::Impl::linkToLocked(uint64_t process) {
  for (MemberId id : {process, Device::inboundPeer(process)}) {
    auto it = links.find(id);
    if (it != links.end() && it->second->failure.empty() && device->hasPeer(id) &&
        it->second->closing == Link::Closing::kNo)
      return it->second.get();
  }
  return nullptr;
}

bool Engine::Impl::closingLinkToLocked(uint64_t process) {
  for (MemberId id : {process, Device::inboundPeer(process)}) {
    auto it = links.find(id);
    if (it != links.end() && it->second->failure.empty() && it->second->closing != Link::Closing::kNo) return true;
  }
  return false;
}

void Engine::Impl::sendControlTypeLocked(Link& link, ControlType type) {
  ControlMessage m;
  m.type = static_cast<uint32_t>(type);
  m.from = device->self();
  m.to = link.process;
  sendControlLocked(link, m);
}

void Engine::Impl::postControlRecvLocked(Link& link) {
  link.controlRecv = device->irecv(link.peer, kControlSeq | link.controlExpected, kControlTag, &link.controlIn,
                                   sizeof(link.controlIn));
}

void Engine::Impl::sendControlLocked(Link& link, const ControlMessage& m) {
  auto owned = std::make_unique<ControlMessage>(m);
  link.controlOutRequests.push_back(
      device->isend(link.peer, kControlSeq | link.controlSent++, kControlTag, owned.get(), sizeof(*owned)));
  link.controlOut.push_back(std::move(owned));
}

void Engine::Impl::onControlLocked(Link& link, const ControlMessage& m) {
  const std::string who = fmt::format("process {:016x}", link.process);
  log::trace("net plugin: control {} (channel {}) from {} via peer {:016x}, {} channels", m.type, m.channel, who,
             link.peer, link.channels);
  if (m.type == static_cast<uint32_t>(ControlType::kOpen)) {
    auto it = listens.find(m.listenId);
    std::string refusal;
    if (it == listens.end())
      refusal = fmt::format("listen comm {:016x} is closed or never existed here (a stale handle)", m.listenId);
    else if (m.to != device->self() || m.from != link.process || !macEqual(m.proof, openProof(it->second->token, m)))
      refusal = fmt::format("its proof of listen comm {:016x}'s token is wrong (a forged or stale handle)", m.listenId);
    else if (m.eagerBytes > kMaxEagerBytes)
      refusal = fmt::format("its eager bound of {} bytes is above {}", m.eagerBytes, kMaxEagerBytes);
    // The answer either way: an eager send waits for it, so no byte is
    // taken over a comm the listener never honoured.
    ControlMessage answer;
    answer.type = static_cast<uint32_t>(refusal.empty() ? ControlType::kAccept : ControlType::kRefuse);
    answer.channel = m.channel;
    answer.from = device->self();
    answer.to = link.process;
    sendControlLocked(link, answer);
    if (!refusal.empty()) {
      log::warn("net plugin: refused channel {} from {}: {}", m.channel, who, refusal);
      return;
    }
    auto* channel = new Channel;
    channel->link = &link;
    channel->id = m.channel;
    channel->eagerBytes = m.eagerBytes;
    link.channels++;
    it->second->ready.push_back(channel);
    return;
  }
  if (m.type == static_cast<uint32_t>(ControlType::kClosing)) {
    // Agreed only with no channel of ours over these lanes (an open we
    // sent is one): we use them no more; they go with the asker's goodbye.
    if (link.channels > 0) {
      sendControlTypeLocked(link, ControlType::kStay);
      return;
    }
    sendControlTypeLocked(link, ControlType::kCloseOk);
    link.closing = Link::Closing::kAgreed;
    return;
  }
  if (m.type == static_cast<uint32_t>(ControlType::kCloseOk)) {
    if (link.channels == 0 && link.closing != Link::Closing::kNo) {
      link.closeNow = true;
      return;
    }
    // A channel of theirs opened after we asked and is still ours to close
    // (they may be done with their end and agreed since), or we stopped
    // asking: the lanes stay, and they must hear it, or they wait for our
    // goodbye for ever.
    link.closing = Link::Closing::kNo;
    link.idleSince = Clock::now();
    sendControlTypeLocked(link, ControlType::kStay);
    return;
  }
  if (m.type == static_cast<uint32_t>(ControlType::kStay)) {
    link.closing = Link::Closing::kNo;
    link.idleSince = Clock::now();
    return;
  }
  if (m.type == static_cast<uint32_t>(ControlType::kAccept)) {
    link.accepted.insert(m.channel);
    return;
  }
  if (m.type == static_cast<uint32_t>(ControlType::kRefuse)) {
    // The lanes are fine; only that channel is refused.
    link.refused[m.channel] = fmt::format("{} refused the connection (a wrong token, its listen comm is closed, or it refused our eager bound)", who);
    log::warn("net plugin: {}", link.refused[m.channel]);
    return;
  }
  log::warn("net plugin: {} sent an unknown control message (type {}); ignored", who, m.type);
}

// Applies what the device reported, reads control messages, and retires
// finished control sends: the service thread, connect and accept run it.
void Engine::Impl::pumpLocked(bool reap) {
  std::vector<MemberId> newPeers;
  std::vector<std::pair<MemberId, std::string>> failures;
  {
    std::lock_guard<std::mutex> lock(eventsMu);
    newPeers.swap(arrived);
    failures.swap(failed);
  }
  // A control receive that failed: the lanes are gone (the other side said
  // goodbye, or failed), whether or not the device called it a failure. Seen
  // before arrivals, so the same process dialing anew gets a new link.
  for (auto& [peer, link] : links)
    if (link->failure.empty() && link->controlRecv && link->controlRecv->state.load() == Request::kFailed) {
      link->failure = link->controlRecv->error.empty() ? "its lanes closed" : link->controlRecv->error;
      log::trace("net plugin: lanes to process {:016x} via peer {:016x} gone: {}", link->process, peer, link->failure);
    }
  for (auto& [peer, why] : failures) {
    auto it = links.find(peer);
    if (it == links.end() || !it->second->failure.empty()) continue;
    it->second->failure = why;
    log::warn("net plugin: lanes to process {:016x} failed: {}", it->second->process, why);
  }
  // A failed link's device peer is let go of at once (comms naming the
  // link fail by its failure): a fresh dial from that process waits in the
  // device until then, so nothing done with the old link reaches it.
  for (auto& [peer, link] : links)
    if (!link->failure.empty() && !link->released) {
      device->removePeerIncarnation(link->peer, link->incarnation);
      link->released = true;
    }
  // An arrival is a new device peer: the link we hold under its name, if
  // any, failed and was let go of above, or the news is one we acted on.
  for (MemberId peer : newPeers) {
    auto it = links.find(peer);
    if (it != links.end() && it->second->failure.empty() && it->second->incarnation == device->peerIncarnation(peer))
      continue;
    addLinkLocked(peer, peer & ~Device::kInboundPeerBit).lanesUp = true;
  }
  for (auto& [peer, link] : links) {
    if (!link->failure.empty()) continue;
    while (link->controlRecv && link->controlRecv->state.load() == Request::kDone) {
      ControlMessage m = link->controlIn;
      link->controlExpected++;
      postControlRecvLocked(*link);
      onControlLocked(*link, m);
    }
    for (size_t i = 0; i < link->controlOutRequests.size();) {
      if (link->controlOutRequests[i]->state.load() == Request::kPending) {
        ++i;
        continue;
      }
      link->controlOutRequests.erase(link->controlOutRequests.begin() + static_cast<long>(i));
      link->controlOut.erase(link->controlOut.begin() + static_cast<long>(i));
    }
  }
  if (reap) reapIdleLocked();
}

// Pooled lanes nobody has used for a while are closed, once both sides
// agree: we ask (kClosing); the other side agrees (kCloseOk) only if no
// channel of its own uses them, an open it sent included, and from then on
// neither side opens channels over them (a connect waits, then dials
// anew). The device says goodbye on them, so the other end closes quietly.
void Engine::Impl::reapIdleLocked() {
  const auto now = Clock::now();
  const auto bound = std::chrono::milliseconds(poolIdleMs);
  for (auto it = links.begin(); it != links.end();) {
    Link& link = *it->second;
    bool dead = !link.failure.empty() && link.channels == 0;
    if (!dead && link.failure.empty() && link.channels == 0 && link.closing == Link::Closing::kNo &&
        now - link.idleSince >= bound && device->hasPeer(link.peer)) {
      log::trace("net plugin: asking process {:016x} to close peer {:016x}", link.process, link.peer);
      sendControlTypeLocked(link, ControlType::kClosing);
      link.closing = Link::Closing::kAsked;
      link.closeAsked = now;
    }
    // No answer within the bound: the other side is gone or hung. (An
    // agreeing side waits for the asker's goodbye: until then a dial of
    // ours could meet its old lanes.)
    bool unanswered = link.closing == Link::Closing::kAsked &&
                      now - link.closeAsked >= std::max(bound, std::chrono::milliseconds(1000));
    bool idle = link.channels == 0 && (link.closeNow || unanswered);
    if (!idle && !dead) {
      ++it;
      continue;
    }
    if (idle) log::info("net plugin: closing idle pooled lanes to process {:016x}", link.process);
    // Only the lanes this link knew: the process may have dialed anew
    // since this pass read the device's news.
    device->removePeerIncarnation(link.peer, link.incarnation);
    it = links.erase(it);
  }
  stats.linksOpen = links.size();
}

Status Engine::listen(void* handle, ListenComm** comm) {
  return guarded([&] {
    ECCL_CHECK_ARG(handle && comm, "listen: handle and listenComm must not be null");
    auto listen = std::make_unique<ListenComm>();
    do randomBytes(&listen->listenId, sizeof(listen->listenId));
    while (listen->listenId == 0);
    randomBytes(listen->token.data(), listen->token.size());
    ListenHandle h{impl_->device->self(), listen->listenId, listen->token, impl_->device->address()};
    encodeHandle(h, handle);
    {
      MutexLock tokens(impl_->tokensMu);
      impl_->tokens[listen->listenId] = listen->token;
    }
    MutexLock lock(impl_->mu);
    impl_->listens[listen->listenId] = listen.get();
    *comm = listen.release();
  });
}

Status Engine::connect(const void* handle, Channel** comm) {
  return guarded([&] {
    ECCL_CHECK_ARG(handle && comm, "connect: handle and sendComm must not be null");
    *comm = nullptr;
    ListenHandle h;
    std::string why;
    if (!decodeHandle(handle, &h, &why)) fail(ecclInvalidArgument, "connect: {}", why);
    if (h.process == 0 || (h.process & Device::kInboundPeerBit))
      fail(ecclInvalidArgument, "connect: listen handle names no process");
    MutexLock lock(impl_->mu);
    impl_->pumpLocked();
    Link* link = impl_->linkToLocked(h.process);
    if (!link && impl_->closingLinkToLocked(h.process)) return;  // the pair is agreeing on a close: call again
    if (!link) {
      if (auto old = impl_->links.find(h.process); old != impl_->links.end()) {
        // Lanes that failed or were closed: dial anew (a new peer entry).
        if (old->second->channels > 0 && !old->second->failure.empty())
          fail(ecclRemoteError, "connect: process {:016x} failed: {}", h.process, old->second->failure);
        impl_->device->removePeer(h.process);
        if (old->second->channels > 0) impl_->retired.push_back(std::move(old->second));
        impl_->links.erase(old);
      }
      impl_->device->addPeer(h.process, h.address, fmt::format("process {:016x}", h.process),
                             Device::PeerRole::kCandidate);
      impl_->device->setPeerCredentials(h.process, h.listenId, h.token);
      impl_->device->startConnect(h.process);
      link = &impl_->addLinkLocked(h.process, h.process);
    }
    if (!link->lanesUp) {
      if (!impl_->device->checkAlive(link->peer, timeoutMs_)) {
        impl_->pumpLocked(/*reap=*/false);  // collects the reason the device gave
        fail(ecclRemoteError, "connect: process {:016x} could not be reached: {}", h.process,
             link->failure.empty() ? "its lanes are gone" : link->failure);
      }
      if (impl_->device->lanesUp(link->peer) < impl_->lanes) return;  // still dialing: NCCL calls again
      link->lanesUp = true;
      impl_->stats.channelsOpened++;
    } else {
      impl_->stats.channelsReused++;
    }
    ControlMessage open;
    open.type = static_cast<uint32_t>(ControlType::kOpen);
    open.channel = link->nextChannel++;
    open.listenId = h.listenId;
    open.from = impl_->device->self();
    open.to = h.process;
    open.eagerBytes = impl_->eagerBytes;
    open.proof = openProof(h.token, open);
    impl_->sendControlLocked(*link, open);
    auto* channel = new Channel;
    channel->link = link;
    channel->id = open.channel;
    channel->sender = true;
    channel->eagerBytes = impl_->eagerBytes;
    link->channels++;
    *comm = channel;
  });
}

Status Engine::accept(ListenComm* listen, Channel** comm) {
  return guarded([&] {
    ECCL_CHECK_ARG(listen && comm, "accept: listenComm and recvComm must not be null");
    MutexLock lock(impl_->mu);
    impl_->pumpLocked();
    *comm = nullptr;
    if (listen->ready.empty()) return;
    *comm = listen->ready.front();
    listen->ready.pop_front();
  });
}

Status Engine::closeChannel(Channel* comm) {
  return guarded([&] {
    ECCL_CHECK_ARG(comm, "close: null comm");
    MutexLock lock(impl_->mu);
    Link& link = *comm->link;
    // NCCL's abort closes comms with requests in flight and frees their
    // buffers: the device must let go of them first.
    for (PluginRequest* r : comm->requests) {
      impl_->settleLocked(*r, false);
      for (int i = 0; i < r->n; ++i)
        for (RequestPtr* part : {&r->parts[i], &r->headers[i]})
          if (*part) impl_->device->cancel(*part, "the comm was closed");
      if (r->ctsSend) impl_->device->cancel(r->ctsSend, "the comm was closed");
      delete r;
    }
    for (auto& [ctsRequest, cts] : comm->cts) impl_->device->cancel(ctsRequest, "the comm was closed");
    if (--link.channels == 0) link.idleSince = Clock::now();
    link.refused.erase(comm->id);
    link.accepted.erase(comm->id);
    delete comm;
    std::erase_if(impl_->retired, [](const std::unique_ptr<Link>& l) { return l->channels == 0; });
    impl_->pumpLocked();
  });
}

Status Engine::closeListen(ListenComm* listen) {
  return guarded([&] {
    ECCL_CHECK_ARG(listen, "closeListen: null listen comm");
    {
      MutexLock tokens(impl_->tokensMu);
      impl_->tokens.erase(listen->listenId);
    }
    MutexLock lock(impl_->mu);
    impl_->listens.erase(listen->listenId);
    for (Channel* c : listen->ready) {
      if (--c->link->channels == 0) c->link->idleSince = Clock::now();
      delete c;
    }
    delete listen;
    std::erase_if(impl_->retired, [](const std::unique_ptr<Link>& l) { return l->channels == 0; });
  });
}

EngineStats Engine::stats() {
  MutexLock lock(impl_->mu);
  EngineStats s = impl_->stats;
  s.connectionsOpened = impl_->device->stats().connectionsOpened;
  return s;
}

}  // namespace eccl::netplugin
