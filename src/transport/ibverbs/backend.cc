#include "transport/ibverbs/backend.h"

#include <sys/socket.h>

#include "common/error.h"
#include "common/params.h"
#include "common/socket.h"
#include "transport/ibverbs/ring_lane.h"

namespace eccl::transport::ibverbs {

IbBackend::IbBackend(const BackendOptions& options)
    : opt_(options), context_(Context::open(params::ibHca(), static_cast<int>(params::ibGidIndex()))) {
  ECCL_CHECK_ARG(RingLane::validRingBytes(opt_.ringBytes),
                 "ibverbs ring size {} must be a power of two between 4 KiB and 1 GiB", opt_.ringBytes);
  if (int64_t cap = params::ibRegistrationCacheBytes(); cap > 0)
    registrations_ = std::make_unique<RegistrationCache>(*context_, static_cast<size_t>(cap));
  nic_ = pickInterface(options.ifname);
  auto [fd, bound] = listenOn(nic_.addr);
  listenFd_ = std::move(fd);
  address_ = bound;
  setNonBlocking(listenFd_.get(), true);
}

std::string IbBackend::describe() const {
  return fmt::format("RDMA {} (bootstrap {} on {})", context_->describe(), address_.str(), nic_.name);
}

Fd IbBackend::dial(MemberId, const std::string& address, Deadline deadline, const std::string& what,
                   const std::function<bool()>& giveUp) {
  return connectTo(SockAddr::parse(address), deadline, what, giveUp);
}

Fd IbBackend::accept(std::string* from) {
  SockAddr peer;
  Fd fd = acceptPending(listenFd_.get(), &peer);
  if (fd && from) *from = peer.str();
  return fd;
}

// Over the authenticated stream: each end's offer (the dialer's first),
// both queue pairs to RTS, then one byte each way, so neither writes
// before the other can receive. Nothing more is sent on the stream.
std::unique_ptr<Conduit> IbBackend::open(Fd stream, bool dialer, Deadline deadline, const std::string& what) {
  const int fd = stream.get();
  auto lane = std::make_unique<RingLane>(*context_, std::move(stream), opt_.ringBytes, what,
                                         static_cast<size_t>(std::max<int64_t>(0, params::ibZeroCopyBytes())),
                                         completionsForALane(), registrations_.get(), &registrationsReused_);
  LaneOffer mine = lane->offer(), theirs{};
  if (dialer) sendAll(fd, &mine, sizeof(mine), deadline, what + ": sending the queue pair's offer");
  recvAll(fd, &theirs, sizeof(theirs), deadline, what + ": receiving the peer's queue pair offer");
  if (!dialer) sendAll(fd, &mine, sizeof(mine), deadline, what + ": sending the queue pair's offer");
  lane->connect(theirs);
  char ready = 1, peerReady = 0;
  sendAll(fd, &ready, 1, deadline, what + ": saying the queue pair is ready");
  recvAll(fd, &peerReady, 1, deadline, what + ": waiting for the peer's queue pair");
  return lane;
}

std::unique_ptr<Conduit> IbBackend::openDialed(Fd stream, Deadline deadline, const std::string& what) {
  return open(std::move(stream), true, deadline, what);
}

std::unique_ptr<Conduit> IbBackend::openAccepted(Fd stream, Deadline deadline, const std::string& what) {
  return open(std::move(stream), false, deadline, what);
}

// One queue for up to 64 lanes; a device that cannot make one that large
// gets one per lane.
std::shared_ptr<SharedCompletions> IbBackend::completionsForALane() {
  constexpr uint32_t kLanesPerQueue = 64;
  MutexLock lock(completionsMu_);
  for (auto& shared : completions_)
    if (shared->reserve(RingLane::kCompletionEntries)) return shared;
  std::shared_ptr<SharedCompletions> fresh;
  try {
    fresh = std::make_shared<SharedCompletions>(*context_, kLanesPerQueue * RingLane::kCompletionEntries);
  } catch (const Error&) {
    fresh = std::make_shared<SharedCompletions>(*context_, RingLane::kCompletionEntries);
  }
  fresh->reserve(RingLane::kCompletionEntries);
  completions_.push_back(fresh);
  return fresh;
}

BackendSpec backendSpec() {
  return {"ib", /*reachesOtherHosts=*/true,
          [](const BackendOptions& o) -> std::unique_ptr<Backend> { return std::make_unique<IbBackend>(o); },
          /*needsHardware=*/true};
}

}  // namespace eccl::transport::ibverbs
