#include <gtest/gtest.h>
#include <sys/socket.h>

#include "api/guard.h"
#include "membership/coord_channel.h"
#include "membership/handshake.h"
#include "membership/coord_messages.h"
#include "membership/unique_id.h"

namespace eccl::membership {
namespace {

TEST(UniqueId, TextRoundTripAndMalformedInput) {
  UniqueIdData d;
  d.root = SockAddr::parse("127.0.0.1:4711");
  d.secret.fill(0xab);
  d.jobId = 99;
  ecclUniqueId id = encodeUniqueId(d);
  std::string text = uniqueIdToText(id);
  UniqueIdData back = decodeUniqueId(uniqueIdFromText(text));
  EXPECT_EQ(back.root.str(), "127.0.0.1:4711");
  EXPECT_EQ(back.secret, d.secret);
  EXPECT_EQ(back.jobId, 99u);
  EXPECT_THROW(uniqueIdFromText("abc"), Error);
  std::string bad = text;
  bad[0] = 'z';
  EXPECT_THROW(uniqueIdFromText(bad), Error);
  ecclUniqueId zero{};
  try {
    decodeUniqueId(zero);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ecclInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("malformed"), std::string::npos);
  }
}

TEST(UniqueId, SpareCoordinatorsRoundTripAndAnIdWithoutThemKeepsItsShortForm) {
  UniqueIdData d;
  d.root = SockAddr::parse("10.0.0.1:4711");
  d.secret.fill(0x5c);
  d.jobId = 7;
  EXPECT_EQ(uniqueIdToText(encodeUniqueId(d)).size(), 104u);
  d.spares = {SockAddr::parse("10.0.0.2:4712"), SockAddr::parse("10.0.0.3:4713")};
  std::string text = uniqueIdToText(encodeUniqueId(d));
  EXPECT_EQ(text.size(), 2u * (56 + 2 * 6));
  UniqueIdData back = decodeUniqueId(uniqueIdFromText(text));
  ASSERT_EQ(back.coordinators().size(), 3u);
  EXPECT_EQ(back.coordinators()[0].str(), "10.0.0.1:4711");
  EXPECT_EQ(back.coordinators()[2].str(), "10.0.0.3:4713");
  EXPECT_EQ(back.secret, d.secret);

  d.spares = {SockAddr::parse("[fd00::2]:1"), SockAddr::parse("[fd00::3]:2"), SockAddr::parse("[fd00::4]:3"),
              SockAddr::parse("[fd00::5]:4")};
  back = decodeUniqueId(uniqueIdFromText(uniqueIdToText(encodeUniqueId(d))));
  EXPECT_EQ(back.spares.back().str(), "[fd00::5]:4");
  d.spares.push_back(SockAddr::parse("[fd00::6]:5"));
  EXPECT_THROW(encodeUniqueId(d), Error);  // a fifth IPv6 spare does not fit
  d.spares = {SockAddr::parse("10.0.0.2:1"), SockAddr::parse("[fd00::2]:1")};
  EXPECT_THROW(encodeUniqueId(d), Error);

  // Cut short, or a count past what fits: refused, naming the lengths.
  EXPECT_THROW(uniqueIdFromText(text.substr(0, text.size() - 2)), Error);
  ecclUniqueId id = encodeUniqueId(UniqueIdData{d.root, d.secret, 7, {SockAddr::parse("10.0.0.2:1")}});
  id.internal[52] = 13;
  EXPECT_THROW(decodeUniqueId(id), Error);
}

TEST(CoordMessages, RoundTripAndRejectGarbage) {
  CoordMessage m;
  m.kind = CoordKind::kView;
  m.epoch = 7;
  m.rank = 2;
  m.text = "rank 2 -> standby";
  m.entries = {{11, "10.1.2.3:5"}, {12, "10.1.2.4:6"}};
  m.members = {12, 13};
  m.neededFrom = {0, 40};
  auto bytes = encodeCoordMessage(m);
  std::string why;
  auto back = decodeCoordMessage(bytes.data(), bytes.size(), &why);
  ASSERT_TRUE(back) << why;
  EXPECT_EQ(back->kind, CoordKind::kView);
  EXPECT_EQ(back->epoch, 7u);
  EXPECT_EQ(back->rank, 2);
  EXPECT_EQ(back->entries, m.entries);
  EXPECT_EQ(back->members, m.members);
  EXPECT_EQ(back->neededFrom, m.neededFrom);
  for (size_t cut = 0; cut < bytes.size(); ++cut)
    EXPECT_FALSE(decodeCoordMessage(bytes.data(), cut, &why)) << "truncated at " << cut;
  bytes.push_back(0);
  EXPECT_FALSE(decodeCoordMessage(bytes.data(), bytes.size(), &why));
  EXPECT_NE(why.find("trailing"), std::string::npos) << why;
  bytes.pop_back();
  // Entries encoded once for many messages go on the wire as they would inline.
  CoordMessage shared = m;
  shared.entries.clear();
  shared.encoded = encodeEntries(m.entries);
  EXPECT_EQ(encodeCoordMessage(shared), bytes);
  EXPECT_EQ(shared.viewEntries(), m.entries);
  bytes[shared.encoded->bytes.size()] = 99;  // the kind follows the entries
  EXPECT_FALSE(decodeCoordMessage(bytes.data(), bytes.size(), &why));
  EXPECT_NE(why.find("unknown coordinator message kind 99"), std::string::npos) << why;
  m.neededFrom = {40};  // neither empty nor one per member
  bytes = encodeCoordMessage(m);
  EXPECT_FALSE(decodeCoordMessage(bytes.data(), bytes.size(), &why));
  EXPECT_NE(why.find("neededFrom"), std::string::npos) << why;
}

// A broadcast's entries are encoded and hashed once and sent from that one
// copy on every connection, each sealed under its own key; a view larger
// than the socket's buffer goes out over several flushes in order; one
// sealed under another key is refused.
TEST(SealedChannel, SharedEntriesGoOutOnEveryConnectionAndAreSealedPerConnection) {
  std::vector<ViewEntry> entries;
  for (uint64_t i = 0; i < 4000; ++i) entries.push_back({1000 + i, fmt::format("tcp:10.0.{}.{}:{}", i / 250, i % 250, 40000 + i)});
  auto shared = encodeEntries(entries);
  for (uint8_t k = 1; k <= 2; ++k) {
    int sv[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    Secret key{};
    key[0] = k;
    SealedChannel server(Fd(sv[0]), key, true, "member"), client(Fd(sv[1]), key, false, "coordinator");
    CoordMessage view;
    view.kind = CoordKind::kView;
    view.epoch = 3;
    view.rank = k;
    view.encoded = shared;
    CoordMessage beat;
    beat.kind = CoordKind::kHeartbeat;
    ASSERT_TRUE(server.enqueue(view, 1 << 24));
    ASSERT_TRUE(server.enqueue(beat, 1 << 24));
    EXPECT_GT(server.queuedBytes(), shared->bytes.size());
    std::vector<CoordMessage> got;
    for (int round = 0; round < 1000 && got.size() < 2; ++round) {
      server.flush();
      client.drain(&got);
    }
    ASSERT_EQ(got.size(), 2u);
    EXPECT_EQ(server.queuedBytes(), 0u);
    EXPECT_EQ(got[0].kind, CoordKind::kView);
    EXPECT_EQ(got[0].rank, k);
    EXPECT_EQ(got[0].entries, entries);
    EXPECT_EQ(got[1].kind, CoordKind::kHeartbeat);
  }
  // Sealed under another key: refused, nothing handed over.
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  Secret a{}, b{};
  b[0] = 9;
  SealedChannel server(Fd(sv[0]), a, true, "member"), client(Fd(sv[1]), b, false, "coordinator");
  CoordMessage small;
  small.kind = CoordKind::kView;
  small.encoded = encodeEntries({{1, "tcp:10.0.0.1:1"}});
  ASSERT_TRUE(server.enqueue(small, 1 << 20));
  server.flush();
  std::vector<CoordMessage> got;
  try {
    client.drain(&got);
    ADD_FAILURE() << "a message sealed under another key was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fails authentication"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(got.empty());
}

// A view sent as changes applies only to the view it was computed from;
// anything else is refused with the reason and leaves the held view as it was.
TEST(CoordMessages, AViewDeltaAppliesOnlyToItsBaseAndIsChecked) {
  HeldView held;
  CoordMessage whole;
  whole.kind = CoordKind::kView;
  whole.epoch = 4;
  whole.entries = {{11, "a"}, {12, "b"}, {13, "c"}, {14, "d"}};
  std::string why;
  ASSERT_TRUE(takeView(&held, &whole, &why)) << why;
  EXPECT_EQ(held.epoch, 4u);
  std::vector<ViewEntry> next{{11, "a"}, {12, "b"}, {15, "e"}, {14, "d"}};
  auto delta = [&] {
    CoordMessage d;
    d.kind = CoordKind::kView;
    d.policy = kViewDelta;
    d.epoch = 5;
    d.pid = 4;
    d.nranks = 4;
    d.members = {2};
    d.entries = {{15, "e"}};
    d.member = viewChecksum(next);
    return d;
  };
  CoordMessage wrongBase = delta();
  wrongBase.pid = 3;
  EXPECT_FALSE(takeView(&held, &wrongBase, &why));
  EXPECT_NE(why.find("holds epoch 4"), std::string::npos) << why;
  CoordMessage badRank = delta();
  badRank.members = {7};
  EXPECT_FALSE(takeView(&held, &badRank, &why));
  EXPECT_NE(why.find("rank 7"), std::string::npos) << why;
  CoordMessage badSum = delta();
  badSum.member ^= 1;
  EXPECT_FALSE(takeView(&held, &badSum, &why));
  EXPECT_NE(why.find("checksum"), std::string::npos) << why;
  CoordMessage unequal = delta();
  unequal.entries.clear();
  EXPECT_FALSE(takeView(&held, &unequal, &why));
  EXPECT_EQ(held.epoch, 4u);  // nothing refused changed what is held
  EXPECT_EQ(held.entries, whole.entries);
  CoordMessage good = delta();
  ASSERT_TRUE(takeView(&held, &good, &why)) << why;
  EXPECT_EQ(good.entries, next);
  EXPECT_EQ(good.policy, kViewWhole);
  EXPECT_EQ(held.epoch, 5u);
  // A shrink: the size alone changes.
  CoordMessage shrink = delta();
  shrink.epoch = 6;
  shrink.pid = 5;
  shrink.nranks = 3;
  shrink.members.clear();
  shrink.entries.clear();
  next.resize(3);
  shrink.member = viewChecksum(next);
  ASSERT_TRUE(takeView(&held, &shrink, &why)) << why;
  EXPECT_EQ(shrink.entries, next);
}

TEST(Hello, RejectsForeignMagicAndPurpose) {
  uint8_t buf[kHelloBytes];
  Nonce n{};
  encodeHello({Purpose::kData, 1, 2, 3, 0}, n, buf);
  Hello h;
  std::string why;
  EXPECT_TRUE(decodeHello(buf, &h, &why));
  EXPECT_EQ(h.fromMember, 2u);
  buf[6] = 77;
  EXPECT_FALSE(decodeHello(buf, &h, &why));
  buf[0] = 'G';
  EXPECT_FALSE(decodeHello(buf, &h, &why));
  EXPECT_NE(why.find("not an eccl hello"), std::string::npos);
}

// The C ABI's one translation point turns any exception into a code.
TEST(Guard, NoExceptionCrossesTheCAbi) {
  EXPECT_EQ(api::guarded(nullptr, "t", [] { throw std::runtime_error("boom"); }), ecclInternalError);
  EXPECT_NE(std::string(ecclGetLastError(nullptr)).find("boom"), std::string::npos);
  EXPECT_EQ(api::guarded(nullptr, "t", [] { throw 42; }), ecclInternalError);
  EXPECT_EQ(api::guarded(nullptr, "t", [] { throw std::bad_alloc(); }), ecclSystemError);
  EXPECT_EQ(api::guarded(nullptr, "t", [] { throw Error(ecclTimeout, "late"); }), ecclTimeout);
  EXPECT_EQ(api::guarded(nullptr, "t", [] {}), ecclSuccess);
}

}  // namespace
}  // namespace eccl::membership
