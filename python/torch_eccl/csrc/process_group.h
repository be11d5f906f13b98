// ProcessGroupEccl: torch.distributed's "eccl" backend, a c10d::Backend
// over eccl's C API. Collectives and point-to-point run on the driver
// thread (work.h); the elastic calls (recover, reconfigure, migration,
// grow) run there too, after the ops issued before them.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <map>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "eccl.h"
#include "work.h"

// Torch before the single-tensor collectives were renamed (all_gather_single
// for _allgather_base, ...): the methods below keep the new names and the
// old ones forward to them.
#if TORCH_ECCL_SINGLE_NAMES
#define TORCH_ECCL_OVERRIDE_SINGLE override
#else
#define TORCH_ECCL_OVERRIDE_SINGLE
#endif

namespace torch_eccl {

class MoePlan;

// How a process group finds its eccl communicator.
struct Setup {
  c10::intrusive_ptr<c10d::Store> store;  // rendezvous (rank 0 publishes the job id), may be null
  int rank = 0, size = 1;
  std::chrono::milliseconds timeout{0};
  std::string jobId;         // the job's unique id as text ("": from the store)
  bool standby = false;      // register as a standby (reconfigure regime): no rank until a view names it
  ecclComm_t adopt = nullptr;  // a communicator promoted before torch made the group
};

class ProcessGroupEccl : public c10d::Backend {
 public:
  explicit ProcessGroupEccl(const Setup& setup);
  ~ProcessGroupEccl() override;

  const std::string getBackendName() const override { return "eccl"; }
#if TORCH_ECCL_RECONFIGURE
  bool supportsReconfigure() const override { return true; }
#endif
  bool supportsSplitting() const override { return false; }
  void setTimeout(std::chrono::milliseconds timeout) override;
  // Ops issued by this process group, counted as Gloo counts its: c10d's
  // debug wrapper (TORCH_DISTRIBUTED_DEBUG=DETAIL) compares them across ranks.
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_.load(); }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> all_gather_single(at::Tensor& output, at::Tensor& input,
                                                   const c10d::AllgatherOptions& opts = {}) TORCH_ECCL_OVERRIDE_SINGLE;
  c10::intrusive_ptr<c10d::Work> all_gather_single_coalesced(std::vector<at::Tensor>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllgatherOptions& opts = {}) TORCH_ECCL_OVERRIDE_SINGLE;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_single(at::Tensor& output, at::Tensor& input,
                                                       const c10d::ReduceScatterOptions& opts = {}) TORCH_ECCL_OVERRIDE_SINGLE;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_single_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts = {}) TORCH_ECCL_OVERRIDE_SINGLE;
  c10::intrusive_ptr<c10d::Work> all_to_all_single(at::Tensor& output, at::Tensor& input,
                                                   std::vector<int64_t>& outputSplitSizes,
                                                   std::vector<int64_t>& inputSplitSizes,
                                                   const c10d::AllToAllOptions& opts = {}) TORCH_ECCL_OVERRIDE_SINGLE;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts = {}) override;
#if !TORCH_ECCL_SINGLE_NAMES
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts = {}) override {
    return all_gather_single(output, input, opts);
  }
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts = {}) override {
    return all_gather_single_coalesced(outputs, inputs, opts);
  }
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts = {}) override {
    return reduce_scatter_single(output, input, opts);
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts = {}) override {
    return reduce_scatter_single_coalesced(outputs, inputs, opts);
  }
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplitSizes,
                                               std::vector<int64_t>& inputSplitSizes,
                                               const c10d::AllToAllOptions& opts = {}) override {
    return all_to_all_single(output, input, outputSplitSizes, inputSplitSizes, opts);
  }
#endif
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = {}) override;
  // The barrier that names the ranks that did not arrive (monitored.cc).
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks = false) override;

#if TORCH_ECCL_RECONFIGURE
  // Fault tolerance (c10d's reconfigure API, done as eccl's delta).
  c10d::ReconfigureHandle get_reconfigure_handle() const override;
  c10::intrusive_ptr<c10d::Work> reconfigure(const c10d::ReconfigureOptions& opts) override;
  // reconfigure, waited for at once: on the caller's thread when no op is
  // queued (two thread hand-offs fewer; torchft waits at once anyway).
  void reconfigureNow(const c10d::ReconfigureOptions& opts);
#endif
  void abort() override;     // ends the communicator now: pending and later work fails (a group of the
                             // reconfigure regime takes a new member at its next handle or reconfigure)
  void shutdown() override;  // finishes queued work, then leaves the job in order
  c10d::ErrorType getError() override;

  // What reconfigure cannot express (torch_eccl's Python API).
  std::map<std::string, double> recover(ecclRecoverPolicy_t policy);
  void prepare(int rank);
  std::pair<std::string, int> prepareStatus();
  std::map<std::string, double> switchover();
  void migrationSend(const at::Tensor& t);
  void migrationRecv(at::Tensor& t);

  // A standby's sandbox (ecclCommSandbox): rank/size say `rank` of
  // `nranks` until a promotion; tryPromotion takes a pending one (false:
  // none yet).
  void sandbox(int nranks, int rank);
  // A rank records its next `calls` collectives for the eager standbys'
  // sandboxes (ecclCommSandboxRecord).
  void sandboxRecord(int calls);
  bool tryPromotion();

  // Boundary-send logs (snapshots.cc; docs/logs.md): sends to `peers`
  // (empty: every peer) teed into a host-memory log.
  void logConfigure(int64_t capacityBytes, const std::vector<int>& peers, int whenFull);
  void logSetTag(int64_t iteration, int32_t microbatch);
  void logTruncate(int64_t iteration);
  void logDiscard(int64_t fromIteration);
  void logReplay(int peer, int64_t fromIteration, int64_t toIteration);

  // Peer-memory snapshots (snapshots.cc; docs/snapshots.md), on the
  // driver thread like every call on the communicator.
  void snapshotConfigure(int replicas, int64_t maxInFlightBytes);
  void snapshotPut(int64_t version, const std::string& name, const at::Tensor& t);
  void snapshotCommit(int64_t version);
  void snapshotWait(int64_t version, int64_t timeoutMs);
  int64_t snapshotCommitted();
  std::vector<std::tuple<std::string, int64_t, int64_t>> snapshotList();
  int64_t snapshotGet(const std::string& name, at::Tensor& t);
  // The copies this rank holds of other ranks' shards: (owner, name,
  // version, bytes), owner a rank of the snapshots' view.
  std::vector<std::tuple<int, std::string, int64_t, int64_t>> snapshotListHeld();
  int64_t snapshotGetHeld(int owner, const std::string& name, at::Tensor& t);
  int64_t snapshotRestore();
  int snapshotRestoreState();  // ecclSnapshotRestoreState_t
  void snapshotPersist(const std::string& directory);
  int64_t snapshotPersistWait(int64_t timeoutMs);
  int64_t snapshotLoad(const std::string& directory);
  // MoE dispatch (moe.cc, docs/moe.md): collective; the plan carries the
  // rows and what combine and the backward passes follow.
  std::shared_ptr<MoePlan> moeDispatch(const at::Tensor& x, const at::Tensor& topk, const at::Tensor& replicas);
  // Runs `run` with the communicator on the driver thread, in issue order,
  // the tensors' stream current when they are CUDA tensors (opStream()).
  void runOnComm(const char* name, const std::vector<at::Tensor>& tensors, const std::function<void(ecclComm_t)>& run);
  int64_t epoch();
  std::map<std::string, double> grow(int count);
  std::map<std::string, double> awaitPromotion(std::chrono::milliseconds timeout);
  std::map<std::string, double> stats();
  uint64_t memberId() const { return member_; }
  std::string jobId() const { return jobText_; }
  // What went wrong last on this communicator (a failure found by an op or
  // a notice): torchft's errored() reports it.
  std::string lastError() const { return comm_ ? ecclGetLastError(comm_) : "the process group was shut down"; }
  bool isStandby();
  // Interpreter exit with groups still alive (no destroy_process_group):
  // their driver threads must stop before Python finalizes, or the last
  // reference to a tensor dropped there would need the GIL of a dying
  // interpreter. Ends every live group as abort() does.
  static void endAllAtExit();

 private:
  // Queues `run` as one op of this group; its work is returned at once.
  // `async`: the op's asyncOp option (false: the caller waits at once, so
  // it may run inline on the caller's thread).
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, const char* name, std::vector<at::Tensor> outputs,
                                         std::vector<at::Tensor> inputs, std::function<void()> run, bool async = true);
  c10::intrusive_ptr<c10d::Work> enqueueP2p(c10d::OpType type, const char* name, const at::Tensor& t, int peer,
                                            bool isSend);
  // Runs `run` on the driver thread after everything queued, and waits.
  void runNow(const char* name, std::function<void()> run);
  // Throws a DistBackendError with eccl's message if `r` failed.
  void check(ecclResult_t r, const char* what) const;
  void refreshRankAndSize();
  // c10d::Backend's rank and size; a torch that fixes them at creation
  // (before 2.14) raises, naming `what`, if they would change.
  void setRankAndSize(int rank, int size, const char* what);
  void requireRank(const char* what) const;
  c10::intrusive_ptr<c10d::Work> allreduceSparse(const at::Tensor& t, const c10d::AllreduceOptions& opts);
  int checkedPeer(int64_t peer, const char* what) const;
  std::map<std::string, double> statsLocked();
#if TORCH_ECCL_RECONFIGURE
  std::vector<uint64_t> membersNamed(const c10d::ReconfigureOptions& opts) const;
  c10::intrusive_ptr<c10d::Work> startReconfigure(const c10d::ReconfigureOptions& opts, bool async);
#endif
  void renewIfAborted();

  ecclComm_t comm_ = nullptr;
  bool sandboxed_ = false;  // a standby in the sandbox: its rank is pretend
  uint64_t member_ = 0;
  std::string jobText_;
  uint64_t jobId_ = 0;
  std::chrono::milliseconds timeout_;
  bool ended_ = false;  // aborted or shut down
  const bool reconfigurable_;  // made in the reconfigure regime: abort() is followed by a new member
  std::mutex endMu_;
  std::unique_ptr<Driver> driver_;
  std::atomic<uint64_t> seq_{0};
  c10::intrusive_ptr<c10d::Store> store_;  // the group's rendezvous store (monitored barriers), may be null
  uint64_t monitoredRounds_ = 0;
};

}  // namespace torch_eccl
