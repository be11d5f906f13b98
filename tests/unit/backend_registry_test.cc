// The back-end registry and the address every member publishes: what the
// device is created with, and the one string membership carries for it.
#include <gtest/gtest.h>

#include "common/error.h"
#include "eccl_config.h"
#include "transport/backend.h"
#include "transport/device.h"

namespace eccl::transport {
namespace {

// RDMA (ib, where rdma-core is there) comes before TCP: where a device
// is, it is what reaches other hosts best.
const std::vector<std::string> kBuilt =
    ECCL_HAVE_VERBS ? std::vector<std::string>{"shm", "ib", "tcp"} : std::vector<std::string>{"shm", "tcp"};
const char* const kBuiltNames = ECCL_HAVE_VERBS ? "shm,ib,tcp" : "shm,tcp";

TEST(BackendRegistry, AutoIsEveryRegisteredBackEndInDialOrder) {
  EXPECT_EQ(parseBackendList("auto"), kBuilt);
  EXPECT_EQ(registeredBackendNames(), kBuiltNames);
  EXPECT_EQ(parseBackendList("tcp"), std::vector<std::string>{"tcp"});
  EXPECT_EQ(parseBackendList("tcp,shm,tcp"), (std::vector<std::string>{"tcp", "shm"}));
}

TEST(BackendRegistry, AnUnknownNameSaysWhatThisBuildHas) {
  try {
    parseBackendList("shm,rdma");
    FAIL() << "accepted an unknown back end";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ecclInvalidArgument);
    EXPECT_NE(std::string(e.what()).find(std::string("'rdma' is not a back end of this build (auto or a list of: ") +
                                         kBuiltNames + ")"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(parseBackendList("tcp,"), Error);
}

TEST(MemberAddress, SplitsBackIntoEachBackEndsPart) {
  std::vector<std::pair<std::string, std::string>> parts{{"shm", "eccl-00ff"}, {"tcp", "[::1]:4711"}};
  std::string joined = joinAddress(parts);
  EXPECT_EQ(joined, "shm:eccl-00ff,tcp:[::1]:4711");
  EXPECT_EQ(splitAddress(joined), parts);
  EXPECT_EQ(displayAddress(joined), "[::1]:4711");  // the part that reaches other hosts
  EXPECT_EQ(displayAddress("shm:eccl-00ff"), "shm:eccl-00ff");
  EXPECT_THROW(splitAddress("10.0.0.1"), Error);
  EXPECT_THROW(splitAddress("tcp:1.2.3.4:5,:x"), Error);
}

TEST(MemberAddress, ADeviceListensOnEveryBackEndItWasGiven) {
  DeviceOptions o;
  o.jobId = o.commId = 9;
  o.secret.fill(3);
  o.ifname = "lo";
  o.self = 1;
  auto every = createDevice(o);
  auto parts = splitAddress(every->address());
  ASSERT_EQ(parts.size(), 2u) << every->address();
  EXPECT_EQ(parts[0].first, "shm");
  EXPECT_EQ(parts[1].first, "tcp");
  EXPECT_EQ(parts[1].second.rfind("127.0.0.1:", 0), 0u) << every->address();
  o.backends = {"tcp"};
  auto tcpOnly = createDevice(o);
  EXPECT_EQ(splitAddress(tcpOnly->address()).size(), 1u) << tcpOnly->address();
  // Two members never share a shared-memory name, whatever ids they chose.
  o.backends = {"shm"};
  auto a = createDevice(o), b = createDevice(o);
  EXPECT_NE(a->address(), b->address());
}

}  // namespace
}  // namespace eccl::transport
