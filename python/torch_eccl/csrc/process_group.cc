// Setup, the driver plumbing, and the fault-tolerance calls of the backend.
#include "process_group.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <variant>

#include "handle.h"
#include "streams.h"
#include "tensors.h"

namespace torch_eccl {

namespace {


std::mutex liveMu;
std::set<ProcessGroupEccl*> live;

ecclUniqueId idFromText(const std::string& text) {
  ecclUniqueId id;
  ecclResult_t r = ecclUniqueIdFromString(text.c_str(), &id);
  TORCH_CHECK_VALUE(r == ecclSuccess, "eccl: malformed job id: ", ecclGetLastError(nullptr));
  return id;
}

ecclConfig_t configFor(std::chrono::milliseconds timeout) {
  ecclConfig_t config{};
  config.size = sizeof(config);
  config.timeoutMs = timeout.count();
  return config;
}

// ECCL_TIMEOUT_MS, when set, is every op's deadline; otherwise the
// process group's timeout is.
std::chrono::milliseconds effectiveTimeout(std::chrono::milliseconds pgTimeout) {
  if (const char* env = std::getenv("ECCL_TIMEOUT_MS"); env && *env) return std::chrono::milliseconds(std::atoll(env));
  return pgTimeout;
}

}  // namespace

ProcessGroupEccl::ProcessGroupEccl(const Setup& s)
    : c10d::Backend(s.rank, s.size), timeout_(effectiveTimeout(s.timeout)), reconfigurable_(s.standby),
      store_(s.store) {
  ecclConfig_t config = configFor(timeout_);
  if (s.adopt) {
    comm_ = s.adopt;
    jobText_ = s.jobId;
  } else {
    // torch_eccl (Python) finds the job: given, eccl-run's, or through the group's store.
    TORCH_CHECK_VALUE(!s.jobId.empty(), "eccl: no job to join: give the process group a store, or set "
                                        "ECCL_UNIQUE_ID (eccl-run does)");
    jobText_ = s.jobId;
    ecclUniqueId id = idFromText(jobText_);
    ecclResult_t r = s.standby ? ecclCommRegisterStandby(&comm_, id, &config)
                               : ecclCommInitRankConfig(&comm_, s.size, id, s.rank, &config);
    TORCH_CHECK_WITH(DistBackendError, r == ecclSuccess, "eccl: ", s.standby ? "registering a standby" : "init",
                     " failed: ", ecclGetLastError(nullptr));
  }
  jobId_ = jobTag(jobText_);
  check(ecclCommMemberId(comm_, &member_), "member id");
  refreshRankAndSize();
  driver_ = std::make_unique<Driver>();
  std::lock_guard<std::mutex> lock(liveMu);
  live.insert(this);
}

// Runs from Python's atexit, before the interpreter finalizes and before
// C atexit handlers (OpenSSL's cleanup, registered when Python loaded it,
// would pull the locks from under the communicator's HMAC-ing threads):
// every thread of every live group is stopped and joined here.
void ProcessGroupEccl::endAllAtExit() {
  std::lock_guard<std::mutex> lock(liveMu);
  for (ProcessGroupEccl* pg : live) {
    pg->abort();
    pg->driver_.reset();
    if (pg->comm_) ecclCommAbort(pg->comm_);
    pg->comm_ = nullptr;
  }
}

ProcessGroupEccl::~ProcessGroupEccl() {
  {
    std::lock_guard<std::mutex> lock(liveMu);
    live.erase(this);
  }
  bool ended;
  {
    std::lock_guard<std::mutex> lock(endMu_);
    ended = ended_;
    ended_ = true;
  }
  if (driver_) {
    if (!ended) driver_->drain();
    driver_->stop("the process group was destroyed");
    driver_.reset();
  }
  if (comm_) (ended ? ecclCommAbort(comm_) : ecclCommDestroy(comm_));
}

void ProcessGroupEccl::setTimeout(std::chrono::milliseconds timeout) {
  TORCH_WARN("eccl: the timeout is fixed when the communicator is made (",
             timeout_.count(), " ms); set_timeout(", timeout.count(), " ms) applies to Work.wait only");
}

void ProcessGroupEccl::check(ecclResult_t r, const char* what) const {
  if (r == ecclSuccess) return;
  std::string message = ecclGetLastError(comm_);
  if (r == ecclInvalidArgument) TORCH_CHECK_VALUE(false, "eccl ", what, ": ", message);
  if (r == ecclInvalidUsage) TORCH_CHECK(false, "eccl ", what, ": ", message);
  // "Timed out" as Gloo and NCCL say it: code that handles timeouts matches on it.
  if (r == ecclTimeout)
    TORCH_CHECK_WITH(DistBackendError, false, "eccl ", what, " (", ecclGetErrorString(r), "): Timed out waiting ",
                     timeout_.count(), "ms for ", what, ": ", message);
  TORCH_CHECK_WITH(DistBackendError, false, "eccl ", what, " (", ecclGetErrorString(r), "): ", message);
}

void ProcessGroupEccl::refreshRankAndSize() {
  int rank = -1, count = 0;
  check(ecclCommUserRank(comm_, &rank), "rank");
  check(ecclCommCount(comm_, &count), "size");
  if (rank >= 0) setRankAndSize(rank, count, "view change");
}

void ProcessGroupEccl::setRankAndSize(int rank, int size, const char* what) {
#if !TORCH_ECCL_FIXED_RANK
  rank_ = rank, size_ = size;
#else
  TORCH_CHECK(rank == rank_ && size == size_, "eccl ", what, ": this member is rank ", rank, " of ", size,
              " now (the process group was made as rank ", rank_, " of ", size_, "); torch ",
              TORCH_ECCL_TORCH_VERSION, " fixes a backend's rank and size when it is made (torch >= 2.14 lets them "
              "change): make a new process group for the new view");
#endif
}

bool ProcessGroupEccl::isStandby() {
  int rank = -1;
  check(ecclCommUserRank(comm_, &rank), "rank");
  return rank < 0 || sandboxed_;
}

void ProcessGroupEccl::requireRank(const char* what) const {
  TORCH_CHECK(comm_, "eccl ", what, ": the process group was shut down");
  int rank = -1;
  check(ecclCommUserRank(comm_, &rank), what);
  TORCH_CHECK(rank >= 0, "eccl ", what, ": this process is a standby with no rank yet (reconfigure or "
              "await_promotion takes it into the group)");
}

int ProcessGroupEccl::checkedPeer(int64_t peer, const char* what) const {
  TORCH_CHECK_VALUE(peer >= 0 && peer < size_, "eccl ", what, ": rank ", peer, " is outside [0, ", size_, ")");
  return static_cast<int>(peer);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupEccl::enqueue(c10d::OpType type, const char* name,
                                                         std::vector<at::Tensor> outputs,
                                                         std::vector<at::Tensor> inputs, std::function<void()> run,
                                                         bool async) {
  requireRank(name);
  seq_++;
  std::vector<at::Tensor> all = outputs;
  all.insert(all.end(), inputs.begin(), inputs.end());
  run = onCallerStream(all, std::move(run));
  auto work = c10::make_intrusive<EcclWork>(rank_, type, name, std::move(outputs), std::move(inputs));
  if (!async && driver_->runInlineIfIdle(work, run)) return work;
  driver_->post(work, std::move(run));
  return work;
}

void ProcessGroupEccl::runNow(const char* name, std::function<void()> run) {
  auto work = c10::make_intrusive<EcclWork>(rank_, c10d::OpType::UNKNOWN, name, std::vector<at::Tensor>{},
                                            std::nullopt);
  driver_->post(work, std::move(run));
  work->wait();
}

c10d::ErrorType ProcessGroupEccl::getError() {
  ecclResult_t async = ecclSuccess;
  if (ecclCommGetAsyncError(comm_, &async) != ecclSuccess) return c10d::ErrorType::COMM_ERROR;
  switch (async) {
    case ecclSuccess: return c10d::ErrorType::SUCCESS;
    case ecclTimeout: return c10d::ErrorType::TIMEOUT;
    case ecclRemoteError: return c10d::ErrorType::REMOTE_ERROR;
    default: return c10d::ErrorType::COMM_ERROR;
  }
}

void ProcessGroupEccl::abort() {
  {
    std::lock_guard<std::mutex> lock(endMu_);
    if (ended_ || !comm_) return;
    ended_ = true;
  }
  ecclCommRevoke(comm_);  // wakes the op in flight; safe from this thread
  driver_->stop("the process group was aborted");
  driver_->drain();
}

void ProcessGroupEccl::shutdown() {
  {
    std::lock_guard<std::mutex> lock(endMu_);
    if (ended_ || !comm_) return;
    ended_ = true;
  }
  driver_->drain();
  driver_->stop("the process group was shut down");
  ecclResult_t r = ecclCommDestroy(comm_);
  comm_ = nullptr;
  check(r, "shutdown");
}

std::map<std::string, double> ProcessGroupEccl::statsLocked() {
  ecclCommStats_t s{};
  s.size = sizeof(s);
  check(ecclCommGetStats(comm_, &s), "stats");
  return {{"epoch", s.epoch},
          {"joined_epoch", s.joinedEpoch},
          {"rank", s.rank},
          {"world_size", s.nranks},
          {"reconfigurations", static_cast<double>(s.reconfigurations)},
          {"open_connections", static_cast<double>(s.openConnections)},
          {"stale_frames_dropped", static_cast<double>(s.staleFramesDropped)},
          {"connections_opened", static_cast<double>(s.connectionsOpened)},
          {"connections_closed", static_cast<double>(s.connectionsClosed)},
          {"connections_inherited", static_cast<double>(s.connectionsInherited)},
          {"connections_prepared", static_cast<double>(s.connectionsPrepared)},
          {"agree_ms", s.agreeMs},
          {"apply_ms", s.applyMs},
          {"total_ms", s.totalMs},
          {"prepare_ms", s.prepareMs},
          {"queue_pairs_open", static_cast<double>(s.queuePairsOpen)},
          {"queue_pairs_opened", static_cast<double>(s.queuePairsOpened)},
          {"queue_pairs_closed", static_cast<double>(s.queuePairsClosed)},
          {"queue_pairs_prepared", static_cast<double>(s.queuePairsPrepared)},
          {"sandbox_calls", static_cast<double>(s.sandboxCalls)},
          {"sandbox_replayed", static_cast<double>(s.sandboxReplayed)},
          {"sandbox_recordings_received", static_cast<double>(s.sandboxRecordingsReceived)},
          {"sandbox_recordings_shipped", static_cast<double>(s.sandboxRecordingsShipped)}};
}

std::map<std::string, double> ProcessGroupEccl::stats() {
  std::map<std::string, double> out;
  runNow("stats", [&] { out = statsLocked(); });
  return out;
}

std::map<std::string, double> ProcessGroupEccl::recover(ecclRecoverPolicy_t policy) {
  std::map<std::string, double> out;
  runNow("recover", [&] {
    check(ecclCommRecover(comm_, policy), "recover");
    refreshRankAndSize();
    out = statsLocked();
  });
  return out;
}

void ProcessGroupEccl::prepare(int rank) {
  runNow("prepare", [&] { check(ecclCommPrepare(comm_, rank), "prepare"); });
}

std::pair<std::string, int> ProcessGroupEccl::prepareStatus() {
  std::pair<std::string, int> out;
  runNow("prepare_status", [&] {
    ecclPrepareState_t state;
    int leaving = -1;
    check(ecclCommPrepareStatus(comm_, &state, &leaving), "prepare_status");
    const char* names[] = {"none", "preparing", "ready", "failed"};
    out = {state >= 0 && state <= 3 ? names[state] : "unknown", leaving};
    if (state == ecclPrepareFailed) out.first += std::string(": ") + ecclGetLastError(comm_);
  });
  return out;
}

std::map<std::string, double> ProcessGroupEccl::switchover() {
  std::map<std::string, double> out;
  runNow("switchover", [&] {
    check(ecclCommSwitchover(comm_), "switchover");
    int rank = -1;
    check(ecclCommUserRank(comm_, &rank), "rank");
    if (rank >= 0) {
      refreshRankAndSize();
      out = statsLocked();
    }
  });
  return out;
}

void ProcessGroupEccl::migrationSend(const at::Tensor& t) {
  checkTensor(t, "migration_send");
  runNow("migration_send", [&] {
    Flat f(t, true);
    check(ecclMigrationSend(f.data(), f.bytes(), ecclUint8, comm_, nullptr), "migration_send");
  });
}

void ProcessGroupEccl::migrationRecv(at::Tensor& t) {
  checkTensor(t, "migration_recv");
  runNow("migration_recv", [&] {
    Flat f(t, false);
    check(ecclMigrationRecv(f.data(), f.bytes(), ecclUint8, comm_, nullptr), "migration_recv");
    f.writeBack();
  });
}

std::map<std::string, double> ProcessGroupEccl::grow(int count) {
  std::map<std::string, double> out;
  runNow("grow", [&] {
    check(ecclCommGrow(comm_, count), "grow");
    refreshRankAndSize();
    out = statsLocked();
  });
  return out;
}

void ProcessGroupEccl::sandbox(int nranks, int rank) {
  runNow("sandbox", [&] {
#if TORCH_ECCL_FIXED_RANK
    if (nranks > 0) setRankAndSize(rank, nranks, "sandbox");  // refuses before the sandbox is entered
#endif
    check(ecclCommSandbox(comm_, nranks, rank), "sandbox");
    sandboxed_ = nranks > 0;
    if (sandboxed_) setRankAndSize(rank, nranks, "sandbox");
  });
}

void ProcessGroupEccl::sandboxRecord(int calls) {
  runNow("sandbox_record", [&] { check(ecclCommSandboxRecord(comm_, calls), "sandbox_record"); });
}

bool ProcessGroupEccl::tryPromotion() {
  bool promoted = false;
  runNow("try_promotion", [&] {
    ecclResult_t r = ecclCommAwaitPromotion(comm_, 1);
    if (r == ecclTimeout) return;
    check(r, "try_promotion");
    sandboxed_ = false;
    refreshRankAndSize();
    promoted = true;
  });
  return promoted;
}

std::map<std::string, double> ProcessGroupEccl::awaitPromotion(std::chrono::milliseconds timeout) {
  std::map<std::string, double> out;
  runNow("await_promotion", [&] {
    check(ecclCommAwaitPromotion(comm_, timeout.count()), "await_promotion");
    sandboxed_ = false;
    refreshRankAndSize();
    out = statsLocked();
  });
  return out;
}

// A group of the reconfigure regime outlives abort() (torchft aborts a
// broken group, then reconfigures it): the aborted member is gone for good
// (its peers saw it end), so the next handle or reconfiguration registers a
// new standby of the same job in its place.
void ProcessGroupEccl::renewIfAborted() {
  std::lock_guard<std::mutex> lock(endMu_);
  if (!ended_ || !reconfigurable_ || !comm_) return;
  driver_.reset();
  ecclCommAbort(comm_);
  comm_ = nullptr;
  ecclConfig_t config = configFor(timeout_);
  ecclResult_t r = ecclCommRegisterStandby(&comm_, idFromText(jobText_), &config);
  TORCH_CHECK_WITH(DistBackendError, r == ecclSuccess, "eccl: registering a standby after abort failed: ",
                   ecclGetLastError(nullptr));
  check(ecclCommMemberId(comm_, &member_), "member id");
  driver_ = std::make_unique<Driver>();
  ended_ = false;
}

#if TORCH_ECCL_RECONFIGURE
c10d::ReconfigureHandle ProcessGroupEccl::get_reconfigure_handle() const {
  const_cast<ProcessGroupEccl*>(this)->renewIfAborted();  // c10d declares this const
  ecclCommStats_t s{};
  s.size = sizeof(s);
  ecclCommGetStats(comm_, &s);
  return makeHandle({member_, jobId_, s.rank, s.epoch});
}

// The members the options name, in rank order. A set lets eccl choose the
// order: members of the newest view keep their order, the rest follow by
// member id (every caller computes the same order from the same set).
std::vector<uint64_t> ProcessGroupEccl::membersNamed(const c10d::ReconfigureOptions& opts) const {
  std::vector<HandleInfo> infos;
  auto add = [&](const std::string& h) {
    HandleInfo info = parseHandle(h);
    TORCH_CHECK_VALUE(info.job == jobId_, "eccl reconfigure: handle ", h, " belongs to another eccl job (job ",
                      info.job, ", this is ", jobId_, "); every member must join one job (one ECCL_UNIQUE_ID)");
    infos.push_back(info);
  };
  if (auto* list = std::get_if<std::vector<c10d::ReconfigureHandle>>(&opts.handles)) {
    for (const auto& h : *list) add(h);
  } else {
    for (const auto& h : std::get<std::unordered_set<c10d::ReconfigureHandle>>(opts.handles)) add(h);
    uint32_t newest = 0;
    for (const auto& i : infos) newest = std::max(newest, i.rank >= 0 ? i.epoch : 0u);
    std::sort(infos.begin(), infos.end(), [&](const HandleInfo& a, const HandleInfo& b) {
      bool aKept = a.rank >= 0 && a.epoch == newest, bKept = b.rank >= 0 && b.epoch == newest;
      if (aKept != bKept) return aKept;
      if (aKept) return a.rank < b.rank;
      return a.member < b.member;
    });
  }
  std::vector<uint64_t> members;
  for (const auto& i : infos) members.push_back(i.member);
  return members;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupEccl::reconfigure(const c10d::ReconfigureOptions& opts) {
  return startReconfigure(opts, true);
}

void ProcessGroupEccl::reconfigureNow(const c10d::ReconfigureOptions& opts) { startReconfigure(opts, false)->wait(); }

c10::intrusive_ptr<c10d::Work> ProcessGroupEccl::startReconfigure(const c10d::ReconfigureOptions& opts, bool async) {
  renewIfAborted();
  std::vector<uint64_t> members = membersNamed(opts);
  TORCH_CHECK_VALUE(std::count(members.begin(), members.end(), member_) == 1, "eccl reconfigure: this process (member ",
                    member_, ") is not named in the handles");
  int64_t timeoutMs = opts.timeout ? opts.timeout->count() : timeout_.count();
  uint64_t uuid = static_cast<uint64_t>(opts.uuid);
  auto work = c10::make_intrusive<EcclWork>(rank_, c10d::OpType::UNKNOWN, "reconfigure", std::vector<at::Tensor>{},
                                            std::nullopt);
  std::function<void()> run = [this, members, uuid, timeoutMs] {
    check(ecclCommReconfigure(comm_, members.data(), static_cast<int>(members.size()), uuid, timeoutMs),
          "reconfigure");
    refreshRankAndSize();
  };
  if (!async && driver_->runInlineIfIdle(work, run)) return work;
  driver_->post(work, std::move(run));
  return work;
}
#endif  // TORCH_ECCL_RECONFIGURE

}  // namespace torch_eccl
