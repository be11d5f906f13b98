// The device's matching table (src/transport/message_table.h) on its own:
// posted and early messages, the staging pool behind them, arrival order,
// and receives that drain while a peer may still write into them.
#include "transport/message_table.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace eccl::transport::lanes {
namespace {

InboxKey key(uint64_t seq, MemberId peer = 7) { return {3, peer, seq, 0}; }

TEST(MessageTable, AnEarlyMessageIsStagedNumberedAndDeliveredIntoTheLaterReceive) {
  MessageTable table;
  auto first = table.openUnexpected(key(1), 16);
  auto second = table.openUnexpected(key(2), 4);
  EXPECT_EQ(first->second.arrival, 1u);
  EXPECT_EQ(second->second.arrival, 2u) << "arrivals are numbered in order (Device::arrived reports it)";
  EXPECT_TRUE(first->second.unexpected);
  EXPECT_EQ(table.unexpectedBytesHeld(), 20u);
  std::memcpy(first->second.base(), "sixteen bytes!!", 16);
  first->second.received = 16;

  std::vector<char> user(16);
  Inbox& box = first->second;
  box.request = std::make_shared<Request>();
  box.userBuffer = reinterpret_cast<uint8_t*>(user.data());
  EXPECT_EQ(table.unexpectedBytesHeld(), 4u) << "a message with a receive is not held for nobody";
  table.deliverStaged(box);
  EXPECT_STREQ(user.data(), "sixteen bytes!!");
  EXPECT_FALSE(box.staged) << "the staging buffer went back to the pool";
  EXPECT_EQ(table.staging().heldBytes(), 16u);
  table.erase(first);
  EXPECT_EQ(table.size(), 1u);
}

TEST(MessageTable, ErasingAMessageGivesItsBufferBackUnlessAPeerMayStillWriteIt) {
  MessageTable table;
  auto it = table.openUnexpected(key(1), 1000);
  const uint8_t* at = it->second.staged.bytes.get();
  table.erase(it);
  EXPECT_EQ(table.staging().heldBytes(), 1000u);
  auto again = table.openUnexpected(key(2), 500);
  EXPECT_EQ(again->second.staged.bytes.get(), at) << "the next early message reuses it";

  again->second.exposed = 1;  // a zero-copy chunk cleared into it, not landed
  table.erase(again);
  EXPECT_EQ(table.staging().heldBytes(), 0u) << "memory a peer may write into is never handed out again";
}

TEST(MessageTable, APostedReceiveIsMatchedByKeyAndNothingElse) {
  MessageTable table;
  std::vector<uint8_t> buffer(64);
  auto request = std::make_shared<Request>();
  Inbox& box = table.openPosted(key(5), request, buffer.data(), 64, /*upTo=*/true);
  EXPECT_EQ(box.request, request);
  EXPECT_EQ(box.capacity, 64u);
  EXPECT_TRUE(box.upTo);
  EXPECT_FALSE(box.unexpected);
  EXPECT_EQ(box.base(), buffer.data());
  EXPECT_TRUE(table.contains(key(5)));
  EXPECT_FALSE(table.contains(key(5, /*peer=*/8))) << "another peer's message of the same op";
  EXPECT_FALSE(table.contains({4, 7, 5, 0})) << "the same op of an older view";
  EXPECT_EQ(table.unexpectedArrivals(), 0u);
}

TEST(MessageTable, ARefusedOpsMessageIsReadAndDroppedWithoutStaging) {
  MessageTable table;
  auto it = table.openDiscarded(key(9), 1 << 20);
  EXPECT_TRUE(it->second.cancelled);
  EXPECT_FALSE(it->second.staged) << "nothing is staged for bytes nobody will ask for";
  EXPECT_EQ(table.unexpectedBytesHeld(), 0u);
  EXPECT_EQ(table.unexpectedArrivals(), 0u);
}

TEST(MessageTable, ADrainingReceiveEndsWithItsLastExposedChunk) {
  MessageTable table;
  auto it = table.openUnexpected(key(1), 256);
  it->second.request = std::make_shared<Request>();
  it->second.exposed = 2;
  table.eraseDraining(it, ecclRemoteError, "superseded by a new view");
  EXPECT_FALSE(table.contains(key(1)));
  EXPECT_EQ(table.drainingCount(), 1u);

  std::optional<Draining> finished;
  EXPECT_FALSE(table.finishDrainingOne(key(2), &finished)) << "not draining";
  EXPECT_TRUE(table.finishDrainingOne(key(1), &finished));
  EXPECT_FALSE(finished) << "one chunk still exposed";
  EXPECT_EQ(table.staging().heldBytes(), 0u);
  EXPECT_TRUE(table.finishDrainingOne(key(1), &finished));
  ASSERT_TRUE(finished);
  EXPECT_EQ(finished->code, ecclRemoteError);
  EXPECT_EQ(finished->reason, "superseded by a new view");
  EXPECT_TRUE(finished->request);
  EXPECT_EQ(table.staging().heldBytes(), 256u) << "once nothing can write it, the buffer is reused";
  EXPECT_EQ(table.drainingCount(), 0u);
}

TEST(MessageTable, ClearingEndsEveryPendingRequestOnceIncludingDrainingOnes) {
  MessageTable table;
  std::vector<uint8_t> buffer(8);
  table.openPosted(key(1), std::make_shared<Request>(), buffer.data(), 8, false);
  table.openUnexpected(key(2), 8);  // nobody asked: no request to end
  auto draining = table.openUnexpected(key(3), 8);
  draining->second.request = std::make_shared<Request>();
  draining->second.exposed = 1;
  table.eraseDraining(draining, ecclRemoteError, "x");
  std::vector<RequestPtr> pending = table.clear();
  EXPECT_EQ(pending.size(), 2u);
  for (const RequestPtr& r : pending) EXPECT_TRUE(r);
  EXPECT_EQ(table.size(), 0u);
  EXPECT_EQ(table.drainingCount(), 0u);
}

}  // namespace
}  // namespace eccl::transport::lanes
