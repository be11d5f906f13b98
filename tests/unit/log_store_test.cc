// The boundary-send log store: tags, truncation (a prefix, O(freed)), the
// three full policies, checksums, gaps, wrap-around of the ring arena.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "common/error.h"
#include "log/log_store.h"

namespace eccl::log {
namespace {

RecordInfo info(int peer, int64_t it, int32_t mb, size_t bytes, uint64_t seq = 0) {
  RecordInfo r;
  r.peer = peer;
  r.tag = {it, mb};
  r.bytes = r.count = bytes;
  r.seq = seq;
  return r;
}

// Appends a record whose payload is `fill` repeated.
void append(LogStore& s, const RecordInfo& r, uint8_t fill, int64_t waitMs = 100) {
  auto res = s.reserve(r, deadlineAfterMs(waitMs), "test send");
  std::memset(res.data, fill, r.bytes);
  s.commit(res, crc32c(res.data, r.bytes));
}

TEST(LogStore, Crc32cIsTheStandardOne) {
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
}

// An interrupted iteration is redone: its first attempt's records go, the
// space they held at the head comes back at once, and the redo is what a
// later replay returns.
TEST(LogStore, DiscardingFromAnIterationDropsItsRecordsAndReclaimsTheHead) {
  LogStore s(4096 + 4 * LogStore::kRecordOverheadBytes, FullPolicy::kError);
  append(s, info(1, 1, 0, 1000), 0x11);
  append(s, info(1, 2, 0, 1000), 0x21);
  append(s, info(1, 3, 0, 1000), 0x31);  // the attempt a failure cut short
  EXPECT_EQ(s.discardFrom(3), 1u);
  EXPECT_EQ(s.stats().records, 2u);
  append(s, info(1, 3, 0, 1000), 0x32);  // the redo
  append(s, info(1, 4, 0, 1000), 0x41);  // fits only because the head came back
  std::vector<const uint8_t*> payloads;
  auto replay = s.select(1, 2, 4, &payloads);
  ASSERT_EQ(replay.size(), 3u);
  EXPECT_EQ(payloads[1][0], 0x32);
  EXPECT_EQ(payloads[2][0], 0x41);
  EXPECT_EQ(s.discardFrom(10), 0u);
}

// A shrink: old rank 1 left, 2 -> 1, 3 -> 2. Records and evicted-gap
// marks follow their peer; the leaver's records are gone and their space
// comes back when truncation reaches them.
TEST(LogStore, RenumberingFollowsPeersAndDropsTheLeaver) {
  LogStore s(4096 + 3 * LogStore::kRecordOverheadBytes, FullPolicy::kEvict);
  append(s, info(3, 1, 0, 1000), 0x33);  // evicted below: a gap for peer 3
  append(s, info(1, 1, 0, 1000), 0x11);
  append(s, info(2, 2, 0, 1000), 0x22);
  append(s, info(3, 2, 0, 1000), 0x34);
  append(s, info(3, 3, 0, 1000), 0x35);
  ASSERT_EQ(s.stats().gaps, 1u);
  s.renumberPeers({0, -1, 1, 2});
  StoreStats st = s.stats();
  EXPECT_EQ(st.records, 3u);  // the leaver's record no longer counts
  EXPECT_EQ(st.gaps, 1u);
  std::vector<const uint8_t*> payloads;
  auto moved = s.select(1, 2, 2, &payloads);
  ASSERT_EQ(moved.size(), 1u);
  EXPECT_EQ(moved[0].peer, 1);
  EXPECT_EQ(payloads[0][0], 0x22);
  // Old peer 3's gap (iteration 1) moved with it to rank 2.
  EXPECT_THROW(s.select(2, 1, 3, &payloads), Error);
  payloads.clear();
  auto later = s.select(2, 2, 3, &payloads);
  ASSERT_EQ(later.size(), 2u);
  EXPECT_EQ(payloads[0][0], 0x34);
  EXPECT_EQ(payloads[1][0], 0x35);
  EXPECT_TRUE(s.select(1, 1, 1, &payloads).empty());  // the leaver's record is not rank 1's
  // Truncation reclaims the dropped record's space with the others.
  EXPECT_EQ(s.truncate(3), 3u);  // the dropped record and the two of iteration 2
  EXPECT_EQ(s.stats().records, 1u);
}

TEST(LogStore, SelectsByPeerAndIterationInSendOrderWithChecksums) {
  LogStore s(1 << 16, FullPolicy::kError);
  for (int it = 1; it <= 3; ++it)
    for (int mb = 0; mb < 2; ++mb) {
      append(s, info(1, it, mb, 100, it * 2 + mb), uint8_t(it * 10 + mb));
      append(s, info(2, it, mb, 50), uint8_t(200 + it));
    }
  std::vector<const uint8_t*> payloads;
  auto got = s.select(1, 2, 3, &payloads);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[0].tag, (Tag{2, 0}));
  EXPECT_EQ(got[3].tag, (Tag{3, 1}));
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(payloads[i][0], uint8_t(got[i].tag.iteration * 10 + got[i].tag.microbatch));
    EXPECT_EQ(crc32c(payloads[i], got[i].bytes), got[i].crc);
  }
  StoreStats st = s.stats();
  EXPECT_EQ(st.records, 12u);
  EXPECT_EQ(st.bytes, 6u * 150);
  EXPECT_EQ(*st.oldest, (Tag{1, 0}));
  EXPECT_EQ(*st.newest, (Tag{3, 1}));
  const uint8_t* p;
  EXPECT_EQ(s.read(2, 1, &p).tag, (Tag{1, 1}));
  EXPECT_THROW(s.read(2, 6, &p), Error);
}

TEST(LogStore, TruncateFreesOlderIterationsAndReplayOfThemIsAnError) {
  LogStore s(1 << 16, FullPolicy::kError);
  for (int it = 1; it <= 4; ++it) append(s, info(1, it, 0, 1000), 1);
  EXPECT_EQ(s.truncate(3), 2u);
  EXPECT_EQ(s.stats().records, 2u);
  EXPECT_EQ(s.select(1, 3, 4, nullptr).size(), 2u);
  try {
    s.select(1, 2, 4, nullptr);
    ADD_FAILURE() << "replay of a truncated range succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ecclInvalidUsage);
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s.truncate(3), 0u);  // nothing older left
}

TEST(LogStore, ErrorPolicyRecordsNothingWhenFull) {
  LogStore s(1000, FullPolicy::kError);
  append(s, info(1, 1, 0, 600), 1);
  try {
    s.reserve(info(1, 1, 1, 600), deadlineAfterMs(100), "send to rank 1");
    ADD_FAILURE() << "a full log accepted a record";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ecclLogFull);
    EXPECT_NE(std::string(e.what()).find("send to rank 1"), std::string::npos);
  }
  EXPECT_EQ(s.stats().records, 1u);
  EXPECT_THROW(s.reserve(info(1, 1, 1, 2000), deadlineAfterMs(100), "huge"), Error);
  s.truncate(2);
  append(s, info(1, 2, 0, 600), 2);  // room again after the truncate
  EXPECT_EQ(s.stats().records, 1u);
}

TEST(LogStore, BlockPolicyWaitsForATruncateWithADeadline) {
  LogStore s(1000, FullPolicy::kBlock);
  append(s, info(1, 1, 0, 700), 1);
  std::thread truncator([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    s.truncate(2);
  });
  append(s, info(1, 2, 0, 700), 2, 10000);  // blocks until the truncate
  truncator.join();
  EXPECT_EQ(s.stats().records, 1u);
  auto t0 = Clock::now();
  EXPECT_THROW(s.reserve(info(1, 2, 1, 700), deadlineAfterMs(150), "send"), Error);
  EXPECT_GE(Clock::now() - t0, std::chrono::milliseconds(140));
}

TEST(LogStore, EvictPolicyDropsTheOldestAndReplayAcrossTheGapIsAnError) {
  LogStore s(1000, FullPolicy::kEvict);
  for (int it = 1; it <= 5; ++it) append(s, info(1, it, 0, 300), uint8_t(it));
  StoreStats st = s.stats();
  EXPECT_EQ(st.records, 3u);
  EXPECT_EQ(st.evictions, 2u);
  EXPECT_EQ(st.gaps, 1u);
  EXPECT_EQ(*st.oldest, (Tag{3, 0}));
  try {
    s.select(1, 1, 5, nullptr);
    ADD_FAILURE() << "replay across a gap succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gap"), std::string::npos) << e.what();
  }
  std::vector<const uint8_t*> p;
  auto whole = s.select(1, 3, 5, &p);  // past the gap: whole
  ASSERT_EQ(whole.size(), 3u);
  EXPECT_EQ(p[0][0], 3);
  EXPECT_EQ(s.select(2, 1, 5, nullptr).size(), 0u);  // another peer has no gap
}

TEST(LogStore, RingWrapsAroundAndKeepsEveryPayloadIntact) {
  LogStore s(1000, FullPolicy::kError);
  for (int it = 1; it <= 50; ++it) {
    s.truncate(it - 1);  // keep the previous record: two live, so the ring wraps often
    append(s, info(1, it, 0, 250 + it % 7), uint8_t(it));
    std::vector<const uint8_t*> p;
    auto got = s.select(1, std::max(1, it - 1), it, &p);
    ASSERT_EQ(got.size(), it == 1 ? 1u : 2u);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(crc32c(p[i], got[i].bytes), got[i].crc) << "payload damaged at iteration " << it;
      ASSERT_EQ(p[i][got[i].bytes - 1], uint8_t(got[i].tag.iteration));
    }
  }
}

TEST(LogStore, AbandonedSendLeavesNoRecord) {
  LogStore s(1000, FullPolicy::kError);
  append(s, info(1, 1, 0, 100), 1);
  auto r = s.reserve(info(1, 1, 1, 800), deadlineAfterMs(100), "send");
  s.abandon(r);
  EXPECT_EQ(s.stats().records, 1u);
  append(s, info(1, 1, 2, 800), 3);  // the abandoned space is free again
  EXPECT_EQ(s.stats().records, 2u);
}

}  // namespace
}  // namespace eccl::log
