// Peer-memory snapshots end to end, real processes: sparse versions commit
// once every rank's shards reached their replicas; a killed rank's
// replacement restores its shards from the survivors' memory (and no file
// is read); two ranks killed at once with two replicas lose nothing, and a
// corrupt copy makes the replacement ask the next holder; with one replica
// and both copies of a shard gone, restore names the lost names and the
// ranks go back to the version persisted before; persist
// and load carry a version across a whole-job restart, and a persist killed
// midway leaves the previous version loadable.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "api/guard.h"
#include "snapshot/snapshots.h"
#include "tests/support/host_cuda/host_cuda.h"
#include "tests/support/multiproc.h"

namespace eccl::test {
namespace {

constexpr int kNames = 8;

std::string nameOf(int k) { return "layer" + std::to_string(k) + ".weight"; }
size_t bytesOf(int rank, int k) { return size_t(k + 1) * 48 * 1024 + size_t(rank) * 7 + 3; }
// The bytes rank `rank` puts for name k at version v.
std::vector<uint8_t> contentOf(int rank, int k, int64_t v) {
  std::vector<uint8_t> b(bytesOf(rank, k));
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(i * 31 + size_t(rank) * 101 + size_t(k) * 7 + size_t(v) * 13);
  return b;
}
// Sparse: version v holds the names k with k % 4 == v % 4.
bool inVersion(int k, int64_t v) { return k % 4 == v % 4; }
// The version the dense view at `v` takes name k from (-1: none yet);
// `abandoned` never committed.
int64_t denseVersion(int k, int64_t v, int64_t abandoned) {
  for (int64_t u = v; u >= 1; --u)
    if (inVersion(k, u) && u != abandoned) return u;
  return -1;
}

void putVersion(ecclComm_t comm, int rank, int64_t v) {
  for (int k = 0; k < kNames; ++k)
    if (inVersion(k, v)) {
      auto b = contentOf(rank, k, v);
      RANK_OK(ecclSnapshotPut(comm, v, nameOf(k).c_str(), b.data(), b.size()), comm);
    }
}

// Puts versions `from`..`to`, commits each, and waits until `to` is committed everywhere.
void putCommitted(ecclComm_t comm, int rank, int64_t from, int64_t to) {
  for (int64_t v = from; v <= to; ++v) {
    putVersion(comm, rank, v);
    RANK_OK(ecclSnapshotCommit(comm, v), comm);
  }
  RANK_OK(ecclSnapshotWait(comm, to, 30000), comm);
}

// This rank holds `expected` copies of other ranks' names (`what` says which).
void checkHeldCount(ecclComm_t comm, int rank, int expected, const std::string& what) {
  int count = -1;
  RANK_OK(ecclSnapshotListHeld(comm, nullptr, 0, &count), comm);
  RANK_CHECK(count == expected, "rank " + std::to_string(rank) + " holds " + std::to_string(count) + " copies of " +
                                    what + ", not " + std::to_string(expected));
}

// This rank holds `owner`'s copy of name k as put at version `from`.
void checkHeldCopy(ecclComm_t comm, int owner, int k, int64_t from) {
  std::vector<uint8_t> got(bytesOf(owner, k));
  int64_t version = -1;
  RANK_OK(ecclSnapshotGetHeld(comm, owner, nameOf(k).c_str(), got.data(), got.size(), &version), comm);
  RANK_CHECK(version == from && got == contentOf(owner, k, from),
             "rank " + std::to_string(owner) + "'s " + nameOf(k) + " differs in its holder's memory");
}

// This rank's dense view equals what it put up to version v.
void checkDense(ecclComm_t comm, int rank, int64_t v, int64_t abandoned = -1) {
  std::vector<ecclSnapshotEntry_t> entries(kNames + 2);
  int count = 0;
  RANK_OK(ecclSnapshotList(comm, entries.data(), static_cast<int>(entries.size()), &count), comm);
  int expected = 0;
  for (int k = 0; k < kNames; ++k) expected += denseVersion(k, v, abandoned) > 0;
  RANK_CHECK(count == expected, "rank " + std::to_string(rank) + " lists " + std::to_string(count) + " names, not " +
                                    std::to_string(expected));
  for (int k = 0; k < kNames; ++k) {
    int64_t from = denseVersion(k, v, abandoned);
    if (from < 0) continue;
    std::vector<uint8_t> got(bytesOf(rank, k));
    int64_t version = -1;
    RANK_OK(ecclSnapshotGet(comm, nameOf(k).c_str(), got.data(), got.size(), &version), comm);
    RANK_CHECK(version == from, nameOf(k) + " comes from version " + std::to_string(version) + ", not " +
                                    std::to_string(from));
    RANK_CHECK(got == contentOf(rank, k, from), nameOf(k) + " of rank " + std::to_string(rank) + " differs");
  }
}

void configure(ecclComm_t comm, int replicas) {
  ecclSnapshotConfig_t cfg{};
  cfg.size = sizeof(cfg);
  cfg.replicas = replicas;
  cfg.replicasSet = 1;
  cfg.maxInFlightBytes = 256 << 10;  // small: many rounds of the cap
  RANK_OK(ecclSnapshotConfigure(comm, &cfg), comm);
}

class Snapshot : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("ECCL_SOCKET_IFNAME", "lo", 1);
    setenv("ECCL_TIMEOUT_MS", "15000", 1);
    setenv("ECCL_HEARTBEAT_MS", "100", 1);
  }
};

TEST_F(Snapshot, SparseVersionsCommitEverywhereAndBadCallsAreClearErrors) {
  ProcessGroup group(3, [](int rank, int n, const ecclUniqueId& id) {
    ecclComm_t comm;
    RANK_OK(ecclCommInitRank(&comm, n, id, rank), nullptr);
    uint8_t byte = 1;
    RANK_CHECK(ecclSnapshotPut(comm, 1, "x", &byte, 1) == ecclInvalidUsage, "a put before configure");
    RANK_CHECK(std::string(ecclGetLastError(comm)).find("ecclSnapshotConfigure") != std::string::npos,
               ecclGetLastError(comm));
    ecclSnapshotConfig_t bad{};
    bad.size = sizeof(bad);
    bad.replicas = 3;
    RANK_CHECK(ecclSnapshotConfigure(comm, &bad) == ecclInvalidArgument, "3 replicas among 3 ranks");
    configure(comm, 1);
    for (int64_t v = 1; v <= 6; ++v) {
      putVersion(comm, rank, v);
      RANK_OK(ecclSnapshotCommit(comm, v), comm);
      if (v % 2 == 0) RANK_OK(ecclSnapshotWait(comm, v, 20000), comm);
    }
    RANK_OK(ecclSnapshotWait(comm, 6, 20000), comm);
    int64_t committed = -1;
    RANK_OK(ecclSnapshotCommitted(comm, &committed), comm);
    RANK_CHECK(committed == 6, "committed " + std::to_string(committed));
    checkDense(comm, rank, 6);
    // Bad input: each a clear error that changes nothing.
    RANK_CHECK(ecclSnapshotPut(comm, 5, "x", &byte, 1) == ecclInvalidUsage, "an older version was accepted");
    RANK_CHECK(std::string(ecclGetLastError(comm)).find("not newer") != std::string::npos, ecclGetLastError(comm));
    std::string longName(300, 'n');
    RANK_CHECK(ecclSnapshotPut(comm, 7, longName.c_str(), &byte, 1) == ecclInvalidArgument, "a 300-byte name");
    std::vector<uint8_t> wrong(3);
    RANK_CHECK(ecclSnapshotGet(comm, nameOf(0).c_str(), wrong.data(), wrong.size(), nullptr) == ecclInvalidArgument,
               "a get into a buffer of the wrong size");
    RANK_CHECK(ecclSnapshotGet(comm, "nobody", wrong.data(), wrong.size(), nullptr) == ecclInvalidArgument,
               "a get of a name never put");
    checkDense(comm, rank, 6);
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(90));
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
}

// Device buffers go through host copies both ways (the suite's host
// emulation of the CUDA driver stands in for a GPU here).
TEST_F(Snapshot, DeviceBuffersArePutAndGotThroughHostCopies) {
  setenv("ECCL_CUDA_DRIVER", ECCL_HOST_CUDA, 1);
  ProcessGroup group(2, [](int rank, int n, const ecclUniqueId& id) {
    ecclComm_t comm;
    RANK_OK(ecclCommInitRank(&comm, n, id, rank), nullptr);
    configure(comm, 1);
    auto content = contentOf(rank, 3, 1);
    void* device = hostCudaMalloc(content.size());
    void* back = hostCudaMalloc(content.size());
    std::memcpy(device, content.data(), content.size());  // emulated device memory is host memory
    RANK_OK(ecclSnapshotPut(comm, 1, "on-device", device, content.size()), comm);
    RANK_OK(ecclSnapshotCommit(comm, 1), comm);
    RANK_OK(ecclSnapshotWait(comm, 1, 20000), comm);
    std::memset(device, 0, content.size());
    int64_t version = -1;
    RANK_OK(ecclSnapshotGet(comm, "on-device", back, content.size(), &version), comm);
    RANK_CHECK(version == 1 && std::memcmp(back, content.data(), content.size()) == 0, "the device copy differs");
    hostCudaFree(device);
    hostCudaFree(back);
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  unsetenv("ECCL_CUDA_DRIVER");
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
}

// Survivors and replacements alike: recover and restore until a view with
// every rank alive restored (a second failure can land mid-restore).
ecclSnapshotRestoreState_t restoreState(ecclComm_t comm) {
  auto state = static_cast<ecclSnapshotRestoreState_t>(-1);
  RANK_OK(ecclSnapshotRestoreState(comm, &state), comm);
  return state;
}

// Returns the restored version, or -2 with `lost` set when shards were lost.
int64_t recoverAndRestore(ecclComm_t comm, bool recoverFirst, std::string* lost) {
  for (int attempt = 0; attempt < 5; ++attempt) {
    // A replacement that dies while it is taken in fails the recovery too.
    if (recoverFirst && ecclCommRecover(comm, ecclRecoverReplace) != ecclSuccess) continue;
    recoverFirst = true;
    int64_t version = -1;
    ecclResult_t rc = ecclSnapshotRestore(comm, &version);
    if (rc == ecclSuccess) {
      RANK_CHECK(restoreState(comm) == ecclSnapshotRestoreOk, "a restore that succeeded left state " +
                                                                  std::to_string(restoreState(comm)));
      return version;
    }
    // A peer that died during the restore fails it with ecclRemoteError
    // too; the state tells the loss apart.
    std::string why = ecclGetLastError(comm);
    if (restoreState(comm) == ecclSnapshotRestoreShardsLost) {
      RANK_CHECK(rc == ecclRemoteError && why.find("every replica") != std::string::npos, why);
      *lost = why;
      return -2;
    }
  }
  throw std::runtime_error(std::string("restore kept failing: ") + ecclGetLastError(comm));
}

// `n` ranks snapshot versions 1-3, the ranks in `victims` die while
// version 4 is being put, standbys replace them and restore version 3.
// With `joinerDies`, the first standby promoted is killed before it
// restores (the survivors are in their restore), and a second one takes
// its place.
// When shards are lost (`expectLost`), version 3 was persisted before the
// failure: every member goes back to it from the directory and goes on.
void loadAfterTheLoss(ecclComm_t comm, int rank, const std::string& dir) {
  int64_t v = -1;
  // Restoring again cannot conjure the lost shards: it says so again.
  RANK_CHECK(ecclSnapshotRestore(comm, &v) == ecclRemoteError, "a second restore succeeded");
  RANK_CHECK(std::string(ecclGetLastError(comm)).find("every replica") != std::string::npos, ecclGetLastError(comm));
  RANK_CHECK(restoreState(comm) == ecclSnapshotRestoreShardsLost, "state " + std::to_string(restoreState(comm)));
  RANK_OK(ecclSnapshotLoad(comm, dir.c_str(), &v), comm);
  RANK_CHECK(v == 3, "loaded version " + std::to_string(v));
  checkDense(comm, rank, 3);
  putVersion(comm, rank, 5);
  RANK_OK(ecclSnapshotCommit(comm, 5), comm);
  RANK_OK(ecclSnapshotWait(comm, 5, 30000), comm);
  checkDense(comm, rank, 5, /*abandoned=*/4);
  RANK_CHECK(ecclSnapshotLoad(comm, dir.c_str(), &v) == ecclInvalidUsage, "a load with nothing lost");
}

// Or they start the snapshots over instead (the state came back another
// way): the copies are gone and new versions replicate.
void startOverAfterTheLoss(ecclComm_t comm, int rank, int replicas) {
  int64_t v = -1;
  RANK_CHECK(ecclSnapshotRestore(comm, &v) == ecclRemoteError, "a second restore succeeded");
  configure(comm, replicas);
  int64_t committed = 0;
  int held = -1;
  RANK_OK(ecclSnapshotCommitted(comm, &committed), comm);
  RANK_OK(ecclSnapshotListHeld(comm, nullptr, 0, &held), comm);
  RANK_CHECK(committed == -1 && held == 0, "started over with version " + std::to_string(committed) + " and " +
                                               std::to_string(held) + " held copies");
  putCommitted(comm, rank, 5, 6);
  int count = -1;
  RANK_OK(ecclSnapshotList(comm, nullptr, 0, &count), comm);
  RANK_CHECK(count == kNames / 2, "lists " + std::to_string(count) + " names after versions 5 and 6");
  RANK_CHECK(ecclSnapshotConfigure(comm, nullptr) == ecclInvalidUsage, "configured again with nothing lost");
}

enum class AfterLoss { kLoad, kStartOver };

// ranksPerHost > 0: ECCL_HOSTID simulates hosts of that many ranks (the
// standbys on a spare one), so copies avoid the ranks a host takes along.
void killAndRestore(int n, int replicas, std::vector<int> victims, bool corruptFirstHolder, bool expectLost,
                    bool joinerDies = false, AfterLoss afterLoss = AfterLoss::kLoad, int ranksPerHost = 0) {
  const int standbys = static_cast<int>(victims.size()) + (joinerDies ? 1 : 0);
  ReadyFiles marks;
  const std::string firstJoiner = marks.dir + "/first-joiner";
  const std::string persisted = marks.dir + "/persisted";
  ProcessGroup group(n + standbys, [=](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    std::string lost;
    if (ranksPerHost > 0)
      setenv("ECCL_HOSTID", index < n ? ("host" + std::to_string(index / ranksPerHost)).c_str() : "spare", 1);
    else
      unsetenv("ECCL_HOSTID");
    auto afterTheLoss = [&](int rank) {
      if (afterLoss == AfterLoss::kLoad) loadAfterTheLoss(comm, rank, persisted);
      else startOverAfterTheLoss(comm, rank, replicas);
    };
    if (index >= n) {
      RANK_OK(ecclCommInitStandby(&comm, id, nullptr), nullptr);
      int rank = -1;
      RANK_OK(ecclCommUserRank(comm, &rank), comm);
      RANK_CHECK(std::find(victims.begin(), victims.end(), rank) != victims.end(),
                 "a standby took rank " + std::to_string(rank));
      configure(comm, replicas);
      if (joinerDies) {
        int fd = open(firstJoiner.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
        if (fd >= 0) raise(SIGKILL);
      }
      int64_t v = recoverAndRestore(comm, false, &lost);
      if (expectLost) {
        RANK_CHECK(v == -2, "nothing was lost");
        afterTheLoss(rank);
      } else {
        RANK_CHECK(v == 3, "restored version " + std::to_string(v));
        checkDense(comm, rank, 3);  // from the survivors' memory: no file exists
      }
      if (!expectLost) {
        putVersion(comm, rank, 5);
        RANK_OK(ecclSnapshotCommit(comm, 5), comm);
        RANK_OK(ecclSnapshotWait(comm, 5, 30000), comm);
        checkDense(comm, rank, 5, /*abandoned=*/4);
      }
      RANK_OK(ecclCommDestroy(comm), comm);
      return;
    }
    const int rank = index;
    RANK_OK(ecclCommInitRank(&comm, n, id, rank), nullptr);
    configure(comm, replicas);
    for (int64_t v = 1; v <= 3; ++v) {
      putVersion(comm, rank, v);
      RANK_OK(ecclSnapshotCommit(comm, v), comm);
    }
    RANK_OK(ecclSnapshotWait(comm, 3, 30000), comm);
    if (expectLost) {
      RANK_CHECK(ecclSnapshotLoad(comm, persisted.c_str(), nullptr) == ecclInvalidUsage, "a load over snapshots");
      RANK_OK(ecclSnapshotPersist(comm, persisted.c_str()), comm);
      int64_t onDisk = -1;
      RANK_OK(ecclSnapshotPersistWait(comm, 30000, &onDisk), comm);
      RANK_CHECK(onDisk == 3, "persisted " + std::to_string(onDisk));
    }
    float one = 1;
    // The victims die once they finished this allreduce, which others may
    // not have yet: for them the failure shows up here or later.
    ecclResult_t rc = ecclAllReduce(&one, &one, 1, ecclFloat32, ecclSum, comm, nullptr);
    const bool victim = std::find(victims.begin(), victims.end(), rank) != victims.end();
    if (victim && rc != ecclSuccess) raise(SIGKILL);  // the other victim went first
    if (rc == ecclSuccess) {
      // Version 4: the victims die midway through their puts.
      for (int k = 0; k < kNames; ++k) {
        if (!inVersion(k, 4)) continue;
        auto b = contentOf(rank, k, 4);
        RANK_OK(ecclSnapshotPut(comm, 4, nameOf(k).c_str(), b.data(), b.size()), comm);
        if (victim) raise(SIGKILL);
      }
      RANK_OK(ecclSnapshotCommit(comm, 4), comm);
    }
    const bool committed4 = rc == ecclSuccess;
    while (rc == ecclSuccess) rc = ecclAllReduce(&one, &one, 1, ecclFloat32, ecclSum, comm, nullptr);
    if (committed4) {
      // A rank died during version 4: waiting for it is a clear error.
      RANK_CHECK(ecclSnapshotWait(comm, 4, 20000) != ecclSuccess, "version 4 committed without the victims");
      const std::string why = ecclGetLastError(comm);
      RANK_CHECK(why.find("version 4") != std::string::npos &&
                     (why.find("rank") != std::string::npos || why.find("view changed") != std::string::npos),
                 why);
    }
    if (corruptFirstHolder && rank == victims.back() + 1) comm->snapshots->corruptHeldForTesting(victims.back());
    int64_t v = recoverAndRestore(comm, true, &lost);
    if (expectLost) {
      RANK_CHECK(v == -2, "nothing was lost");
      RANK_CHECK(lost.find("rank " + std::to_string(victims.front()) + " lost") != std::string::npos, lost);
      afterTheLoss(rank);
    } else {
      RANK_CHECK(v == 3, "restored version " + std::to_string(v));
      putVersion(comm, rank, 5);
      RANK_OK(ecclSnapshotCommit(comm, 5), comm);
      RANK_OK(ecclSnapshotWait(comm, 5, 30000), comm);
      checkDense(comm, rank, 5, /*abandoned=*/4);
    }
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(150));
  int killedStandbys = 0;
  for (int r = 0; r < n + standbys; ++r) {
    const auto& o = outcomes[static_cast<size_t>(r)];
    const bool killed = !o.exited && o.signal == SIGKILL;
    if (std::find(victims.begin(), victims.end(), r) != victims.end())
      EXPECT_TRUE(killed) << describe(outcomes);
    else if (r >= n && joinerDies && killed)
      killedStandbys++;
    else
      EXPECT_TRUE(o.exited && o.exitCode == 0) << describe(outcomes);
  }
  EXPECT_EQ(killedStandbys, joinerDies ? 1 : 0) << describe(outcomes);
}

TEST_F(Snapshot, AReplacementRestoresItsRankFromTheSurvivorsMemory) { killAndRestore(4, 1, {2}, false, false); }

TEST_F(Snapshot, TwoRanksKilledWithTwoReplicasLoseNothingAndACorruptCopyIsRefetched) {
  killAndRestore(5, 2, {1, 2}, true, false);
}

TEST_F(Snapshot, AReplacementKilledBeforeItRestoredIsReplacedInTurn) { killAndRestore(4, 1, {2}, false, false, true); }

TEST_F(Snapshot, WithEveryReplicaOfAShardGoneRestoreNamesThemAndTheRanksLoadThePersistedVersion) {
  killAndRestore(4, 1, {2, 3}, false, true);
}

TEST_F(Snapshot, WithEveryReplicaOfAShardGoneTheRanksMayStartOverInstead) {
  killAndRestore(4, 1, {2, 3}, false, true, false, AfterLoss::kStartOver);
}

// The same two ranks, one simulated host: their copies are on the other.
TEST_F(Snapshot, ASimulatedHostsTwoRanksKeepTheirCopiesOnTheOtherHost) {
  killAndRestore(4, 1, {2, 3}, false, false, false, AfterLoss::kLoad, 2);
}

// No standby: the view shrinks and the departed rank's shards stay only in
// its holder's memory. The holder reads them there (by the old rank, which
// the snapshots keep until they start over); a configure that cannot suit
// the smaller view is refused and keeps them; a good one starts over.
TEST_F(Snapshot, AfterAShrinkTheHolderReadsTheDepartedRanksShardsAndTheRanksStartOver) {
  constexpr int n = 4, victim = 1;
  ProcessGroup group(n, [](int rank, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    RANK_OK(ecclCommInitRank(&comm, n, id, rank), nullptr);
    configure(comm, 1);
    for (int64_t v = 1; v <= 3; ++v) {
      putVersion(comm, rank, v);
      RANK_OK(ecclSnapshotCommit(comm, v), comm);
    }
    RANK_OK(ecclSnapshotWait(comm, 3, 30000), comm);
    RANK_CHECK(ecclSnapshotConfigure(comm, nullptr) == ecclInvalidUsage, "configured twice on one view");
    float one = 1;
    ecclResult_t rc = ecclAllReduce(&one, &one, 1, ecclFloat32, ecclSum, comm, nullptr);
    if (rank == victim) raise(SIGKILL);
    while (rc == ecclSuccess) rc = ecclAllReduce(&one, &one, 1, ecclFloat32, ecclSum, comm, nullptr);
    RANK_OK(ecclCommRecover(comm, ecclRecoverShrink), comm);
    int size = 0;
    RANK_OK(ecclCommCount(comm, &size), comm);
    RANK_CHECK(size == n - 1, "the view has " + std::to_string(size) + " ranks");

    std::vector<ecclSnapshotHeldEntry_t> held(2 * kNames);
    int count = -1;
    RANK_OK(ecclSnapshotListHeld(comm, held.data(), static_cast<int>(held.size()), &count), comm);
    // One replica each, on the next rank: rank r holds rank r-1's shards.
    const int owner = (rank + n - 1) % n;
    int names = 0;
    for (int k = 0; k < kNames; ++k) names += denseVersion(k, 3, -1) > 0;
    RANK_CHECK(count == names, "rank " + std::to_string(rank) + " holds " + std::to_string(count) + " copies, not " +
                                   std::to_string(names));
    for (int i = 0; i < count; ++i) RANK_CHECK(held[static_cast<size_t>(i)].owner == owner, "a copy of another rank");
    for (int k = 0; k < kNames; ++k) {
      const int64_t from = denseVersion(k, 3, -1);
      if (from < 0) continue;
      checkHeldCopy(comm, owner, k, from);
    }
    std::vector<uint8_t> one8(8);
    RANK_CHECK(ecclSnapshotGetHeld(comm, rank, nameOf(0).c_str(), one8.data(), one8.size(), nullptr) ==
                   ecclInvalidArgument,
               "a copy of its own shard was found among the held ones");
    const std::string why = ecclGetLastError(comm);
    RANK_CHECK(why.find(nameOf(0)) != std::string::npos && why.find("rank " + std::to_string(rank)) != std::string::npos,
               why);
    // Put is refused until the snapshots start over; a configure that does
    // not suit three ranks changes nothing.
    RANK_CHECK(ecclSnapshotPut(comm, 4, "x", one8.data(), one8.size()) == ecclInvalidUsage, "put on a stale view");
    ecclSnapshotConfig_t tooMany{};
    tooMany.size = sizeof(tooMany);
    tooMany.replicas = n - 1;
    RANK_CHECK(ecclSnapshotConfigure(comm, &tooMany) == ecclInvalidArgument, "3 replicas among 3 ranks");
    RANK_OK(ecclSnapshotListHeld(comm, nullptr, 0, &count), comm);
    RANK_CHECK(count == names, "a refused configure dropped the held copies");

    int newRank = -1;
    RANK_OK(ecclCommUserRank(comm, &newRank), comm);
    configure(comm, 1);
    int64_t committed = 0;
    RANK_OK(ecclSnapshotCommitted(comm, &committed), comm);
    RANK_OK(ecclSnapshotListHeld(comm, nullptr, 0, &count), comm);
    RANK_CHECK(committed == -1 && count == 0, "started over with version " + std::to_string(committed) + " and " +
                                                   std::to_string(count) + " held copies");
    for (int64_t v = 5; v <= 6; ++v) {
      putVersion(comm, newRank, v);
      RANK_OK(ecclSnapshotCommit(comm, v), comm);
    }
    RANK_OK(ecclSnapshotWait(comm, 6, 30000), comm);
    RANK_OK(ecclSnapshotListHeld(comm, nullptr, 0, &count), comm);
    RANK_CHECK(count == 4, "holds " + std::to_string(count) + " copies of versions 5 and 6, not 4");
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(90));
  for (int r = 0; r < n; ++r) {
    const auto& o = outcomes[static_cast<size_t>(r)];
    if (r == victim) EXPECT_TRUE(!o.exited && o.signal == SIGKILL) << describe(outcomes);
    else EXPECT_TRUE(o.exited && o.exitCode == 0) << describe(outcomes);
  }
}

// One recovery both replaces and shrinks (two ranks dead, one standby):
// the view is smaller than the snapshots, so restore fails on every rank,
// the newcomer's included, and every rank's configure starts over together.
TEST_F(Snapshot, AReplacementAndAShrinkInOneRecoveryFailRestoreEverywhereAndStartOver) {
  constexpr int n = 4;
  ProcessGroup group(n + 1, [&](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    auto startOver = [&] {
      int64_t v = 0;
      RANK_CHECK(ecclSnapshotRestore(comm, &v) == ecclInvalidUsage, "restored on a view that shrank");
      const std::string why = ecclGetLastError(comm);
      RANK_CHECK(why.find("the view has 3 ranks and the snapshots 4") != std::string::npos, why);
      RANK_CHECK(restoreState(comm) == ecclSnapshotRestoreViewShrank, "state " + std::to_string(restoreState(comm)));
      configure(comm, 1);
      int rank = -1;
      RANK_OK(ecclCommUserRank(comm, &rank), comm);
      putCommitted(comm, rank, 5, 5);
      checkHeldCount(comm, rank, 2, "version 5");  // one owner's: version 5 names two of the kNames
      RANK_OK(ecclCommDestroy(comm), comm);
    };
    if (index == n) {
      RANK_OK(ecclCommInitStandby(&comm, id, nullptr), nullptr);
      configure(comm, 1);
      return startOver();
    }
    RANK_OK(ecclCommInitRank(&comm, n, id, index), nullptr);
    configure(comm, 1);
    putCommitted(comm, index, 1, 3);
    float one = 1;
    ecclResult_t rc = ecclAllReduce(&one, &one, 1, ecclFloat32, ecclSum, comm, nullptr);
    if (index >= 2) raise(SIGKILL);
    while (rc == ecclSuccess) rc = ecclAllReduce(&one, &one, 1, ecclFloat32, ecclSum, comm, nullptr);
    RANK_OK(ecclCommRecover(comm, ecclRecoverReplaceOrShrink), comm);
    int size = 0;
    RANK_OK(ecclCommCount(comm, &size), comm);
    RANK_CHECK(size == n - 1, "the view has " + std::to_string(size) + " ranks");
    startOver();
  });
  auto outcomes = group.wait(std::chrono::seconds(90));
  for (int i = 0; i <= n; ++i) {
    const auto& o = outcomes[static_cast<size_t>(i)];
    if (i == 2 || i == 3) EXPECT_TRUE(!o.exited && o.signal == SIGKILL) << describe(outcomes);
    else EXPECT_TRUE(o.exited && o.exitCode == 0) << describe(outcomes);
  }
}

// A replacement snapshots with the others from its restore on; when the
// view then shrinks, its configure starts over with theirs (collective),
// not as a newcomer's (local, waiting for a restore nobody calls).
TEST_F(Snapshot, AReplacementStartsOverWithTheOthersAfterALaterShrink) {
  constexpr int n = 3;
  // A rank that dies with its last allreduce's frames unread resets the
  // connections and fails that allreduce on its peers: it waits first.
  auto dieAfterThePeersRead = [] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    raise(SIGKILL);
  };
  ProcessGroup group(n + 1, [&](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    float one = 1;
    auto untilFailure = [&] {
      ecclResult_t rc = ecclSuccess;
      while (rc == ecclSuccess) rc = ecclAllReduce(&one, &one, 1, ecclFloat32, ecclSum, comm, nullptr);
    };
    int rank = -1;
    if (index == n) {
      RANK_OK(ecclCommInitStandby(&comm, id, nullptr), nullptr);
      configure(comm, 1);
      RANK_OK(ecclSnapshotRestore(comm, nullptr), comm);
    } else {
      RANK_OK(ecclCommInitRank(&comm, n, id, index), nullptr);
      configure(comm, 1);
      putCommitted(comm, index, 1, 1);
      RANK_OK(ecclAllReduce(&one, &one, 1, ecclFloat32, ecclSum, comm, nullptr), comm);
      if (index == 2) dieAfterThePeersRead();
      untilFailure();
      RANK_OK(ecclCommRecover(comm, ecclRecoverReplace), comm);
      RANK_OK(ecclSnapshotRestore(comm, nullptr), comm);
    }
    RANK_OK(ecclCommUserRank(comm, &rank), comm);
    putCommitted(comm, rank, 2, 2);
    RANK_OK(ecclAllReduce(&one, &one, 1, ecclFloat32, ecclSum, comm, nullptr), comm);
    if (index == 0) dieAfterThePeersRead();
    untilFailure();
    RANK_OK(ecclCommRecover(comm, ecclRecoverShrink), comm);
    configure(comm, 1);  // the replacement (now rank 1) starts over with rank 0
    RANK_OK(ecclCommUserRank(comm, &rank), comm);
    putCommitted(comm, rank, 3, 3);
    checkHeldCount(comm, rank, 2, "version 3");
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(90));
  for (int i = 0; i <= n; ++i) {
    const auto& o = outcomes[static_cast<size_t>(i)];
    if (i == 0 || i == 2) EXPECT_TRUE(!o.exited && o.signal == SIGKILL) << describe(outcomes);
    else EXPECT_TRUE(o.exited && o.exitCode == 0) << describe(outcomes);
  }
}

// A grow keeps every rank's number and adds an empty rank at the end: the
// old ranks restore what they had, the new one owns nothing yet, fetches
// the copies it now holds (its predecessor's in the larger ring), and its
// own shards replicate from the next version on.
TEST_F(Snapshot, AGrownViewRestoresAndItsNewRankHoldsAndReplicates) {
  constexpr int n = 3;
  ProcessGroup group(n + 1, [](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    if (index == n) {
      RANK_OK(ecclCommInitStandby(&comm, id, nullptr), nullptr);
      configure(comm, 1);
    } else {
      RANK_OK(ecclCommInitRank(&comm, n, id, index), nullptr);
      configure(comm, 1);
      putCommitted(comm, index, 1, 3);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the standby registered
      RANK_OK(ecclCommGrow(comm, 1), comm);
    }
    int rank = -1, count = -1;
    RANK_OK(ecclCommUserRank(comm, &rank), comm);
    RANK_CHECK(rank == index, "rank " + std::to_string(rank) + " after the grow");
    int64_t restored = -1;
    RANK_OK(ecclSnapshotRestore(comm, &restored), comm);
    RANK_CHECK(restored == 3, "restored version " + std::to_string(restored));
    RANK_CHECK(restoreState(comm) == ecclSnapshotRestoreOk, "state " + std::to_string(restoreState(comm)));
    if (rank < n) checkDense(comm, rank, 3);
    const int owner = (rank + n) % (n + 1);
    RANK_OK(ecclSnapshotListHeld(comm, nullptr, 0, &count), comm);
    RANK_CHECK(count == (owner < n ? 6 : 0), "rank " + std::to_string(rank) + " holds " + std::to_string(count) +
                                                 " copies of rank " + std::to_string(owner) + " after the grow");
    putCommitted(comm, rank, 4, 5);
    if (rank < n) checkDense(comm, rank, 5);
    RANK_OK(ecclSnapshotListHeld(comm, nullptr, 0, &count), comm);
    RANK_CHECK(count == (owner < n ? kNames : 4), "rank " + std::to_string(rank) + " holds " + std::to_string(count) +
                                                      " copies of rank " + std::to_string(owner) + " at version 5");
    for (int k = 0; k < kNames; ++k) {
      const int64_t from = owner < n ? denseVersion(k, 5, -1) : inVersion(k, 5) ? 5 : inVersion(k, 4) ? 4 : -1;
      if (from < 0) continue;
      checkHeldCopy(comm, owner, k, from);
    }
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(90));
  for (const auto& o : outcomes) EXPECT_TRUE(o.exited && o.exitCode == 0) << describe(outcomes);
}

TEST_F(Snapshot, PersistAndLoadAcrossAWholeJobRestartAndAPersistKilledMidway) {
  char tmpl[] = "/tmp/eccl-snapshots-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  constexpr int n = 3;
  {
    ProcessGroup job(n, [dir](int rank, int nranks, const ecclUniqueId& id) {
      ecclComm_t comm;
      RANK_OK(ecclCommInitRank(&comm, nranks, id, rank), nullptr);
      configure(comm, 1);
      for (int64_t v = 1; v <= 5; ++v) {
        putVersion(comm, rank, v);
        RANK_OK(ecclSnapshotCommit(comm, v), comm);
        RANK_OK(ecclSnapshotWait(comm, v, 30000), comm);
        // Every rank has committed it before rank 1 dies: a rank that
        // committed may still be passing the last notice on.
        float sync = 0;
        RANK_OK(ecclAllReduce(&sync, &sync, 1, ecclFloat32, ecclSum, comm, nullptr), comm);
        if (v == 4 || v == 5) RANK_OK(ecclSnapshotPersist(comm, dir.c_str()), comm);
        if (v == 5 && rank != 1) std::ofstream(dir + ".allreduce-done-" + std::to_string(rank)).put('1');
        if (v == 5 && rank == 1) {
          // Its allreduce returning says its part is handed over, not that
          // the last bytes left this process: it dies once the others have
          // theirs (or after 30 s), while its persist writes.
          const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
          while ((!std::filesystem::exists(dir + ".allreduce-done-0") ||
                  !std::filesystem::exists(dir + ".allreduce-done-2")) &&
                 std::chrono::steady_clock::now() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          raise(SIGKILL);
        }
        int64_t onDisk = -1;
        if (v == 4) RANK_OK(ecclSnapshotPersistWait(comm, 30000, &onDisk), comm);
        RANK_CHECK(v != 4 || onDisk == 4, "persisted " + std::to_string(onDisk));
      }
      int64_t onDisk = -1;
      RANK_OK(ecclSnapshotPersistWait(comm, 30000, &onDisk), comm);
      RANK_CHECK(onDisk == 5, "persisted " + std::to_string(onDisk));
      raise(SIGKILL);  // the whole job goes down
    });
    auto outcomes = job.wait(std::chrono::seconds(90));
    for (const auto& o : outcomes) ASSERT_TRUE(!o.exited && o.signal == SIGKILL) << describe(outcomes);
  }
  // Rank 1 never finished version 5 (its files may be partial, its manifest
  // missing): the restart loads version 4 and replicates it anew.
  ProcessGroup restart(n, [dir](int rank, int nranks, const ecclUniqueId& id) {
    ecclComm_t comm;
    RANK_OK(ecclCommInitRank(&comm, nranks, id, rank), nullptr);
    configure(comm, 1);
    // Rank 1's persist of version 5 was cut short unless it happened to
    // finish before the exit: its manifest, written last, says which.
    const int64_t expected = std::filesystem::exists(dir + "/v5/rank1.manifest") ? 5 : 4;
    int64_t v = -1;
    RANK_OK(ecclSnapshotLoad(comm, dir.c_str(), &v), comm);
    RANK_CHECK(v == expected, "loaded version " + std::to_string(v) + ", not " + std::to_string(expected));
    checkDense(comm, rank, v);
    putVersion(comm, rank, v + 1);
    RANK_OK(ecclSnapshotCommit(comm, v + 1), comm);
    RANK_OK(ecclSnapshotWait(comm, v + 1, 30000), comm);
    checkDense(comm, rank, v + 1);
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = restart.wait(std::chrono::seconds(90));
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
  std::filesystem::remove_all(dir);
  for (int rank : {0, 2}) std::filesystem::remove(dir + ".allreduce-done-" + std::to_string(rank));
}

}  // namespace
}  // namespace eccl::test
