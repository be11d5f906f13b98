// What the coordinator tells members, with raw clients on threads of one
// process: a failure report's neededFrom reaches the others in the same
// epoch, and watched groups break only for a member that was in them.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "membership/coord_client.h"
#include "membership/coordinator.h"
#include "membership/unique_id.h"

namespace eccl::membership {
namespace {

using namespace std::chrono_literals;

// One member's client and what it heard. The client is declared last: it
// is destroyed first, stopping its thread before what the callbacks fill.
struct Member {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<CoordMessage> failed, groupFailed;
  std::unique_ptr<CoordClient> client;

  Member(const UniqueIdData& id, int rank, int nranks) {
    JoinRequest join{Role::kRank, rank, nranks, 100u + static_cast<uint64_t>(rank), "tcp:127.0.0.1:1", false};
    client = std::make_unique<CoordClient>(id, join, 100, 3000, deadlineAfterMs(10000));
    CoordClient::Callbacks cb;
    cb.onFailed = [this](const CoordMessage& m) { record(failed, m); };
    cb.onGroupFailed = [this](const CoordMessage& m) { record(groupFailed, m); };
    client->setCallbacks(cb);
  }
  void record(std::vector<CoordMessage>& into, const CoordMessage& m) {
    std::lock_guard<std::mutex> lock(mu);
    into.push_back(m);
    cv.notify_all();
  }
  // The first message of `list` within 5 s.
  std::optional<CoordMessage> first(std::vector<CoordMessage>& list, std::chrono::milliseconds within = 5000ms) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, within, [&] { return !list.empty(); });
    return list.empty() ? std::nullopt : std::optional<CoordMessage>(list.front());
  }
};

std::vector<std::unique_ptr<Member>> formJob(int n) {
  UniqueIdData id = decodeUniqueId(createUniqueId());
  std::vector<std::unique_ptr<Member>> m(n);
  std::vector<std::thread> joins;
  for (int r = 0; r < n; ++r) joins.emplace_back([&, r] { m[r] = std::make_unique<Member>(id, r, n); });
  for (auto& t : joins) t.join();
  for (auto& member : m) member->client->awaitView(deadlineAfterMs(10000), "the first view");
  return m;
}

TEST(CoordinatorNews, AReportedLeaversNeededFromReachesTheOthersOfThatEpoch) {
  auto m = formJob(3);
  m[0]->client->report(102, "peer rank 2 has left (it destroyed its communicator)", /*neededFrom=*/40, /*epoch=*/1);
  auto f = m[1]->first(m[1]->failed);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->epoch, 1u);
  EXPECT_EQ(f->members, std::vector<uint64_t>{102});
  EXPECT_EQ(f->neededFrom, std::vector<uint64_t>{40});
}

TEST(CoordinatorNews, AReportFromAnotherEpochMeansEveryOp) {
  auto m = formJob(3);
  m[0]->client->report(102, "peer rank 2 has left", /*neededFrom=*/40, /*epoch=*/7);
  auto f = m[1]->first(m[1]->failed);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->neededFromOf(0), 0u);
}

TEST(CoordinatorNews, AFailedMemberBreaksOnlyTheGroupsItIsStillIn) {
  auto m = formJob(4);
  for (int r : {0, 1, 2}) m[r]->client->joinGroup(0xa);  // rank 2 is in group a
  for (int r : {0, 1, 3}) m[r]->client->joinGroup(0xb);  // not in group b
  m[3]->client->joinGroup(0xc);
  m[3]->client->leaveGroup(0xc);  // rank 3 was in group c, and left it in order
  m[0]->client->joinGroup(0xc);
  std::this_thread::sleep_for(200ms);  // the registrations arrive first
  m[0]->client->report(102, "rank 2's connection reset", 0, 1);
  auto g = m[1]->first(m[1]->groupFailed);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->uuid, 0xau);
  EXPECT_EQ(g->members, std::vector<uint64_t>{102});
  EXPECT_NE(g->text.find("rank 2"), std::string::npos) << g->text;
  EXPECT_FALSE(m[3]->first(m[3]->groupFailed, 300ms));  // rank 3 is in no group with rank 2
  m[1]->client->report(103, "rank 3's connection reset", 0, 1);
  ASSERT_TRUE(m[0]->first(m[0]->groupFailed));
  std::this_thread::sleep_for(300ms);
  {
    std::lock_guard<std::mutex> lock(m[0]->mu);
    std::vector<uint64_t> broken;
    for (auto& x : m[0]->groupFailed) broken.push_back(x.uuid);
    EXPECT_EQ(broken, (std::vector<uint64_t>{0xa, 0xb}));  // not c: rank 3 had left it
  }
  // A member that registers with a broken group hears it at once.
  m[0]->client->leaveGroup(0xc);
  m[1]->client->joinGroup(0xb);
  std::this_thread::sleep_for(300ms);
  std::lock_guard<std::mutex> lock(m[1]->mu);
  ASSERT_EQ(m[1]->groupFailed.size(), 3u);  // a, b, and b again on registering
  EXPECT_EQ(m[1]->groupFailed.back().uuid, 0xbu);
  EXPECT_EQ(m[1]->groupFailed.back().members, std::vector<uint64_t>{103});
}

}  // namespace
}  // namespace eccl::membership
