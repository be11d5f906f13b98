// A sandbox recording's wire form (core/sandbox_recording.h): what a member
// encodes a standby decodes to the same calls, and every malformed part is
// refused with its reason instead of being replayed.
#include "core/sandbox_recording.h"

#include <gtest/gtest.h>

#include <cstring>

namespace eccl::sandbox {
namespace {

using transport::CallKind;
using transport::CallSignature;

Recording sample() {
  Recording r;
  r.rank = 2;
  r.nranks = 4;
  CallSignature allreduce{CallKind::kAllReduce, ecclFloat32, ecclSum, -1, 8};
  CallSignature barrier{CallKind::kBarrier, -1, -1, -1, 0};
  CallSignature broadcast{CallKind::kBroadcast, ecclInt32, -1, 3, 2};
  r.calls = {{allreduce, true, 0, 32}, {barrier, false, 32, 0}, {broadcast, true, 32, 8}};
  r.outputs.assign(40, 7);
  return r;
}

Announce announceOf(const Recording& r) {
  return {static_cast<uint32_t>(r.calls.size()), encodeTable(r).size(), r.outputs.size()};
}

TEST(SandboxRecording, RoundTripsItsCallsAndSizes) {
  Recording r = sample();
  uint8_t wire[kAnnounceBytes];
  encodeAnnounce(announceOf(r), wire);
  std::string why;
  auto a = decodeAnnounce(wire, 1 << 20, &why);
  ASSERT_TRUE(a) << why;
  Recording back;
  ASSERT_TRUE(decodeTable(encodeTable(r), *a, &back, &why)) << why;
  EXPECT_EQ(back.rank, 2);
  EXPECT_EQ(back.nranks, 4);
  ASSERT_EQ(back.calls.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(back.calls[i].signature, r.calls[i].signature) << i;
    EXPECT_EQ(back.calls[i].hasOutput, r.calls[i].hasOutput) << i;
    EXPECT_EQ(back.calls[i].offset, r.calls[i].offset) << i;
    EXPECT_EQ(back.calls[i].bytes, r.calls[i].bytes) << i;
  }
  EXPECT_TRUE(Recording::rankDependent(CallKind::kReduceScatter));
  EXPECT_FALSE(Recording::rankDependent(CallKind::kAllReduce));
}

TEST(SandboxRecording, RefusesMalformedAnnouncements) {
  Recording r = sample();
  uint8_t wire[kAnnounceBytes];
  std::string why;
  encodeAnnounce(announceOf(r), wire);
  wire[0] ^= 1;
  EXPECT_FALSE(decodeAnnounce(wire, 1 << 20, &why));
  EXPECT_NE(why.find("not a sandbox recording"), std::string::npos) << why;
  encodeAnnounce(announceOf(r), wire);
  EXPECT_FALSE(decodeAnnounce(wire, 39, &why));
  EXPECT_NE(why.find("ECCL_SANDBOX_RECORD_BYTES"), std::string::npos) << why;
  Announce tooMany = announceOf(r);
  tooMany.calls = kMaxRecordedCalls + 1;
  encodeAnnounce(tooMany, wire);
  EXPECT_FALSE(decodeAnnounce(wire, 1 << 20, &why));
  Announce wrongTable = announceOf(r);
  wrongTable.tableBytes += 1;
  encodeAnnounce(wrongTable, wire);
  EXPECT_FALSE(decodeAnnounce(wire, 1 << 20, &why));
}

TEST(SandboxRecording, RefusesTablesThatDoNotTileTheOutputs) {
  Recording r = sample();
  Recording back;
  std::string why;
  Announce a = announceOf(r);
  a.outputBytes = 48;  // more than the calls account for
  EXPECT_FALSE(decodeTable(encodeTable(r), a, &back, &why));
  EXPECT_NE(why.find("add up to 40"), std::string::npos) << why;
  a.outputBytes = 16;  // the first call alone claims more
  EXPECT_FALSE(decodeTable(encodeTable(r), a, &back, &why));
  EXPECT_NE(why.find("allreduce"), std::string::npos) << why;
  std::vector<uint8_t> table = encodeTable(r);
  table[8] = 0x7f;  // the first call's kind
  EXPECT_FALSE(decodeTable(table, announceOf(r), &back, &why));
  EXPECT_NE(why.find("call 0"), std::string::npos) << why;
  table = encodeTable(r);
  std::memset(table.data(), 0xff, 4);  // rank beyond nranks
  EXPECT_FALSE(decodeTable(table, announceOf(r), &back, &why));
  table = encodeTable(r);
  table.pop_back();
  EXPECT_FALSE(decodeTable(table, announceOf(r), &back, &why));
}

TEST(SandboxRecording, TheBuilderKeepsCallOrderFillsReceivesLateAndCapsOutputs) {
  RecordingBuilder b(1, 3, 4, 12);
  CallSignature allreduce{CallKind::kAllReduce, ecclFloat32, ecclSum, -1, 2};
  CallSignature recv{CallKind::kRecv, ecclUint8, -1, 0, 4};
  CallSignature send{CallKind::kSend, ecclUint8, -1, 2, 4};
  const float sum[2] = {1.5f, 2.5f};
  uint8_t received[4] = {0, 0, 0, 0};
  int request = 0;  // stands for a posted receive's handle
  b.add(allreduce, sum, sizeof(sum));
  b.addPending(recv, &request, received, sizeof(received));
  b.add(send, nullptr, 0);
  EXPECT_FALSE(b.full());
  b.add(allreduce, sum, sizeof(sum));  // past the 12-byte cap: signature only
  EXPECT_TRUE(b.full());
  EXPECT_FALSE(b.complete());  // the receive is still in flight
  std::memcpy(received, "abcd", 4);
  int other = 0;
  EXPECT_FALSE(b.fill(&other));
  EXPECT_TRUE(b.fill(&request));
  EXPECT_TRUE(b.complete());
  Recording r = b.take();
  ASSERT_EQ(r.calls.size(), 4u);
  EXPECT_EQ(r.outputs.size(), 12u);
  EXPECT_TRUE(r.calls[0].hasOutput);
  EXPECT_EQ(std::memcmp(r.outputs.data() + r.calls[0].offset, sum, 8), 0);
  EXPECT_EQ(r.calls[1].signature, recv);
  EXPECT_EQ(std::memcmp(r.outputs.data() + r.calls[1].offset, "abcd", 4), 0);
  EXPECT_FALSE(r.calls[2].hasOutput);
  EXPECT_FALSE(r.calls[3].hasOutput);
  EXPECT_TRUE(Recording::rankDependent(CallKind::kRecv));
}

}  // namespace
}  // namespace eccl::sandbox
