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
  encodeFrame(h, buf);
  buf[4] = 9;  // version, with the CRC recomputed so only the version is wrong
  uint8_t copy[FrameHeader::kSize];
  std::memcpy(copy, buf, sizeof(copy));
  EXPECT_FALSE(decodeFrame(copy, &why));
  EXPECT_NE(why.find("version"), std::string::npos) << why;
}

}  // namespace
}  // namespace eccl::transport
