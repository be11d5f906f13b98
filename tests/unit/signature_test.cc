#include "transport/signature.h"

#include <gtest/gtest.h>

#include <cstring>

#include "common/crypto.h"
#include "transport/frame.h"

namespace eccl::transport {
namespace {

CallSignature allreduce(uint64_t count, ecclDataType_t type = ecclFloat32, ecclRedOp_t op = ecclSum) {
  CallSignature s;
  s.kind = CallKind::kAllReduce;
  s.count = count;
  s.type = static_cast<int8_t>(type);
  s.op = static_cast<int8_t>(op);
  return s;
}

TEST(CallSignature, RoundTripsAndDescribesItself) {
  CallSignature s;
  s.kind = CallKind::kBroadcast;
  s.type = ecclBfloat16;
  s.root = 70000;
  s.count = (uint64_t{1} << 40) + 3;
  uint8_t wire[CallSignature::kWireBytes];
  encodeSignature(s, wire);
  std::string why;
  auto back = decodeSignature(wire, &why);
  ASSERT_TRUE(back) << why;
  EXPECT_EQ(*back, s);
  EXPECT_EQ(describe(s), "broadcast(count 1099511627779, bfloat16, root 70000)");
  EXPECT_EQ(describe(allreduce(8, ecclInt32, ecclMax)), "allreduce(count 8, int32, max)");
}

TEST(CallSignature, RejectsFieldsOutOfRange) {
  uint8_t wire[CallSignature::kWireBytes];
  std::string why;
  auto rejects = [&](size_t at, uint8_t value, const char* word) {
    encodeSignature(allreduce(4), wire);
    wire[at] = value;
    EXPECT_FALSE(decodeSignature(wire, &why)) << at;
    EXPECT_NE(why.find(word), std::string::npos) << why;
  };
  rejects(0, 0, "kind");
  rejects(0, 200, "kind");
  rejects(1, ecclNumTypes, "type");
  rejects(2, ecclNumOps, "op");
  rejects(3, 1, "padding");
  rejects(7, 0x80, "root");
}

TEST(CallSignature, SendsMatchReceivesOfTheSameTypeAndCount) {
  CallSignature send, recv;
  send.kind = CallKind::kSend, recv.kind = CallKind::kRecv;
  send.type = recv.type = ecclFloat32;
  send.count = recv.count = 10;
  EXPECT_TRUE(signaturesAgree(send, recv));
  EXPECT_FALSE(signaturesAgree(send, send));
  recv.count = 11;
  EXPECT_FALSE(signaturesAgree(send, recv));
  recv.count = 10, recv.type = ecclInt32;
  EXPECT_FALSE(signaturesAgree(send, recv));
  EXPECT_FALSE(signaturesAgree(send, allreduce(10)));
  EXPECT_TRUE(signaturesAgree(allreduce(10), allreduce(10)));
  EXPECT_FALSE(signaturesAgree(allreduce(10), allreduce(10, ecclFloat32, ecclMin)));
}

TEST(SignatureBook, ComparesAPeerAheadWhenThisRankGetsThere) {
  SignatureBook<uint64_t> book;
  EXPECT_FALSE(book.local(1, 1, allreduce(4)));
  EXPECT_FALSE(book.remote(1, 2, 7, allreduce(5)));  // peer 7 is one op ahead
  EXPECT_FALSE(book.remote(1, 2, 8, allreduce(4)));
  auto m = book.local(1, 2, allreduce(4));
  ASSERT_TRUE(m);
  EXPECT_EQ(m->peer, 7u);
  EXPECT_EQ(m->seq, 2u);
  EXPECT_EQ(m->theirs.count, 5u);
}

TEST(SignatureBook, ComparesAPeerBehindAgainstTheRecentHistory) {
  SignatureBook<uint64_t> book;
  for (uint64_t seq = 1; seq <= 5; ++seq) EXPECT_FALSE(book.local(1, seq, allreduce(seq)));
  EXPECT_FALSE(book.remote(1, 3, 9, allreduce(3)));
  EXPECT_TRUE(book.remote(1, 3, 9, allreduce(4)));
  EXPECT_TRUE(book.remote(1, 5, 9, allreduce(4)));
}

TEST(SignatureBook, ANewEpochForgetsTheOldOne) {
  SignatureBook<uint64_t> book;
  EXPECT_FALSE(book.local(1, 1, allreduce(1)));
  EXPECT_FALSE(book.remote(1, 2, 4, allreduce(9)));
  book.beginEpoch(2);
  EXPECT_FALSE(book.local(2, 1, allreduce(2)));
  EXPECT_FALSE(book.local(2, 2, allreduce(2)));  // epoch 1's early op 2 is gone
  EXPECT_FALSE(book.remote(1, 1, 4, allreduce(5)));
}

TEST(Frame, ACallSignatureTravelsWithItsFlagAndChecksum) {
  FrameHeader h;
  h.type = FrameType::kData;
  h.commId = 1;
  h.seq = 3;
  h.length = h.total = 8;
  h.flags = FrameHeader::kCallSignature;
  uint8_t sig[CallSignature::kWireBytes];
  encodeSignature(allreduce(2), sig);
  h.signatureCrc = crc32c(sig, sizeof(sig));
  uint8_t buf[FrameHeader::kSize];
  encodeFrame(h, buf);
  std::string why;
  auto back = decodeFrame(buf, &why);
  ASSERT_TRUE(back) << why;
  EXPECT_EQ(back->extensionBytes(), FrameHeader::kSignatureBytes);
  EXPECT_EQ(back->signatureCrc, h.signatureCrc);
  h.flags = 0;  // the checksum without its flag
  encodeFrame(h, buf);
  buf[56] = 1;
  uint32_t crc = crc32c(buf, 60);
  std::memcpy(buf + 60, &crc, 4);
  EXPECT_FALSE(decodeFrame(buf, &why));
  EXPECT_NE(why.find("signature"), std::string::npos) << why;
}

}  // namespace
}  // namespace eccl::transport
