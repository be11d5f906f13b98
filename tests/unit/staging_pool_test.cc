// Early messages' buffers (src/transport/staging_pool.h): reuse of the
// smallest that fits, the cap on what is held, and a zero-length message.
#include "transport/staging_pool.h"

#include <gtest/gtest.h>

namespace eccl::transport::lanes {
namespace {

TEST(StagingPool, ATakeReusesTheSmallestHeldBufferThatFits) {
  StagingPool pool;
  StagingBuffer small = pool.take(100), large = pool.take(10000);
  const uint8_t* smallAt = small.bytes.get();
  const uint8_t* largeAt = large.bytes.get();
  EXPECT_EQ(small.capacity, 100u);
  pool.give(large);
  pool.give(small);
  EXPECT_FALSE(small) << "a given buffer leaves its holder";
  EXPECT_EQ(pool.heldBytes(), 10100u);
  StagingBuffer a = pool.take(50);
  EXPECT_EQ(a.bytes.get(), smallAt) << "the 100-byte buffer fits 50 best";
  EXPECT_EQ(a.capacity, 100u) << "a reused buffer keeps its capacity";
  StagingBuffer b = pool.take(60);
  EXPECT_EQ(b.bytes.get(), largeAt);
  StagingBuffer c = pool.take(70);
  EXPECT_EQ(c.capacity, 70u) << "none held: a new one of the size asked";
  EXPECT_EQ(pool.heldBytes(), 0u);
  EXPECT_EQ(pool.heldBuffers(), 0u);
}

TEST(StagingPool, ABufferPastTheCapIsFreedNotHeld) {
  StagingPool pool(1000);
  StagingBuffer a = pool.take(600), b = pool.take(600), c = pool.take(400);
  pool.give(a);
  pool.give(b);
  EXPECT_FALSE(b) << "freed, not left with its holder";
  EXPECT_EQ(pool.heldBytes(), 600u);
  pool.give(c);
  EXPECT_EQ(pool.heldBytes(), 1000u) << "up to the cap exactly";
  EXPECT_EQ(pool.heldBuffers(), 2u);
}

TEST(StagingPool, AZeroLengthMessageGetsAnAddressAndGivingNothingKeepsNothing) {
  StagingPool pool;
  StagingBuffer empty = pool.take(0);
  EXPECT_TRUE(empty) << "a zero-length message still has somewhere to point";
  EXPECT_EQ(empty.capacity, 0u);
  StagingBuffer none;
  pool.give(none);
  EXPECT_EQ(pool.heldBuffers(), 0u);
  pool.give(empty);
  EXPECT_EQ(pool.heldBuffers(), 1u);
  EXPECT_EQ(pool.take(0).capacity, 0u) << "it serves the next zero-length message";
}

}  // namespace
}  // namespace eccl::transport::lanes
