#include "tests/support/multiproc.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <exception>
#include <fstream>
#include <mutex>
#include <thread>

#include "tests/support/crash_report.h"

namespace eccl::test {

namespace {

// The bootstrap root is a thread; a process forked while another thread
// holds a lock (OpenSSL's, the allocator's) can deadlock on it. So the root
// lives in its own helper process, as it does under eccl-run, and this
// process stays single-threaded while it forks the ranks. The helper exits
// when `lifeline` reaches end of file (the group is destroyed).
pid_t startRootProcess(ecclUniqueId* id, int* lifeline) {
  int idPipe[2], lifePipe[2];
  if (pipe2(idPipe, O_CLOEXEC) != 0 || pipe2(lifePipe, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(idPipe[0]);
    close(lifePipe[1]);
    ecclUniqueId made;
    if (ecclGetUniqueId(&made) != ecclSuccess) _exit(1);
    [[maybe_unused]] ssize_t n = write(idPipe[1], &made, sizeof(made));
    char c;
    while (read(lifePipe[0], &c, 1) > 0) {
    }
    _exit(0);
  }
  close(idPipe[1]);
  close(lifePipe[0]);
  ssize_t got = read(idPipe[0], id, sizeof(*id));
  close(idPipe[0]);
  if (got != static_cast<ssize_t>(sizeof(*id))) {
    close(lifePipe[1]);
    waitpid(pid, nullptr, 0);
    throw std::runtime_error("the bootstrap root process could not create a unique id");
  }
  *lifeline = lifePipe[1];
  return pid;
}

}  // namespace

ProcessGroup::ProcessGroup(int nranks, Body body) {
  ecclUniqueId id;
  rootPid_ = startRootProcess(&id, &rootLifeline_);
  start_ = std::chrono::steady_clock::now();
  for (int r = 0; r < nranks; ++r) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      close(fds[0]);
      reportCrashes(r);
      std::string message;
      int code = 0;
      try {
        body(r, nranks, id);
      } catch (const std::exception& e) {
        message = e.what();
        code = 1;
      } catch (...) {
        message = "unknown exception";
        code = 1;
      }
      if (!message.empty()) [[maybe_unused]] ssize_t n = write(fds[1], message.data(), message.size());
      _exit(code);
    }
    close(fds[1]);
    pids_.push_back(pid);
    pipes_.push_back(fds[0]);
  }
}

ProcessGroup::~ProcessGroup() {
  if (!waited_) wait(std::chrono::milliseconds(0));
  for (int fd : pipes_) close(fd);
  close(rootLifeline_);
  ::kill(rootPid_, SIGKILL);
  waitpid(rootPid_, nullptr, 0);
}

void ProcessGroup::signal(int rank, int sig) { ::kill(pids_[rank], sig); }

namespace {

// Whether `pid` is stopped (SIGSTOP): state 'T' in /proc/<pid>/stat.
bool stopped(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'T';
}

}  // namespace

std::vector<RankOutcome> ProcessGroup::wait(std::chrono::milliseconds deadline) {
  waited_ = true;
  deadline *= timeScale();  // a hang's bound, not a budget: stretched where the CPUs are emulated
  std::vector<RankOutcome> out(pids_.size());
  std::vector<std::string> messages(pids_.size());
  size_t left = pids_.size();
  auto until = std::chrono::steady_clock::now() + deadline;
  std::vector<bool> done(pids_.size(), false);
  auto stoppedSince = std::chrono::steady_clock::now(), lastLook = stoppedSince;
  auto drain = [&](size_t i) {
    char buf[4096];
    ssize_t n;
    while ((n = ::read(pipes_[i], buf, sizeof(buf))) > 0) messages[i].append(buf, static_cast<size_t>(n));
  };
  while (left > 0) {
    for (size_t i = 0; i < pids_.size(); ++i) {
      if (done[i]) continue;
      int status;
      pid_t p = waitpid(pids_[i], &status, WNOHANG);
      if (p != pids_[i]) continue;
      done[i] = true;
      --left;
      out[i].rank = static_cast<int>(i);
      out[i].exited = WIFEXITED(status);
      out[i].exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      out[i].signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      out[i].seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      drain(i);
    }
    if (left == 0) break;
    // Only stopped processes left, for 2 s: nobody will wake them (a test's
    // SIGSTOPped victim), so the stretched deadline need not run out.
    const auto now = std::chrono::steady_clock::now();
    if (now - lastLook >= std::chrono::milliseconds(100)) {  // /proc, ten times a second
      lastLook = now;
      bool allStopped = true;
      for (size_t i = 0; i < pids_.size() && allStopped; ++i) allStopped = done[i] || stopped(pids_[i]);
      if (!allStopped) stoppedSince = now;
    }
    if (now >= until || now - stoppedSince >= std::chrono::seconds(2)) {
      for (size_t i = 0; i < pids_.size(); ++i) {
        if (done[i]) continue;
        ::kill(pids_[i], SIGCONT);
        ::kill(pids_[i], SIGKILL);
        int status;
        waitpid(pids_[i], &status, 0);
        out[i].rank = static_cast<int>(i);
        out[i].hung = true;
        out[i].signal = SIGKILL;
        out[i].seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
        drain(i);
      }
      break;
    }
    usleep(2000);
  }
  for (size_t i = 0; i < out.size(); ++i) out[i].message = messages[i];
  return out;
}

std::string describe(const std::vector<RankOutcome>& outcomes) {
  std::string s;
  for (const auto& o : outcomes) {
    s += "rank " + std::to_string(o.rank) + ": ";
    if (o.hung) s += "HUNG (killed at the deadline)";
    else if (o.exited) s += "exit " + std::to_string(o.exitCode);
    else s += "signal " + std::to_string(o.signal);
    s += " after " + std::to_string(o.seconds) + " s";
    if (!o.message.empty()) s += ": " + o.message;
    s += "\n";
  }
  return s;
}

bool allSucceeded(const std::vector<RankOutcome>& outcomes) {
  for (const auto& o : outcomes)
    if (o.hung || !o.exited || o.exitCode != 0) return false;
  return true;
}

void runThreads(int nranks, const std::function<void(int, ecclComm_t)>& body) {
  ecclUniqueId id;
  if (ecclGetUniqueId(&id) != ecclSuccess) throw std::runtime_error("ecclGetUniqueId failed");
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int r = 0; r < nranks; ++r) {
    threads.emplace_back([&, r] {
      ecclComm_t comm = nullptr;
      try {
        RANK_OK(ecclCommInitRank(&comm, nranks, id, r), nullptr);
        body(r, comm);
        RANK_OK(ecclCommDestroy(comm), nullptr);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first) first = std::current_exception();
        if (comm) ecclCommAbort(comm);
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace eccl::test
