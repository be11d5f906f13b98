// The slots of shared memory's fast path (transport/fast_channel.h): whole
// messages in order, a full ring refused rather than overwritten, the
// peer's header checked rather than trusted, and a producer and a consumer
// thread that agree on every byte (TSan checks the flag's ordering).
#include "transport/fast_channel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "common/error.h"

namespace eccl::transport {
namespace {

// Both directions' slots in one allocation, and the two ends over it.
struct Pair {
  std::shared_ptr<void> memory;
  std::atomic<bool> closed{false};
  std::unique_ptr<FastChannel> a, b;
  Pair() {
    const size_t bytes = 2 * FastChannel::footprint();
    memory.reset(std::aligned_alloc(64, bytes), std::free);
    std::memset(memory.get(), 0xa5, bytes);  // create() must not rely on zeroed memory
    auto* base = static_cast<unsigned char*>(memory.get());
    FastChannel::create(base);
    FastChannel::create(base + FastChannel::footprint());
    auto isClosed = [this] { return closed.load(); };
    auto noFrames = [] { return false; };
    a = std::make_unique<FastChannel>(memory, base, base + FastChannel::footprint(), isClosed, noFrames);
    b = std::make_unique<FastChannel>(memory, base + FastChannel::footprint(), base, isClosed, noFrames);
  }
};

FastChannel::Header header(uint64_t seq, uint32_t tag, uint32_t bytes) {
  FastChannel::Header h;
  h.epoch = 3;
  h.seq = seq;
  h.tag = tag;
  h.bytes = bytes;
  h.hasSignature = true;
  h.signature.kind = CallKind::kAllReduce;
  h.signature.type = ecclFloat32;
  h.signature.op = ecclSum;
  h.signature.count = bytes / 4;
  return h;
}

TEST(FastChannel, MessagesArriveWholeInOrderAndAFullRingRefuses) {
  Pair p;
  std::vector<uint8_t> data(FastChannel::kPayloadBytes);
  for (size_t i = 0; i < FastChannel::kSlots; ++i) {
    std::memset(data.data(), static_cast<int>(i), data.size());
    ASSERT_TRUE(p.a->trySend(header(i, 7, static_cast<uint32_t>(i * 100)), data.data())) << i;
  }
  EXPECT_FALSE(p.a->trySend(header(99, 7, 4), data.data())) << "a full ring overwrote an unread slot";
  EXPECT_EQ(p.a->peek(), nullptr) << "a message came back to its sender";
  for (size_t i = 0; i < FastChannel::kSlots; ++i) {
    const FastChannel::Message* m = p.b->peek();
    ASSERT_NE(m, nullptr) << i;
    EXPECT_EQ(p.b->peek(), m) << "a second look is the same message";
    EXPECT_EQ(m->header.epoch, 3u);
    EXPECT_EQ(m->header.seq, i);
    EXPECT_EQ(m->header.tag, 7u);
    ASSERT_EQ(m->header.bytes, i * 100);
    ASSERT_TRUE(m->header.hasSignature);
    EXPECT_EQ(m->header.signature, header(i, 7, static_cast<uint32_t>(i * 100)).signature);
    for (size_t k = 0; k < m->header.bytes; ++k) ASSERT_EQ(m->data[k], static_cast<uint8_t>(i)) << i << " at " << k;
    p.b->pop();
    if (i == 0) EXPECT_TRUE(p.a->trySend(header(16, 8, 0), nullptr)) << "the slot read first is free again";
  }
  const FastChannel::Message* last = p.b->peek();
  ASSERT_NE(last, nullptr);
  EXPECT_EQ(last->header.seq, 16u);
  EXPECT_EQ(last->header.bytes, 0u);
  p.b->pop();
  EXPECT_EQ(p.b->peek(), nullptr);
  EXPECT_EQ(p.a->sent(), FastChannel::kSlots + 1);
  EXPECT_EQ(p.b->received(), FastChannel::kSlots + 1);
}

TEST(FastChannel, AMessageLargerThanASlotIsRefusedBeforeAnythingIsWritten) {
  Pair p;
  std::vector<uint8_t> data(FastChannel::kPayloadBytes + 1);
  EXPECT_THROW(p.a->trySend(header(1, 1, static_cast<uint32_t>(data.size())), data.data()), Error);
  EXPECT_EQ(p.b->peek(), nullptr);
  EXPECT_EQ(p.a->sent(), 0u);
}

// The peer's words are read, never followed: a length past the slot or a
// signature out of range comes up as a message longer than any slot, which
// the fast path reports as a size mismatch naming the peer.
TEST(FastChannel, APeersMalformedHeaderReadsAsAnOversizedMessage) {
  Pair p;
  ASSERT_TRUE(p.a->trySend(header(1, 1, 8), "12345678"));
  // Corrupt the length in shared memory as a broken peer would.
  // Two 64-byte doorbell lines, then the slots.
  constexpr size_t kDoorbellBytes = 128;
  const size_t slotBytes = (FastChannel::footprint() - kDoorbellBytes) / FastChannel::kSlots;
  auto* words = reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(p.memory.get()) + kDoorbellBytes);
  words[6] = 1u << 30;  // the slot's `bytes` field: after flag (8), seq (8), epoch, tag
  const FastChannel::Message* m = p.b->peek();
  ASSERT_NE(m, nullptr);
  EXPECT_GT(m->header.bytes, FastChannel::kPayloadBytes);
  p.b->pop();
  FastChannel::Header bad = header(2, 1, 8);
  ASSERT_TRUE(p.a->trySend(bad, "12345678"));
  auto* slot1 = static_cast<uint8_t*>(p.memory.get()) + kDoorbellBytes + slotBytes;
  slot1[32] = 0xee;  // the signature's kind: out of range
  m = p.b->peek();
  ASSERT_NE(m, nullptr);
  EXPECT_FALSE(m->header.hasSignature);
  EXPECT_GT(m->header.bytes, FastChannel::kPayloadBytes);
}

// The reader's count of what it took is the peer's word too: a count past
// what was sent never frees a slot it has not read.
TEST(FastChannel, APeersCountPastWhatWasSentFreesNothing) {
  Pair p;
  for (size_t i = 0; i < FastChannel::kSlots; ++i) ASSERT_TRUE(p.a->trySend(header(i, 1, 8), "12345678")) << i;
  // The count sits on the second doorbell line of the direction it counts.
  auto* consumed = reinterpret_cast<std::atomic<uint64_t>*>(static_cast<uint8_t*>(p.memory.get()) + 64);
  consumed->store(FastChannel::kSlots + 5);
  EXPECT_FALSE(p.a->trySend(header(16, 1, 8), "12345678")) << "an unread slot was overwritten";
  consumed->store(0);
  EXPECT_FALSE(p.a->trySend(header(16, 1, 8), "12345678"));
  p.b->peek();
  p.b->pop();  // an honest count: one slot free
  EXPECT_TRUE(p.a->trySend(header(16, 1, 8), "12345678"));
  EXPECT_FALSE(p.a->trySend(header(17, 1, 8), "12345678"));
}

// A reader asleep on the doorbell wakes when the message comes, long
// before its deadline; with nothing coming it wakes at the deadline.
TEST(FastChannel, ASleepingReaderWakesWhenTheMessageComes) {
  Pair p;
  auto started = Clock::now();
  p.b->waitForMessage(started + std::chrono::milliseconds(50));
  EXPECT_GE(Clock::now() - started, std::chrono::milliseconds(45)) << "woke early with nothing sent";
  for (int round = 0; round < 20; ++round) {
    std::thread writer([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      while (!p.a->trySend(header(static_cast<uint64_t>(round), 1, 4), "abcd")) std::this_thread::yield();
    });
    started = Clock::now();
    while (!p.b->peek()) p.b->waitForMessage(started + std::chrono::seconds(10));
    const auto took = Clock::now() - started;
    writer.join();
    EXPECT_LT(took, std::chrono::seconds(5)) << "round " << round << ": the writer's doorbell did not wake the reader";
    EXPECT_EQ(p.b->peek()->header.seq, static_cast<uint64_t>(round));
    p.b->pop();
  }
}

TEST(FastChannel, ClosedFollowsTheLane) {
  Pair p;
  EXPECT_FALSE(p.a->closed());
  p.closed = true;
  EXPECT_TRUE(p.a->closed());
  EXPECT_TRUE(p.b->closed());
}

// A producer thread and a consumer thread, many laps of the ring, every
// payload checked: the flag's release and acquire order the copies.
TEST(FastChannel, AProducerAndAConsumerThreadAgreeOnEveryByte) {
  Pair p;
  constexpr uint64_t kMessages = 20000;
  std::thread producer([&] {
    std::vector<uint8_t> data(FastChannel::kPayloadBytes);
    for (uint64_t i = 0; i < kMessages; ++i) {
      const uint32_t bytes = static_cast<uint32_t>((i * 37) % (FastChannel::kPayloadBytes + 1));
      for (uint32_t k = 0; k < bytes; ++k) data[k] = static_cast<uint8_t>(i + k);
      while (!p.a->trySend(header(i, static_cast<uint32_t>(i), bytes), data.data())) std::this_thread::yield();
    }
  });
  uint64_t bad = 0;
  for (uint64_t i = 0; i < kMessages; ++i) {
    const FastChannel::Message* m;
    while (!(m = p.b->peek())) std::this_thread::yield();
    const uint32_t bytes = static_cast<uint32_t>((i * 37) % (FastChannel::kPayloadBytes + 1));
    if (m->header.seq != i || m->header.tag != static_cast<uint32_t>(i) || m->header.bytes != bytes) ++bad;
    for (uint32_t k = 0; k < std::min(bytes, m->header.bytes); ++k)
      if (m->data[k] != static_cast<uint8_t>(i + k)) ++bad;
    p.b->pop();
  }
  producer.join();
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(p.b->peek(), nullptr);
}

}  // namespace
}  // namespace eccl::transport
