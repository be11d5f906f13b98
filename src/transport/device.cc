#include "transport/lane_device.h"

namespace eccl::transport::lanes {

LaneDevice::LaneDevice(const DeviceOptions& o) : opt_(o) {
  startBackends();
  epollFd_.reset(epoll_create1(EPOLL_CLOEXEC));
  laneEpoll_.reset(epoll_create1(EPOLL_CLOEXEC));
  eventFd_.reset(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!epollFd_ || !laneEpoll_ || !eventFd_)
    fail(ecclSystemError, "epoll/eventfd creation failed: {}", strerror(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeToken;
  epoll_ctl(epollFd_.get(), EPOLL_CTL_ADD, eventFd_.get(), &ev);
  ev.data.u64 = kLanesToken;
  epoll_ctl(epollFd_.get(), EPOLL_CTL_ADD, laneEpoll_.get(), &ev);
  progressThread_ = std::thread([this] { progressLoop(); });
  acceptThread_ = std::thread([this] {
    acceptLoop();
    releaseThreadCryptoState();
  });
}

// Starts the chosen back ends. With the default list (every registered one)
// a back end that cannot start here is left out with a note, unless it is
// the only kind that reaches other hosts; one the user named must start.
void LaneDevice::startBackends() {
  const bool chosen = !opt_.backends.empty();
  std::vector<std::string> names = chosen ? opt_.backends : parseBackendList("auto");
  BackendOptions options{opt_.jobId, opt_.self, opt_.ifname, opt_.ringBytes, opt_.shmZeroCopyBytes,
                         opt_.shmUnlockedWrites, opt_.shmPeerReads};
  std::vector<std::pair<std::string, std::string>> parts;
  std::string where;
  for (const std::string& name : names) {
    auto spec = std::find_if(registeredBackends().begin(), registeredBackends().end(),
                             [&](const BackendSpec& b) { return name == b.name; });
    if (spec == registeredBackends().end())
      fail(ecclInvalidArgument, "member {}: '{}' is not a back end of this build ({})", opt_.self, name,
           registeredBackendNames());
    try {
      backends_.push_back(spec->create(options));
    } catch (const Error& e) {
      if (chosen || (spec->reachesOtherHosts && !spec->needsHardware)) throw;
      if (spec->needsHardware) log::info("member {}: no {} lanes ({})", opt_.self, name, e.what());
      else log::warn("member {}: no {} lanes ({}); going on without them", opt_.self, name, e.what());
      continue;
    }
    parts.emplace_back(name, backends_.back()->address());
    // Network listeners first: they are how people find a member in the logs.
    std::string said = backends_.back()->describe();
    where = spec->reachesOtherHosts ? said + (where.empty() ? "" : " and " + where)
                                    : (where.empty() ? "" : where + " and ") + said;
  }
  if (backends_.empty()) fail(ecclInvalidArgument, "member {}: no back end to use", opt_.self);
  address_ = joinAddress(parts);
  log::info("member {} listening on {}, {} lanes per peer", opt_.self, where, opt_.lanes);
}

LaneDevice::~LaneDevice() {
  stopping_ = true;
  wakeLoop();
  if (progressThread_.joinable()) progressThread_.join();
  if (acceptThread_.joinable()) acceptThread_.join();
  std::vector<Dial> dials;
  {
    MutexLock lock(mu_);
    dials.swap(dials_);
  }
  for (Dial& d : dials) d.thread.join();  // each gives up at stopping_ or its handshake deadline
  MutexLock lock(mu_);
  for (auto& [id, peer] : peers_)
    for (auto& lane : peer.lanes) closeLaneLocked(*lane);
  for (auto& [key, box] : messages_)
    if (box.request) completeLocked(box.request, ecclInvalidUsage, "communicator destroyed");
}

void LaneDevice::wakeLoop() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t rc = ::write(eventFd_.get(), &one, sizeof(one));
}

void LaneDevice::addPeer(MemberId member, const std::string& address, const std::string& label, PeerRole role) {
  auto addr = splitAddress(address);
  MutexLock lock(mu_);
  Peer& p = peers_[member];
  if (p.incarnation == 0) p.incarnation = ++incarnations_;
  p.id = member;
  p.address = addr;
  p.label = label;
  // A view member never becomes a candidate again: a late standby list must
  // not soften the failure of a member promoted meanwhile.
  if (role == PeerRole::kViewMember || p.lanes.empty()) p.role = role;
  if (p.lanes.empty()) {
    for (int i = 0; i < opt_.lanes; ++i) {
      auto lane = std::make_unique<Lane>();
      lane->key = ConnKey{opt_.self, member, static_cast<uint32_t>(i)};
      p.lanes.push_back(std::move(lane));
    }
  }
  // A candidate's failure was nobody's (an eager standby's warm-up dial that
  // did not get through): once the view names it, it gets a fresh start,
  // unless the coordinator had said it failed (a member that died right
  // after its switchover vote, seen first while it was a candidate here).
  if (role == PeerRole::kViewMember && p.state == Peer::State::kFailed && candidateFailed_.erase(member) &&
      !judgedFailed_.count(member)) {
    for (auto& lane : p.lanes) closeLaneLocked(*lane), lane->opened = false, lane->saidGoodbye = false;
    p.state = Peer::State::kIdle;
    p.backend = nullptr;
  }
  installParkedLocked(member);
  if (auto early = failedBeforeKnown_.find(member); early != failedBeforeKnown_.end()) {
    EarlyFailure f = std::move(early->second);
    failedBeforeKnown_.erase(early);
    failPeerLocked(member, f.code, f.reason, /*flood=*/false, f.neededFrom);
  }
  cv_.notifyAll();  // the accept thread may be waiting for this member
}

Peer& LaneDevice::peerLocked(MemberId member) {
  auto it = peers_.find(member);
  if (it == peers_.end()) fail(ecclInvalidArgument, "member {} is not a peer of member {}", member, opt_.self);
  return it->second;
}

std::string LaneDevice::labelLocked(MemberId member) {
  auto it = peers_.find(member);
  return it == peers_.end() ? fmt::format("member {}", member) : it->second.label;
}

// Where peers come from connections (the NCCL plugin), dialing never
// blocks the caller: a post to a member not connected yet queues on its
// lanes, and a thread of its own dials, authenticates and installs them (a
// silent peer holds only that thread). A communicator's post dials inline,
// as it always has: see connectAll for dialing a view's peers at once.
// A failed dial fails the member.
void LaneDevice::connectPeer(MemberId member) {
  std::vector<std::pair<std::string, std::string>> address;
  std::string label;
  std::pair<uint64_t, Secret> credentials;
  {
    MutexLock lock(mu_);
    Peer& p = peerLocked(member);
    // The lower member id opens the connection and the higher one accepts;
    // where peers come from connections, whoever has the address dials.
    const bool dials = opt_.peersFromConnections ? !p.address.empty() : opt_.self < member;
    if (p.state != Peer::State::kIdle || !dials || stopping_) return;
    p.state = Peer::State::kConnecting;
    address = p.address;
    label = p.label;
    credentials = p.credentials.value_or(std::make_pair(opt_.jobId, opt_.secret));
    if (opt_.peersFromConnections) {
      joinFinishedDialsLocked();
      auto finished = std::make_shared<std::atomic<bool>>(false);
      dials_.push_back({std::thread([this, member, address, label, credentials, finished] {
                          dialPeer(member, address, label, credentials);
                          releaseThreadCryptoState();
                          *finished = true;
                        }),
                        finished});
      return;
    }
  }
  dialPeer(member, address, label, credentials);
}

// A dial's thread is joined soon after it ends (here and from the progress
// loop), not only at close: a device that lives as long as its process (the
// net plugin's) would otherwise end it holding finished, unjoined threads.
void LaneDevice::joinFinishedDialsLocked() {
  std::erase_if(dials_, [](Dial& d) {
    if (!*d.finished) return false;
    d.thread.join();
    return true;
  });
}

void LaneDevice::dialPeer(MemberId member, const std::vector<std::pair<std::string, std::string>>& addr,
                          const std::string& label, const std::pair<uint64_t, Secret>& credentials) {
  std::vector<std::unique_ptr<Conduit>> conduits;
  Backend* backend = nullptr;
  try {
    Deadline deadline = deadlineAfterMs(opt_.handshakeTimeoutMs);
    auto giveUp = [this, member] {
      MutexLock lock(mu_);
      auto it = peers_.find(member);
      return stopping_ || it == peers_.end() || it->second.state != Peer::State::kConnecting;
    };
    for (int i = 0; i < opt_.lanes; ++i) {
      std::string what = fmt::format("connecting lane {} to peer {}", i, label);
      Fd stream;
      if (!backend) {
        backend = backendFor(member, addr, deadline, what, giveUp, &stream);
      } else {
        auto part = std::find_if(addr.begin(), addr.end(), [&](auto& p) { return p.first == backend->name(); });
        stream = backend->dial(member, part->second, deadline, what, giveUp);
      }
      if (!stream) fail(ecclRemoteError, "{}: peer no longer reachable over {}", what, backend->name());
      membership::Hello hello{membership::Purpose::kData, credentials.first, opt_.self, member,
                              static_cast<uint32_t>(i)};
      membership::authenticateAsClient(stream.get(), credentials.second, hello, deadline, what);
      conduits.push_back(backend->openDialed(std::move(stream), deadline, what));
    }
  } catch (const Error& e) {
    MutexLock lock(mu_);
    failPeerLocked(member, e.code() == ecclAuthError ? ecclAuthError : ecclRemoteError, e.what(), true);
    return;
  }
  MutexLock lock(mu_);
  Peer& p = peerLocked(member);
  if (p.state != Peer::State::kConnecting) return;  // failed meanwhile
  p.backend = backend;
  for (int i = 0; i < opt_.lanes; ++i) installLaneLocked(p, static_cast<uint32_t>(i), std::move(conduits[i]));
}

// The first back end that reaches the member carries all its lanes.
Backend* LaneDevice::backendFor(MemberId member, const std::vector<std::pair<std::string, std::string>>& address,
                               Deadline deadline, const std::string& what, const std::function<bool()>& giveUp,
                               Fd* stream) {
  std::vector<std::string> tried, mine, localOnly;
  for (auto& backend : backends_) {
    mine.push_back(backend->name());
    auto part = std::find_if(address.begin(), address.end(), [&](auto& p) { return p.first == backend->name(); });
    if (part == address.end()) continue;  // the peer does not listen on it
    *stream = backend->dial(member, part->second, deadline, what, giveUp);
    if (*stream) return backend.get();
    tried.push_back(backend->name());
  }
  for (const BackendSpec& spec : registeredBackends())
    if (!spec.reachesOtherHosts) localOnly.push_back(spec.name);
  fail(ecclInvalidUsage,
       "{}: no back end used here ({}) reaches the peer{} (its address: {}); ECCL_TRANSPORT must name one that "
       "works between these two ({} reach only members on this host and in this network namespace)",
       what, fmt::join(mine, ","),
       tried.empty() ? ", which listens on none of them" : fmt::format(" (tried {})", fmt::join(tried, ", ")),
       joinAddress(address), fmt::join(localOnly, ", "));
}

void LaneDevice::installLaneLocked(Peer& peer, uint32_t index, std::unique_ptr<Conduit> conduit) {
  Lane& lane = *peer.lanes[index];
  lane.conduit = std::move(conduit);
  lane.fast = lane.conduit->fastChannel();
  lane.conduit->attachedTo(peer.id, index);
  if (lane.conduit->pollsMemory()) memoryLanes_.push_back(&lane);
  log::info("member {}: lane {} to peer {} is up over {}", opt_.self, index, peer.label, lane.conduit->kind());
  lane.token = nextToken_++;
  lane.opened = true;
  lane.rx = Lane::Rx::kHeader;
  lane.headerGot = 0;
  lane.rxBegin = lane.rxEnd = 0;
  if (!lane.rxBuffer) lane.rxBuffer.reset(new uint8_t[kRxBufferBytes]);
  lanesByToken_[lane.token] = &lane;
  lane.wantOut = false;
  updateEpollLocked(lane, EPOLL_CTL_ADD);
  stats_.connectionsOpened++;
  stats_.queuePairsOpened += lane.conduit->queuePairs();
  if (closing_) queueControlLocked(lane, FrameType::kGoodbye, goodbyePayloadLocked());
  bool allUp = std::all_of(peer.lanes.begin(), peer.lanes.end(), [](auto& l) { return bool(l->conduit); });
  if (allUp) peer.state = Peer::State::kUp;
  cv_.notifyAll();
  flushLocked(lane);
}

void LaneDevice::closeLaneLocked(Lane& lane) {
  if (!lane.conduit) return;
  eventLocked();
  epoll_ctl(laneEpoll_.get(), EPOLL_CTL_DEL, lane.conduit->pollFd(), nullptr);
  lanesByToken_.erase(lane.token);
  std::erase(memoryLanes_, &lane);
  lane.token = 0;
  stats_.queuePairsClosed += lane.conduit->queuePairs();
  // Nothing lands in an exposed chunk once the connection is gone.
  LaneRendezvous::Closed closed = lane.rendezvous.close(*lane.conduit);
  lane.conduit.reset();
  const std::string peerLabel = labelLocked(lane.key.remote);
  for (const Exposure& e : closed.exposures)
    chunkLandedLocked(e.key, e.chunk.length, /*arrived=*/false, peerLabel);
  for (const Exposure& window : closed.windows) receiveWindowGoneLocked(window.key);
  for (const ChunkRef& chunk : closed.prewrites) prewriteFinishedLocked(lane, chunk);
  lane.sendQueue.clear();
  lane.bulk.reset();
  lane.rxBegin = lane.rxEnd = 0;
  stats_.connectionsClosed++;
}

void LaneDevice::setWantOutLocked(Lane& lane, bool on) {
  if (lane.wantOut == on || !lane.conduit || !lane.conduit->writableByPoll()) return;
  lane.wantOut = on;
  updateEpollLocked(lane, EPOLL_CTL_MOD);
}

void LaneDevice::updateEpollLocked(Lane& lane, int op) {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP | (lane.wantOut ? uint32_t{EPOLLOUT} : 0u);
  ev.data.u64 = lane.token;
  epoll_ctl(laneEpoll_.get(), op, lane.conduit->pollFd(), &ev);
}

void LaneDevice::setCallerOwnedLocked(bool owned) {
  if (callerOwned_ == owned) return;
  callerOwned_ = owned;
  epoll_event ev{};
  ev.events = owned ? 0u : uint32_t{EPOLLIN};
  ev.data.u64 = kLanesToken;
  epoll_ctl(epollFd_.get(), EPOLL_CTL_MOD, laneEpoll_.get(), &ev);
  // The progress thread sleeps with the lanes' timeout (200 ms); it must
  // take the short lease's instead, or lanes a caller stops driving sit
  // unserviced until that timeout ends.
  if (owned) wakeLoop();
}

void LaneDevice::removePeer(MemberId member) {
  MutexLock lock(mu_);
  removePeerLocked(member, 0);
}

bool LaneDevice::removePeerIncarnation(MemberId member, uint64_t incarnation) {
  MutexLock lock(mu_);
  return removePeerLocked(member, incarnation);
}

bool LaneDevice::removePeerLocked(MemberId member, uint64_t incarnation) {
  auto it = peers_.find(member);
  if (it == peers_.end() || (incarnation != 0 && it->second.incarnation != incarnation)) return false;
  Peer& p = it->second;
  eventLocked();
  std::string reason = fmt::format("peer {} is not in the new view", p.label);
  for (auto& lane : p.lanes) {
    failLaneSendsLocked(*lane, ecclRemoteError, reason);
    // A goodbye first, so the leaver sees an orderly close and tells
    // nobody we failed.
    std::erase_if(lane->sendQueue, [](const SendItem& item) { return item.done == 0; });
    lane->bulk.waiting().clear();
    if (lane->conduit && lane->sendQueue.empty()) queueControlLocked(*lane, FrameType::kGoodbye, {});
    closeLaneLocked(*lane);
  }
  for (auto box = messages_.begin(); box != messages_.end();) {
    bool mine = box->first.peer == member;
    if (mine && box->second.request) completeLocked(box->second.request, ecclRemoteError, reason);
    box = mine ? messages_.erase(box) : std::next(box);
  }
  discardOrphanedPayloadsLocked();
  peers_.erase(it);
  if (opt_.peersFromConnections) installRedialsLocked(member);
  return true;
}

void LaneDevice::beginEpoch(uint32_t epoch) {
  MutexLock lock(mu_);
  eventLocked();
  epoch_ = epoch;
  revokedCode_ = ecclSuccess;
  revokedReason_.clear();
  revokedFromSeq_ = 0;
  lastCheckedSeq_ = 0;
  signatures_.beginEpoch(epoch);
  for (auto box = messages_.begin(); box != messages_.end();) {
    bool stale = box->first.epoch < epoch && !FrameHeader::isOutOfView(box->first.seq);
    box = stale ? dropBoxLocked(box, ecclRemoteError, "superseded by a new view") : std::next(box);
  }
  discardOrphanedPayloadsLocked();
}

void LaneDevice::startConnect(MemberId member) { connectPeer(member); }

void LaneDevice::connectNow(MemberId member, Deadline deadline) {
  connectPeer(member);
  MutexLock lock(mu_);
  for (;;) {
    Peer& p = peerLocked(member);
    // A peer that connected, said goodbye and went (a fast rank that did
    // its part and destroyed its communicator before this one got here) is
    // not a failure to connect: what it sent stays receivable, and an op
    // that needs more of it fails then (leftPeerNeededLocked).
    if (p.state == Peer::State::kUp || p.state == Peer::State::kLeft) return;
    if (p.state == Peer::State::kFailed) fail(p.failCode, "connecting to peer {}: {}", p.label, p.failReason);
    if (!cv_.waitUntil(mu_, deadline) && Clock::now() >= deadline) {
      // Every live member dials whatever it must (connectPeers goes on past
      // failures), so a view member still silent here is stopped or cut
      // off: like a wait's deadline, this declares it failed. A candidate's
      // silence only fails this call; the coordinator judges candidates.
      std::string why = fmt::format("peer {} did not connect before the deadline", p.label);
      if (p.role == PeerRole::kViewMember) failPeerLocked(member, ecclTimeout, why, true);
      fail(ecclTimeout, "{}", why);
    }
  }
}

void LaneDevice::abort(const std::string& reason) {
  MutexLock lock(mu_);
  if (aborted_) return;
  aborted_ = true;
  abortReason_ = reason;
  eventLocked();
  for (auto& [id, p] : peers_) {
    for (auto& lane : p.lanes) {
      failLaneSendsLocked(*lane, ecclRemoteError, reason);
      closeLaneLocked(*lane);
    }
  }
  for (const RequestPtr& r : messages_.clear()) completeLocked(r, ecclRemoteError, reason);
  cv_.notifyAll();
}

void LaneDevice::close(Deadline deadline) {
  MutexLock lock(mu_);
  closing_ = true;
  for (auto& [id, p] : peers_)
    for (auto& lane : p.lanes)
      if (lane->conduit) queueControlLocked(*lane, FrameType::kGoodbye, goodbyePayloadLocked());
  for (;;) {
    bool pending = false;
    // Also wait for the peers' goodbyes: closing a socket with unread
    // incoming bytes sends a reset that can destroy data the peer has not
    // read yet.
    for (auto& [id, p] : peers_) {
      // Candidates (standbys) exchange no data; their goodbye is not awaited.
      if (p.state == Peer::State::kFailed || p.state == Peer::State::kLeft || p.role == PeerRole::kCandidate) continue;
      bool partlyConnected = std::any_of(p.lanes.begin(), p.lanes.end(), [](auto& l) { return l->opened; });
      for (auto& lane : p.lanes)
        pending = pending ||
                  (lane->conduit && (lane->hasSends() || !lane->rendezvous.awaitingClearance.empty() || !lane->saidGoodbye)) ||
                  (!lane->opened && partlyConnected);
    }
    if (!pending || !cv_.waitUntil(mu_, std::min(deadline, Clock::now() + std::chrono::milliseconds(10))))
      if (!pending || Clock::now() >= deadline) break;
  }
}

// Accepts and authenticates lanes on every back end's listener through one
// gate, so handshakes run side by side and a silent or hostile connection
// delays no member's. One that comes from a member this device does not
// know yet (it read the address table before we did) is parked rather than
// waited for here, so the lanes behind it are accepted meanwhile; addPeer
// installs it, or it is dropped at its deadline.
void LaneDevice::acceptLoop() {
  membership::GateOptions gateOptions;
  gateOptions.handshakeTimeoutMs = opt_.handshakeTimeoutMs;
  gateOptions.maxPending = static_cast<size_t>(params::maxUnauthenticated());
  membership::HandshakeGate gate(opt_.acceptSecrets ? opt_.acceptSecrets : membership::singleJob(opt_.secret, opt_.jobId),
                                 gateOptions, fmt::format("member {}", opt_.self));
  for (auto& owned : backends_) {
    Backend* b = owned.get();
    gate.addListener(b->listenFd(), [b](std::string* from) { return b->accept(from); });
  }
  uint64_t countedAtGate = 0;
  while (!stopping_) {
    std::vector<membership::Admitted> admitted;
    try {
      admitted = gate.runOnce(100);
    } catch (const std::exception& e) {
      log::warn("member {}: accepting connections: {}", opt_.self, e.what());
    }
    {
      MutexLock lock(mu_);
      dropExpiredParkedLocked();
      uint64_t rejectedAtGate = gate.stats().rejected();
      stats_.connectionsRejected += rejectedAtGate - countedAtGate;
      countedAtGate = rejectedAtGate;
    }
    for (auto& a : admitted) acceptOne(*backends_[a.listener], std::move(a));
  }
}

void LaneDevice::acceptOne(Backend& backend, membership::Admitted admitted) {
  const membership::Hello& hello = admitted.hello;
  std::string what = fmt::format("member {}: incoming {} connection from {}", opt_.self, backend.name(), admitted.from);
  try {
    Deadline deadline = deadlineAfterMs(opt_.handshakeTimeoutMs);
    if (hello.purpose != membership::Purpose::kData || hello.toMember != opt_.self)
      fail(ecclAuthError, "{}: hello is for member {}, purpose {}", what, hello.toMember,
           static_cast<int>(hello.purpose));
    auto conduit = backend.openAccepted(std::move(admitted.fd), deadline, what);
    MutexLock lock(mu_);
    if (opt_.peersFromConnections) {
      Peer* p = arrivedPeerLocked(hello.fromMember, hello.lane, hello.jobId, admitted.from);
      if (!p) {
        parked_.push_back({hello.fromMember, hello.lane, &backend, std::move(conduit), deadline, what,
                           /*redial=*/true, hello.jobId, admitted.from});
        return;
      }
      acceptLaneLocked(p->id, hello.lane, &backend, std::move(conduit), what);
      return;
    }
    if (!peers_.count(hello.fromMember)) {
      parked_.push_back({hello.fromMember, hello.lane, &backend, std::move(conduit), deadline, what, false, 0, {}});
      return;
    }
    acceptLaneLocked(hello.fromMember, hello.lane, &backend, std::move(conduit), what);
  } catch (const std::exception& e) {
    MutexLock lock(mu_);
    stats_.connectionsRejected++;
    log::warn("rejected {}", e.what());
  }
}

void LaneDevice::acceptLaneLocked(MemberId from, uint32_t laneIndex, Backend* backend,
                                  std::unique_ptr<Conduit> conduit, const std::string& what) {
  Peer& p = peers_.at(from);
  if (laneIndex >= p.lanes.size() || p.lanes[laneIndex]->opened || p.state == Peer::State::kFailed ||
      p.state == Peer::State::kLeft || (!opt_.peersFromConnections && from >= opt_.self))
    fail(ecclAuthError, "{}: unexpected lane {} from member {}", what, laneIndex, from);
  if (p.backend && p.backend != backend)
    fail(ecclAuthError, "{}: lane {} from member {} came over {}, its other lanes over {}", what, laneIndex, from,
         backend->name(), p.backend->name());
  p.backend = backend;
  installLaneLocked(p, laneIndex, std::move(conduit));
}

// A member that dialed in unannounced (peers from connections): its lanes
// go to a candidate peer of their own, created by its first lane. A lane
// whose place is taken is a new dial: that process dropped the lanes we
// hold (it dials only when it has none), so they are failed, even if their
// goodbye has not been read yet. The new lanes wait (parked) until the
// consumer lets go of the old peer (removePeer): until then the name means
// the old lanes, and nothing the consumer still does with them (a reply,
// a receive re-posted, a close) may reach the new ones.
Peer* LaneDevice::arrivedPeerLocked(MemberId member, uint32_t lane, uint64_t jobId, const std::string& from) {
  const MemberId id = inboundPeer(member);
  auto it = peers_.find(id);
  if (it == peers_.end()) return &newArrivedPeerLocked(member, jobId, from);
  bool dead = it->second.state == Peer::State::kFailed || it->second.state == Peer::State::kLeft;
  bool redialed = !dead && lane < it->second.lanes.size() && it->second.lanes[lane]->opened;
  if (!dead && !redialed) return &it->second;
  if (redialed)
    failPeerLocked(id, ecclRemoteError, fmt::format("{} dialed anew (its earlier lanes were dropped)", it->second.label),
                   /*flood=*/false);
  return nullptr;
}

// The consumer let go of `id`: a fresh dial parked under it gets the name.
void LaneDevice::installRedialsLocked(MemberId id) {
  Peer* p = nullptr;
  for (auto it = parked_.begin(); it != parked_.end();) {
    if (!it->redial || inboundPeer(it->from) != id) {
      ++it;
      continue;
    }
    try {
      if (!p) p = &newArrivedPeerLocked(it->from, it->jobId, it->address);
      acceptLaneLocked(id, it->lane, it->backend, std::move(it->conduit), it->what);
    } catch (const Error& e) {
      stats_.connectionsRejected++;
      log::warn("rejected {}", e.what());
    }
    it = parked_.erase(it);
  }
}

Peer& LaneDevice::newArrivedPeerLocked(MemberId member, uint64_t jobId, const std::string& from) {
  const MemberId id = inboundPeer(member);
  candidateFailed_.erase(id);
  Peer& p = peers_[id];
  p.incarnation = ++incarnations_;
  p.id = id;
  p.label = fmt::format("process {:016x} ({})", member, from);
  p.role = PeerRole::kCandidate;
  for (int i = 0; i < opt_.lanes; ++i) {
    auto lane = std::make_unique<Lane>();
    lane->key = ConnKey{opt_.self, id, static_cast<uint32_t>(i)};
    p.lanes.push_back(std::move(lane));
  }
  if (onPeerArrived) onPeerArrived(id, jobId);
  return p;
}

void LaneDevice::installParkedLocked(MemberId member) {
  for (auto it = parked_.begin(); it != parked_.end();) {
    if (it->from != member || it->redial) {
      ++it;
      continue;
    }
    try {
      acceptLaneLocked(it->from, it->lane, it->backend, std::move(it->conduit), it->what);
    } catch (const Error& e) {
      stats_.connectionsRejected++;
      log::warn("rejected {}", e.what());
    }
    it = parked_.erase(it);
  }
}

void LaneDevice::dropExpiredParkedLocked() {
  for (auto it = parked_.begin(); it != parked_.end();) {
    if (!stopping_ && Clock::now() < it->deadline) {
      ++it;
      continue;
    }
    stats_.connectionsRejected++;
    if (it->redial)
      log::warn("rejected {}: the lanes it replaces were never let go of", it->what);
    else
      log::warn("rejected {}: member {} is not a member of this communicator", it->what, it->from);
    it = parked_.erase(it);
  }
}

}  // namespace eccl::transport::lanes

namespace eccl::transport {

std::unique_ptr<Device> createDevice(const DeviceOptions& options) {
  return std::make_unique<lanes::LaneDevice>(options);
}

}  // namespace eccl::transport
