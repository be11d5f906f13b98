// Bulk admission by count (src/transport/bulk_credit.h): the cap on bytes
// the peer has not reported reading, the receiver's reports, and a report
// that claims more than was sent.
#include "transport/bulk_credit.h"

#include <gtest/gtest.h>

namespace eccl::transport::lanes {
namespace {

TEST(BulkCredit, UnreadBytesStayUnderTheCapUntilThePeerReportsReading) {
  BulkCredit c;
  EXPECT_TRUE(c.room(false));
  c.sent(BulkCredit::kUnreadBytes - 1);
  EXPECT_TRUE(c.room(false));
  c.sent(1);
  EXPECT_FALSE(c.room(false)) << "128 KiB unread on a busy lane";
  EXPECT_TRUE(c.room(true)) << "a quiet lane may hold 1 MiB";
  c.sent(BulkCredit::kQuietUnreadBytes - BulkCredit::kUnreadBytes);
  EXPECT_FALSE(c.room(true));
  ASSERT_TRUE(c.peerRead(BulkCredit::kQuietUnreadBytes - BulkCredit::kUnreadBytes + 1));
  EXPECT_TRUE(c.room(false));
  ASSERT_TRUE(c.peerRead(10)) << "an older report arriving late";
  EXPECT_TRUE(c.room(false)) << "a late report takes back nothing";
}

TEST(BulkCredit, AReportOfMoreThanWasSentIsRefusedAndChangesNothing) {
  BulkCredit c;
  c.sent(1000);
  EXPECT_FALSE(c.peerRead(1001));
  EXPECT_EQ(c.sentTotal(), 1000u);
  c.sent(BulkCredit::kUnreadBytes);
  EXPECT_FALSE(c.room(false)) << "the refused report freed nothing";
  EXPECT_TRUE(c.peerRead(1000 + BulkCredit::kUnreadBytes));
  EXPECT_TRUE(c.room(false));
}

TEST(BulkCredit, TheReceiverReportsItsTotalEvery64KiB) {
  BulkCredit c;
  EXPECT_FALSE(c.read(BulkCredit::kReportBytes - 1));
  auto first = c.read(1);
  ASSERT_TRUE(first);
  EXPECT_EQ(*first, BulkCredit::kReportBytes);
  EXPECT_FALSE(c.read(100));
  auto second = c.read(BulkCredit::kReportBytes);
  ASSERT_TRUE(second);
  EXPECT_EQ(*second, 2 * BulkCredit::kReportBytes + 100) << "the total, not the bytes since the last report";
}

TEST(BulkCredit, AClosedLaneStartsAgainFromZero) {
  BulkCredit c;
  c.sent(BulkCredit::kQuietUnreadBytes);
  (void)c.read(BulkCredit::kReportBytes - 1);
  c.reset();
  EXPECT_TRUE(c.room(false));
  EXPECT_EQ(c.sentTotal(), 0u);
  EXPECT_FALSE(c.read(1)) << "the receiving count restarted too";
}

}  // namespace
}  // namespace eccl::transport::lanes
