// Level-2 test helper (after Gloo's multiproc_test.h): real processes
// joined into one eccl job. A rank's body throws to fail; the parent
// collects each rank's exit status and message, can SIGKILL or SIGSTOP a
// rank, and kills anything still running at the deadline (reported as hung).
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "eccl.h"
#include "tests/support/time_scale.h"

namespace eccl::test {

struct RankOutcome {
  int rank = -1;
  bool exited = false;  // exited normally (else killed by a signal)
  int exitCode = -1;
  int signal = 0;
  bool hung = false;    // still running at the deadline
  std::string message;  // what the body reported
  double seconds = 0;   // from start to exit
};

class ProcessGroup {
 public:
  using Body = std::function<void(int rank, int nranks, const ecclUniqueId& id)>;
  ProcessGroup(int nranks, Body body);
  ~ProcessGroup();
  void signal(int rank, int sig);
  pid_t pid(int rank) const { return pids_[rank]; }
  std::vector<RankOutcome> wait(std::chrono::milliseconds deadline);

 private:
  pid_t rootPid_ = -1;
  int rootLifeline_ = -1;
  std::vector<pid_t> pids_;
  std::vector<int> pipes_;
  std::chrono::steady_clock::time_point start_;
  bool waited_ = false;
};

// Each rank leaves a file in a fresh directory once it is running (its
// first allreduce done, say); a test signals a victim only once every
// rank's file is there, so a slow start (a loaded host, an emulated CPU)
// never turns a fault in the steady state into one during initialisation.
struct ReadyFiles {
  std::string dir;
  ReadyFiles() {
    char tmpl[] = "/tmp/eccl-faults-XXXXXX";
    dir = mkdtemp(tmpl);
  }
  ~ReadyFiles() { std::filesystem::remove_all(dir); }
  // In a rank's body (a forked process: by the directory's name).
  static void mark(const std::string& dir, int rank) {
    if (FILE* f = std::fopen((dir + "/" + std::to_string(rank)).c_str(), "w")) std::fclose(f);
  }
  // Whether all `n` ranks' files are there before the deadline.
  bool waitAll(int n, std::chrono::seconds deadline) const {
    std::vector<int> ranks(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) ranks[static_cast<size_t>(r)] = r;
    return waitFor(dir, ranks, deadline);
  }
  // Whether the files of `ranks` are all in `in` before the deadline (also
  // from a rank's body).
  static bool waitFor(const std::string& in, const std::vector<int>& ranks, std::chrono::seconds deadline) {
    auto until = std::chrono::steady_clock::now() + deadline * timeScale();
    for (;;) {
      size_t ready = 0;
      for (int r : ranks) ready += std::filesystem::exists(in + "/" + std::to_string(r));
      if (ready == ranks.size()) return true;
      if (std::chrono::steady_clock::now() > until) return false;
      usleep(20 * 1000);
    }
  }
};

// Formats outcomes for a failed assertion.
std::string describe(const std::vector<RankOutcome>& outcomes);
bool allSucceeded(const std::vector<RankOutcome>& outcomes);

// Inside a rank body: fail with a message naming the rank and location.
#define RANK_CHECK(cond, ...)                                                                     \
  do {                                                                                            \
    if (!(cond))                                                                                  \
      throw std::runtime_error(std::string(__FILE__ ":") + std::to_string(__LINE__) + ": " +      \
                               #cond + " " + ::eccl::test::format(__VA_ARGS__));                  \
  } while (0)
#define RANK_OK(call, comm)                                                                       \
  do {                                                                                            \
    ecclResult_t rc_ = (call);                                                                    \
    if (rc_ != ecclSuccess)                                                                       \
      throw std::runtime_error(std::string(#call) + " -> " + ecclGetErrorString(rc_) + ": " +     \
                               ecclGetLastError(comm));                                           \
  } while (0)

// The communicator's counters (ecclCommGetStats); throws naming the error.
inline ecclCommStats_t statsOf(ecclComm_t comm) {
  ecclCommStats_t s{};
  s.size = sizeof(s);
  RANK_OK(ecclCommGetStats(comm, &s), comm);
  return s;
}


inline std::string format() { return {}; }
inline std::string format(const std::string& s) { return s; }

// Runs body as nranks threads in this process (level-1 tests), each with
// its own communicator; rethrows the first failure.
void runThreads(int nranks, const std::function<void(int rank, ecclComm_t comm)>& body);

}  // namespace eccl::test
