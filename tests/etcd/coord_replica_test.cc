// Replicated coordinators (ecclcoord serve --etcd) over a real three-node
// etcd cluster: three ecclcoord processes for one job, each at an address
// of its own (127.0.0.1, .2 and .3: as far as the sockets go, three
// hosts), the leader killed with SIGKILL twice while real member clients
// are connected. Each time another takes the lead within the lease,
// reloads the state and listens at its own address, which the job's id
// names, and the members find it and resume with it keeping their ranks;
// a rank that dies afterwards is declared by the third leader and the
// survivors' recovery completes through it. A replica started after the
// job was made, at an address its id does not name, says so and stops.
// A leader cut off from etcd (the only etcd node it reaches stops
// answering) while the members still reach it stops serving before the
// lease lets another replica in, and the members move to that one.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "membership/coord_client.h"
#include "membership/coordinator.h"
#include "membership/etcd_client.h"
#include "membership/unique_id.h"
#include "tests/support/etcd_cluster.h"
#include "tests/support/member_client.h"

namespace eccl::test {
namespace {

using namespace std::chrono_literals;
using namespace eccl::membership;

pid_t launchCoordinator(const std::vector<std::string>& args, const std::string& log = "") {
  pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> argv{const_cast<char*>(ECCL_COORD_BIN)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    if (!freopen("/dev/null", "w", stdout)) _exit(126);
    if (!log.empty() && !freopen(log.c_str(), "w", stderr)) _exit(126);
    execv(ECCL_COORD_BIN, argv.data());
    _exit(127);
  }
  return pid;
}

std::string waitForFile(const std::string& path, std::chrono::milliseconds within) {
  auto until = std::chrono::steady_clock::now() + within;
  while (std::chrono::steady_clock::now() < until) {
    std::ifstream in(path);
    std::string text;
    if (in >> text) return text;
    std::this_thread::sleep_for(20ms);
  }
  return "";
}

using Member = test::MemberClient;

// A real three-node etcd cluster, and a directory for the replicas' id
// files and logs, per test.
class CoordinatorReplicas : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(EtcdCluster::binary().empty()) << "no etcd binary (scripts/setup.sh installs etcd-server)";
    etcd = std::make_unique<EtcdCluster>(3);
    char dirTemplate[] = "/tmp/eccl-replica-XXXXXX";
    ASSERT_NE(mkdtemp(dirTemplate), nullptr);
    dir = dirTemplate;
  }
  void TearDown() override {
    if (!dir.empty()) std::filesystem::remove_all(dir);
  }
  std::unique_ptr<EtcdCluster> etcd;
  std::string dir;
};

TEST_F(CoordinatorReplicas, LeadersKilledAreReplacedAtOtherAddressesAndTheMembersFollow) {
  auto args = [&](int n) {
    return std::vector<std::string>{"serve", "--etcd", etcd->endpoints(), "--etcd-prefix", "/replica-test/",
                                    "--etcd-ttl", "1", "--replicas", "3", "--listen",
                                    "127.0.0." + std::to_string(n), "--id-file", dir + "/" + std::to_string(n) + ".id"};
  };
  std::vector<pid_t> replicas;
  for (int n = 1; n <= 3; ++n) replicas.push_back(launchCoordinator(args(n)));
  std::string idText;
  for (auto until = std::chrono::steady_clock::now() + 30s; idText.empty() && std::chrono::steady_clock::now() < until;)
    for (int n = 1; n <= 3 && idText.empty(); ++n) idText = waitForFile(dir + "/" + std::to_string(n) + ".id", 20ms);
  ASSERT_FALSE(idText.empty()) << "no replica announced the job";
  UniqueIdData id = decodeUniqueId(uniqueIdFromText(idText));
  ASSERT_EQ(id.coordinators().size(), 3u) << "the id does not name every replica";

  std::vector<std::unique_ptr<Member>> m(3);
  std::vector<std::thread> joins;
  for (int r = 0; r < 3; ++r) joins.emplace_back([&, r] { m[r] = std::make_unique<Member>(id, r, 3, 700u + r, 1500, 10000); });
  for (auto& t : joins) t.join();
  for (auto& member : m) ASSERT_EQ(member->client->awaitView(deadlineAfterMs(10000), "the first view").epoch, 1u);

  // Two leaders killed, one after the other: whoever leads writes its id
  // file (the same job's id) when it starts leading.
  std::string leaderAddress = id.root.str();
  for (int round = 0; round < 2; ++round) {
    for (int n = 1; n <= 3; ++n) std::remove((dir + "/" + std::to_string(n) + ".id").c_str());
    pid_t leader = -1;
    for (int n = 1; n <= 3; ++n)
      if (leaderAddress.starts_with("127.0.0." + std::to_string(n) + ":")) leader = replicas[n - 1];
    ASSERT_GT(leader, 0) << "no replica at " << leaderAddress;
    const auto killedAt = std::chrono::steady_clock::now();
    ::kill(leader, SIGKILL);
    waitpid(leader, nullptr, 0);
    std::replace(replicas.begin(), replicas.end(), leader, pid_t(-1));
    int next = 0;
    for (auto until = std::chrono::steady_clock::now() + 15s; !next && std::chrono::steady_clock::now() < until;)
      for (int n = 1; n <= 3 && !next; ++n)
        if (replicas[n - 1] > 0 && waitForFile(dir + "/" + std::to_string(n) + ".id", 20ms) == idText) next = n;
    ASSERT_NE(next, 0) << "no replica took over the job in round " << round;
    const double takeover = std::chrono::duration<double>(std::chrono::steady_clock::now() - killedAt).count();
    printf("round %d: the replica at 127.0.0.%d leads %.2f s after the leader at %s was killed (lease 1 s)\n", round,
           next, takeover, leaderAddress.c_str());
    EXPECT_LT(takeover, 5.0);
    for (auto& a : id.coordinators())
      if (a.str().starts_with("127.0.0." + std::to_string(next) + ":")) leaderAddress = a.str();
    // Past the heartbeat timeout: the members are back with it, not declared.
    std::this_thread::sleep_for(2000ms);
    for (auto& member : m) {
      std::lock_guard<std::mutex> lock(member->mu);
      EXPECT_TRUE(member->failed.empty()) << "a member was declared after round " << round;
    }
  }

  m[2]->client.reset();  // rank 2 dies under the third leader
  ASSERT_TRUE(m[0]->heard(702, 10000ms));
  ASSERT_TRUE(m[1]->heard(702, 10000ms));
  EXPECT_EQ(std::count(m[0]->failed.begin(), m[0]->failed.end(), 700u), 0);
  test::expectShrunkTo({m[0].get(), m[1].get()}, {700, 701});

  // A late replica at an address the id does not name stops, saying why.
  const std::string log = dir + "/late.log";
  pid_t late = fork();
  if (late == 0) {
    auto a = args(4);
    std::vector<char*> argv{const_cast<char*>(ECCL_COORD_BIN)};
    for (auto& x : a) argv.push_back(x.data());
    argv.push_back(nullptr);
    if (!freopen(log.c_str(), "w", stderr) || !freopen("/dev/null", "w", stdout)) _exit(126);
    execv(ECCL_COORD_BIN, argv.data());
    _exit(127);
  }
  int status = 0;
  waitpid(late, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status;
  std::ifstream in(log);
  std::string said((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(said.find("not this one"), std::string::npos) << said;
  EXPECT_NE(said.find("127.0.0.4"), std::string::npos) << said;

  m.clear();
  for (pid_t p : replicas)
    if (p > 0) ::kill(p, SIGTERM), waitpid(p, nullptr, 0);
}

TEST_F(CoordinatorReplicas, ALeaderCutOffFromEtcdStopsServingAndTheMembersMoveToTheNext) {
  auto args = [&](const std::string& endpoints, const std::string& ip, const std::string& name) {
    return std::vector<std::string>{"serve", "--etcd", endpoints, "--etcd-prefix", "/partition-test/", "--etcd-ttl",
                                    "1", "--replicas", "2", "--listen", ip, "--id-file", dir + "/" + name + ".id"};
  };
  // a reaches etcd only through node 0; b through nodes 1 and 2. a leads.
  pid_t a = launchCoordinator(args(etcd->endpoint(0), "127.0.0.1", "a"), dir + "/a.log");
  EtcdClient client(etcd->endpoints(), 3s);
  for (auto until = std::chrono::steady_clock::now() + 20s;
       !client.get("/partition-test/leader") && std::chrono::steady_clock::now() < until;)
    std::this_thread::sleep_for(20ms);
  ASSERT_TRUE(client.get("/partition-test/leader")) << "a never led";
  pid_t b = launchCoordinator(args(etcd->endpoint(1) + "," + etcd->endpoint(2), "127.0.0.2", "b"));
  const std::string idText = waitForFile(dir + "/a.id", 30s);
  ASSERT_FALSE(idText.empty()) << "a did not make the job";
  UniqueIdData id = decodeUniqueId(uniqueIdFromText(idText));
  ASSERT_EQ(id.coordinators().size(), 2u);

  std::vector<std::unique_ptr<Member>> m(3);
  std::vector<std::thread> joins;
  for (int r = 0; r < 3; ++r) joins.emplace_back([&, r] { m[r] = std::make_unique<Member>(id, r, 3, 700u + r, 1500, 10000); });
  for (auto& t : joins) t.join();
  for (auto& member : m) ASSERT_EQ(member->client->awaitView(deadlineAfterMs(10000), "the first view").epoch, 1u);

  const auto cut = std::chrono::steady_clock::now();
  etcd->stop(0);  // a's only etcd node stops answering; the members still reach a
  const std::string taken = waitForFile(dir + "/b.id", 15s);
  const double bLeads = std::chrono::duration<double>(std::chrono::steady_clock::now() - cut).count();
  etcd->resume(0);
  ASSERT_EQ(taken, idText) << "b did not take the job over";
  printf("partition: b leads %.2f s after a was cut off from etcd (lease 1 s)\n", bLeads);
  std::this_thread::sleep_for(2000ms);  // past the heartbeat timeout: the members are with b
  for (auto& member : m) {
    std::lock_guard<std::mutex> lock(member->mu);
    EXPECT_TRUE(member->failed.empty()) << "a member was declared across the partition";
  }
  EXPECT_EQ(::waitpid(a, nullptr, WNOHANG), 0) << "a exited instead of standing by";
  m[1]->client.reset();  // a rank dies: b declares it
  ASSERT_TRUE(m[0]->heard(701, 10000ms));
  ASSERT_TRUE(m[2]->heard(701, 10000ms));
  std::ifstream in(dir + "/a.log");
  std::string said((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(said.find("no longer the job's leader"), std::string::npos) << said;

  m.clear();
  for (pid_t p : {a, b}) ::kill(p, SIGTERM), waitpid(p, nullptr, 0);
}

}  // namespace
}  // namespace eccl::test
