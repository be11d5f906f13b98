// Call signatures: ranks that disagree about a call (its collective, type,
// reduction op, root or count; a send and a receive about type or count)
// all get ecclInvalidUsage naming both calls, within the call or the next
// one, never a hang or a result of mismatched data. The op before the
// mismatch completes everywhere.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "tests/support/multiproc.h"

namespace eccl::test {
namespace {

struct Call {
  std::string described;  // as the error message prints it
  std::function<ecclResult_t(ecclComm_t, int rank, int n)> run;
};

struct Case {
  const char* name;
  Call agreed, odd;  // the odd rank calls `odd`, the others `agreed`
  bool failsInTheCall;  // false: a rank may finish the call and fail the next
  // Ranks that disagree without sending each other anything (two roots of
  // a reduce) find out at the deadline, by asking each other: a short one.
  const char* timeoutMs = "20000";
  bool oddIsFirst = false;  // rank 0 is the odd one (else the last rank)
  // The odd rank, a pure sender whose call succeeded, destroys its
  // communicator and exits at once: the others still name the disagreement.
  bool oddLeaves = false;
};

std::vector<float>& buffer() {
  static std::vector<float> b(4096 * 8, 1.0f);
  return b;
}

Call allreduce(size_t count, ecclDataType_t type, ecclRedOp_t op, const char* described) {
  return {described, [=](ecclComm_t c, int, int) {
            return ecclAllReduce(buffer().data(), buffer().data(), count, type, op, c, nullptr);
          }};
}

Call broadcast(size_t count, int root, const char* described) {
  return {described, [=](ecclComm_t c, int, int) {
            return ecclBroadcast(buffer().data(), buffer().data(), count, ecclFloat32, root, c, nullptr);
          }};
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"Type", allreduce(1024, ecclFloat32, ecclSum, "allreduce(count 1024, float, sum)"),
       allreduce(1024, ecclInt32, ecclSum, "allreduce(count 1024, int32, sum)"), true},
      {"Op", allreduce(64, ecclFloat32, ecclSum, "allreduce(count 64, float, sum)"),
       allreduce(64, ecclFloat32, ecclMax, "allreduce(count 64, float, max)"), true},
      {"Count", allreduce(1024, ecclFloat32, ecclSum, "allreduce(count 1024, float, sum)"),
       allreduce(1000, ecclFloat32, ecclSum, "allreduce(count 1000, float, sum)"), true},
      {"CountOfALargeRing", allreduce(4096 * 8, ecclFloat32, ecclSum, "allreduce(count 32768, float, sum)"),
       allreduce(4096 * 8 - 5, ecclFloat32, ecclSum, "allreduce(count 32763, float, sum)"), true},
      {"CountZero", allreduce(16, ecclFloat32, ecclSum, "allreduce(count 16, float, sum)"),
       allreduce(0, ecclFloat32, ecclSum, "allreduce(count 0, float, sum)"), false},
      // Over shared memory the others' 16384-byte messages take the slots and
      // the odd rank's 16388-byte receive the ring: it finds out at the
      // deadline, when its ping's answer carries the sender's call.
      {"CountAcrossTheSlotLimit", broadcast(4096, 0, "broadcast(count 4096, float, root 0)"),
       broadcast(4097, 0, "broadcast(count 4097, float, root 0)"), false, "1500"},
      {"Root", broadcast(64, 0, "broadcast(count 64, float, root 0)"),
       broadcast(64, 1, "broadcast(count 64, float, root 1)"), false},
      {"ReduceRoot",
       {"reduce(count 64, float, sum, root 0)",
        [](ecclComm_t c, int, int) {
          return ecclReduce(buffer().data(), buffer().data() + 64, 64, ecclFloat32, ecclSum, 0, c, nullptr);
        }},
       {"reduce(count 64, float, sum, root 1)",
        [](ecclComm_t c, int, int) {
          return ecclReduce(buffer().data(), buffer().data() + 64, 64, ecclFloat32, ecclSum, 1, c, nullptr);
        }},
       false, "1500"},
      {"Collective", allreduce(256, ecclFloat32, ecclSum, "allreduce(count 256, float, sum)"),
       {"reducescatter(count 256, float, sum)",
        [](ecclComm_t c, int, int n) {
          return ecclReduceScatter(buffer().data(), buffer().data() + 256 * n, 256, ecclFloat32, ecclSum, c, nullptr);
        }},
       true},
      // The root of a broadcast only sends: the others' allreduce must name
      // its broadcast, whether it waits in its next call or has gone.
      {"BroadcastAgainstAllreduce", allreduce(64, ecclFloat32, ecclSum, "allreduce(count 64, float, sum)"),
       broadcast(64, 0, "broadcast(count 64, float, root 0)"), false, "20000", true},
      {"BroadcastRootGone", allreduce(64, ecclFloat32, ecclSum, "allreduce(count 64, float, sum)"),
       broadcast(64, 0, "broadcast(count 64, float, root 0)"), false, "20000", true, true},
      {"SendRecvType",
       {"recv(count 512, float)",
        [](ecclComm_t c, int rank, int n) {
          return rank == 0 ? ecclRecv(buffer().data(), 512, ecclFloat32, n - 1, c, nullptr) : ecclSuccess;
        }},
       {"send(count 512, int32)",
        [](ecclComm_t c, int, int) { return ecclSend(buffer().data(), 512, ecclInt32, 0, c, nullptr); }},
       false},
      {"SendRecvCount",
       {"recv(count 512, float)",
        [](ecclComm_t c, int rank, int n) {
          return rank == 0 ? ecclRecv(buffer().data(), 512, ecclFloat32, n - 1, c, nullptr) : ecclSuccess;
        }},
       {"send(count 500, float)",
        [](ecclComm_t c, int, int) { return ecclSend(buffer().data(), 500, ecclFloat32, 0, c, nullptr); }},
       false},
  };
  return all;
}

class Signatures : public ::testing::TestWithParam<std::tuple<int, size_t>> {};

TEST_P(Signatures, EveryRankGetsInvalidUsageNamingBothCalls) {
  const int n = std::get<0>(GetParam());
  const Case& c = cases()[std::get<1>(GetParam())];
  setenv("ECCL_SOCKET_IFNAME", "lo", 1);
  // The deadline also covers connecting, which the VM's emulated CPUs on a
  // loaded host can make slower than a short one (CI: ReduceRoot at 5
  // ranks timed out connecting under TCG beside a busy host).
  const std::string timeoutMs = std::to_string(std::atoll(c.timeoutMs) * timeScale());
  setenv("ECCL_TIMEOUT_MS", timeoutMs.c_str(), 1);
  ProcessGroup group(n, [&](int rank, int nranks, const ecclUniqueId& id) {
    ecclComm_t comm;
    RANK_OK(ecclCommInitRank(&comm, nranks, id, rank), nullptr);
    // An op everyone agrees on first: it completes everywhere, even on a
    // rank still finishing it when another finds the mismatch of the next.
    std::vector<int64_t> v(8, rank + 1);
    RANK_OK(ecclAllReduce(v.data(), v.data(), v.size(), ecclInt64, ecclSum, comm, nullptr), comm);
    RANK_CHECK(v[0] == nranks * (nranks + 1) / 2, "the agreed allreduce gave " + std::to_string(v[0]));
    const bool odd = rank == (c.oddIsFirst ? 0 : nranks - 1);
    const Call& mine = odd ? c.odd : c.agreed;
    ecclResult_t r = mine.run(comm, rank, nranks);
    std::string why = ecclGetLastError(comm);
    if (odd && c.oddLeaves && r == ecclSuccess) {
      RANK_OK(ecclCommDestroy(comm), nullptr);
      return;
    }
    if (r == ecclSuccess) {
      RANK_CHECK(!c.failsInTheCall, "the mismatched call succeeded");
      r = ecclBarrier(comm);
      why = ecclGetLastError(comm);
    }
    RANK_CHECK(r == ecclInvalidUsage, std::string("got ") + ecclGetErrorString(r) + ": " + why);
    RANK_CHECK(why.find(c.agreed.described) != std::string::npos && why.find(c.odd.described) != std::string::npos,
               "the error does not name both calls: " + why);
    ecclResult_t async = ecclSuccess;
    RANK_OK(ecclCommGetAsyncError(comm, &async), comm);
    RANK_CHECK(async == ecclInvalidUsage, std::string("async error ") + ecclGetErrorString(async));
    RANK_CHECK(ecclAllReduce(v.data(), v.data(), 1, ecclInt64, ecclSum, comm, nullptr) == ecclInvalidUsage,
               "a later op did not fail");
    r = ecclCommRecover(comm, ecclRecoverReplace);
    RANK_CHECK(r == ecclInvalidUsage, std::string("recover gave ") + ecclGetErrorString(r));
    RANK_OK(ecclCommDestroy(comm), nullptr);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  unsetenv("ECCL_TIMEOUT_MS");
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
  for (const auto& o : outcomes)
    EXPECT_LT(o.seconds, 15.0 * timeScale()) << "a rank waited for a deadline\n" << describe(outcomes);
}

// With the check off (ECCL_CHECK_CALLS=0) nothing is compared: a
// disagreement of type with equal byte counts passes, as it did before.
TEST(SignaturesOff, AgreeingByteCountsPassUnchecked) {
  setenv("ECCL_SOCKET_IFNAME", "lo", 1);
  setenv("ECCL_CHECK_CALLS", "0", 1);
  ProcessGroup group(2, [](int rank, int nranks, const ecclUniqueId& id) {
    ecclComm_t comm;
    RANK_OK(ecclCommInitRank(&comm, nranks, id, rank), nullptr);
    std::vector<int32_t> v(16, 1);
    RANK_OK(ecclAllReduce(v.data(), v.data(), v.size(), rank ? ecclInt32 : ecclUint32, ecclSum, comm, nullptr), comm);
    RANK_CHECK(v[0] == 2, "got " + std::to_string(v[0]));
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(30));
  unsetenv("ECCL_CHECK_CALLS");
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
}

std::string caseName(const ::testing::TestParamInfo<std::tuple<int, size_t>>& info) {
  return std::string(cases()[std::get<1>(info.param)].name) + "At" + std::to_string(std::get<0>(info.param)) + "Ranks";
}

INSTANTIATE_TEST_SUITE_P(Fields, Signatures,
                         ::testing::Combine(::testing::Values(2, 3, 5), ::testing::Range(size_t{0}, cases().size())),
                         caseName);

}  // namespace
}  // namespace eccl::test
