// torch_eccl._C: the backend class and the calls the Python package needs.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <mutex>

#include "moe.h"
#include "process_group.h"
#include "streams.h"

namespace py = pybind11;

namespace torch_eccl {
namespace {

// A standby promoted before torch made its process group (its rank is not
// known until then): the next backend this process makes adopts it.
std::mutex promotedMu;
ecclComm_t promoted = nullptr;
std::string promotedJob;

std::pair<int, int> awaitStandby(const std::string& job, int64_t timeoutMs, int64_t opTimeoutMs) {
  ecclUniqueId id;
  TORCH_CHECK_VALUE(ecclUniqueIdFromString(job.c_str(), &id) == ecclSuccess, "eccl: malformed job id: ",
                    ecclGetLastError(nullptr));
  ecclConfig_t config{};
  config.size = sizeof(config);
  config.timeoutMs = opTimeoutMs;
  ecclComm_t comm = nullptr;
  TORCH_CHECK_WITH(DistBackendError, ecclCommRegisterStandby(&comm, id, &config) == ecclSuccess,
                   "eccl: registering a standby failed: ", ecclGetLastError(nullptr));
  if (ecclCommAwaitPromotion(comm, timeoutMs) != ecclSuccess) {
    std::string why = ecclGetLastError(comm);
    ecclCommDestroy(comm);
    TORCH_CHECK_WITH(DistBackendError, false, "eccl: standby was not promoted: ", why);
  }
  int rank = -1, size = 0;
  ecclCommUserRank(comm, &rank);
  ecclCommCount(comm, &size);
  std::lock_guard<std::mutex> lock(promotedMu);
  TORCH_CHECK(!promoted, "eccl: a promoted standby is already waiting for its process group");
  promoted = comm;
  promotedJob = job;
  return {rank, size};
}

c10::intrusive_ptr<c10d::Backend> createBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                std::chrono::milliseconds timeout, const std::string& job,
                                                bool standby, bool adoptPromoted) {
  Setup s;
  s.store = store;
  s.rank = rank;
  s.size = size;
  s.timeout = timeout;
  s.jobId = job;
  s.standby = standby;
  if (adoptPromoted) {
    std::lock_guard<std::mutex> lock(promotedMu);
    if (promoted) {
      int r = -1, n = 0;
      ecclCommUserRank(promoted, &r);
      ecclCommCount(promoted, &n);
      TORCH_CHECK_VALUE(r == rank && n == size, "eccl: the promoted standby holds rank ", r, " of ", n,
                        ", but the process group is made for rank ", rank, " of ", size);
      s.adopt = promoted;
      s.jobId = promotedJob;
      promoted = nullptr;
    }
  }
  return c10::make_intrusive<ProcessGroupEccl>(s);
}

}  // namespace
}  // namespace torch_eccl

PYBIND11_MODULE(_C, m) {
  using torch_eccl::ProcessGroupEccl;
  py::module_::import("torch.distributed");
  auto release = py::call_guard<py::gil_scoped_release>();
  py::module_::import("atexit").attr("register")(py::cpp_function([] {
    py::gil_scoped_release noGil;
    ProcessGroupEccl::endAllAtExit();
  }));
  m.def("create_backend", &torch_eccl::createBackend, release, py::arg("store"), py::arg("rank"), py::arg("size"),
        py::arg("timeout"), py::arg("job"), py::arg("standby"), py::arg("adopt_promoted"));
  m.def("await_standby", &torch_eccl::awaitStandby, release, py::arg("job"), py::arg("timeout_ms"),
        py::arg("op_timeout_ms"));
  m.def("make_job", [] {
    ecclUniqueId id;
    TORCH_CHECK_WITH(DistBackendError, ecclGetUniqueId(&id) == ecclSuccess, "eccl: cannot make a job: ",
                     ecclGetLastError(nullptr));
    char text[512];
    TORCH_CHECK(ecclUniqueIdToString(&id, text, sizeof(text)) == ecclSuccess, "eccl: ", ecclGetLastError(nullptr));
    return std::string(text);
  });
  m.def("cuda_build", &torch_eccl::cudaBuild);
  m.def("moe_allocate_replicas", &torch_eccl::planner::allocateReplicas, py::arg("load"), py::arg("nodes"),
        py::arg("slots_per_node"), py::arg("min_replicas"));
  m.def("moe_place", &torch_eccl::planner::place, py::arg("replicas"), py::arg("nodes"), py::arg("slots_per_node"),
        py::arg("policy"));
  m.def("moe_recovery_probability", &torch_eccl::planner::recoveryProbability, release, py::arg("placement"),
        py::arg("slots_per_node"), py::arg("experts"), py::arg("failures"), py::arg("seed"));
  m.def("moe_plan_migration", &torch_eccl::planner::planMigration, py::arg("current"), py::arg("failed"),
        py::arg("target"), py::arg("slots_per_node"), py::arg("experts"));
  // c10d's reconfigure API is in torch >= 2.14; a build against an older
  // torch leaves it out (python/CMakeLists.txt says so at configure time).
  m.attr("has_reconfigure") = static_cast<bool>(TORCH_ECCL_RECONFIGURE);
  m.attr("torch_version") = TORCH_ECCL_TORCH_VERSION;
  m.def("version", [] {
    int v = 0;
    ecclGetVersion(&v);
    return v;
  });
  py::class_<torch_eccl::MoePlan, std::shared_ptr<torch_eccl::MoePlan>>(m, "MoePlan")
      .def_property_readonly("rows", &torch_eccl::MoePlan::rows)
      .def_property_readonly("local_experts", &torch_eccl::MoePlan::localExperts)
      .def_property_readonly("expert_rows", &torch_eccl::MoePlan::expertRows)
      .def_property_readonly("tokens", &torch_eccl::MoePlan::tokens)
      .def_property_readonly("topk", &torch_eccl::MoePlan::topk)
      .def_property_readonly("epoch", &torch_eccl::MoePlan::epoch)
      .def("stats", &torch_eccl::MoePlan::stats)
      .def("combine", &torch_eccl::MoePlan::combine, release, py::arg("expert_output"), py::arg("weights"))
      .def("dispatch_along", &torch_eccl::MoePlan::dispatchAlong, release, py::arg("rows"), py::arg("per_choice"));
  py::class_<ProcessGroupEccl, c10d::Backend, c10::intrusive_ptr<ProcessGroupEccl>>(m, "ProcessGroupEccl")
      .def_property_readonly("member_id", &ProcessGroupEccl::memberId)
      .def_property_readonly("job_id", &ProcessGroupEccl::jobId)
      .def("is_standby", &ProcessGroupEccl::isStandby, release)
      .def("last_error", &ProcessGroupEccl::lastError)
#if TORCH_ECCL_RECONFIGURE
      .def("reconfigure_now", &ProcessGroupEccl::reconfigureNow, release, py::arg("opts"))
#else
      .def(
          "reconfigure_now",
          [](ProcessGroupEccl&, const py::object&) {
            TORCH_CHECK(false, "eccl reconfigure: needs c10d's reconfigure API (torch >= 2.14); this torch_eccl "
                               "was built against torch " TORCH_ECCL_TORCH_VERSION);
          },
          py::arg("opts"))
#endif
      .def(
          "recover",
          [](ProcessGroupEccl& pg, int policy) { return pg.recover(static_cast<ecclRecoverPolicy_t>(policy)); },
          release, py::arg("policy"))
      .def("prepare", &ProcessGroupEccl::prepare, release, py::arg("rank"))
      .def("prepare_status", &ProcessGroupEccl::prepareStatus, release)
      .def("switchover", &ProcessGroupEccl::switchover, release)
      .def("migration_send", &ProcessGroupEccl::migrationSend, release, py::arg("tensor"))
      .def("migration_recv", &ProcessGroupEccl::migrationRecv, release, py::arg("tensor"))
      .def("grow", &ProcessGroupEccl::grow, release, py::arg("count"))
      .def("await_promotion", &ProcessGroupEccl::awaitPromotion, release, py::arg("timeout"))
      .def("stats", &ProcessGroupEccl::stats, release)
      .def("epoch", &ProcessGroupEccl::epoch, release)
      .def("moe_dispatch", &ProcessGroupEccl::moeDispatch, release, py::arg("x"), py::arg("topk_ids"),
           py::arg("replicas"))
      .def("sandbox", &ProcessGroupEccl::sandbox, release, py::arg("nranks"), py::arg("rank"))
      .def("sandbox_record", &ProcessGroupEccl::sandboxRecord, release, py::arg("calls"))
      .def("try_promotion", &ProcessGroupEccl::tryPromotion, release)
      .def("log_configure", &ProcessGroupEccl::logConfigure, release, py::arg("capacity_bytes"), py::arg("peers"),
           py::arg("when_full"))
      .def("log_set_tag", &ProcessGroupEccl::logSetTag, release, py::arg("iteration"), py::arg("microbatch"))
      .def("log_truncate", &ProcessGroupEccl::logTruncate, release, py::arg("iteration"))
      .def("log_discard", &ProcessGroupEccl::logDiscard, release, py::arg("from_iteration"))
      .def("log_replay", &ProcessGroupEccl::logReplay, release, py::arg("peer"), py::arg("from_iteration"),
           py::arg("to_iteration"))
      .def("snapshot_configure", &ProcessGroupEccl::snapshotConfigure, release, py::arg("replicas"),
           py::arg("max_in_flight_bytes"))
      .def("snapshot_put", &ProcessGroupEccl::snapshotPut, release, py::arg("version"), py::arg("name"),
           py::arg("tensor"))
      .def("snapshot_commit", &ProcessGroupEccl::snapshotCommit, release, py::arg("version"))
      .def("snapshot_wait", &ProcessGroupEccl::snapshotWait, release, py::arg("version"), py::arg("timeout_ms"))
      .def("snapshot_committed", &ProcessGroupEccl::snapshotCommitted, release)
      .def("snapshot_list", &ProcessGroupEccl::snapshotList, release)
      .def("snapshot_get", &ProcessGroupEccl::snapshotGet, release, py::arg("name"), py::arg("tensor"))
      .def("snapshot_list_held", &ProcessGroupEccl::snapshotListHeld, release)
      .def("snapshot_get_held", &ProcessGroupEccl::snapshotGetHeld, release, py::arg("owner"), py::arg("name"),
           py::arg("tensor"))
      .def("snapshot_restore", &ProcessGroupEccl::snapshotRestore, release)
      .def("snapshot_restore_state", &ProcessGroupEccl::snapshotRestoreState, release)
      .def("snapshot_persist", &ProcessGroupEccl::snapshotPersist, release, py::arg("directory"))
      .def("snapshot_persist_wait", &ProcessGroupEccl::snapshotPersistWait, release, py::arg("timeout_ms"))
      .def("snapshot_load", &ProcessGroupEccl::snapshotLoad, release, py::arg("directory"));
}
