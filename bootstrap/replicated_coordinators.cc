#include "bootstrap/replicated_coordinators.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/clock.h"
#include "common/error.h"
#include "membership/coordinator.h"

namespace eccl::launcher {

using membership::EtcdWrite;

ReplicatedCoordinators::ReplicatedCoordinators(ReplicaSet set) : set_(std::move(set)) {
  char dirTemplate[] = "/tmp/eccl-run-coord-XXXXXX";
  if (!mkdtemp(dirTemplate)) fail(ecclSystemError, "mkdtemp: {}", strerror(errno));
  dir_ = dirTemplate;
  idFile_ = dir_ + "/id";
  etcd_ = std::make_unique<membership::EtcdClient>(set_.etcdEndpoints, std::chrono::milliseconds(2000));
  if (!etcd_->getPrefix(set_.prefix).empty())
    fail(ecclInvalidUsage, "etcd already holds keys under {}: another job's (pick another --etcd-prefix)",
         set_.prefix);
  try {
    for (int i = 0; i < set_.replicas; ++i) replicas_.push_back({spawn(set_.listenIp), set_.listenIp});
    const Deadline until = deadlineAfterMs(30000);
    while (Clock::now() < until) {
      std::ifstream in(idFile_);
      if (in >> idText_) break;
      for (auto& r : replicas_) {
        int status = 0;
        if (waitpid(r.pid, &status, WNOHANG) == r.pid)
          fail(ecclSystemError, "coordinator replica (pid {}) exited before the job was made (status {})", r.pid,
               status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (idText_.empty())
      fail(ecclTimeout, "no coordinator replica made the job within 30 s (etcd at {})", set_.etcdEndpoints);
    id_ = membership::decodeUniqueId(membership::uniqueIdFromText(idText_));
  } catch (...) {
    for (auto& r : replicas_) kill(r.pid, SIGKILL), waitpid(r.pid, nullptr, 0);
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
    throw;
  }
  poller_ = std::thread([this] { pollStatus(); });
}

ReplicatedCoordinators::~ReplicatedCoordinators() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  wake_.notifyAll();
  if (poller_.joinable()) poller_.join();
  for (auto& r : replicas_)
    if (r.running) kill(r.pid, SIGTERM);
  for (auto& r : replicas_)
    if (r.running) waitpid(r.pid, nullptr, 0);
  try {
    etcd_->transaction({}, {EtcdWrite::removePrefix(set_.prefix)});
  } catch (const Error& e) {
    fprintf(stderr, "eccl-run: could not remove the job's keys under %s from etcd: %s\n", set_.prefix.c_str(),
            e.what());
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

pid_t ReplicatedCoordinators::spawn(const std::string& listen) {
  std::vector<std::string> args = {set_.ecclcoord,  "serve",       "--etcd",     set_.etcdEndpoints,
                                    "--etcd-prefix", set_.prefix,  "--etcd-ttl", std::to_string(set_.ttlSeconds),
                                    "--replicas",    std::to_string(set_.replicas), "--listen", listen,
                                    "--id-file",     idFile_};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::string execFailed = fmt::format("eccl-run: cannot execute {}\n", set_.ecclcoord);
  pid_t pid = fork();
  if (pid < 0) fail(ecclSystemError, "fork: {}", strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (!freopen("/dev/null", "w", stdout)) _exit(126);  // it prints the id; the file carries it
    execv(argv[0], argv.data());
    [[maybe_unused]] ssize_t n = write(2, execFailed.data(), execFailed.size());
    _exit(127);
  }
  return pid;
}

void ReplicatedCoordinators::pollStatus() {
  MutexLock lock(mu_);
  while (!stopping_) {
    mu_.unlock();
    std::optional<membership::StatusPids> pids;
    try {
      pids = membership::parseStatusPids(membership::queryCoordinatorStatus(id_, deadlineAfterMs(1000)));
    } catch (const Error&) {
      // A takeover under way: keep what the last leader said.
    }
    mu_.lock();
    if (pids) {
      idle_ = std::move(pids->idleStandbys);
      view_ = std::move(pids->view);
      fenced_.insert(pids->fenced.begin(), pids->fenced.end());
    }
    wake_.waitUntil(mu_, Clock::now() + std::chrono::milliseconds(200));
  }
}

std::set<uint64_t> ReplicatedCoordinators::idleStandbyPids() const {
  MutexLock lock(mu_);
  return idle_;
}

std::set<uint64_t> ReplicatedCoordinators::viewPids() const {
  MutexLock lock(mu_);
  return view_;
}

std::set<uint64_t> ReplicatedCoordinators::fencedPids() const {
  MutexLock lock(mu_);
  return fenced_;
}

std::string ReplicatedCoordinators::killLeader() {
  auto leader = etcd_->get(set_.prefix + "leader");
  if (!leader) return "";
  const std::string& name = leader->value;  // "host:pid"
  const pid_t pid = static_cast<pid_t>(std::strtol(name.substr(name.rfind(':') + 1).c_str(), nullptr, 10));
  auto registered = etcd_->get(set_.prefix + "replicas/" + name);
  for (auto& r : replicas_) {
    if (r.pid != pid || !r.running || r.killed || !registered) continue;
    r.killed = true;
    kill(pid, SIGKILL);
    replicas_.push_back({spawn(registered->value), registered->value});
    return fmt::format("killed the leading coordinator (pid {} at {}); a new replica (pid {}) holds its address", pid,
                       registered->value, replicas_.back().pid);
  }
  return "";
}

bool ReplicatedCoordinators::exited(pid_t pid, int status) {
  for (auto& r : replicas_) {
    if (r.pid != pid) continue;
    r.running = false;
    if (!r.killed) {
      ++failures_;
      fprintf(stderr, "eccl-run: coordinator replica (pid %d, %s) %s %d\n", pid, r.listen.c_str(),
              WIFSIGNALED(status) ? "was killed by signal" : "exited with status",
              WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    }
    return true;
  }
  return false;
}

}  // namespace eccl::launcher
