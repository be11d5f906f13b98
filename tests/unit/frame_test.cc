#include <gtest/gtest.h>

#include <cstring>

#include "transport/frame.h"

namespace eccl::transport {
namespace {

FrameHeader sample() {
  FrameHeader h;
  h.type = FrameType::kData;
  h.epoch = 7;
  h.commId = 0x1122334455667788ull;
  h.seq = FrameHeader::kP2pBit | 42;
  h.tag = 0x10020003;
  h.length = 4096;
  h.offset = 8192;
  h.total = 1 << 20;
  return h;
}

TEST(Frame, RoundTripsEveryField) {
  uint8_t buf[FrameHeader::kSize];
  encodeFrame(sample(), buf);
  std::string why;
  auto h = decodeFrame(buf, &why);
  ASSERT_TRUE(h) << why;
  EXPECT_EQ(h->epoch, 7u);
  EXPECT_EQ(h->commId, 0x1122334455667788ull);
  EXPECT_EQ(h->seq, FrameHeader::kP2pBit | 42);
  EXPECT_EQ(h->tag, 0x10020003u);
  EXPECT_EQ(h->length, 4096u);
  EXPECT_EQ(h->offset, 8192u);
  EXPECT_EQ(h->total, 1u << 20);
}

TEST(Frame, PayloadChecksumTravelsOnlyWithItsFlag) {
  uint8_t buf[FrameHeader::kSize];
  FrameHeader h = sample();
  h.flags = FrameHeader::kPayloadChecksum;
  h.payloadCrc = 0xdeadbeef;
  encodeFrame(h, buf);
  std::string why;
  auto back = decodeFrame(buf, &why);
  ASSERT_TRUE(back) << why;
  EXPECT_EQ(back->payloadCrc, 0xdeadbeefu);
  EXPECT_EQ(back->flags, FrameHeader::kPayloadChecksum);
  h.flags = 0x80;  // an unknown flag
  encodeFrame(h, buf);
  EXPECT_FALSE(decodeFrame(buf, &why));
  EXPECT_NE(why.find("flags"), std::string::npos) << why;
}

TEST(Frame, AnySingleBitFlipIsRejected) {
  uint8_t good[FrameHeader::kSize];
  encodeFrame(sample(), good);
  for (size_t bit = 0; bit < FrameHeader::kSize * 8; ++bit) {
    uint8_t bad[FrameHeader::kSize];
    std::memcpy(bad, good, sizeof(bad));
    bad[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    std::string why;
    EXPECT_FALSE(decodeFrame(bad, &why)) << "bit " << bit;
    EXPECT_FALSE(why.empty());
  }
}

TEST(Frame, RendezvousFlagAndChunkReferencesRoundTrip) {
  uint8_t buf[FrameHeader::kSize];
  FrameHeader h = sample();
  encodeFrame(h, buf);
  markRendezvous(buf, true);
  auto d = decodeFrame(buf, nullptr);
  ASSERT_TRUE(d);
  EXPECT_TRUE(d->flags & FrameHeader::kRendezvous);
  markRendezvous(buf, false);
  d = decodeFrame(buf, nullptr);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->flags, h.flags);
  markRendezvous(buf, true, FrameHeader::kPrewritten);
  d = decodeFrame(buf, nullptr);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->flags, h.flags | FrameHeader::kPrewritten);
  ChunkRef c{3, 9, 0x8000000000000011ull, 4096, 0x7f0012345000ull, 0xabcd, 65536, ChunkRef::kWriteHere};
  auto bytes = encodeChunkRef(c);
  ASSERT_EQ(bytes.size(), ChunkRef::kBytes);
  ChunkRef back = decodeChunkRef(bytes.data());
  EXPECT_TRUE(back.sameChunk(c));
  EXPECT_EQ(back.address, c.address);
  EXPECT_EQ(back.key, c.key);
  EXPECT_EQ(back.answer, c.answer);
}

TEST(Frame, RejectsWithSpecificReasons) {
  uint8_t buf[FrameHeader::kSize];
  std::string why;
  std::memset(buf, 0, sizeof(buf));
  EXPECT_FALSE(decodeFrame(buf, &why));
  EXPECT_NE(why.find("magic"), std::string::npos) << why;

  FrameHeader h = sample();
  h.offset = h.total;  // chunk past the end
  encodeFrame(h, buf);
  EXPECT_FALSE(decodeFrame(buf, &why));
  EXPECT_NE(why.find("outside"), std::string::npos) << why;

  h = sample();
  h.length = FrameHeader::kMaxPayload + 1;
  h.total = h.length;
  h.offset = 0;
  encodeFrame(h, buf);
  EXPECT_FALSE(decodeFrame(buf, &why));
  EXPECT_NE(why.find("exceeds"), std::string::npos) << why;

  h = sample();
  h.type = FrameType::kNotice;
  h.length = 12;  // shorter than a member id and an op
  encodeFrame(h, buf);
  EXPECT_FALSE(decodeFrame(buf, &why));
  EXPECT_NE(why.find("notice"), std::string::npos) << why;

  h = sample();
  h.type = FrameType::kGoodbye;
  h.flags = 0;
  h.length = 25;  // not whole (op, signature) entries
  encodeFrame(h, buf);
  EXPECT_FALSE(decodeFrame(buf, &why));
  EXPECT_NE(why.find("goodbye"), std::string::npos) << why;
  h.length = 48;  // two entries
  encodeFrame(h, buf);
  EXPECT_TRUE(decodeFrame(buf, &why)) << why;

  h = sample();
  h.type = FrameType::kClearToSend;
  h.flags = 0;
  h.length = ChunkRef::kBytes - 1;
  encodeFrame(h, buf);
  EXPECT_FALSE(decodeFrame(buf, &why));
  EXPECT_NE(why.find("chunk reference"), std::string::npos) << why;

  h = sample();
  h.flags = FrameHeader::kRendezvous;
  h.length = 0;  // a zero-copy chunk of nothing
  encodeFrame(h, buf);
  EXPECT_FALSE(decodeFrame(buf, &why));
  EXPECT_NE(why.find("rendezvous"), std::string::npos) << why;

  h = sample();
  h.flags = FrameHeader::kRendezvous | FrameHeader::kPrewritten;  // offered and already written
  encodeFrame(h, buf);
  EXPECT_FALSE(decodeFrame(buf, &why));
  EXPECT_NE(why.find("both offered and already written"), std::string::npos) << why;

  for (FrameType type : {FrameType::kReceiveReady, FrameType::kReceiveDone, FrameType::kReceiveReleased}) {
    h = sample();
    h.type = type;
    h.flags = 0;
    h.length = ChunkRef::kBytes;
    encodeFrame(h, buf);
    EXPECT_TRUE(decodeFrame(buf, &why)) << why;
    h.length = ChunkRef::kBytes + 1;
    encodeFrame(h, buf);
    EXPECT_FALSE(decodeFrame(buf, &why));
    EXPECT_NE(why.find("chunk reference"), std::string::npos) << why;
  }
  h = sample();
  h.type = FrameType::kBulkRead;  // a count of bytes read: 8 bytes, no more, no less
  h.flags = 0;
  h.length = 8;
  encodeFrame(h, buf);
  EXPECT_TRUE(decodeFrame(buf, &why)) << why;
  h.length = 9;
  encodeFrame(h, buf);
  EXPECT_FALSE(decodeFrame(buf, &why));
  EXPECT_NE(why.find("bulk read report of 9 bytes"), std::string::npos) << why;
  h = sample();
  h.flags = FrameHeader::kBulkCredit;  // a counted bulk chunk
  encodeFrame(h, buf);
  EXPECT_TRUE(decodeFrame(buf, &why)) << why;

  h = sample();
  h.type = FrameType::kRefused;  // an op, then why: at least 8 bytes
  h.flags = 0;
  h.length = 7;
  encodeFrame(h, buf);
  EXPECT_FALSE(decodeFrame(buf, &why));
  EXPECT_NE(why.find("refusal notice shorter than its op"), std::string::npos) << why;
  h.length = 8 + 20;
  encodeFrame(h, buf);
  EXPECT_TRUE(decodeFrame(buf, &why)) << why;

  h = sample();
  h.flags = 0;
  h.type = static_cast<FrameType>(14);
  encodeFrame(h, buf);
  EXPECT_FALSE(decodeFrame(buf, &why));
  EXPECT_NE(why.find("unknown frame type"), std::string::npos) << why;

  h = sample();
  encodeFrame(h, buf);
  buf[4] = 9;  // version, with the CRC recomputed so only the version is wrong
  uint8_t copy[FrameHeader::kSize];
  std::memcpy(copy, buf, sizeof(copy));
  EXPECT_FALSE(decodeFrame(copy, &why));
  EXPECT_NE(why.find("version"), std::string::npos) << why;
}

}  // namespace
}  // namespace eccl::transport
