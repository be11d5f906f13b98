// coord_scale: the membership coordinator under a large job, simulated.
//
// Per N in --members, a real coordinator (`ecclcoord serve`, its own
// process) and N members speaking the real protocol (authenticated
// connections, sealed messages, heartbeats both ways, views whole or as
// deltas), served by two event loops in this process (sim_members.h says
// why not a thread each), plus --standbys standbys. No data connections:
// only the coordinator is measured.
//   admit_ms        first connection to every member holding the formed view
//   coord_cpu_pct   the coordinator's CPU at steady heartbeats (user+system
//                   over --steady-s seconds, % of one core)
//   notice_p50_ms / notice_max_ms
//                   one member's connection closed (its process "died") to
//                   each survivor's failure notice
//   replace_ms      that death to every survivor holding the view in which
//                   a standby has the dead member's rank (every survivor
//                   asks for REPLACE when told, as ecclCommRecover does)
// --check fails (exit 1) unless every survivor was told and the new view
// puts a standby in the dead rank: what the ctest slice runs.
#include "cli/cli.h"
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "membership/unique_id.h"
#include "sim_members.h"

namespace {

using namespace eccl;
using membership::Role;
using perf::SimulatedMembers;

double msBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// Runs fn(i) for i in [0, n) on `threads` threads; rethrows the first error.
template <typename Fn>
void parallelFor(size_t n, int threads, Fn fn) {
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      for (size_t i; (i = next++) < n;) {
        try {
          fn(i);
        } catch (...) {
          std::lock_guard<std::mutex> lock(mu);
          if (!first) first = std::current_exception();
        }
      }
    });
  for (auto& th : pool) th.join();
  if (first) std::rethrow_exception(first);
}

struct CoordinatorProcess {
  static inline int runs = 0;
  pid_t pid = -1;
  std::string idText;
  const std::string idFile, log;

  // With etcd endpoints: one replica of a replicated coordinator (it leads
  // and writes every state change to etcd before announcing it).
  CoordinatorProcess(const std::string& ecclcoord, const std::string& idPath, const std::string& etcd)
      : idFile(idPath), log(idPath + ".log") {
    const std::string prefix = "/coord-scale/" + std::to_string(getpid()) + "-" + std::to_string(++runs) + "/";
    ::unlink(idFile.c_str());
    pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGTERM);  // never outlive the benchmark
      // Its own log: the id it prints and the one failure each run causes.
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
      if (etcd.empty())
        execl(ecclcoord.c_str(), ecclcoord.c_str(), "serve", "--id-file", idFile.c_str(), nullptr);
      else
        execl(ecclcoord.c_str(), ecclcoord.c_str(), "serve", "--id-file", idFile.c_str(), "--etcd", etcd.c_str(),
              "--etcd-prefix", prefix.c_str(), nullptr);
      _exit(127);
    }
    for (int i = 0; i < 300 && idText.empty(); ++i) {
      std::ifstream in(idFile);
      in >> idText;
      if (idText.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (idText.empty()) throw std::runtime_error("coord_scale: " + ecclcoord + " serve wrote no id");
  }
  ~CoordinatorProcess() {
    ::kill(pid, SIGTERM);
    for (int i = 0; i < 100 && ::waitpid(pid, nullptr, WNOHANG) == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (::waitpid(pid, nullptr, WNOHANG) == 0) {
      fprintf(stderr, "coord_scale: the coordinator did not stop within 5 s of SIGTERM; killed\n");
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    ::unlink(idFile.c_str());
    if (std::uncaught_exceptions() == 0)
      ::unlink(log.c_str());
    else
      fprintf(stderr, "coord_scale: the coordinator's log is %s\n", log.c_str());
  }
  // User + system CPU seconds so far.
  double cpuSeconds() const {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string text((std::istreambuf_iterator<char>(in)), {});
    std::istringstream rest(text.substr(text.rfind(')') + 2));
    std::string field;
    double ticks = 0;
    for (int i = 3; i <= 15 && rest >> field; ++i)
      if (i == 14 || i == 15) ticks += std::stod(field);
    return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
  }
};

struct Result {
  int members = 0, standbys = 0;
  double admitMs = 0, cpuPct = 0, noticeP50 = 0, noticeMax = 0, replaceMs = 0;
  int told = 0;
  bool standbyTookTheRank = false;
};

Result runOnce(const std::string& ecclcoord, const std::string& etcd, int n, int standbys, double steadyS,
               int threads) {
  Result r;
  r.members = n;
  r.standbys = standbys;
  CoordinatorProcess coord(ecclcoord, "/tmp/eccl-coord-scale-" + std::to_string(getpid()) + ".id", etcd);
  auto id = membership::decodeUniqueId(membership::uniqueIdFromText(coord.idText));
  SimulatedMembers::Options options;  // heartbeats every 500 ms, 3 s of silence declares
  SimulatedMembers sim(id, options);
  // Member ids drawn here, one thread, distinct.
  std::mt19937_64 rng(std::random_device{}());
  std::vector<uint64_t> ids;
  while (ids.size() < static_cast<size_t>(n + standbys)) {
    uint64_t v = rng() | 1;
    if (std::find(ids.begin(), ids.end(), v) == ids.end()) ids.push_back(v);
  }
  auto admitted = [&](const char* what) {
    if (!sim.firstError().empty()) throw std::runtime_error(std::string(what) + ": " + sim.firstError());
  };
  const auto joinBy = Clock::now() + std::chrono::seconds(120);
  std::vector<size_t> spare(standbys), ranks(n);
  parallelFor(spare.size(), threads, [&](size_t i) { spare[i] = sim.join(Role::kStandby, -1, n, ids[n + i], joinBy); });

  auto start = Clock::now();
  // Every join first: the view forms only once all ranks are in.
  parallelFor(ranks.size(), threads,
              [&](size_t i) { ranks[i] = sim.join(Role::kRank, static_cast<int>(i), n, ids[i], joinBy); });
  fprintf(stderr, "coord_scale: %d members joined in %.0f ms\n", n, msBetween(start, Clock::now()));
  if (!sim.awaitViews(n, 1, Clock::now() + std::chrono::seconds(180)))
    throw std::runtime_error("formation: " + (sim.firstError().empty() ? "no view within 180 s" : sim.firstError()));
  r.admitMs = msBetween(start, Clock::now());

  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  double cpu0 = coord.cpuSeconds();
  std::this_thread::sleep_for(std::chrono::duration<double>(steadyS));
  r.cpuPct = 100.0 * (coord.cpuSeconds() - cpu0) / steadyS;
  admitted("steady heartbeats");

  const int victim = n / 2;
  const uint64_t victimId = ids[victim];
  sim.setWatchedRank(victim);
  const uint32_t epoch = sim.seen(ranks[0]).epoch;
  auto died = Clock::now();
  sim.kill(ranks[victim]);  // no goodbye: its connection just closes
  sim.awaitTold(n - 1, Clock::now() + std::chrono::seconds(60));
  // Each survivor told asks for REPLACE, as ecclCommRecover does; the
  // coordinator answers once every survivor has asked.
  sim.askRecover(epoch, ecclRecoverReplace);
  const bool replaced = sim.awaitViews(n - 1 + (standbys > 0 ? 1 : 0), epoch + 1, Clock::now() + std::chrono::seconds(60));

  std::vector<double> notices;
  Clock::time_point last = died;
  bool standbyRank = replaced && standbys > 0;
  int newViews = 0;
  for (int i = 0; i < n; ++i) {
    if (i == victim) continue;
    auto& seen = sim.seen(ranks[i]);
    if (seen.toldAtNs.load()) notices.push_back((seen.toldAtNs.load() - died.time_since_epoch().count()) / 1e6);
    if (seen.epoch.load() <= epoch) continue;
    ++newViews;
    last = std::max(last, Clock::time_point(Clock::duration(seen.viewAtNs.load())));
    const uint64_t took = seen.memberAtWatched.load();
    if (took == victimId || std::find(ids.begin() + n, ids.end(), took) == ids.end()) standbyRank = false;
  }
  std::sort(notices.begin(), notices.end());
  r.told = static_cast<int>(notices.size());
  if (!notices.empty()) {
    r.noticeP50 = notices[notices.size() / 2];
    r.noticeMax = notices.back();
  }
  r.replaceMs = msBetween(died, last);
  r.standbyTookTheRank = standbys > 0 && newViews == n - 1 && standbyRank;
  if (!sim.firstError().empty()) fprintf(stderr, "coord_scale: %s\n", sim.firstError().c_str());
  // Members leave in order, so the coordinator's last act is not n failures.
  sim.leaveAll(Clock::now() + std::chrono::seconds(30));
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  eccl::cli::App app{"coord_scale: the membership coordinator with many simulated members"};
  std::vector<int> sizes = {256, 1024, 4096};
  int standbys = 64, threads = 32;
  double steadyS = 4;
  bool json = false, check = false;
  std::string ecclcoord;
  app.option("--members", sizes, "job sizes to run").delimiter(',');
  app.option("--standbys", standbys, "standbys registered before the ranks");
  app.option("--steady-s", steadyS, "seconds of steady heartbeats measured");
  app.option("--threads", threads, "threads that join members and wait for views");
  std::string etcd;
  app.option("--etcd", etcd,
                 "replicated: the coordinator is an ecclcoord serve --etcd replica writing to this etcd cluster "
                 "(IP:port,...)");
  app.option("--ecclcoord", ecclcoord, "the coordinator daemon (default: beside this binary)");
  app.flag("--json", json, "also print one JSON line per size");
  app.flag("--check", check, "exit 1 unless every survivor was told and a standby took the rank");
  if (int status = app.parse(argc, argv); status >= 0) return status;
  for (int n : sizes)
    if (n < 2) {
      fprintf(stderr, "coord_scale: --members %d: a job needs at least 2 members (one dies)\n", n);
      return 2;
    }
  if (threads < 1 || steadyS <= 0 || standbys < 0) {
    fprintf(stderr, "coord_scale: --threads and --steady-s must be positive, --standbys not negative\n");
    return 2;
  }
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (ecclcoord.empty()) {
    std::string self = std::filesystem::canonical("/proc/self/exe").string();
    ecclcoord = self.substr(0, self.rfind('/')) + "/../bootstrap/ecclcoord";
  }
  rlimit files{};
  getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = files.rlim_max;
  setrlimit(RLIMIT_NOFILE, &files);

  if (etcd.empty())
    printf("# coord_scale: one coordinator (ecclcoord serve), members over loopback, heartbeats 500 ms\n");
  else
    printf("# coord_scale: a replicated coordinator (ecclcoord serve --etcd %s, leading), members over loopback, "
           "heartbeats 500 ms\n",
           etcd.c_str());
  printf("# %8s %9s %10s %13s %14s %14s %11s %6s\n", "members", "standbys", "admit_ms", "coord_cpu_pct",
         "notice_p50_ms", "notice_max_ms", "replace_ms", "told");
  bool ok = true;
  for (int n : sizes) {
    Result r;
    try {
      r = runOnce(ecclcoord, etcd, n, standbys, steadyS, threads);
    } catch (const std::exception& e) {
      fprintf(stderr, "coord_scale: at %d members: %s\n", n, e.what());
      return 1;
    }
    printf("  %8d %9d %10.1f %13.1f %14.2f %14.2f %11.1f %6d\n", r.members, r.standbys, r.admitMs, r.cpuPct,
           r.noticeP50, r.noticeMax, r.replaceMs, r.told);
    if (json)
      printf("%s\n", nlohmann::json{{"members", r.members}, {"standbys", r.standbys}, {"admit_ms", r.admitMs},
                                    {"coord_cpu_pct", r.cpuPct}, {"notice_p50_ms", r.noticeP50},
                                    {"notice_max_ms", r.noticeMax}, {"replace_ms", r.replaceMs},
                                    {"told", r.told}, {"standby_took_rank", r.standbyTookTheRank}}
                         .dump()
                         .c_str());
    fflush(stdout);
    if (r.told != n - 1 || !r.standbyTookTheRank) {
      fprintf(stderr, "coord_scale: at %d members %d of %d survivors were told%s\n", n, r.told, n - 1,
              r.standbyTookTheRank ? "" : ", and no standby took the dead rank");
      ok = false;
    }
  }
  return check && !ok ? 1 : 0;
}
