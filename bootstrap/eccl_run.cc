// eccl-run: starts N ranks of a program with the environment that
// ecclCommInitFromEnv reads, prefixes their output with the rank, forwards
// SIGINT/SIGTERM, and exits non-zero if any rank fails. The rendezvous root
// runs inside the launcher, so killing any rank never kills it; with --etcd
// the launcher starts replicated coordinators beside it instead (see
// replicated_coordinators.h), which may be killed too (SIGUSR1 to the
// launcher kills the leading one). Ranks go to
// the hosts of --host-list in turn; a remote one is started through the
// remote shell (--rsh, default ssh: `ssh HOST env ECCL_...=... PROGRAM`).
#include "cli/cli.h"
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bootstrap/replicated_coordinators.h"
#include "membership/coordinator.h"
#include "membership/unique_id.h"
#include "common/clock.h"
#include "common/crypto.h"
#include "common/error.h"
#include "common/netif.h"
#include "common/params.h"

namespace {

volatile sig_atomic_t pendingSignal = 0;
void onSignal(int sig) { pendingSignal = sig; }
// SIGUSR1 with --etcd: kill the leading coordinator now (a drill: the
// others take over; --coord-chaos does it on a timer).
volatile sig_atomic_t killLeaderAsked = 0;
void onKillLeader(int) { killLeaderAsked = 1; }

struct Child {
  int rank = 0;  // launch index: ranks first, then standbys
  std::string label;  // "2" or "s0"
  bool standby = false;
  bool injected = false;  // killed on purpose by --kill
  pid_t pid = -1;
  int outFd = -1, errFd = -1;
  std::string outLine, errLine;
  std::string lastErrLine;  // said why, if it failed
  bool exited = false;
  bool registered = false;  // seen idle or in the view: no longer starting
  bool fenced = false;      // declared failed by the coordinator, and killed here
  int status = 0;
};

// Writes complete lines with a "[rank] " prefix; keeps partial lines and
// the last complete one in `last`.
void pump(const std::string& label, std::string& pending, std::string& last, FILE* sink, bool flushAll) {
  size_t start = 0, nl;
  while ((nl = pending.find('\n', start)) != std::string::npos) {
    fprintf(sink, "[%s] %.*s\n", label.c_str(), static_cast<int>(nl - start), pending.data() + start);
    if (nl > start) last.assign(pending, start, nl - start);
    start = nl + 1;
  }
  pending.erase(0, start);
  if (flushAll && !pending.empty()) {
    fprintf(sink, "[%s] %s\n", label.c_str(), pending.c_str());
    last = pending;
    pending.clear();
  }
  fflush(sink);
}

// Forwards what an exited child left in its pipes (without blocking: a
// process it started may still hold them) and closes those at end of file.
void drainExited(Child& c) {
  for (int* fd : {&c.outFd, &c.errFd}) {
    bool isOut = fd == &c.outFd;
    std::string& pending = isOut ? c.outLine : c.errLine;
    std::string ignored;
    while (*fd >= 0) {
      pollfd p{*fd, POLLIN, 0};
      if (::poll(&p, 1, 0) <= 0) break;
      char buf[65536];
      ssize_t n = ::read(*fd, buf, sizeof(buf));
      if (n > 0) {
        pending.append(buf, static_cast<size_t>(n));
        pump(c.label, pending, isOut ? ignored : c.lastErrLine, isOut ? stdout : stderr, false);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      pump(c.label, pending, isOut ? ignored : c.lastErrLine, isOut ? stdout : stderr, true);
      close(*fd);
      *fd = -1;
    }
  }
}

// A program installed beside this one (ecclcoord next to eccl-run).
std::string siblingProgram(const std::string& name) {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return name;
  std::string path(self, static_cast<size_t>(n));
  return path.substr(0, path.rfind('/') + 1) + name;
}

bool isLocalHost(const std::string& h) { return h.empty() || h == "localhost" || h == "127.0.0.1" || h == "::1"; }

std::vector<std::string> splitOn(const std::string& text, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(sep, start);
    std::string part = text.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (!part.empty()) parts.push_back(part);
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return parts;
}

// The argument vector that starts `command` on `host`: the command itself
// for this host; otherwise the remote shell, the host, and `env` with the
// eccl variables (a remote shell does not carry our environment).
std::vector<std::string> launchArgs(const std::string& host, const std::vector<std::string>& rsh,
                                    const std::vector<std::string>& env, const std::vector<std::string>& command) {
  if (isLocalHost(host)) return command;
  std::vector<std::string> args = rsh;
  args.push_back(host);
  args.push_back("env");
  for (const auto& e : env)
    if (e.starts_with("ECCL_")) args.push_back(e);
  args.insert(args.end(), command.begin(), command.end());
  return args;
}

struct Fault {
  int rank = 0;
  double seconds = 0;
  std::string pattern;  // --kill-when: fire once the rank's output contains this
  bool triggered = false;
  int signal = SIGKILL;
  bool done = false;
  bool deferred = false;  // its time came before its rank was in the view
};

// "RANK:TEXT", e.g. "2:step 40".
Fault parseOutputFault(const std::string& spec, int np) {
  Fault f;
  size_t colon = spec.find(':');
  char* end = nullptr;
  if (colon == std::string::npos || colon + 1 == spec.size())
    throw eccl::cli::UsageError("fault '" + spec + "' must be RANK:TEXT");
  const std::string rankText = spec.substr(0, colon);
  f.rank = static_cast<int>(std::strtol(rankText.c_str(), &end, 10));
  if (rankText.empty() || *end || f.rank < 0 || f.rank >= np)
    throw eccl::cli::UsageError("fault '" + spec + "': rank out of range");
  f.pattern = spec.substr(colon + 1);
  return f;
}

// "RANK@SECONDS", e.g. "2@3.5".
Fault parseFault(const std::string& spec, int sig, int np) {
  Fault f;
  f.signal = sig;
  size_t at = spec.find('@');
  char* end = nullptr;
  if (at == std::string::npos) throw eccl::cli::UsageError("fault '" + spec + "' must be RANK@SECONDS");
  const std::string rankText = spec.substr(0, at), timeText = spec.substr(at + 1);
  f.rank = static_cast<int>(std::strtol(rankText.c_str(), &end, 10));
  if (rankText.empty() || *end || f.rank < 0 || f.rank >= np)
    throw eccl::cli::UsageError("fault '" + spec + "': rank out of range");
  f.seconds = std::strtod(timeText.c_str(), &end);
  if (timeText.empty() || *end || f.seconds < 0) throw eccl::cli::UsageError("fault '" + spec + "': bad time");
  return f;
}

// This process's environment plus the variables ecclCommInitFromEnv reads.
// hostId: ECCL_HOSTID for the child ("" keeps this process's).
std::vector<std::string> rankEnvironment(int rank, int nranks, const std::string& idText, bool standby,
                                         const std::string& hostId) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string_view v(*e);
    if (!v.starts_with("ECCL_RANK=") && !v.starts_with("ECCL_NRANKS=") && !v.starts_with("ECCL_UNIQUE_ID=") &&
        !v.starts_with("ECCL_ROLE=") && !(!hostId.empty() && v.starts_with("ECCL_HOSTID=")))
      env.emplace_back(v);
  }
  if (!hostId.empty()) env.push_back("ECCL_HOSTID=" + hostId);
  env.push_back(standby ? "ECCL_ROLE=standby" : "ECCL_ROLE=rank");
  env.push_back(fmt::format("ECCL_RANK={}", rank));
  env.push_back(fmt::format("ECCL_NRANKS={}", nranks));
  env.push_back("ECCL_UNIQUE_ID=" + idText);
  return env;
}

// --pool-first: waits until `want` standbys have registered with the
// coordinator. False (having killed them and said why) when one ends first,
// the launcher is signalled, or --timeout passes.
template <typename IdlePids>
bool awaitPool(std::vector<Child>& standbys, int want, const IdlePids& idlePids, double timeoutSeconds) {
  const auto start = eccl::Clock::now();
  auto deadline = eccl::deadlineAfterMs(static_cast<int64_t>(timeoutSeconds * 1000));
  std::string why;
  while (why.empty()) {
    if (static_cast<int>(idlePids().size()) >= want) {
      fprintf(stderr, "eccl-run: --pool-first: %d standbys registered after %.2f s; starting the ranks\n", want,
              std::chrono::duration<double>(eccl::Clock::now() - start).count());
      return true;
    }
    for (auto& c : standbys) {
      int status = 0;
      if (waitpid(c.pid, &status, WNOHANG) == c.pid) {
        c.exited = true;
        why = fmt::format("standby {} (pid {}) ended before it registered ({})", c.label, c.pid,
                          WIFSIGNALED(status) ? strsignal(WTERMSIG(status)) : fmt::format("exit {}", WEXITSTATUS(status)));
        break;
      }
    }
    if (why.empty() && pendingSignal) why = fmt::format("{} while the standbys registered", strsignal(pendingSignal));
    if (why.empty() && timeoutSeconds > 0 && eccl::Clock::now() >= deadline)
      why = fmt::format("{} of {} standbys registered within --timeout {} s", idlePids().size(), want, timeoutSeconds);
    if (why.empty()) usleep(20000);
  }
  fprintf(stderr, "eccl-run: --pool-first: %s; no rank started\n", why.c_str());
  for (auto& c : standbys) {
    if (c.exited) continue;
    kill(c.pid, SIGKILL);
    waitpid(c.pid, nullptr, 0);
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  eccl::cli::App app{"eccl-run: launch ranks of an eccl program"};
  int np = 0, standbys = 0;
  std::vector<std::string> kills, stops;
  std::string hostList;
  double timeoutSeconds = 0;
  std::vector<std::string> command;
  app.option("-n,--np", np, "number of ranks (-np N also works)").required().range(1, 4096);
  app.option("--host-list", hostList, "comma-separated hosts; ranks (then standbys) go to them in turn");
  std::string rshText = "ssh";
  app.option("--rsh", rshText, "remote shell for the hosts that are not this one (\"ssh\"; a test uses \"ip netns exec\")");
  app.option("--timeout", timeoutSeconds, "kill every rank after this many seconds (0: never)");
  std::string idFile;
  app.option("--id-file", idFile, "write the job id here (for ecclcoord status/migrate)");
  app.option("--standby", standbys, "also start this many standbys (ECCL_ROLE=standby)").range(0, 4096);
  bool refill = false, poolFirst = false;
  int chaosMs = 0, chaosMax = 1000000;
  unsigned seed = 1;
  bool bindCores = false;
  app.flag("--bind-cores", bindCores,
               "pin each process to a core of its own (ranks, then standbys, in turn over the cores this launcher "
               "may use)");
  app.flag("--refill", refill,
               "keep --standby K idle: start a standby whenever one is promoted, and one for each dead rank the "
               "view still holds");
  app.flag("--pool-first", poolFirst,
           "start the --standby K standbys first and the ranks once every one has registered (a job that begins "
           "with its pool provisioned, so a failure at its first step finds a standby)");
  int ranksPerHost = 0;
  app.option("--ranks-per-host", ranksPerHost,
                 "simulated hosts: ECCL_HOSTID=hostI for ranks I*N to I*N+N-1, spareJ for the standbys started "
                 "J*N to J*N+N-1 (a spare host each N; refills included), so snapshot copies avoid the ranks a host "
                 "fault takes together")
      .range(1, 4096);
  double respawnSeconds = -1;  // never
  app.option("--respawn", respawnSeconds,
                 "SECONDS after a rank dies, start a new standby in its place (a repaired host coming back; the "
                 "ranks take it in with ecclCommGrow)")
      .range(0.0, 86400.0);
  app.option("--chaos", chaosMs, "fault injection: SIGKILL a random rank every MS milliseconds on average")
      .range(10, 3600000);
  app.option("--chaos-max", chaosMax, "stop the chaos after this many kills").range(1, 100000000);
  app.option("--seed", seed, "seed of the chaos schedule");
  app.option("--kill", kills,
             "fault injection: SIGKILL rank R after S seconds, once it is in the job's view (R@S, repeatable)");
  app.option("--stop", stops,
             "fault injection: SIGSTOP rank R after S seconds, once it is in the job's view (R@S, repeatable)");
  std::vector<std::string> killWhens;
  app.option("--kill-when", killWhens,
             "fault injection: SIGKILL rank R once its output contains TEXT (R:TEXT, repeatable)");
  std::string etcd, etcdPrefix;
  int coordinators = 3, etcdTtl = 2, coordChaosMs = 0, coordChaosMax = 1000000;
  app.option("--etcd", etcd,
                 "replicated coordinators: start --coordinators of them (ecclcoord serve --etcd) beside the launcher, "
                 "leading in turn through this etcd cluster (IP:port,...)");
  app.option("--coordinators", coordinators, "with --etcd: how many coordinator replicas (default 3)")
      .range(1, 13);
  app.option("--etcd-prefix", etcdPrefix, "with --etcd: the job's keys (default /eccl/run-<random>/)");
  app.option("--etcd-ttl", etcdTtl, "with --etcd: seconds a dead leader holds the lead (default 2)")
      .range(1, 60);
  app.option("--coord-chaos", coordChaosMs,
                 "with --etcd: SIGKILL the leading coordinator every MS milliseconds on average (a new replica "
                 "takes its address)")
      .range(100, 3600000);
  app.option("--coord-chaos-max", coordChaosMax, "stop killing coordinators after this many")
      .range(1, 100000000);
  // Everything from the program name on belongs to the program.
  app.prefixCommand();
  // mpirun's spelling "-np N" is the one people type.
  app.alias("-np", "--np");
  if (int status = app.parse(argc, argv); status >= 0) return status;
  command = app.remaining();
  if (command.empty()) {
    fprintf(stderr, "eccl-run: no program given\n%s", app.help().c_str());
    return 2;
  }
  std::vector<std::string> hosts = splitOn(hostList, ',');
  if (hosts.empty()) hosts.push_back("localhost");
  std::vector<std::string> rsh = splitOn(rshText, ' ');
  bool allLocal = std::all_of(hosts.begin(), hosts.end(), isLocalHost);
  if (!allLocal && rsh.empty()) {
    fprintf(stderr, "eccl-run: --rsh is empty but --host-list names hosts other than this one\n");
    return 2;
  }
  // Every rank on this host: keep all traffic on loopback unless told
  // otherwise. With other hosts the default interface choice applies.
  if (allLocal) setenv("ECCL_SOCKET_IFNAME", getenv("ECCL_SOCKET_IFNAME") ? getenv("ECCL_SOCKET_IFNAME") : "lo", 1);
  std::vector<Fault> faults;
  try {
    for (auto& k : kills) faults.push_back(parseFault(k, SIGKILL, np));
    for (auto& k : stops) faults.push_back(parseFault(k, SIGSTOP, np));
    for (auto& k : killWhens) faults.push_back(parseOutputFault(k, np));
  } catch (const eccl::cli::UsageError& e) {
    fprintf(stderr, "eccl-run: %s\n", e.what());
    return 2;
  }
  // A pool being refilled is short only for a moment: the coordinator holds
  // a REPLACE that lacks standbys while the refills register (the members'
  // recovery waits up to ECCL_TIMEOUT_MS; the hold ends well before).
  if (refill && !getenv("ECCL_REPLACE_WAIT_MS")) {
    int64_t timeoutMs = 30000;
    try {
      timeoutMs = eccl::params::timeoutMs();
    } catch (const eccl::Error& e) {
      fprintf(stderr, "eccl-run: %s\n", e.what());
      return 2;
    }
    setenv("ECCL_REPLACE_WAIT_MS", std::to_string(timeoutMs / 2).c_str(), 1);
  }
  if (etcd.empty() && coordChaosMs > 0) {
    fprintf(stderr, "eccl-run: --coord-chaos needs --etcd (a single coordinator has no successor)\n");
    return 2;
  }
  if (etcd.empty())
    for (const char* option : {"--coordinators", "--etcd-prefix", "--etcd-ttl", "--coord-chaos-max"})
      if (app.given(option)) {
        fprintf(stderr, "eccl-run: %s needs --etcd (without it the launcher runs one coordinator itself)\n", option);
        return 2;
      }
  // The coordinator lives here, never in a rank: killing any rank leaves it
  // up. Replicated, it lives in processes of its own beside the launcher.
  std::string idText;
  std::unique_ptr<eccl::membership::Coordinator> coordinator;
  std::unique_ptr<eccl::launcher::ReplicatedCoordinators> replicated;
  try {
    if (etcd.empty()) {
      ecclUniqueId id;
      coordinator = eccl::membership::createJob(&id);
      idText = eccl::membership::uniqueIdToText(id);
    } else {
      eccl::launcher::ReplicaSet set;
      set.etcdEndpoints = etcd;
      uint64_t tag;
      eccl::randomBytes(&tag, sizeof(tag));
      set.prefix = etcdPrefix.empty() ? fmt::format("/eccl/run-{:016x}/", tag) : etcdPrefix;
      set.ecclcoord = siblingProgram("ecclcoord");
      set.listenIp = eccl::pickInterface(eccl::params::socketIfname()).addr.str();
      set.listenIp = set.listenIp.substr(0, set.listenIp.rfind(':'));
      set.replicas = coordinators;
      set.ttlSeconds = etcdTtl;
      replicated = std::make_unique<eccl::launcher::ReplicatedCoordinators>(set);
      idText = replicated->idText();
      // Members look for the next leader for longer than a takeover takes.
      setenv("ECCL_COORD_FAILOVER_MS", getenv("ECCL_COORD_FAILOVER_MS") ?: std::to_string(etcdTtl * 1000 + 8000).c_str(),
             1);
      fprintf(stderr, "eccl-run: %d coordinator replicas through etcd at %s (keys under %s)\n", coordinators,
              etcd.c_str(), set.prefix.c_str());
    }
    if (!idFile.empty()) {
      std::string tmp = idFile + ".tmp";
      FILE* f = fopen(tmp.c_str(), "w");
      if (!f || fprintf(f, "%s\n", idText.c_str()) < 0 || fclose(f) != 0 || rename(tmp.c_str(), idFile.c_str()) != 0)
        throw eccl::Error(ecclSystemError, fmt::format("cannot write the job id to {}: {}", idFile, strerror(errno)));
    }
  } catch (const eccl::Error& e) {
    fprintf(stderr, "eccl-run: %s\n", e.what());
    return 2;
  }
  auto idlePids = [&] { return coordinator ? coordinator->idleStandbyPids() : replicated->idleStandbyPids(); };
  auto viewPids = [&] { return coordinator ? coordinator->viewPids() : replicated->viewPids(); };
  auto fencedPids = [&] { return coordinator ? coordinator->fencedPids() : replicated->fencedPids(); };
  auto tellRankExited = [&](int rank, const std::string& how) {
    try {
      const auto id = eccl::membership::decodeUniqueId(eccl::membership::uniqueIdFromText(idText));
      eccl::membership::reportRankExited(id, rank, how, eccl::deadlineAfterMs(5000));
      fprintf(stderr, "eccl-run: rank %d ended before the job formed (%s); the next idle standby takes its rank\n", rank,
              how.c_str());
    } catch (const eccl::Error& e) {
      fprintf(stderr, "eccl-run: rank %d ended before the job formed; telling the coordinator failed: %s\n", rank,
              e.what());
    }
  };
  int coordChaosKills = 0;
  auto nextCoordChaos = eccl::Clock::now() + std::chrono::milliseconds(coordChaosMs);

  struct sigaction sa {};
  sa.sa_handler = onSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  struct sigaction usr {};
  usr.sa_handler = onKillLeader;
  sigaction(SIGUSR1, &usr, nullptr);  // never the default action: that would end the launcher

  std::vector<int> cores;
  if (bindCores) {
    cpu_set_t mine;
    CPU_ZERO(&mine);
    if (sched_getaffinity(0, sizeof(mine), &mine) == 0)
      for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &mine)) cores.push_back(c);
    if (cores.empty()) {
      fprintf(stderr, "eccl-run: --bind-cores: cannot read this process's CPU affinity: %s\n", strerror(errno));
      return 2;
    }
    if (static_cast<int>(cores.size()) < np + standbys)
      fprintf(stderr, "eccl-run: --bind-cores: %d processes share %zu cores\n", np + standbys, cores.size());
  }
  std::vector<Child> children;
  int standbysStarted = 0, ranksStarted = 0;
  // Everything a child needs is built before fork: the coordinator thread is
  // running, so between fork and exec only async-signal-safe calls happen.
  auto spawn = [&](bool standby) -> bool {
    // The launch index (ranks first, then standbys) places a process on a
    // host and a core whichever order they start in.
    int index = standby ? np + standbysStarted : ranksStarted;
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
      perror("eccl-run: pipe");
      return false;
    }
    std::string hostId;
    if (ranksPerHost > 0)
      hostId = standby ? fmt::format("spare{}", standbysStarted / ranksPerHost) : fmt::format("host{}", index / ranksPerHost);
    std::vector<std::string> env = rankEnvironment(standby ? -1 : index, np, idText, standby, hostId);
    std::vector<std::string> argv = launchArgs(hosts[static_cast<size_t>(index) % hosts.size()], rsh, env, command);
    std::vector<char*> envp, args;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    std::string execFailed = fmt::format("eccl-run: cannot execute {} (not found or not executable)\n", argv[0]);
    cpu_set_t core;
    CPU_ZERO(&core);
    if (!cores.empty()) CPU_SET(cores[static_cast<size_t>(index) % cores.size()], &core);
    // Signals blocked across fork: a SIGTERM that releases a standby the
    // moment it is started would otherwise run the launcher's handler in
    // the child before exec and be lost (the standby then waited for a
    // promotion until --timeout). The child takes the default actions
    // back first, then any signal sent meanwhile.
    sigset_t everything, before;
    sigfillset(&everything);
    pthread_sigmask(SIG_BLOCK, &everything, &before);
    pid_t pid = fork();
    if (pid == 0) {
      for (int handled : {SIGINT, SIGTERM, SIGUSR1}) signal(handled, SIG_DFL);
      pthread_sigmask(SIG_SETMASK, &before, nullptr);
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // no orphaned ranks if the launcher dies
      if (!cores.empty()) sched_setaffinity(0, sizeof(core), &core);
      dup2(out[1], 1);
      dup2(err[1], 2);
      execvpe(args[0], args.data(), envp.data());
      [[maybe_unused]] ssize_t n = write(2, execFailed.data(), execFailed.size());
      _exit(127);
    }
    pthread_sigmask(SIG_SETMASK, &before, nullptr);
    close(out[1]);
    close(err[1]);
    Child c;
    c.rank = index;
    c.label = standby ? fmt::format("s{}", standbysStarted++) : std::to_string(ranksStarted++);
    c.standby = standby;
    c.pid = pid;
    c.outFd = out[0];
    c.errFd = err[0];
    children.push_back(std::move(c));
    return true;
  };
  if (poolFirst) {
    for (int s = 0; s < standbys; ++s)
      if (!spawn(true)) return 2;
    if (!awaitPool(children, standbys, idlePids, timeoutSeconds)) return 2;
  }
  for (int r = 0; r < np; ++r)
    if (!spawn(false)) return 2;
  for (int s = poolFirst ? standbys : 0; s < standbys; ++s)
    if (!spawn(true)) return 2;
  // Ranks first, as --kill R@S and the rest look them up.
  std::stable_partition(children.begin(), children.end(), [](const Child& c) { return !c.standby; });
  const auto started = eccl::Clock::now();

  auto deadline = eccl::deadlineAfterMs(static_cast<int64_t>(timeoutSeconds * 1000));
  int running = static_cast<int>(children.size());
  std::mt19937 chaosRng(seed);
  int chaosKills = 0;
  bool jobEnding = false;  // a rank finished on its own: no more chaos or refills
  auto nextChaos = started + std::chrono::milliseconds(chaosMs);
  bool timedOut = false;
  bool standbysReleased = false;
  std::vector<eccl::Clock::time_point> respawnAt;  // one per dead rank, while --respawn
  while (running > 0) {
    double elapsed = std::chrono::duration<double>(eccl::Clock::now() - started).count();
    if (!jobEnding && !timedOut && !standbysReleased)
      for (auto due = respawnAt.begin(); due != respawnAt.end();) {
        if (eccl::Clock::now() < *due) {
          ++due;
          continue;
        }
        due = respawnAt.erase(due);
        if (spawn(true)) {
          ++running;
          fprintf(stderr, "eccl-run: --respawn: standby %s started at %.2f s\n", children.back().label.c_str(), elapsed);
        }
      }
    auto idle = idlePids();
    // A standby is available until it is in the view (idle, or still
    // starting however long that takes: a loaded host took over 10 s to
    // import torch, and a pool that counted those as gone grew by one every
    // 10 s); a promoted one is a rank (fair game for the chaos, and
    // replaced by a refill).
    auto inView = viewPids();
    // A timed fault waits for its rank to be in the view, as the chaos
    // does: a rank gone before the job formed can never be replaced (the
    // others time out in bootstrap), and "R@S" means a failure of the
    // running job (a rank slow to start under load was killed at 0.14 s,
    // before it registered).
    for (auto& f : faults) {
      if (f.done || (f.pattern.empty() ? elapsed < f.seconds : !f.triggered)) continue;
      Child& c = children[f.rank];
      if (f.pattern.empty() && !c.exited && !inView.count(static_cast<uint64_t>(c.pid))) {
        if (!f.deferred)
          fprintf(stderr, "eccl-run: %s for rank %d at %.2f s waits until it is in the job's view\n",
                  strsignal(f.signal), f.rank, elapsed);
        f.deferred = true;
        continue;
      }
      f.done = true;
      if (c.exited) continue;
      fprintf(stderr, "eccl-run: injecting %s into rank %d (pid %d) at %.2f s\n", strsignal(f.signal), f.rank, c.pid,
              elapsed);
      c.injected = f.signal == SIGKILL;
      kill(c.pid, f.signal);
    }
    // A member declared failed is fenced: it can never rejoin. One still
    // alive is hung (stopped, spinning, cut off); it would hold its slot
    // and its repair (--respawn) until a watchdog or --timeout. Killed
    // here, it is repaired like any dead rank.
    for (uint64_t pid : fencedPids())
      for (auto& c : children)
        if (!c.exited && !c.fenced && !c.injected && static_cast<uint64_t>(c.pid) == pid) {
          c.fenced = true;
          fprintf(stderr, "eccl-run: %s %s (pid %d) was declared failed and is fenced: killed at %.2f s\n",
                  c.standby ? "promoted standby" : "rank", c.label.c_str(), c.pid, elapsed);
          kill(c.pid, SIGKILL);
        }
    auto available = [&](const Child& c) {
      return c.standby && !c.exited && !inView.count(static_cast<uint64_t>(c.pid));
    };
    // A dead rank still in the view is a REPLACE waiting for a standby:
    // one more is started for it at once, as a scheduler replaces a failed
    // node (refilling only after promotions left a job with more dead
    // ranks than idle standbys waiting for ones nobody would start).
    if (refill && !jobEnding && !timedOut && !standbysReleased) {
      int pool = 0, unreplaced = 0;
      for (auto& c : children) {
        pool += available(c);
        unreplaced += c.exited && inView.count(static_cast<uint64_t>(c.pid));
      }
      for (; pool < standbys + unreplaced; ++pool)
        if (spawn(true)) ++running;
    }
    // A kill only while the idle pool can replace every failed rank and
    // this one too: faster kills would leave REPLACE waiting for standbys
    // the pool never grows to hold.
    size_t unreplaced = 0;
    for (auto& c : children) unreplaced += c.injected && inView.count(static_cast<uint64_t>(c.pid));
    bool poolCovers = unreplaced + 1 <= idle.size();
    if (chaosMs > 0 && !jobEnding && !timedOut && chaosKills < chaosMax && eccl::Clock::now() >= nextChaos &&
        poolCovers) {
      // Only members of the current view: a rank killed before the job
      // formed (or a process not yet in any view) can never be replaced.
      std::vector<Child*> ranks;
      for (auto& c : children)
        if (!c.exited && !c.injected && !available(c) && inView.count(static_cast<uint64_t>(c.pid)))
          ranks.push_back(&c);
      if (!ranks.empty()) {
        Child* victim = ranks[std::uniform_int_distribution<size_t>(0, ranks.size() - 1)(chaosRng)];
        victim->injected = true;
        kill(victim->pid, SIGKILL);
        ++chaosKills;
        fprintf(stderr, "eccl-run: chaos kill %d: %s %s (pid %d) at %.2f s\n", chaosKills,
                victim->standby ? "promoted standby" : "rank", victim->label.c_str(), victim->pid, elapsed);
      }
      nextChaos = eccl::Clock::now() +
                  std::chrono::milliseconds(std::uniform_int_distribution<int>(chaosMs / 2, chaosMs * 3 / 2)(chaosRng));
    }
    // What killing the leader did ("" when there was none to kill, or it failed: said here).
    auto killLeader = [&](const char* why) -> std::string {
      try {
        return replicated->killLeader();
      } catch (const eccl::Error& e) {
        fprintf(stderr, "eccl-run: %s: %s\n", why, e.what());
        return "";
      }
    };
    if (killLeaderAsked) {
      killLeaderAsked = 0;
      std::string did = replicated ? killLeader("SIGUSR1") : "ignored: only replicated coordinators (--etcd) are killed";
      fprintf(stderr, "eccl-run: SIGUSR1: %s at %.2f s\n",
              did.empty() ? "no leader killed (a takeover is under way)" : did.c_str(), elapsed);
    }
    if (coordChaosMs > 0 && !jobEnding && !timedOut && coordChaosKills < coordChaosMax &&
        eccl::Clock::now() >= nextCoordChaos) {
      const std::string did = killLeader("coordinator chaos");
      if (!did.empty())
        fprintf(stderr, "eccl-run: coordinator chaos kill %d: %s at %.2f s\n", ++coordChaosKills, did.c_str(), elapsed);
      // After a random pause; while a takeover is under way there is no
      // leader to kill, so look again soon.
      nextCoordChaos = eccl::Clock::now() + std::chrono::milliseconds(
                                                did.empty() ? 200
                                                            : std::uniform_int_distribution<int>(
                                                                  coordChaosMs / 2, coordChaosMs * 3 / 2)(chaosRng));
    }
    // When no rank is left, standbys that were never promoted are released
    // (those --respawn started too: nobody is left to promote them), the
    // ones still starting too: a refill importing torch on a loaded host
    // held the job's end for 15 s waiting for it to register. "Starting"
    // means never seen idle or in the view: a promoted standby that a view
    // being rebuilt leaves out for a moment is not one.
    if (!standbysReleased && (standbys > 0 || respawnSeconds >= 0)) {
      bool onlyIdle = true;
      for (auto& c : children) {
        const auto pid = static_cast<uint64_t>(c.pid);
        c.registered = c.registered || idle.count(pid) || inView.count(pid);
        if (!c.exited && !idle.count(pid) && !(c.standby && !c.registered)) onlyIdle = false;
      }
      if (onlyIdle) {
        for (auto& c : children)
          if (!c.exited) kill(c.pid, SIGTERM), c.injected = true;
        standbysReleased = true;
      }
    }
    if (pendingSignal) {
      for (auto& c : children)
        if (!c.exited) kill(c.pid, pendingSignal);
      pendingSignal = 0;
    }
    if (timeoutSeconds > 0 && !timedOut && eccl::Clock::now() >= deadline) {
      fprintf(stderr, "eccl-run: --timeout of %.1f s reached; killing every rank\n", timeoutSeconds);
      for (auto& c : children)
        if (!c.exited) kill(c.pid, SIGKILL);
      timedOut = true;
    }
    std::vector<pollfd> fds;
    std::vector<std::pair<Child*, bool>> owners;
    for (auto& c : children) {
      if (c.outFd >= 0) fds.push_back({c.outFd, POLLIN, 0}), owners.push_back({&c, true});
      if (c.errFd >= 0) fds.push_back({c.errFd, POLLIN, 0}), owners.push_back({&c, false});
    }
    if (!fds.empty() && poll(fds.data(), fds.size(), 100) > 0) {
      for (size_t i = 0; i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        auto [c, isOut] = owners[i];
        int& fd = isOut ? c->outFd : c->errFd;
        std::string& pending = isOut ? c->outLine : c->errLine;
        char buf[65536];
        ssize_t n = ::read(fd, buf, sizeof(buf));
        std::string ignored;
        std::string& last = isOut ? ignored : c->lastErrLine;
        if (n > 0) {
          pending.append(buf, static_cast<size_t>(n));
          for (auto& f : faults)
            if (!f.pattern.empty() && !f.triggered && !c->standby && c->rank == f.rank &&
                pending.find(f.pattern) != std::string::npos)
              f.triggered = true;
          pump(c->label, pending, last, isOut ? stdout : stderr, false);
        } else {
          pump(c->label, pending, last, isOut ? stdout : stderr, true);
          close(fd);
          fd = -1;
        }
      }
    } else if (fds.empty()) {
      usleep(10000);
    }
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
      if (replicated && replicated->exited(pid, status)) continue;
      for (auto& c : children) {
        if (c.pid != pid) continue;
        c.exited = true;
        c.status = status;
        --running;
        if (!c.injected && WIFEXITED(status) && WEXITSTATUS(status) == 0) jobEnding = true;
        // A rank (or a promoted standby) gone while the job runs: its host
        // comes back after the repair. Idle standbys that end are the pool's.
        bool wasRank = !c.standby || c.fenced || inView.count(static_cast<uint64_t>(pid));
        bool died = WIFSIGNALED(status) || WEXITSTATUS(status) != 0;
        if (respawnSeconds >= 0 && wasRank && died && !jobEnding && !timedOut)
          respawnAt.push_back(eccl::Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(respawnSeconds * 1000)));
        const char* what = c.standby ? "standby" : "rank";
        bool failedItself = !c.injected && (WIFSIGNALED(status) || WEXITSTATUS(status) != 0);
        if (failedItself) drainExited(c);  // its last words, for the line below
        std::string said = c.lastErrLine.empty() ? "" : "; it said: " + c.lastErrLine;
        if (!failedItself)
          ;  // exited cleanly, or the launcher did it
        else if (WIFSIGNALED(status))
          fprintf(stderr, "eccl-run: %s %s (pid %d) was killed by signal %d (%s)%s\n", what, c.label.c_str(), pid,
                  WTERMSIG(status), strsignal(WTERMSIG(status)), said.c_str());
        else
          fprintf(stderr, "eccl-run: %s %s (pid %d) exited with status %d%s\n", what, c.label.c_str(), pid,
                  WEXITSTATUS(status), said.c_str());
        // Gone before the job formed: the others would wait in formation
        // until their deadline; the coordinator hands its rank to a standby.
        if (!c.standby && failedItself && inView.empty() && !jobEnding && !timedOut)
          tellRankExited(c.rank, WIFSIGNALED(status) ? fmt::format("pid {} killed by signal {}", pid, WTERMSIG(status))
                                                     : fmt::format("pid {} exited with status {}", pid,
                                                                   WEXITSTATUS(status)));
      }
    }
  }
  // Drain what is left in the pipes.
  for (auto& c : children) {
    for (int* fd : {&c.outFd, &c.errFd}) {
      if (*fd < 0) continue;
      std::string& pending = fd == &c.outFd ? c.outLine : c.errLine;
      char buf[65536];
      ssize_t n;
      while ((n = ::read(*fd, buf, sizeof(buf))) > 0) pending.append(buf, static_cast<size_t>(n));
      std::string ignored;
      pump(c.label, pending, fd == &c.outFd ? ignored : c.lastErrLine, fd == &c.outFd ? stdout : stderr, true);
      close(*fd);
    }
  }
  int failed = 0;
  for (auto& c : children)
    if (!c.injected && (!WIFEXITED(c.status) || WEXITSTATUS(c.status) != 0)) ++failed;
  if (chaosMs > 0) fprintf(stderr, "eccl-run: chaos killed %d processes; %d standbys started\n", chaosKills, standbysStarted);
  if (coordChaosMs > 0) fprintf(stderr, "eccl-run: coordinator chaos killed %d leaders\n", coordChaosKills);
  if (replicated && replicated->failures()) {
    fprintf(stderr, "eccl-run: %d coordinator replicas failed on their own\n", replicated->failures());
    failed += replicated->failures();
  }
  if (failed) fprintf(stderr, "eccl-run: %d of %zu processes failed\n", failed, children.size());
  return failed ? 1 : 0;
}
