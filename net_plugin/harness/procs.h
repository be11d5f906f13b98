// Header-only; used by tests/net_plugin and perf/plugin_perf, never built into the plugin.
// Real processes for the plugin tests, with the one thing NCCL's bootstrap
// gives a net plugin: a way to pass 128-byte handles around. Each rank is
// forked before it loads the plugin (so each has its own), talks to the
// parent over a socket pair, and reports failure by throwing. The parent
// relays allgathers, and kills whatever is left at the deadline.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace eccl::test {

constexpr size_t kBlob = 128;

class Ranks {
 public:
  // In a rank: every rank's blob, in rank order.
  static std::vector<std::string> allgather(const void* mine);

  using Body = std::function<void(int rank, int nranks)>;
  // Runs body in nranks processes; returns each rank's outcome ("" = ok,
  // else its message, "killed by signal N" or "hung").
  static std::vector<std::string> run(int nranks, Body body, std::chrono::seconds deadline);

 private:
  static inline int s_fd = -1;
  static inline int s_nranks = 0;
};

inline std::vector<std::string> Ranks::allgather(const void* mine) {
  if (::write(s_fd, mine, kBlob) != static_cast<ssize_t>(kBlob)) throw std::runtime_error("allgather: write");
  std::vector<std::string> all(s_nranks, std::string(kBlob, '\0'));
  for (auto& blob : all) {
    size_t got = 0;
    while (got < kBlob) {
      ssize_t n = ::read(s_fd, blob.data() + got, kBlob - got);
      if (n <= 0) throw std::runtime_error("allgather: the relay closed (a rank died)");
      got += static_cast<size_t>(n);
    }
  }
  return all;
}

inline std::vector<std::string> Ranks::run(int nranks, Body body, std::chrono::seconds deadline) {
  std::vector<pid_t> pids(nranks);
  std::vector<int> fds(nranks), results(nranks);
  for (int r = 0; r < nranks; ++r) {
    int pair[2], result[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, pair) != 0 || pipe(result) != 0) throw std::runtime_error("socketpair");
    pid_t pid = fork();
    if (pid == 0) {
      ::close(pair[0]);
      ::close(result[0]);
      s_fd = pair[1];
      s_nranks = nranks;
      std::string message;
      try {
        body(r, nranks);
      } catch (const std::exception& e) {
        message = e.what();
        if (message.empty()) message = "failed";
      }
      if (!message.empty()) [[maybe_unused]] ssize_t n = ::write(result[1], message.data(), message.size());
      _exit(message.empty() ? 0 : 1);
    }
    ::close(pair[1]);
    ::close(result[1]);
    pids[r] = pid;
    fds[r] = pair[0];
    results[r] = result[0];
  }
  // Relay allgathers: a round completes when every rank still talking has
  // written. A rank that exits or stops itself (the failure tests) leaves
  // the relay; a stopped one is killed once every other rank has ended.
  std::vector<std::string> round(nranks), outcome(nranks);
  std::vector<bool> open(nranks, true), running(nranks, true), stopped(nranks, false);
  auto until = std::chrono::steady_clock::now() + deadline;
  auto reap = [&](int r, bool block) {
    int status = 0;
    pid_t done = waitpid(pids[r], &status, (block ? 0 : WNOHANG) | WUNTRACED);
    if (done <= 0) return;
    if (WIFSTOPPED(status)) {
      stopped[r] = true;
      open[r] = false;
      return;
    }
    running[r] = false;
    open[r] = false;
    if (WIFSIGNALED(status)) {
      outcome[r] = stopped[r] ? "" : "killed by signal " + std::to_string(WTERMSIG(status));
    } else if (WEXITSTATUS(status) != 0) {
      char buf[4096];
      ssize_t n = ::read(results[r], buf, sizeof(buf));
      outcome[r] = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "exit " + std::to_string(WEXITSTATUS(status));
    }
  };
  for (;;) {
    bool active = false;
    for (int r = 0; r < nranks; ++r) {
      if (running[r] && !stopped[r]) reap(r, false);
      active = active || (running[r] && !stopped[r]);
    }
    if (!active || std::chrono::steady_clock::now() >= until) break;
    std::vector<pollfd> p;
    for (int r = 0; r < nranks; ++r) p.push_back({open[r] ? fds[r] : -1, POLLIN, 0});
    if (::poll(p.data(), p.size(), 20) <= 0) continue;
    for (int r = 0; r < nranks; ++r) {
      if (!open[r] || !(p[r].revents & (POLLIN | POLLHUP))) continue;
      char buf[kBlob];
      ssize_t n = ::read(fds[r], buf, kBlob - round[r].size());
      if (n <= 0) {
        open[r] = false;
        continue;
      }
      round[r].append(buf, static_cast<size_t>(n));
    }
    bool someone = false, waiting = false;
    for (int r = 0; r < nranks; ++r) {
      if (!open[r]) continue;
      someone = true;
      waiting = waiting || round[r].size() != kBlob;
    }
    if (someone && !waiting) {
      for (auto& blob : round) blob.resize(kBlob, '\0');  // a rank gone from the relay: zeros
      for (int r = 0; r < nranks; ++r)
        for (int s = 0; s < nranks; ++s)
          if (open[r]) [[maybe_unused]] ssize_t n = ::write(fds[r], round[s].data(), kBlob);
      for (auto& blob : round) blob.clear();
    }
  }
  for (int r = 0; r < nranks; ++r) {
    if (running[r]) {
      if (!stopped[r]) outcome[r] = "hung";
      kill(pids[r], SIGKILL);
      int status;
      waitpid(pids[r], &status, 0);
    }
    ::close(fds[r]);
    ::close(results[r]);
  }
  return outcome;
}

}  // namespace eccl::test
