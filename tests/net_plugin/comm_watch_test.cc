// The preload shim's bookkeeping through its own seam (a GroupSource the
// test controls): which uuid each communicator gets, that every member
// derives its children's alike, and what ncclCommGetAsyncError reports.
#include "net_plugin/preload/comm_watch.h"

#include <gtest/gtest.h>

#include <array>
#include <set>

namespace eccl::preload {
namespace {

struct FakeJob {
  std::set<uint64_t> watched, broken, left;
  bool inJob = true;
  GroupSource source() {
    return {[this](uint64_t u) {
              if (inJob) watched.insert(u);
              return inJob;
            },
            [this](uint64_t u) { left.insert(u); },
            [this](uint64_t u) -> std::optional<std::string> {
              if (!broken.count(u)) return std::nullopt;
              return "rank 2 failed: its connection to the coordinator closed";
            }};
  }
};

int comms[8];  // stand-ins for NCCL's communicator pointers

TEST(CommWatch, MembersDeriveTheSameUuidsForTheSameCalls) {
  std::array<char, 128> id{};
  id[0] = 7;
  FakeJob a, b;
  CommWatch left(a.source()), right(b.source());
  uint64_t root = CommWatch::uuidOfIds(id.data(), id.size());
  left.made(&comms[0], root);
  right.made(&comms[1], root);  // another process: its own pointer, the same id
  auto l1 = left.childUuid(&comms[0], 'S', 3), r1 = right.childUuid(&comms[1], 'S', 3);
  auto l2 = left.childUuid(&comms[0], 'S', 3), r2 = right.childUuid(&comms[1], 'S', 3);
  ASSERT_TRUE(l1 && r1 && l2 && r2);
  EXPECT_EQ(*l1, *r1);
  EXPECT_EQ(*l2, *r2);
  EXPECT_NE(*l1, *l2);  // the second split of the same parent is another communicator
  EXPECT_NE(*left.childUuid(&comms[0], 'S', 4), *left.childUuid(&comms[0], 'K', 4));
  EXPECT_FALSE(left.childUuid(&comms[5], 'S', 0));  // a parent the shim never saw
  id[1] = 1;
  EXPECT_NE(CommWatch::uuidOfIds(id.data(), id.size()), root);
}

TEST(CommWatch, ABrokenGroupTurnsSuccessAndInProgressIntoRemoteError) {
  FakeJob job;
  CommWatch w(job.source());
  w.made(&comms[0], 11);
  w.made(&comms[1], 12);
  EXPECT_EQ(job.watched, (std::set<uint64_t>{11, 12}));
  EXPECT_EQ(w.asyncError(&comms[0], CommWatch::kNcclSuccess), CommWatch::kNcclSuccess);
  job.broken.insert(11);
  EXPECT_EQ(w.asyncError(&comms[0], CommWatch::kNcclSuccess), CommWatch::kNcclRemoteError);
  EXPECT_EQ(w.asyncError(&comms[0], CommWatch::kNcclInProgress), CommWatch::kNcclRemoteError);
  EXPECT_EQ(w.asyncError(&comms[0], 2), 2);  // NCCL's own error stands
  EXPECT_EQ(w.asyncError(&comms[1], CommWatch::kNcclSuccess), CommWatch::kNcclSuccess);  // another group
  ASSERT_TRUE(w.failure(&comms[0]));
  EXPECT_NE(w.failure(&comms[0])->find("rank 2"), std::string::npos);
  w.destroyed(&comms[0]);
  EXPECT_EQ(job.left, std::set<uint64_t>{11});  // its exit no longer breaks the group for the others
  EXPECT_EQ(w.asyncError(&comms[0], CommWatch::kNcclSuccess), CommWatch::kNcclSuccess);
}

TEST(CommWatch, OutsideAJobNothingIsWatchedOrOverridden) {
  FakeJob job;
  job.inJob = false;
  job.broken.insert(11);
  CommWatch w(job.source());
  w.made(&comms[0], 11);
  EXPECT_EQ(w.asyncError(&comms[0], CommWatch::kNcclSuccess), CommWatch::kNcclSuccess);
  w.made(nullptr, 12);  // a failed creation leaves no communicator
  EXPECT_TRUE(job.watched.empty());
}

}  // namespace
}  // namespace eccl::preload
