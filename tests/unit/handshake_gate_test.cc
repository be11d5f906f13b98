// The gate in front of every listener: handshakes side by side, so silent,
// trickling, garbage and over-the-cap connections delay no honest peer.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "common/error.h"
#include "common/netif.h"
#include "membership/handshake.h"
#include "membership/handshake_gate.h"

namespace eccl::membership {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kJob = 0x5eed;

Secret secretOf(uint8_t fill) {
  Secret s;
  s.fill(fill);
  return s;
}

// A gate on a loopback listener, driven by its own thread as the
// coordinator's loop and a member's accept thread drive theirs.
class GateFixture : public ::testing::Test {
 protected:
  void start(GateOptions options) {
    SockAddr any = SockAddr::parse("127.0.0.1:0");
    auto [fd, bound] = listenOn(any);
    listen_ = std::move(fd);
    address_ = bound;
    gate_ = std::make_unique<HandshakeGate>(secret_, kJob, options, "test gate");
    gate_->addListener(listen_.get(), [this](std::string* from) {
      SockAddr peer;
      Fd c = acceptUntil(listen_.get(), Clock::now(), &peer);
      if (c) *from = peer.str();
      return c;
    });
    thread_ = std::thread([this] {
      while (!stop_) {
        auto got = gate_->runOnce(20);
        std::lock_guard<std::mutex> lock(mu_);
        for (auto& a : got) admitted_.push_back(std::move(a));
      }
    });
  }
  void TearDown() override {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  Fd dial() { return connectTo(address_, deadlineAfterMs(2000), "test dial"); }
  // An honest member's handshake; returns how long it took.
  std::chrono::milliseconds authenticate(const Secret& secret, uint64_t from, Secret* key = nullptr) {
    auto t0 = Clock::now();
    Fd fd = dial();
    Hello h;
    h.purpose = Purpose::kData;
    h.jobId = kJob;
    h.fromMember = from;
    authenticateAsClient(fd.get(), secret, h, deadlineAfterMs(3000), "test client", key);
    held_.push_back(std::move(fd));
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
  }
  size_t admittedCount() {
    std::lock_guard<std::mutex> lock(mu_);
    return admitted_.size();
  }
  // Waits until the gate's peer closed `fd` (end of file or reset).
  static bool closedWithin(int fd, std::chrono::milliseconds limit) {
    auto end = Clock::now() + limit;
    while (Clock::now() < end) {
      char c;
      ssize_t rc = ::recv(fd, &c, 1, MSG_DONTWAIT);
      if (rc == 0 || (rc < 0 && errno != EAGAIN)) return true;
      std::this_thread::sleep_for(5ms);
    }
    return false;
  }

  Secret secret_ = secretOf(7);
  Fd listen_;
  SockAddr address_;
  std::unique_ptr<HandshakeGate> gate_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<Admitted> admitted_;
  std::vector<Fd> held_;
};

TEST_F(GateFixture, HonestPeerIsAdmittedPromptlyBesideSilentAndTricklingOnes) {
  start({.handshakeTimeoutMs = 5000, .maxPending = 128});
  std::vector<Fd> silent;
  for (int i = 0; i < 60; ++i) silent.push_back(dial());
  Fd trickle = dial();
  ASSERT_EQ(::send(trickle.get(), "E", 1, MSG_NOSIGNAL), 1);
  Secret clientKey;
  auto took = authenticate(secret_, 42, &clientKey);
  // The blocking gate this replaced waited out each silent connection's
  // 5 s deadline in turn before reaching this one.
  EXPECT_LT(took, 1000ms);
  for (int i = 0; i < 200 && admittedCount() == 0; ++i) std::this_thread::sleep_for(5ms);
  std::lock_guard<std::mutex> lock(mu_);
  ASSERT_EQ(admitted_.size(), 1u);
  EXPECT_EQ(admitted_[0].hello.fromMember, 42u);
  EXPECT_EQ(admitted_[0].sessionKey, clientKey);
  EXPECT_TRUE(admitted_[0].fd);
}

TEST_F(GateFixture, GarbageAndWrongSecretsAreRefusedWithoutHarm) {
  start({.handshakeTimeoutMs = 5000, .maxPending = 128});
  for (int i = 0; i < 20; ++i) {
    Fd g = dial();
    uint8_t junk[kHelloBytes];
    for (size_t k = 0; k < sizeof(junk); ++k) junk[k] = static_cast<uint8_t>(k * 31 + i);
    ASSERT_EQ(::send(g.get(), junk, sizeof(junk), MSG_NOSIGNAL), static_cast<ssize_t>(sizeof(junk)));
    EXPECT_TRUE(closedWithin(g.get(), 2000ms));
  }
  try {
    authenticate(secretOf(9), 5);
    FAIL() << "a wrong secret was admitted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("failed to prove the job secret"), std::string::npos) << e.what();
  }
  authenticate(secret_, 6);
  for (int i = 0; i < 200 && admittedCount() == 0; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(admittedCount(), 1u);
  EXPECT_EQ(gate_->stats().refused, 21u);  // the garbage and the wrong secret
}

TEST_F(GateFixture, SilentConnectionsAreDroppedAtTheirDeadline) {
  start({.handshakeTimeoutMs = 200, .maxPending = 128});
  Fd silent = dial();
  auto t0 = Clock::now();
  EXPECT_TRUE(closedWithin(silent.get(), 3000ms));
  EXPECT_GE(Clock::now() - t0, 150ms);
  EXPECT_EQ(gate_->stats().timedOut, 1u);
}

TEST_F(GateFixture, PastTheCapTheOldestIsDropped) {
  start({.handshakeTimeoutMs = 10000, .maxPending = 4});
  std::vector<Fd> squatters;
  for (int i = 0; i < 6; ++i) {
    squatters.push_back(dial());
    std::this_thread::sleep_for(20ms);  // accepted in this order
  }
  EXPECT_TRUE(closedWithin(squatters[0].get(), 2000ms));
  EXPECT_TRUE(closedWithin(squatters[1].get(), 2000ms));
  EXPECT_FALSE(closedWithin(squatters[5].get(), 100ms));
  EXPECT_EQ(gate_->stats().evicted, 2u);
  // An honest peer still gets in, evicting one more squatter.
  EXPECT_LT(authenticate(secret_, 8), 1000ms);
}

// A member whose hello is in but whose proof has not come yet (a slow
// process under a flood) outlives silent connections opened after it.
TEST_F(GateFixture, PastTheCapAPeerPastItsHelloOutlivesSilentOnes) {
  start({.handshakeTimeoutMs = 10000, .maxPending = 4});
  Fd midway = dial();
  Hello h;
  h.purpose = Purpose::kData;
  h.jobId = kJob;
  h.fromMember = 9;
  Nonce nonce{};
  uint8_t hello[kHelloBytes];
  encodeHello(h, nonce, hello);
  ASSERT_EQ(::send(midway.get(), hello, sizeof(hello), MSG_NOSIGNAL), static_cast<ssize_t>(sizeof(hello)));
  std::this_thread::sleep_for(50ms);  // the gate answered with its challenge
  std::vector<Fd> squatters;
  for (int i = 0; i < 6; ++i) {
    squatters.push_back(dial());
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(closedWithin(squatters[0].get(), 2000ms));
  EXPECT_TRUE(closedWithin(squatters[1].get(), 2000ms));
  EXPECT_TRUE(closedWithin(squatters[2].get(), 2000ms));
  EXPECT_FALSE(closedWithin(midway.get(), 100ms)) << "the connection past its hello was dropped for silent ones";
  EXPECT_EQ(gate_->stats().evicted, 3u);
}

}  // namespace
}  // namespace eccl::membership
