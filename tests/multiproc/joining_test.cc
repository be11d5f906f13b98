// Level 2: processes that die while they join a view. A standby killed
// while it is being promoted, a joiner killed while it connects, and a rank
// of the first view gone before the others connect to it are failures of
// the view, recovered like any other: nobody's init fails because of them,
// and REPLACE takes the next standby.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

#include "membership/coord_client.h"
#include "membership/coordinator.h"
#include "common/clock.h"
#include "tests/support/elastic.h"

namespace eccl::test {
namespace {

// State the processes of one test share (mapped before they fork).
struct Shared {
  std::atomic<pid_t> firstStandby{0};
  std::atomic<int> finishedFirstOp{0};
};

Shared* mapShared() {
  void* p = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::runtime_error("mmap failed");
  return new (p) Shared;
}

std::string coordinatorStatus(const ecclUniqueId& id) {
  return membership::queryCoordinatorStatus(membership::decodeUniqueId(id), deadlineAfterMs(3000));
}

// Polls the coordinator's status until `holds` is true of it.
void awaitStatus(const ecclUniqueId& id, const std::function<bool(const std::string&)>& holds, const std::string& what) {
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  std::string last;
  while (!holds(last = coordinatorStatus(id))) {
    RANK_CHECK(std::chrono::steady_clock::now() < until, "never saw " + what + "; coordinator: " + last);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

bool listsStandby(const std::string& status, pid_t pid) {
  return status.find("pid " + std::to_string(pid) + "\n") != std::string::npos &&
         status.find("standby: member") != std::string::npos;
}

bool holdsRank(const std::string& status, int rank, pid_t pid) {
  size_t at = status.find("  rank " + std::to_string(rank) + ": ");
  if (at == std::string::npos) return false;
  std::string line = status.substr(at, status.find('\n', at) - at);
  return line.find(" pid " + std::to_string(pid) + " ") != std::string::npos;
}

// The seam that kills a joiner in the middle of connecting: once armed,
// this process dies right after its next data connection is dialed or
// accepted (the library's calls to connect and accept4 come here first).
std::atomic<bool> dieAtNextConnection{false};

}  // namespace
}  // namespace eccl::test

extern "C" int connect(int fd, const sockaddr* addr, socklen_t len) {
  static auto real = reinterpret_cast<int (*)(int, const sockaddr*, socklen_t)>(dlsym(RTLD_NEXT, "connect"));
  int rc = real(fd, addr, len);
  // A data lane: TCP, or eccl's shared-memory socket (an abstract Unix name
  // starting "eccl-"); not a library's netlink or other Unix socket.
  bool tcp = addr && (addr->sa_family == AF_INET || addr->sa_family == AF_INET6);
  bool shm = addr && addr->sa_family == AF_UNIX && len > sizeof(sa_family_t) + 5 &&
             std::memcmp(reinterpret_cast<const sockaddr_un*>(addr)->sun_path, "\0eccl-", 6) == 0;
  if ((tcp || shm) && eccl::test::dieAtNextConnection) raise(SIGKILL);
  return rc;
}

extern "C" int accept4(int fd, sockaddr* addr, socklen_t* len, int flags) {
  static auto real = reinterpret_cast<int (*)(int, sockaddr*, socklen_t*, int)>(dlsym(RTLD_NEXT, "accept4"));
  int rc = real(fd, addr, len, flags);
  if (rc >= 0 && eccl::test::dieAtNextConnection) raise(SIGKILL);
  return rc;
}

namespace eccl::test {
namespace {

// Recovers with REPLACE until a view holds (a view whose joiner died while
// joining fails to connect; the next recovery replaces the joiner too).
void recoverUntilWhole(ecclComm_t comm) {
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(40);
  for (;;) {
    ecclResult_t r = ecclCommRecover(comm, ecclRecoverReplace);
    if (r == ecclSuccess) return;
    std::string why = ecclGetLastError(comm);
    RANK_CHECK(r == ecclRemoteError || r == ecclTimeout, std::string("recover: ") + ecclGetErrorString(r) + ": " + why);
    RANK_CHECK(std::chrono::steady_clock::now() < until, "no whole view within 40 s: " + why);
  }
}

std::string failingAllreduce(ecclComm_t comm) {
  std::vector<float> v(4096, 1.0f);
  for (int i = 0; i < 100000; ++i) {
    ecclResult_t r = ecclAllReduce(v.data(), v.data(), v.size(), ecclFloat32, ecclSum, comm, nullptr);
    if (r != ecclSuccess) {
      RANK_CHECK(r == ecclRemoteError || r == ecclTimeout, std::string("unexpected ") + ecclGetErrorString(r));
      return ecclGetLastError(comm);
    }
  }
  throw std::runtime_error("no failure seen");
}

// How the first standby dies once it is chosen to take rank 2.
enum class JoinerDeath {
  kStoppedThenKilled,      // stopped before its promotion, killed once the view names it
  kKilledWhileConnecting,  // kills itself at its first data connection of the new view
};

constexpr int n = 4, victim = 2, first = n, second = n + 1;

// A helper thread's failure ends its process with the reason on stderr.
void inThread(std::function<void()> body) {
  std::thread([body = std::move(body)] {
    try {
      body();
    } catch (const std::exception& e) {
      fprintf(stderr, "helper thread: %s\n", e.what());
      _exit(3);
    }
  }).detach();
}

class Joining : public ElasticTest, public ::testing::WithParamInterface<JoinerDeath> {};

// 4 ranks and 2 standbys. Rank 2 dies; the survivors' REPLACE promotes the
// first standby, which dies while the new view's connections are opening.
// The survivors' recovery reports it, they recover again, the second standby
// takes rank 2 at epoch 3, and the allreduces are exact.
TEST_P(Joining, AJoinerThatDiesWhileJoiningIsReplacedByTheNextStandby) {
  const JoinerDeath death = GetParam();
  Shared* shared = mapShared();
  ProcessGroup group(n + 2, [&](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    if (index == first) {
      shared->firstStandby = getpid();
      if (death == JoinerDeath::kKilledWhileConnecting) {
        inThread([&id] {
          awaitStatus(id, [](const std::string& s) { return listsStandby(s, getpid()); }, "this standby registered");
          dieAtNextConnection = true;  // an idle lazy standby has no data connection
        });
      }
      ecclCommInitStandby(&comm, id, nullptr);
      RANK_CHECK(false, "the first standby outlived its promotion");
    }
    if (index == second) {
      // Registers after the first, so REPLACE picks the first.
      awaitStatus(id, [&](const std::string& s) { return shared->firstStandby && listsStandby(s, shared->firstStandby); },
                  "the first standby registered");
      RANK_OK(ecclCommInitStandby(&comm, id, nullptr), nullptr);
      ecclCommStats_t s = statsOf(comm);
      RANK_CHECK(s.rank == victim && s.epoch == 3 && s.joinedEpoch == 3,
                 "second standby took rank " + std::to_string(s.rank) + " at epoch " + std::to_string(s.epoch));
      checkAllreduce(comm, 3);
      RANK_OK(ecclCommDestroy(comm), comm);
      return;
    }
    RANK_OK(ecclCommInitRank(&comm, n, id, index), nullptr);
    checkAllreduce(comm);
    if (index == victim) {
      awaitStatus(id, [](const std::string& s) {
        size_t count = 0;
        for (size_t at = 0; (at = s.find("standby: member", at)) != std::string::npos; ++at) ++count;
        return count == 2;
      }, "both standbys registered");
      if (death == JoinerDeath::kStoppedThenKilled) kill(shared->firstStandby, SIGSTOP);
      dieSoon();
    }
    std::string why = failingAllreduce(comm);
    RANK_CHECK(why.find("rank 2") != std::string::npos, "error does not name rank 2: " + why);
    if (index == 0 && death == JoinerDeath::kStoppedThenKilled) {
      inThread([&id, pid = shared->firstStandby.load()] {
        awaitStatus(id, [pid](const std::string& s) { return holdsRank(s, victim, pid); }, "the first standby promoted");
        kill(pid, SIGKILL);
      });
    }
    recoverUntilWhole(comm);
    ecclCommStats_t s = statsOf(comm);
    RANK_CHECK(s.epoch == 3 && s.rank == index && s.nranks == n,
               "recovered to epoch " + std::to_string(s.epoch) + " as rank " + std::to_string(s.rank));
    checkAllreduce(comm, 3);
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(90));
  expectOnlyVictimsDied(outcomes, {victim, first});
  munmap(shared, sizeof(Shared));
}

INSTANTIATE_TEST_SUITE_P(Deaths, Joining,
                         ::testing::Values(JoinerDeath::kStoppedThenKilled, JoinerDeath::kKilledWhileConnecting),
                         [](const auto& info) {
                           return info.param == JoinerDeath::kStoppedThenKilled ? "StandbyKilledWhileBeingPromoted"
                                                                                : "JoinerKilledWhileConnecting";
                         });

// A rank of the first view registers and dies before anyone connects to it
// (its data address refuses connections). With the lowest member id the
// others wait for it to dial and learn of its death from the coordinator;
// with the highest they dial it and are refused. Either way every other
// rank's init succeeds with the communicator revoked, its first allreduce
// names the dead rank, and REPLACE brings the standby in.
class FirstView : public ElasticTest, public ::testing::WithParamInterface<uint64_t> {};

TEST_P(FirstView, ARankGoneBeforeItsPeersConnectIsRecoveredNotAnInitFailure) {
  constexpr int gone = 3;
  const uint64_t goneMember = GetParam();
  ProcessGroup group(n + 1, [&](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    if (index == gone) {
      membership::JoinRequest join{membership::Role::kRank, gone, n, goneMember, "tcp:127.0.0.1:1", false};
      membership::CoordClient client(membership::decodeUniqueId(id), join, 100, 3000, deadlineAfterMs(10000));
      client.awaitView(deadlineAfterMs(10000), "the first view");
      raise(SIGKILL);
    }
    if (index == n) {
      awaitStatus(id, [](const std::string& s) { return s.starts_with("epoch 1,"); }, "the first view formed");
      RANK_OK(ecclCommInitStandby(&comm, id, nullptr), nullptr);
      ecclCommStats_t s = statsOf(comm);
      RANK_CHECK(s.rank == gone && s.epoch == 2, "standby took rank " + std::to_string(s.rank));
      checkAllreduce(comm, 2);
      RANK_OK(ecclCommDestroy(comm), comm);
      return;
    }
    RANK_OK(ecclCommInitRank(&comm, n, id, index), nullptr);
    // The standby must be registered before REPLACE is asked.
    awaitStatus(id, [](const std::string& s) { return s.find("standby: member") != std::string::npos; },
                "the standby registered");
    std::string why = failingAllreduce(comm);
    RANK_CHECK(why.find("rank 3") != std::string::npos, "error does not name rank 3: " + why);
    ecclResult_t async = ecclSuccess;
    RANK_OK(ecclCommGetAsyncError(comm, &async), comm);
    RANK_CHECK(async == ecclRemoteError || async == ecclTimeout, "async error " + std::string(ecclGetErrorString(async)));
    recoverUntilWhole(comm);
    ecclCommStats_t s = statsOf(comm);
    RANK_CHECK(s.epoch == 2 && s.rank == index, "recovered to epoch " + std::to_string(s.epoch));
    checkAllreduce(comm, 2);
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  expectOnlyVictimsDied(outcomes, {gone});
}

INSTANTIATE_TEST_SUITE_P(MemberIds, FirstView, ::testing::Values(uint64_t{1}, ~uint64_t{0} - 1),
                         [](const auto& info) { return info.param == 1 ? "LowestMemberId" : "HighestMemberId"; });

}  // namespace
}  // namespace eccl::test

namespace eccl::test {
namespace {

// ECCL_REPLACE_WAIT_MS is read by the coordinator, which the fork helper
// starts when the group is made.
class HeldReplace : public ElasticTest {
 protected:
  void TearDown() override {
    unsetenv("ECCL_REPLACE_WAIT_MS");
    ElasticTest::TearDown();
  }
};

// A launcher refilling its pool: the REPLACE is asked before any standby
// exists and is held until one registers, instead of being refused.
TEST_F(HeldReplace, AReplaceShortOfStandbysWaitsForOneToRegister) {
  setenv("ECCL_REPLACE_WAIT_MS", "10000", 1);
  constexpr int victim = 1;
  ProcessGroup group(n + 1, [&](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    if (index == n) {
      awaitStatus(id, [](const std::string& s) { return s.find("FAILED") != std::string::npos; }, "rank 1 failed");
      std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the survivors asked meanwhile
      RANK_OK(ecclCommInitStandby(&comm, id, nullptr), nullptr);
      RANK_CHECK(statsOf(comm).rank == victim, "the standby took rank " + std::to_string(statsOf(comm).rank));
      checkAllreduce(comm, 2);
      RANK_OK(ecclCommDestroy(comm), comm);
      return;
    }
    RANK_OK(ecclCommInitRank(&comm, n, id, index), nullptr);
    checkAllreduce(comm);
    if (index == victim) dieSoon();
    failingAllreduce(comm);
    auto start = std::chrono::steady_clock::now();
    RANK_OK(ecclCommRecover(comm, ecclRecoverReplace), comm);
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    RANK_CHECK(waited > 0.3 && waited < 9, "the held REPLACE returned after " + std::to_string(waited) + " s");
    RANK_CHECK(statsOf(comm).epoch == 2, "epoch " + std::to_string(statsOf(comm).epoch));
    checkAllreduce(comm, 2);
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  expectOnlyVictimsDied(outcomes, {victim});
}

// No standby ever comes: the hold runs out and every survivor gets the
// refusal, saying how long it waited; SHRINK then works.
TEST_F(HeldReplace, AHeldReplaceIsRefusedWhenTheWaitRunsOut) {
  setenv("ECCL_REPLACE_WAIT_MS", "700", 1);
  constexpr int victim = 1;
  ProcessGroup group(n, [&](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    RANK_OK(ecclCommInitRank(&comm, n, id, index), nullptr);
    checkAllreduce(comm);
    if (index == victim) dieSoon();
    failingAllreduce(comm);
    ecclResult_t r = ecclCommRecover(comm, ecclRecoverReplace);
    std::string why = ecclGetLastError(comm);
    RANK_CHECK(r == ecclInvalidUsage && why.find("after waiting 700 ms") != std::string::npos,
               std::string(ecclGetErrorString(r)) + ": " + why);
    RANK_OK(ecclCommRecover(comm, ecclRecoverShrink), comm);
    RANK_CHECK(statsOf(comm).nranks == n - 1, "shrunk to " + std::to_string(statsOf(comm).nranks));
    checkAllreduce(comm, 2);
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  expectOnlyVictimsDied(outcomes, {victim});
}

}  // namespace
}  // namespace eccl::test

namespace eccl::test {
namespace {

// A member that destroys its communicator in the middle of the job (an
// orderly goodbye, not a crash) leaves its rank empty: the others' next op
// fails naming it, and REPLACE fills the rank from the standby.
TEST_F(ElasticTest, AMemberThatLeavesInOrderIsReplacedByRecovery) {
  constexpr int leaver = 1;
  Shared* shared = mapShared();
  ProcessGroup group(n + 1, [&](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    if (index == n) {
      RANK_OK(ecclCommInitStandby(&comm, id, nullptr), nullptr);
      RANK_CHECK(statsOf(comm).rank == leaver, "the standby took rank " + std::to_string(statsOf(comm).rank));
      checkAllreduce(comm, 2);
      RANK_OK(ecclCommDestroy(comm), comm);
      return;
    }
    RANK_OK(ecclCommInitRank(&comm, n, id, index), nullptr);
    checkAllreduce(comm);
    // A departure revokes the communicator like a failure: an op still in
    // flight elsewhere fails even if the leaver finished it. So the leaver
    // goes only once every survivor holds the result it is checked against.
    if (index == leaver) {
      auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (shared->finishedFirstOp.load() < n - 1) {
        RANK_CHECK(std::chrono::steady_clock::now() < until, "the survivors did not finish their first allreduce");
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      RANK_OK(ecclCommDestroy(comm), nullptr);
      return;
    }
    ++shared->finishedFirstOp;
    std::string why = failingAllreduce(comm);
    RANK_CHECK(why.find("rank 1") != std::string::npos, "error does not name rank 1: " + why);
    recoverUntilWhole(comm);
    RANK_CHECK(statsOf(comm).epoch == 2, "epoch " + std::to_string(statsOf(comm).epoch));
    checkAllreduce(comm, 2);
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
  munmap(shared, sizeof(Shared));
}

}  // namespace
}  // namespace eccl::test
