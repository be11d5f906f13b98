// A member of a job speaking to the coordinator through the real member
// client, for tests of the coordinator itself (no data lanes): it records
// every member named in a failure notice it hears.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "common/clock.h"
#include "membership/coord_client.h"
#include "membership/coordinator.h"

namespace eccl::test {

struct MemberClient {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<uint64_t> failed;  // every member a failure notice named, in order
  std::unique_ptr<membership::CoordClient> client;  // last: destroyed first, before what its callbacks fill

  // Rank `rank` of `nranks` as member `memberId`, heartbeats every 100 ms.
  MemberClient(const membership::UniqueIdData& id, int rank, int nranks, uint64_t memberId, int64_t heartbeatTimeoutMs,
               int64_t failoverMs) {
    membership::JoinRequest join{membership::Role::kRank, rank, nranks, memberId, "tcp:127.0.0.1:1", false};
    join.failoverMs = failoverMs;
    client = std::make_unique<membership::CoordClient>(id, join, 100, heartbeatTimeoutMs, deadlineAfterMs(10000));
    membership::CoordClient::Callbacks cb;
    cb.onFailed = [this](const membership::CoordMessage& m) {
      std::lock_guard<std::mutex> lock(mu);
      failed.insert(failed.end(), m.members.begin(), m.members.end());
      cv.notify_all();
    };
    client->setCallbacks(cb);
  }
  bool heard(uint64_t member, std::chrono::milliseconds within) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, within, [&] { return std::count(failed.begin(), failed.end(), member) > 0; });
  }
};

// The survivors (ranks 0.. in order) ask for SHRINK at epoch 1 and each
// gets epoch 2 holding `expected`, its own rank unchanged.
inline void expectShrunkTo(const std::vector<MemberClient*>& survivors, const std::vector<uint64_t>& expected) {
  for (MemberClient* m : survivors)
    m->client->requestRecover(1, static_cast<uint32_t>(membership::RecoverPolicy::kShrink));
  for (size_t r = 0; r < survivors.size(); ++r) {
    membership::ViewUpdate v = survivors[r]->client->awaitView(deadlineAfterMs(10000), "the recovered view");
    EXPECT_EQ(v.epoch, 2u);
    EXPECT_EQ(v.rank, static_cast<int>(r));
    std::vector<uint64_t> got;
    for (const auto& e : v.entries) got.push_back(e.member);
    EXPECT_EQ(got, expected);
  }
}

}  // namespace eccl::test
