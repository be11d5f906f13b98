// eccl-run --etcd over a real three-node etcd cluster: the launcher starts
// three coordinator replicas beside the ranks, kills the leading one again
// and again (--coord-chaos) while it also kills ranks that standbys replace
// (--chaos --refill), and chaos_worker checks every allreduce element by
// element. The job must end by itself with every kill done and no process
// failing: recoveries that straddle a coordinator change complete.
// ECCL_COORD_CHAOS_KILLS sets the number of leaders killed (CI: 5;
// scripts/coord_chaos.sh: 20). And etcd gone entirely for a while: the
// collectives go on, and membership resumes once it is back.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <thread>

#include "tests/support/etcd_cluster.h"

namespace eccl::test {
namespace {

using namespace std::chrono_literals;

// Runs a command and returns what it printed, with its exit status.
std::string runCommand(const std::string& command, int* status) {
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return "popen failed";
  std::string out;
  std::array<char, 4096> buf;
  while (fgets(buf.data(), buf.size(), pipe)) out += buf.data();
  *status = pclose(pipe);
  return out;
}

int envInt(const char* name, int fallback) {
  const char* v = getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

std::string chaosCommand(const std::string& endpoints, int leaderKills, int rankKills, int coordEveryMs,
                         int rankEveryMs, int minSeconds) {
  auto n = [](int v) { return std::to_string(v); };
  return "ECCL_HEARTBEAT_MS=100 ECCL_HEARTBEAT_TIMEOUT_MS=2000 ECCL_TIMEOUT_MS=20000 ECCL_COORD_FAILOVER_MS=15000 " +
         std::string(ECCL_RUN_BIN) + " -np 4 --standby 2 --refill --etcd " + endpoints +
         " --etcd-ttl 1 --coordinators 3 --coord-chaos " + n(coordEveryMs) + " --coord-chaos-max " + n(leaderKills) +
         " --chaos " + n(rankEveryMs) + " --chaos-max " + n(rankKills) + " --seed 7 --timeout " +
         n(minSeconds * 3 + 120) + " " + ECCL_CHAOS_WORKER_BIN + " --min-epoch " + n(rankKills + 1) +
         " --min-seconds " + n(minSeconds) + " --quiet-ms 2000 2>&1";
}

TEST(EcclRunEtcd, LeadersAndRanksKilledTogetherAndEveryResultChecked) {
  ASSERT_FALSE(EtcdCluster::binary().empty()) << "no etcd binary (scripts/setup.sh installs etcd-server)";
  EtcdCluster etcd(3);
  const int leaderKills = envInt("ECCL_COORD_CHAOS_KILLS", 5), rankKills = envInt("ECCL_RANK_CHAOS_KILLS", 4);
  const int coordEveryMs = 2500, rankEveryMs = coordEveryMs * leaderKills / rankKills;
  // The worker runs past the last leader kill: each takes a takeover (about
  // 1.5 s with a 1 s lease) and a pause of up to 1.5 times the average.
  const int minSeconds = leaderKills * coordEveryMs * 3 / 2 / 1000 + 5;
  const std::string command = chaosCommand(etcd.endpoints(), leaderKills, rankKills, coordEveryMs, rankEveryMs,
                                          minSeconds);
  int status = 0;
  const std::string out = runCommand(command, &status);
  auto has = [&](const std::string& text) { return out.find(text) != std::string::npos; };
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status << "\n" << out;
  EXPECT_TRUE(has("coordinator chaos killed " + std::to_string(leaderKills) + " leaders")) << out;
  EXPECT_TRUE(has("chaos killed " + std::to_string(rankKills) + " processes")) << out;
  EXPECT_TRUE(has("allreduces checked element by element")) << out;
  EXPECT_FALSE(has("coordinator replicas failed on their own")) << out;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);)
    if (line.starts_with("eccl-run:") || line.find("chaos_worker:") != std::string::npos) printf("%s\n", line.c_str());
}

// Every etcd node killed while the job runs: the leader can no longer
// renew, stops serving, and nobody leads until etcd is back; the ranks'
// allreduces go on meanwhile (each checked) and the members look for a
// leader within their failover window. Once etcd returns a replica leads,
// the members resume with it, and a rank killed after that is replaced by
// the standby through it.
TEST(EcclRunEtcd, EtcdGoneAWhileStopsNoCollectiveAndMembershipResumesAfter) {
  ASSERT_FALSE(EtcdCluster::binary().empty()) << "no etcd binary (scripts/setup.sh installs etcd-server)";
  EtcdCluster etcd(3);
  const std::string command =
      "ECCL_HEARTBEAT_MS=100 ECCL_HEARTBEAT_TIMEOUT_MS=2000 ECCL_TIMEOUT_MS=30000 ECCL_COORD_FAILOVER_MS=30000 " +
      std::string(ECCL_RUN_BIN) + " -np 3 --standby 1 --etcd " + etcd.endpoints() +
      " --etcd-ttl 1 --coordinators 2 --kill 1@16 --timeout 120 " + ECCL_CHAOS_WORKER_BIN +
      " --min-epoch 2 --min-seconds 22 --quiet-ms 2000 2>&1";
  std::atomic<bool> jobDone{false};
  std::thread outage([&] {
    std::this_thread::sleep_for(5s);
    for (int node = 0; node < etcd.size(); ++node) etcd.kill(node);
    printf("etcd: every node killed\n");
    std::this_thread::sleep_for(5s);
    for (int node = 0; node < etcd.size(); ++node) etcd.restart(node);
    etcd.waitHealthy(30s);
    printf("etcd: back\n");
    // The nodes die with the thread that started them (PR_SET_PDEATHSIG
    // follows the thread): this one lives as long as the job.
    while (!jobDone) std::this_thread::sleep_for(50ms);
  });
  int status = 0;
  const std::string out = runCommand(command, &status);
  jobDone = true;
  outage.join();
  auto has = [&](const std::string& text) { return out.find(text) != std::string::npos; };
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status << "\n" << out;
  EXPECT_TRUE(has("allreduces checked element by element")) << out;
  EXPECT_TRUE(has("finished at epoch 2 with 3 ranks")) << out;
  EXPECT_TRUE(has("looking for its successor")) << "no member lost its coordinator during the outage\n" << out;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);)
    if (line.find("looking for its successor") != std::string::npos || line.find("chaos_worker:") != std::string::npos ||
        line.starts_with("eccl-run:"))
      printf("%s\n", line.c_str());
}

}  // namespace
}  // namespace eccl::test
