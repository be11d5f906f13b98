// The plugin under an eccl job: each process registers with the job's
// coordinator, so a SIGKILLed process fails the plugin comms to it, and
// breaks the groups (NCCL communicators, as the preload shim names them)
// it was in, long before ECCL_TIMEOUT_MS; a member that left a group
// first breaks nothing when it exits.
#include <gtest/gtest.h>

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "eccl.h"
#include "net_plugin/harness/net_api.h"
#include "net_plugin/harness/procs.h"

namespace eccl::test {
namespace {

using namespace std::chrono_literals;

#define CHECK(cond, msg)                                                                             \
  do {                                                                                               \
    if (!(cond)) throw std::runtime_error(std::string(__FILE__ ":") + std::to_string(__LINE__) + ": " + #cond + ": " + (msg)); \
  } while (0)

using WatchFn = int (*)(uint64_t);
using FailureFn = int (*)(uint64_t, char*, size_t);
using LeaveFn = int (*)(uint64_t);

constexpr uint64_t kEveryone = 0xa11, kWithoutRank2 = 0xb22;

template <typename F>
void* until(F&& fn, const char* what) {
  for (auto stop = std::chrono::steady_clock::now() + 20s;;) {
    void* out = nullptr;
    CHECK(fn(&out) == ncclSuccess, what);
    if (out) return out;
    CHECK(std::chrono::steady_clock::now() < stop, std::string(what) + " never completed");
    std::this_thread::yield();
  }
}

// The job's coordinator, in a process of its own: the ranks are forked
// from this one, which must have no threads then (a lock a thread held at
// the fork stays held in the child; the sanitizers' allocator has some).
class Coordinator {
 public:
  Coordinator() {
    int fds[2];
    if (pipe(fds) != 0) throw std::runtime_error("pipe");
    pid_ = fork();
    if (pid_ == 0) {
      ::close(fds[0]);
      ecclUniqueId id;
      char text[512] = {};
      if (ecclGetUniqueId(&id) != ecclSuccess || ecclUniqueIdToString(&id, text, sizeof(text)) != ecclSuccess) _exit(1);
      [[maybe_unused]] ssize_t n = ::write(fds[1], text, sizeof(text));
      for (;;) pause();  // serves until killed
    }
    ::close(fds[1]);
    char text[512] = {};
    size_t got = 0;
    while (got < sizeof(text)) {
      ssize_t n = ::read(fds[0], text + got, sizeof(text) - got);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    ::close(fds[0]);
    if (got != sizeof(text)) throw std::runtime_error("the coordinator process did not start");
    id_ = text;
  }
  ~Coordinator() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  const std::string& id() const { return id_; }

 private:
  pid_t pid_ = -1;
  std::string id_;
};

TEST(PluginUnderAJob, AKilledProcessFailsItsCommsAndBreaksOnlyItsGroupsWithinAHeartbeat) {
  Coordinator coordinator;
  setenv("ECCL_UNIQUE_ID", coordinator.id().c_str(), 1);
  setenv("ECCL_SOCKET_IFNAME", "lo", 1);
  setenv("ECCL_TIMEOUT_MS", "30000", 1);  // the transport alone would take this long
  auto outcome = Ranks::run(3, [](int rank, int nranks) {
    setenv("ECCL_RANK", std::to_string(rank).c_str(), 1);
    setenv("ECCL_NRANKS", std::to_string(nranks).c_str(), 1);
    NetApi net(ECCL_NET_PLUGIN_PATH, 12);
    CHECK(net.init() == ncclSuccess, "init");
    auto watch = reinterpret_cast<WatchFn>(dlsym(net.library(), "ecclNetPluginWatchGroup"));
    auto failure = reinterpret_cast<FailureFn>(dlsym(net.library(), "ecclNetPluginGroupFailure"));
    auto leave = reinterpret_cast<LeaveFn>(dlsym(net.library(), "ecclNetPluginLeaveGroup"));
    CHECK(watch && failure && leave, "the shim's entry points are not exported");
    CHECK(watch(kEveryone) == 1, "not registered with the job");
    if (rank != 2) CHECK(watch(kWithoutRank2) == 1, "not registered with the job");
    // Rank 0 receives from rank 2 over a plugin comm.
    char handle[kBlob] = {};
    void* listen = nullptr;
    CHECK(net.listen(handle, &listen) == ncclSuccess, "listen");
    auto all = Ranks::allgather(handle);
    void* comm = nullptr;
    if (rank == 2) comm = until([&](void** c) { return net.connect(all[0].data(), c); }, "connect");
    if (rank == 0) comm = until([&](void** c) { return net.accept(listen, c); }, "accept");
    // The receive is posted before rank 2 dies: posted after, it may fail
    // at once (its death already known), which is not what this tests.
    std::vector<uint8_t> in(4096);
    void* request = nullptr;
    if (rank == 0) {
      void* data = in.data();
      size_t cap = in.size();
      int tag = 0;
      request = until([&](void** r) { return net.irecv(comm, 1, &data, &cap, &tag, r); }, "irecv");
    }
    std::this_thread::sleep_for(300ms);  // the group registrations reach the coordinator
    char ready[kBlob] = {};
    Ranks::allgather(ready);
    if (rank == 2) raise(SIGKILL);
    auto start = std::chrono::steady_clock::now();
    char why[512] = {};
    while (failure(kEveryone, why, sizeof(why)) != 1) {
      CHECK(std::chrono::steady_clock::now() - start < 5s, "the group of everyone never broke");
      std::this_thread::sleep_for(5ms);
    }
    CHECK(std::string(why).find("rank 2") != std::string::npos, why);
    CHECK(failure(kWithoutRank2, why, sizeof(why)) == 0, "a group without rank 2 broke");
    if (rank == 0) {
      for (int done = 0;;) {
        ncclResult_t rc = net.test(request, &done, nullptr);
        CHECK(!done, "a receive from a dead process completed");
        if (rc != ncclSuccess) {
          CHECK(rc == ncclRemoteError, "result " + std::to_string(rc));
          break;
        }
        CHECK(std::chrono::steady_clock::now() - start < 5s, "the comm to the dead process did not fail");
        std::this_thread::sleep_for(1ms);
      }
    }
    // Rank 1 is done with the group (its communicator destroyed) and then
    // exits: that breaks nothing for rank 0, still in it.
    if (rank == 1) {
      CHECK(leave(kWithoutRank2) == 0, "leave");
      std::this_thread::sleep_for(300ms);  // the leave is on the wire before the exit closes the connection
      return;
    }
    std::this_thread::sleep_for(1500ms);
    CHECK(failure(kWithoutRank2, why, sizeof(why)) == 0, std::string("rank 1's exit after leaving broke it: ") + why);
  }, 60s);
  EXPECT_EQ(outcome[0], "");
  EXPECT_EQ(outcome[1], "");
  unsetenv("ECCL_UNIQUE_ID");
}

}  // namespace
}  // namespace eccl::test

namespace eccl::test {
namespace {

using SetTagFn = ecclResult_t (*)(int64_t, int32_t);
using TruncateFn = ecclResult_t (*)(int64_t);
using StatsFn = ecclResult_t (*)(ecclLogStats_t*);
using ReadFn = ecclResult_t (*)(int, size_t, ecclLogRecord_t*, void*, size_t);

std::vector<uint8_t> pattern(size_t n, int seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 31 + seed * 7);
  return v;
}

template <typename T>
T symbol(NetApi& net, const char* name) {
  auto f = reinterpret_cast<T>(dlsym(net.library(), name));
  CHECK(f, std::string(name) + " is not exported");
  return f;
}

// Rank 0's sends to rank 1 (its pipeline neighbour, ECCL_NET_LOG_RANKS=1)
// are teed into its log, tagged by iteration, read back byte for byte and
// truncated at a checkpoint; rank 1's sends to rank 0 are not logged.
TEST(PluginUnderAJob, SendsToALoggedRankAreTeedTaggedReadAndTruncated) {
  Coordinator coordinator;
  setenv("ECCL_UNIQUE_ID", coordinator.id().c_str(), 1);
  setenv("ECCL_SOCKET_IFNAME", "lo", 1);
  setenv("ECCL_NET_LOG_BYTES", "1048576", 1);
  setenv("ECCL_NET_LOG_RANKS", "1", 1);
  constexpr size_t kBytes = 64 << 10;
  auto outcome = Ranks::run(2, [](int rank, int nranks) {
    setenv("ECCL_RANK", std::to_string(rank).c_str(), 1);
    setenv("ECCL_NRANKS", std::to_string(nranks).c_str(), 1);
    NetApi net(ECCL_NET_PLUGIN_PATH, 12);
    CHECK(net.init() == ncclSuccess, "init");
    auto setTag = symbol<SetTagFn>(net, "ecclNetLogSetTag");
    auto truncate = symbol<TruncateFn>(net, "ecclNetLogTruncate");
    auto stats = symbol<StatsFn>(net, "ecclNetLogStats");
    auto read = symbol<ReadFn>(net, "ecclNetLogRead");
    char handle[kBlob] = {};
    void* listen = nullptr;
    CHECK(net.listen(handle, &listen) == ncclSuccess, "listen");
    auto all = Ranks::allgather(handle);
    void *send = nullptr, *recv = nullptr;
    for (auto stop = std::chrono::steady_clock::now() + 20s; !send || !recv;) {
      if (!send) CHECK(net.connect(all[1 - rank].data(), &send) == ncclSuccess, "connect");
      if (!recv) CHECK(net.accept(listen, &recv) == ncclSuccess, "accept");
      CHECK(std::chrono::steady_clock::now() < stop, "the pair did not connect");
    }
    auto finish = [&](void* request) {
      for (int done = 0; !done;) CHECK(net.test(request, &done, nullptr) == ncclSuccess, "test");
    };
    for (int iteration = 1; iteration <= 3; ++iteration) {
      CHECK(setTag(iteration, 0) == ecclSuccess, "setTag");
      std::vector<uint8_t> out = pattern(kBytes, iteration + rank * 10), in(kBytes);
      void* data = in.data();
      size_t cap = in.size();
      int tag = 0;
      void* r = until([&](void** q) { return net.irecv(recv, 1, &data, &cap, &tag, q); }, "irecv");
      void* s = until([&](void** q) { return net.isend(send, out.data(), out.size(), 0, q); }, "isend");
      finish(s);
      finish(r);
      CHECK(in == pattern(kBytes, iteration + (1 - rank) * 10), "a message arrived changed");
    }
    ecclLogStats_t st{};
    st.size = sizeof(st);
    CHECK(stats(&st) == ecclSuccess, "stats");
    if (rank == 1) {
      CHECK(st.records == 0, "rank 1 logged " + std::to_string(st.records) + " sends to an unlogged rank");
      return;
    }
    CHECK(st.records == 3 && st.bytes == 3 * kBytes, "records " + std::to_string(st.records));
    CHECK(st.oldestIteration == 1 && st.newestIteration == 3, "iterations");
    for (size_t i = 0; i < 3; ++i) {
      ecclLogRecord_t rec{};
      rec.size = sizeof(rec);
      std::vector<uint8_t> payload(kBytes);
      CHECK(read(1, i, &rec, payload.data(), payload.size()) == ecclSuccess, "read");
      CHECK(rec.peer == 1 && rec.iteration == static_cast<int64_t>(i + 1) && rec.count == kBytes, "record");
      CHECK(payload == pattern(kBytes, static_cast<int>(i) + 1), "a logged payload differs from what was sent");
    }
    CHECK(truncate(3) == ecclSuccess, "truncate");
    CHECK(stats(&st) == ecclSuccess && st.records == 1 && st.oldestIteration == 3, "after the truncate");
    ecclLogRecord_t rec{};
    rec.size = sizeof(rec);
    CHECK(read(0, 0, &rec, nullptr, 0) != ecclSuccess, "rank 0's own log to rank 0 exists");
  }, 60s);
  EXPECT_EQ(outcome[0], "");
  EXPECT_EQ(outcome[1], "");
  unsetenv("ECCL_NET_LOG_BYTES");
  unsetenv("ECCL_NET_LOG_RANKS");
  unsetenv("ECCL_UNIQUE_ID");
}

}  // namespace
}  // namespace eccl::test
