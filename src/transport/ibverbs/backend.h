// The ibverbs back end: lanes over RC queue pairs (RingLane), for members
// whose hosts have an RDMA device (InfiniBand or RoCE; Soft-RoCE in the
// tests). A member's address part is its bootstrap listener (ip:port): a
// dial is a TCP stream, authenticated by the device like any other, over
// which the two ends exchange their queue pairs' endpoints and their
// rings' addresses and keys; it then stays open as the lane's liveness
// line. In the default back-end list it is left out where no device has
// an ACTIVE port; ECCL_TRANSPORT=ib makes its absence an error.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/netif.h"
#include "transport/backend.h"
#include "transport/ibverbs/verbs.h"

namespace eccl::transport::ibverbs {

class IbBackend final : public Backend {
 public:
  explicit IbBackend(const BackendOptions& options);
  const char* name() const override { return "ib"; }
  std::string address() const override { return address_.str(); }
  std::string describe() const override;
  int listenFd() const override { return listenFd_.get(); }
  BackendCounters counters() const override {
    // The cache's statistics are read without the device lock that guards
    // its use: a relaxed counter is enough for them.
    return {context_->queuePairsCreated(), context_->queuePairsDestroyed(), context_->completionQueuesOpen(),
            registrationsReused_.load(std::memory_order_relaxed)};
  }
  Fd dial(MemberId member, const std::string& address, Deadline deadline, const std::string& what,
          const std::function<bool()>& giveUp) override;
  Fd accept(std::string* from) override;
  std::unique_ptr<Conduit> openDialed(Fd stream, Deadline deadline, const std::string& what) override;
  std::unique_ptr<Conduit> openAccepted(Fd stream, Deadline deadline, const std::string& what) override;

 private:
  std::unique_ptr<Conduit> open(Fd stream, bool dialer, Deadline deadline, const std::string& what);
  // A completion queue with room for one more lane (dials and accepts run
  // on several threads at once).
  std::shared_ptr<SharedCompletions> completionsForALane();
  BackendOptions opt_;
  std::unique_ptr<Context> context_;
  // ECCL_IB_REGISTRATION_CACHE_BYTES > 0: zero-copy registrations kept
  // (used by the lanes under the device lock only).
  std::unique_ptr<RegistrationCache> registrations_;
  std::atomic<uint64_t> registrationsReused_{0};
  Mutex completionsMu_;
  std::vector<std::shared_ptr<SharedCompletions>> completions_ ECCL_GUARDED_BY(completionsMu_);
  NetInterface nic_;
  SockAddr address_;
  Fd listenFd_;
};

BackendSpec backendSpec();

}  // namespace eccl::transport::ibverbs
