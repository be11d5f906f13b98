// The device as a consumer addressed by handles uses it (the NCCL plugin):
// peers come from connections, each dial proves the token of the job id it
// names, lanes dialed in are filed apart from lanes dialed out, and a
// receive may be larger than its message.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <thread>

#include "common/error.h"
#include "transport/device.h"

namespace eccl::transport {
namespace {

Secret secretOf(uint8_t byte) {
  Secret s;
  s.fill(byte);
  return s;
}

struct Process {
  std::mutex mu;
  std::map<MemberId, uint64_t> arrived;  // peer -> job id it proved
  int arrivals = 0;
  std::unique_ptr<Device> device;        // last: its threads report into the above until it is gone
};

std::unique_ptr<Process> startProcess(MemberId self, std::map<uint64_t, Secret> tokens) {
  auto p = std::make_unique<Process>();
  DeviceOptions o;
  o.self = self;
  o.commId = 0xecc1;
  o.lanes = 2;
  o.ifname = "lo";
  o.backends = {"tcp"};
  o.handshakeTimeoutMs = 3000;
  o.peersFromConnections = true;
  o.acceptSecrets = [tokens](uint64_t job) -> std::optional<Secret> {
    auto it = tokens.find(job);
    return it == tokens.end() ? std::nullopt : std::optional<Secret>(it->second);
  };
  p->device = createDevice(o);
  Process* raw = p.get();
  p->device->onPeerFailure = [](MemberId, ecclResult_t, const std::string&, uint64_t, transport::FailureEvidence) {};
  p->device->onPeerArrived = [raw](MemberId peer, uint64_t job) {
    std::lock_guard<std::mutex> lock(raw->mu);
    raw->arrived[peer] = job;
    raw->arrivals++;
  };
  return p;
}

TEST(ConnectionPeers, AHigherIdDialsInWithATokenAndBothDirectionsUseItsLanes) {
  auto listener = startProcess(5, {{77, secretOf(7)}});
  auto dialer = startProcess(10, {});
  dialer->device->addPeer(5, listener->device->address(), "listener", Device::PeerRole::kCandidate);
  dialer->device->setPeerCredentials(5, 77, secretOf(7));
  std::vector<uint8_t> msg(100000), got(1 << 20, 0);
  for (size_t i = 0; i < msg.size(); ++i) msg[i] = static_cast<uint8_t>(i * 13 + 1);
  auto s = dialer->device->isend(5, 1, 3, msg.data(), msg.size());
  dialer->device->wait(s, deadlineAfterMs(5000), "send");
  const MemberId inbound = Device::inboundPeer(10);
  {
    std::lock_guard<std::mutex> lock(listener->mu);
    ASSERT_EQ(listener->arrived.size(), 1u);
    EXPECT_EQ(listener->arrived.at(inbound), 77u);
  }
  // Posted after the message arrived: it is staged, then copied.
  auto r = listener->device->irecvUpTo(inbound, 1, 3, got.data(), got.size());
  listener->device->wait(r, deadlineAfterMs(5000), "recv");
  EXPECT_EQ(r->bytes, msg.size());
  EXPECT_TRUE(std::equal(msg.begin(), msg.end(), got.begin()));
  // Posted before: the first frame says how much comes.
  int32_t small = 42, back = 0;
  auto r2 = listener->device->irecvUpTo(inbound, 2, 3, got.data(), got.size());
  dialer->device->wait(dialer->device->isend(5, 2, 3, &small, 4), deadlineAfterMs(5000), "send");
  listener->device->wait(r2, deadlineAfterMs(5000), "recv");
  EXPECT_EQ(r2->bytes, 4u);
  // The reverse direction rides the same lanes: no new connection.
  uint64_t opened = listener->device->stats().connectionsOpened;
  auto r3 = dialer->device->irecv(5, 9, 3, &back, 4);
  listener->device->wait(listener->device->isend(inbound, 9, 3, &small, 4), deadlineAfterMs(5000), "send");
  dialer->device->wait(r3, deadlineAfterMs(5000), "recv");
  EXPECT_EQ(back, 42);
  EXPECT_EQ(listener->device->stats().connectionsOpened, opened);
  EXPECT_EQ(dialer->device->stats().connectionsOpened, 2u);
}

// A process that dropped its lanes and dials again: the new lanes wait
// until the consumer lets go of the old peer, so nothing it still does
// under the name (a receive it re-posts, a close it agreed to) reaches
// them; then they are a new incarnation whose numbering starts over.
TEST(ConnectionPeers, AFreshDialWaitsUntilTheOldLanesAreLetGoOf) {
  auto listener = startProcess(5, {{77, secretOf(7)}});
  auto dialer = startProcess(10, {});
  const MemberId inbound = Device::inboundPeer(10);
  auto dial = [&](int32_t value) {
    dialer->device->addPeer(5, listener->device->address(), "listener", Device::PeerRole::kCandidate);
    dialer->device->setPeerCredentials(5, 77, secretOf(7));
    static int32_t sent;
    sent = value;
    dialer->device->wait(dialer->device->isend(5, 1, 3, &sent, 4), deadlineAfterMs(5000), "send");
  };
  auto arrivals = [&] {
    std::lock_guard<std::mutex> lock(listener->mu);
    return listener->arrivals;
  };
  dial(1);
  int32_t got = 0;
  listener->device->wait(listener->device->irecv(inbound, 1, 3, &got, 4), deadlineAfterMs(5000), "recv");
  EXPECT_EQ(got, 1);
  const uint64_t first = listener->device->peerIncarnation(inbound);
  ASSERT_NE(first, 0u);
  auto stale = listener->device->irecv(inbound, 2, 3, &got, 4);
  dialer->device->removePeer(5);
  dial(2);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(arrivals(), 1) << "the fresh dial took a name still held";
  EXPECT_EQ(listener->device->peerIncarnation(inbound), first);
  EXPECT_EQ(stale->state.load(), Request::kFailed) << "the old lanes' receive outlived their goodbye";
  EXPECT_TRUE(listener->device->removePeerIncarnation(inbound, first));
  EXPECT_EQ(arrivals(), 2);
  const uint64_t second = listener->device->peerIncarnation(inbound);
  EXPECT_NE(second, first);
  EXPECT_FALSE(listener->device->removePeerIncarnation(inbound, first)) << "a stale incarnation removed the new one";
  got = 0;
  listener->device->wait(listener->device->irecv(inbound, 1, 3, &got, 4), deadlineAfterMs(5000), "recv");
  EXPECT_EQ(got, 2);
}

TEST(ConnectionPeers, AMessageLargerThanTheReceiveFailsItAndKeepsTheConnection) {
  auto listener = startProcess(1, {{9, secretOf(4)}});
  auto dialer = startProcess(2, {});
  dialer->device->addPeer(1, listener->device->address(), "listener", Device::PeerRole::kCandidate);
  dialer->device->setPeerCredentials(1, 9, secretOf(4));
  const MemberId inbound = Device::inboundPeer(2);
  int64_t eight = 8, into = 0;
  dialer->device->wait(dialer->device->isend(1, 1, 0, &eight, 8), deadlineAfterMs(5000), "send");
  for (int i = 0; i < 500 && listener->device->lanesUp(inbound) < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  auto r = listener->device->irecvUpTo(inbound, 1, 0, &into, 4);
  try {
    listener->device->wait(r, deadlineAfterMs(5000), "recv");
    FAIL() << "an 8-byte message fit a 4-byte receive";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ecclInvalidUsage);
    EXPECT_NE(std::string(e.what()).find("sent 8 bytes where at most 4 were expected"), std::string::npos) << e.what();
  }
  auto r2 = listener->device->irecvUpTo(inbound, 2, 0, &into, 8);
  dialer->device->wait(dialer->device->isend(1, 2, 0, &eight, 8), deadlineAfterMs(5000), "send");
  listener->device->wait(r2, deadlineAfterMs(5000), "recv");
  EXPECT_EQ(into, 8);
}

// A dial with a stale or forged token, or for a job id the listener does
// not serve, is refused at the gate: no peer appears and the dialer's
// requests fail with an authentication error naming the listener.
TEST(ConnectionPeers, AWrongTokenOrUnknownJobIsRefused) {
  auto listener = startProcess(1, {{9, secretOf(4)}});
  for (auto [job, token] : {std::pair<uint64_t, uint8_t>{9, 5}, {10, 4}}) {
    auto dialer = startProcess(2, {});
    dialer->device->addPeer(1, listener->device->address(), "the listener", Device::PeerRole::kCandidate);
    dialer->device->setPeerCredentials(1, job, secretOf(token));
    int32_t x = 1;
    try {
      dialer->device->wait(dialer->device->isend(1, 1, 0, &x, 4), deadlineAfterMs(5000), "send");
      FAIL() << "a dial with job " << job << " and token " << int(token) << " was admitted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("the listener"), std::string::npos) << e.what();
    }
  }
  for (int i = 0; i < 300 && listener->device->stats().connectionsRejected < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_GE(listener->device->stats().connectionsRejected, 2u);
  std::lock_guard<std::mutex> lock(listener->mu);
  EXPECT_TRUE(listener->arrived.empty());
}

}  // namespace
}  // namespace eccl::transport
