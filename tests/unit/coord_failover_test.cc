// A coordinator replaced by a successor that took over its durable state:
// real member clients on threads of one process, real sockets. The members
// resume with the successor at the job's address, keep their ids and ranks,
// and the successor goes on serving them (a failure, a recovery). A standby
// whose admission the dead one never replicated joins the successor afresh
// and can still take a rank; a first join cut off mid-handshake by the
// coordinator's death is made again with its successor.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/crypto.h"
#include "common/error.h"
#include "common/socket.h"
#include "membership/coord_client.h"
#include "membership/coordinator.h"
#include "membership/unique_id.h"
#include "tests/support/member_client.h"

namespace eccl::membership {
namespace {

using namespace std::chrono_literals;

using Member = test::MemberClient;

class CoordinatorFailover : public ::testing::Test {
 protected:
  void SetUp() override {
    randomBytes(id.secret.data(), id.secret.size());
    randomBytes(&id.jobId, sizeof(id.jobId));
    SockAddr loopback = SockAddr::parse("127.0.0.1:0");
    auto [fd, bound] = listenOn(loopback);
    id.root = bound;
    options.heartbeatMs = 100;
    options.heartbeatTimeoutMs = 1500;
    // What a replica would write to etcd: the state as of before the members hear of a change.
    options.replicate = [this](const CoordinatorState* state) {
      if (state) {
        std::lock_guard<std::mutex> lock(stateMu);
        written = *state;
      }
      return true;
    };
    first = std::make_unique<Coordinator>(id, std::move(fd), options);
  }

  std::vector<std::unique_ptr<Member>> form(int n, int64_t failoverMs) {
    std::vector<std::unique_ptr<Member>> m(n);
    std::vector<std::thread> joins;
    for (int r = 0; r < n; ++r) joins.emplace_back([&, r] { m[r] = std::make_unique<Member>(id, r, n, 500u + r, 1500, failoverMs); });
    for (auto& t : joins) t.join();
    for (auto& member : m) EXPECT_EQ(member->client->awaitView(deadlineAfterMs(10000), "the first view").epoch, 1u);
    return m;
  }

  // The first coordinator dies; a successor with its state listens at the
  // job's address.
  void replaceCoordinator() {
    CoordinatorState state;
    {
      std::lock_guard<std::mutex> lock(stateMu);
      state = written;
    }
    ASSERT_FALSE(state.empty());
    first.reset();
    auto [fd, bound] = listenOn(id.root);
    CoordinatorOptions next = options;
    next.replicate = nullptr;
    next.takeOver = state;
    second = std::make_unique<Coordinator>(id, std::move(fd), next);
  }

  UniqueIdData id;
  CoordinatorOptions options;
  std::mutex stateMu;
  CoordinatorState written;  // the first coordinator's last state
  std::unique_ptr<Coordinator> first, second;
};

TEST_F(CoordinatorFailover, MembersResumeWithTheSuccessorKeepTheirRanksAndRecoverThroughIt) {
  auto m = form(3, /*failoverMs=*/5000);
  replaceCoordinator();
  std::this_thread::sleep_for(2500ms);  // past the heartbeat timeout: resumed members are not declared
  for (auto& member : m) EXPECT_FALSE(member->client->evicted());
  EXPECT_EQ(second->viewPids().size(), 1u);  // all three are this process
  m[2]->client.reset();                      // rank 2 dies under the successor
  ASSERT_TRUE(m[0]->heard(502, 5000ms));
  ASSERT_TRUE(m[1]->heard(502, 5000ms));
  test::expectShrunkTo({m[0].get(), m[1].get()}, {500, 501});
}

TEST_F(CoordinatorFailover, ARecoveryAskedOfTheDeadCoordinatorIsAnsweredByTheSuccessor) {
  auto m = form(3, /*failoverMs=*/5000);
  m[2]->client.reset();
  ASSERT_TRUE(m[0]->heard(502, 5000ms));
  ASSERT_TRUE(m[1]->heard(502, 5000ms));
  m[0]->client->requestRecover(1, static_cast<uint32_t>(RecoverPolicy::kShrink));
  std::this_thread::sleep_for(300ms);  // rank 0's ask is in the first coordinator's state
  replaceCoordinator();
  m[1]->client->requestRecover(1, static_cast<uint32_t>(RecoverPolicy::kShrink));
  for (int r : {0, 1}) {
    ViewUpdate v = m[r]->client->awaitView(deadlineAfterMs(10000), "the recovered view");
    EXPECT_EQ(v.epoch, 2u);
    EXPECT_EQ(v.entries.size(), 2u);
  }
}

// What one member heard of a migration: PREPARE and READY, by epoch.
struct Announcements {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<CoordKind, uint32_t>> heard;

  CoordClient::Callbacks callbacks() {
    CoordClient::Callbacks cb;
    cb.onReconfiguration = [this](const CoordMessage& m) {
      std::lock_guard<std::mutex> lock(mu);
      heard.emplace_back(m.kind, m.epoch);
      cv.notify_all();
    };
    return cb;
  }
  bool awaitCount(CoordKind kind, uint32_t epoch, size_t count) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, 10s, [&] {
      return static_cast<size_t>(std::count(heard.begin(), heard.end(), std::make_pair(kind, epoch))) >= count;
    });
  }
};

// A migration straddles the coordinator change: two of its three members
// prepared with the first coordinator; the successor knows the migration,
// tells each participant again, sends READY once the last is prepared, and
// commits on the first yes; the leaver hears that it has left.
TEST_F(CoordinatorFailover, AMigrationPreparedWithTheDeadCoordinatorCommitsWithTheSuccessor) {
  auto m = form(3, /*failoverMs=*/5000);
  JoinRequest spare{Role::kStandby, -1, 3, 600, "tcp:127.0.0.1:1", false};
  spare.failoverMs = 5000;
  auto standby = std::make_unique<CoordClient>(id, spare, 100, 1500, deadlineAfterMs(10000));
  std::array<Announcements, 4> heard;  // ranks 0..2, then the standby
  std::array<CoordClient*, 4> clients = {m[0]->client.get(), m[1]->client.get(), m[2]->client.get(),
                                         standby.get()};
  for (size_t i = 0; i < 4; ++i) clients[i]->setCallbacks(heard[i].callbacks());
  std::this_thread::sleep_for(300ms);  // the standby is registered
  clients[0]->requestMigration(1);
  for (size_t i = 0; i < 4; ++i) ASSERT_TRUE(heard[i].awaitCount(CoordKind::kPrepare, 2, 1)) << i;
  clients[0]->prepared(2);
  clients[3]->prepared(2);
  std::this_thread::sleep_for(300ms);  // both are in the first coordinator's state
  replaceCoordinator();
  for (size_t i = 0; i < 4; ++i) ASSERT_TRUE(heard[i].awaitCount(CoordKind::kPrepare, 2, 2)) << "told again: " << i;
  clients[2]->prepared(2);
  for (size_t i = 0; i < 4; ++i) ASSERT_TRUE(heard[i].awaitCount(CoordKind::kPrepareReady, 2, 1)) << i;
  clients[1]->requestSwitchover(2);  // the leaver waits for the outcome
  for (size_t i : {0, 2, 3}) clients[i]->reportSwitched(2, /*urgent=*/true);
  ViewUpdate left = clients[1]->awaitView(deadlineAfterMs(10000), "the leaver's outcome");
  EXPECT_EQ(left.epoch, 2u);
  EXPECT_EQ(left.rank, -1);
  std::vector<uint64_t> next;
  for (const auto& e : left.entries) next.push_back(e.member);
  EXPECT_EQ(next, (std::vector<uint64_t>{500, 600, 502}));
  const std::string status = queryCoordinatorStatus(id, deadlineAfterMs(5000));
  EXPECT_NE(status.find("epoch 2"), std::string::npos) << status;
  for (CoordClient* c : clients) EXPECT_FALSE(c->evicted());
}

// The leader admits a standby and dies before replicating it: the
// successor's state lacks it and refuses its resume as unknown. A standby
// holds nothing the job needs yet, so it registers afresh (same id) instead
// of ending, and is there when a rank fails.
TEST_F(CoordinatorFailover, AStandbyTheDeadCoordinatorNeverReplicatedJoinsItsSuccessorAfresh) {
  auto m = form(3, /*failoverMs=*/5000);
  CoordinatorState beforeTheStandby;
  {
    std::lock_guard<std::mutex> lock(stateMu);
    beforeTheStandby = written;
  }
  JoinRequest spare{Role::kStandby, -1, 3, 600, "tcp:127.0.0.1:1", false};
  spare.failoverMs = 5000;
  auto standby = std::make_unique<CoordClient>(id, spare, 100, 1500, deadlineAfterMs(10000));
  // The status the coordinator answers once it lists the standby, or its last.
  auto statusListingTheStandby = [&](int64_t withinMs) {
    std::string status;
    for (auto until = deadlineAfterMs(withinMs); Clock::now() < until; std::this_thread::sleep_for(20ms)) {
      status = queryCoordinatorStatus(id, deadlineAfterMs(5000));
      if (status.find("standby: member 0000000000000258") != std::string::npos) break;
    }
    return status;
  };
  std::string status = statusListingTheStandby(5000);
  ASSERT_NE(status.find("standby: member 0000000000000258"), std::string::npos) << status;
  {
    std::lock_guard<std::mutex> lock(stateMu);
    written = beforeTheStandby;  // its admission never reached etcd
  }
  replaceCoordinator();
  status = statusListingTheStandby(8000);
  ASSERT_NE(status.find("standby: member 0000000000000258"), std::string::npos)
      << "the standby did not register with the successor:\n" << status;
  m[2]->client.reset();  // rank 2 dies; the standby takes its place
  ASSERT_TRUE(m[0]->heard(502, 5000ms));
  ASSERT_TRUE(m[1]->heard(502, 5000ms));
  for (int r : {0, 1}) m[r]->client->requestRecover(1, static_cast<uint32_t>(RecoverPolicy::kReplace));
  ViewUpdate promoted = standby->awaitView(deadlineAfterMs(10000), "the standby's promotion");
  while (promoted.rank < 0) promoted = standby->awaitView(deadlineAfterMs(10000), "the standby's promotion");
  EXPECT_EQ(promoted.epoch, 2u);
  EXPECT_EQ(promoted.rank, 2);
  for (int r : {0, 1}) {
    ViewUpdate v = m[r]->client->awaitView(deadlineAfterMs(10000), "the replaced view");
    std::vector<uint64_t> got;
    for (const auto& e : v.entries) got.push_back(e.member);
    EXPECT_EQ(got, (std::vector<uint64_t>{500, 501, 600}));
  }
  EXPECT_FALSE(standby->evicted());
}

// The coordinator dies between accepting a member's connection and
// accepting its proof; a successor takes the job's address. The member's
// first join is made again there rather than failing the member.
TEST_F(CoordinatorFailover, AFirstJoinCutOffMidHandshakeIsMadeAgainWithTheSuccessor) {
  first.reset();
  auto [dying, at] = listenOn(id.root);
  ASSERT_EQ(at.str(), id.root.str());
  std::unique_ptr<Member> member;
  std::string failure;
  std::thread joining([&] {
    try {
      member = std::make_unique<Member>(id, 0, 1, 500, 1500, 5000);
    } catch (const Error& e) {
      failure = e.what();
    }
  });
  SockAddr peer;
  Fd conn = acceptUntil(dying.get(), deadlineAfterMs(5000), &peer);
  char hello[8];
  const bool cut = conn && ::recv(conn.get(), hello, sizeof(hello), 0) > 0;
  linger reset{1, 0};
  ::setsockopt(conn.get(), SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
  conn.reset();   // the connection is reset mid-handshake
  dying.reset();  // and the address freed
  auto [fd, bound] = listenOn(id.root);
  CoordinatorOptions next = options;
  next.replicate = nullptr;
  second = std::make_unique<Coordinator>(id, std::move(fd), next);
  joining.join();
  ASSERT_TRUE(cut) << "the member never began its handshake with the dying coordinator";
  ASSERT_TRUE(failure.empty()) << failure;
  ASSERT_TRUE(member);
  EXPECT_EQ(member->client->awaitView(deadlineAfterMs(10000), "the first view").epoch, 1u);
}

TEST_F(CoordinatorFailover, WithoutFailoverALostCoordinatorIsFinal) {
  auto m = form(2, /*failoverMs=*/0);
  replaceCoordinator();
  EXPECT_THROW(m[0]->client->awaitView(deadlineAfterMs(5000), "a view"), Error);
}

}  // namespace
}  // namespace eccl::membership
