// Faults a script injects into the lanes (tests/support/fault_backend.h),
// over tcp and shm, in one process: each lands where the script says, so
// what eccl does between "peer alive" and "peer dead" is tested on
// purpose. Device pairs first; then collectives of thread ranks through
// the same back end, chosen by ECCL_TRANSPORT like any other.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "common/crypto.h"
#include "common/error.h"
#include "tests/support/collectives.h"
#include "tests/support/fault_backend.h"
#include "tests/support/multiproc.h"
#include "transport/device.h"

namespace eccl::test {
namespace {

using transport::Request;
using transport::RequestPtr;

// Two devices over a fault back end; member 0 writes what the rules strike.
struct FaultyPair {
  std::mutex mu;
  std::string failureAtA, failureAtB;  // outlive the devices, whose threads may still report
  std::unique_ptr<transport::Device> a, b;
  explicit FaultyPair(const std::string& backend, int lanes = 1) {
    transport::DeviceOptions o = faultDeviceOptions(backend, lanes, 11);
    a = transport::createDevice(o);
    o.self = 1;
    b = transport::createDevice(o);
    a->onPeerFailure = [this](transport::MemberId, ecclResult_t, const std::string& why, uint64_t, transport::FailureEvidence) {
      std::lock_guard<std::mutex> lock(mu);
      failureAtA = why;
    };
    b->onPeerFailure = [this](transport::MemberId, ecclResult_t, const std::string& why, uint64_t, transport::FailureEvidence) {
      std::lock_guard<std::mutex> lock(mu);
      failureAtB = why;
    };
    a->addPeer(1, b->address(), "rank 1");
    b->addPeer(0, a->address(), "rank 0");
    a->setEpoch(1);
    b->setEpoch(1);
  }
  ~FaultyPair() { clearFaults(); }
};

std::vector<uint8_t> pattern(size_t bytes, uint32_t seed) { return patternBytes(bytes, seed); }

// One message from a to b, both requests ended before the buffers go.
struct Exchange {
  std::vector<uint8_t> sent, got;
  RequestPtr send, recv;
  Exchange(FaultyPair& p, size_t bytes, uint64_t seq, const uint32_t* crc = nullptr)
      : sent(pattern(bytes, static_cast<uint32_t>(seq))), got(bytes, 0) {
    recv = p.b->irecv(0, seq, 0, got.data(), got.size());
    send = p.a->isend(1, seq, 0, sent.data(), sent.size(), crc);
  }
  // The receive's failure, empty when it completed.
  std::string receive(FaultyPair& p, int64_t ms) {
    try {
      p.b->wait(recv, deadlineAfterMs(ms), "recv");
      return {};
    } catch (const Error& e) {
      return e.what();
    }
  }
  void finish(FaultyPair& p) {
    try {
      p.a->wait(send, deadlineAfterMs(5000), "send");
    } catch (const Error&) {
    }
    if (recv->state.load() == Request::kPending) p.b->cancel(recv, "test over");
    if (send->state.load() == Request::kPending) p.a->cancel(send, "test over");
  }
};

// One message through before any rule: the lanes are open and counting.
bool warm(FaultyPair& p) {
  Exchange first(p, 64, 1);
  const bool ok = first.receive(p, 5000).empty() && first.got == first.sent;
  first.finish(p);
  return ok;
}

class LaneFaults : public ::testing::TestWithParam<std::string> {};

TEST_P(LaneFaults, AShortStallOnlyDelays) {
  FaultyPair p(GetParam());
  ASSERT_TRUE(warm(p));
  addFault({0, 0, FaultKind::kStall, 300});
  const auto start = Clock::now();
  Exchange x(p, 256 << 10, 2);
  EXPECT_EQ(x.receive(p, 10000), "");
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(250));
  EXPECT_EQ(x.got, x.sent);
  x.finish(p);
  EXPECT_EQ(p.failureAtB, "");
}

TEST_P(LaneFaults, EagainForAWhileOnlyDelays) {
  FaultyPair p(GetParam());
  ASSERT_TRUE(warm(p));
  const int before = faultsStruck();
  addFault({0, 0, FaultKind::kAgain, 200});
  Exchange x(p, 100 << 10, 2);
  EXPECT_EQ(x.receive(p, 10000), "");
  EXPECT_EQ(x.got, x.sent);
  x.finish(p);
  EXPECT_EQ(faultsStruck(), before + 1);
  EXPECT_EQ(p.failureAtB, "");
}

TEST_P(LaneFaults, OneByteWritesDeliverEveryByte) {
  FaultyPair p(GetParam());
  ASSERT_TRUE(warm(p));
  addFault({0, 0, FaultKind::kOneByte, 300});
  Exchange x(p, 20000, 2);
  EXPECT_EQ(x.receive(p, 10000), "");
  EXPECT_EQ(x.got, x.sent);
  x.finish(p);
}

// The third frame after the rule: two messages arrive whole, the third
// fails at the receiver naming the peer, and the sender's side names the
// back end's reason.
TEST_P(LaneFaults, AnErrorAfterTwoFramesFailsThePeerWithTheBackEndsReason) {
  FaultyPair p(GetParam());
  ASSERT_TRUE(warm(p));
  addFault({0, 2, FaultKind::kError});
  Exchange one(p, 100, 2), two(p, 100, 3);
  EXPECT_EQ(one.receive(p, 5000), "");
  EXPECT_EQ(two.receive(p, 5000), "");
  Exchange three(p, 100, 4);
  const std::string why = three.receive(p, 5000);
  EXPECT_NE(why.find("rank 0"), std::string::npos) << why;
  one.finish(p), two.finish(p), three.finish(p);
  std::lock_guard<std::mutex> lock(p.mu);
  EXPECT_NE(p.failureAtA.find("injected fault: error after 2 frames"), std::string::npos) << p.failureAtA;
}

TEST_P(LaneFaults, AClosedLaneFailsThePeerOnBothSides) {
  FaultyPair p(GetParam());
  ASSERT_TRUE(warm(p));
  addFault({0, 0, FaultKind::kClose});
  Exchange x(p, 1000, 2);
  const std::string why = x.receive(p, 5000);
  EXPECT_NE(why.find("rank 0"), std::string::npos) << why;
  x.finish(p);
  std::lock_guard<std::mutex> lock(p.mu);
  EXPECT_NE(p.failureAtA.find("injected fault: close"), std::string::npos) << p.failureAtA;
}

// A stall past the receiver's deadline: the wait ends at its deadline
// naming the peer, not before and not never.
TEST_P(LaneFaults, AStallLongerThanTheDeadlineEndsTheWaitNamingThePeer) {
  FaultyPair p(GetParam());
  ASSERT_TRUE(warm(p));
  addFault({0, 0, FaultKind::kStall, 3000});
  Exchange x(p, 1000, 2);
  const auto start = Clock::now();
  const std::string why = x.receive(p, 800);
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(700));
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(2900));
  EXPECT_NE(why.find("rank 0"), std::string::npos) << why;
  x.finish(p);
}

// A header whose checksum fails is refused: the frame is never delivered,
// the receiver names the peer and counts the rejection.
TEST_P(LaneFaults, AFlippedHeaderIsRefusedAndNamed) {
  FaultyPair p(GetParam());
  ASSERT_TRUE(warm(p));
  addFault({0, 0, FaultKind::kFlipHeader});
  Exchange x(p, 1000, 2);
  const std::string why = x.receive(p, 5000);
  EXPECT_NE(why, "");
  EXPECT_NE(why.find("rank 0"), std::string::npos) << why;
  EXPECT_GE(p.b->stats().framesRejected, 1u);
  EXPECT_NE(x.got, x.sent);
  x.finish(p);
}

// A flipped payload byte: a message that carries its checksum fails it at
// the receiver; one without is delivered as it came (eccl checksums only
// what its caller asks for: the boundary log's replays, snapshots).
TEST_P(LaneFaults, AFlippedPayloadFailsItsChecksumAndPassesWithoutOne) {
  FaultyPair p(GetParam());
  ASSERT_TRUE(warm(p));
  addFault({0, 0, FaultKind::kFlipPayload});
  {
    Exchange unchecked(p, 1000, 2);
    EXPECT_EQ(unchecked.receive(p, 5000), "");
    EXPECT_NE(unchecked.got, unchecked.sent);
    EXPECT_EQ(unchecked.got[0], unchecked.sent[0] ^ 0x5a);
    unchecked.finish(p);
  }
  addFault({0, 0, FaultKind::kFlipPayload});
  std::vector<uint8_t> body = pattern(1000, 3);
  const uint32_t crc = crc32c(body.data(), body.size());
  Exchange checked(p, 1000, 3, &crc);
  const std::string why = checked.receive(p, 5000);
  EXPECT_NE(why.find("checksum"), std::string::npos) << why;
  checked.finish(p);
}

// Two messages, the first frame held back behind the second; then two
// chunks of one bulk message swapped: everything lands whole and in place
// (frames name their message and offset; the lane's order is no promise).
TEST_P(LaneFaults, SwappedFramesStillLandWholeAndInPlace) {
  FaultyPair p(GetParam());
  ASSERT_TRUE(warm(p));
  const int swapped = framesSwapped();
  addFault({0, 0, FaultKind::kReorder, 3000});
  {
    Exchange first(p, 1000, 2), second(p, 3000, 3);
    EXPECT_EQ(second.receive(p, 5000), "");
    EXPECT_EQ(first.receive(p, 5000), "");
    EXPECT_EQ(first.got, first.sent);
    EXPECT_EQ(second.got, second.sent);
    first.finish(p);
    second.finish(p);
  }
  EXPECT_EQ(framesSwapped(), swapped + 1);

  addFault({0, 1, FaultKind::kReorder, 3000});  // the second and third of its chunks
  auto sent = pattern(4 * transport::Device::kBulkFrameBytes + 100, 9);
  std::vector<uint8_t> got(sent.size(), 0);
  RequestPtr recv = p.b->irecv(0, 4, 0, got.data(), got.size());
  RequestPtr send = p.a->isendBulk(1, 4, 0, sent.data(), sent.size());
  EXPECT_NO_THROW(p.b->wait(recv, deadlineAfterMs(5000), "recv"));
  EXPECT_NO_THROW(p.a->wait(send, deadlineAfterMs(5000), "send"));
  EXPECT_EQ(got, sent);
  EXPECT_EQ(framesSwapped(), swapped + 2);
}

// A held frame whose sender sends nothing after it goes alone once its
// time is up: a reorder never turns into a hang.
TEST_P(LaneFaults, AHeldFrameWithNothingBehindItGoesLate) {
  FaultyPair p(GetParam());
  ASSERT_TRUE(warm(p));
  const int swapped = framesSwapped(), struck = faultsStruck();
  addFault({0, 0, FaultKind::kReorder, 200});
  Exchange only(p, 500, 2);
  const auto start = Clock::now();
  EXPECT_EQ(only.receive(p, 5000), "");
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(150));
  EXPECT_EQ(only.got, only.sent);
  only.finish(p);
  EXPECT_EQ(faultsStruck(), struck + 1);
  EXPECT_EQ(framesSwapped(), swapped);
}

// A rule keyed by peer and lane strikes only there: with two lanes to
// each of two peers, closing lane 1 to one peer leaves the other peer's
// lanes and its own lane 0 alone until the device fails that peer.
TEST_P(LaneFaults, ARuleForOnePeersLaneStrikesOnlyThere) {
  FaultyPair p(GetParam(), /*lanes=*/2);
  ASSERT_TRUE(warm(p));
  const int struck = faultsStruck();
  addFault({0, 0, FaultKind::kClose, 0, 1, /*peer=*/7, /*lane=*/1});  // no such peer: never strikes
  EXPECT_TRUE(warm(p));
  Exchange striped(p, 1 << 20, 5);  // both lanes
  EXPECT_EQ(striped.receive(p, 5000), "");
  striped.finish(p);
  EXPECT_EQ(faultsStruck(), struck);
  addFault({0, 0, FaultKind::kClose, 0, 1, /*peer=*/1, /*lane=*/1});
  Exchange broken(p, 1 << 20, 6);
  std::string why = broken.receive(p, 5000);
  broken.finish(p);
  EXPECT_NE(why, "");
  EXPECT_NE(why.find("rank 0"), std::string::npos) << why;
  EXPECT_EQ(faultsStruck(), struck + 1);
}

INSTANTIATE_TEST_SUITE_P(Over, LaneFaults, ::testing::Values("fault-tcp", "fault-shm"),
                         [](const auto& info) { return info.param == "fault-tcp" ? "tcp" : "shm"; });

// Every collective of three thread ranks through the fault back end, with
// one-byte writes, short stalls and swapped frames struck on every
// member's lanes as they go: the results are exact and nobody is judged
// failed.
TEST(FaultyLanes, CollectivesSurviveStallsOneByteWritesAndSwappedFrames) {
  registerFaultBackends();
  setenv("ECCL_SOCKET_IFNAME", "lo", 1);
  for (const char* backend : {"fault-tcp", "fault-shm"}) {
    SCOPED_TRACE(backend);
    setenv("ECCL_TRANSPORT", backend, 1);
    const int before = faultsStruck(), swapped = framesSwapped();
    const FaultKind kinds[] = {FaultKind::kOneByte, FaultKind::kStall, FaultKind::kReorder};
    // A held frame is swapped only when its lane writes another before the
    // hold ends (not when the peer must answer it first): reorders strike
    // six lanes each, so some land where two frames go back to back. That
    // is timing: on two loaded cores under TSan a round can swap none, so
    // a few rounds run until one did (each round's results are checked).
    for (int round = 0; round < 5 && framesSwapped() == swapped; ++round) {
      for (int i = 0; i < 9; ++i)
        addFault({kAnyMember, 3 + 5 * i, kinds[i % 3], 50, kinds[i % 3] == FaultKind::kReorder ? 6 : 2});
      runThreads(3, [](int, ecclComm_t comm) {
        for (size_t count : {size_t(1), size_t(1000), size_t(70001)}) checkEveryCollective(comm, count, false);
      });
      clearFaults();
    }
    EXPECT_GT(faultsStruck(), before);
    EXPECT_GT(framesSwapped(), swapped);
  }
  unsetenv("ECCL_TRANSPORT");
}

// A lane that breaks under a collective: every rank's call fails, the
// survivors name the member whose lane broke or a peer that reported it.
TEST(FaultyLanes, ALaneBrokenUnderACollectiveFailsEveryRankNamingAPeer) {
  registerFaultBackends();
  setenv("ECCL_SOCKET_IFNAME", "lo", 1);
  setenv("ECCL_TRANSPORT", "fault-tcp", 1);
  setenv("ECCL_TIMEOUT_MS", "5000", 1);
  std::atomic<int> failed{0}, warm{0};
  runThreads(3, [&](int rank, ecclComm_t comm) {
    std::vector<float> v(50000, 1.0f);
    ASSERT_EQ(ecclAllReduce(v.data(), v.data(), v.size(), ecclFloat32, ecclSum, comm, nullptr), ecclSuccess);
    warm++;
    if (rank == 0) {  // once every rank is past the first allreduce
      for (int i = 0; i < 1000 && warm.load() < 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      addFault({kAnyMember, 0, FaultKind::kClose});
    }
    ecclResult_t r = ecclSuccess;
    for (int i = 0; i < 20 && r == ecclSuccess; ++i)
      r = ecclAllReduce(v.data(), v.data(), v.size(), ecclFloat32, ecclSum, comm, nullptr);
    EXPECT_NE(r, ecclSuccess) << "rank " << rank << " never saw the broken lane";
    EXPECT_NE(std::string(ecclGetLastError(comm)).find("rank"), std::string::npos) << ecclGetLastError(comm);
    if (r != ecclSuccess) failed++;
  });
  EXPECT_EQ(failed.load(), 3);
  clearFaults();
  unsetenv("ECCL_TRANSPORT");
  unsetenv("ECCL_TIMEOUT_MS");
}

// The reconfiguration through the fault back end, in one process: a rank
// whose lanes stall for good and that makes no call (what SIGSTOP does to
// a process) cannot answer a ping, so the others' collective fails naming
// it, the coordinator fences it on their report, and a standby thread
// takes its rank; the new view's collectives are exact. Its progress
// thread still reads: it sees the others close their lanes on it and
// reports them, as a process that stalled past the deadline and came back
// would; the coordinator takes the word of the accused over that report.
TEST(FaultyLanes, AStalledRankIsFencedAndAStandbyTakesItsRank) {
  registerFaultBackends();
  setenv("ECCL_SOCKET_IFNAME", "lo", 1);
  setenv("ECCL_TRANSPORT", "fault-tcp", 1);
  setenv("ECCL_TIMEOUT_MS", "1500", 1);
  constexpr int kRanks = 3, kVictim = 2;
  ecclUniqueId id;
  ASSERT_EQ(ecclGetUniqueId(&id), ecclSuccess);
  std::mutex mu;
  std::vector<std::string> problems;
  auto problem = [&](int who, const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    problems.push_back("rank " + std::to_string(who) + ": " + what);
  };
  std::atomic<int> ready{0};
  std::atomic<bool> armed{false};
  std::atomic<uint64_t> victimMember{0};
  std::atomic<int> recovered{0};  // the survivors and the standby, past their allreduce in the new view
  auto waitFor = [](const std::function<bool()>& done) {
    for (int i = 0; i < 2000 && !done(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return done();
  };
  auto sumOfRanks = [&](ecclComm_t comm, int rank, int who) {
    std::vector<float> v(4096, float(rank + 1));
    if (ecclAllReduce(v.data(), v.data(), v.size(), ecclFloat32, ecclSum, comm, nullptr) != ecclSuccess)
      return problem(who, std::string("allreduce in the new view: ") + ecclGetLastError(comm));
    for (float x : v)
      if (x != float(kRanks * (kRanks + 1) / 2)) return problem(who, "allreduce in the new view: " + std::to_string(x));
  };

  std::thread standby([&] {
    ecclComm_t comm = nullptr;
    if (ecclCommRegisterStandby(&comm, id, nullptr) != ecclSuccess) return problem(-1, "register standby");
    ready++;
    if (ecclCommAwaitPromotion(comm, 30000) != ecclSuccess) {
      problem(-1, std::string("promotion: ") + ecclGetLastError(comm));
      ecclCommAbort(comm);
      return;
    }
    int rank = -1;
    ecclCommUserRank(comm, &rank);
    if (rank != kVictim) problem(-1, "the standby took rank " + std::to_string(rank));
    sumOfRanks(comm, rank, -1);
    recovered++;
    ecclCommDestroy(comm);
  });
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r)
    ranks.emplace_back([&, r] {
      ecclComm_t comm = nullptr;
      if (ecclCommInitRank(&comm, kRanks, id, r) != ecclSuccess) return problem(r, "init");
      std::vector<float> v(4096, 1.0f);
      if (ecclAllReduce(v.data(), v.data(), v.size(), ecclFloat32, ecclSum, comm, nullptr) != ecclSuccess)
        problem(r, std::string("first allreduce: ") + ecclGetLastError(comm));
      if (r == kVictim) {
        uint64_t m = 0;
        ecclCommMemberId(comm, &m);
        victimMember = m;
      }
      ready++;
      if (r == 0 && waitFor([&] { return ready.load() == kRanks + 1; })) {
        addFault({victimMember.load(), 0, FaultKind::kStall, 60000, 16});
        armed = true;
      }
      if (!waitFor([&] { return armed.load(); })) return problem(r, "never armed"), (void)ecclCommAbort(comm);
      if (r == kVictim) {
        if (!waitFor([&] { return recovered.load() == kRanks; }))
          problem(r, "the others did not recover around the stalled rank");
        ecclCommAbort(comm);
        return;
      }
      ecclResult_t rc = ecclAllReduce(v.data(), v.data(), v.size(), ecclFloat32, ecclSum, comm, nullptr);
      const std::string why = rc == ecclSuccess ? "" : ecclGetLastError(comm);
      if (rc == ecclSuccess || why.find("rank 2") == std::string::npos)
        problem(r, "the allreduce under a stalled rank 2 ended with: " + (rc == ecclSuccess ? "success" : why));
      if (ecclCommRecover(comm, ecclRecoverReplace) != ecclSuccess)
        problem(r, std::string("recover: ") + ecclGetLastError(comm));
      else
        sumOfRanks(comm, r, r);
      recovered++;
      ecclCommDestroy(comm);
    });
  for (auto& t : ranks) t.join();
  standby.join();
  clearFaults();
  unsetenv("ECCL_TRANSPORT");
  unsetenv("ECCL_TIMEOUT_MS");
  EXPECT_TRUE(problems.empty()) << ::testing::PrintToString(problems);
}

}  // namespace
}  // namespace eccl::test
