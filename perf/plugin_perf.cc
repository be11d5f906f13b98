// The NCCL net plugin measured as NCCL drives it, beside eccl's own
// point-to-point in the same run and the same two processes:
//  - sendrecv throughput (each rank sends to the other and receives from
//    it), nccl-tests columns, for the plugin and for ecclIsend/ecclIrecv;
//  - creating a communicator's connections (listen, handle exchange,
//    connect/accept, a first message each way): the first time, then
//    re-created over the pool.
//   plugin_perf [--version 12] [-b 8] [-e 64M] [-f 4] [--iters 20] [--warmup 5] [--recreate 5]
#include "cli/cli.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "eccl.h"
#include "net_plugin/harness/net_api.h"
#include "net_plugin/harness/procs.h"

namespace {

using Clock = std::chrono::steady_clock;
using eccl::test::kBlob;
using eccl::test::NetApi;
using eccl::test::Ranks;

struct Options {
  int version = 12;
  size_t minBytes = 8, maxBytes = 64 << 20;
  int factor = 4, iters = 20, warmup = 5, recreate = 5;
};

void check(ncclResult_t rc, const char* what) {
  if (rc != ncclSuccess) throw std::runtime_error(std::string(what) + " -> " + std::to_string(rc));
}

template <typename F>
void* until(F&& fn, const char* what) {
  for (auto stop = Clock::now() + std::chrono::seconds(30);;) {
    void* out = nullptr;
    check(fn(&out), what);
    if (out) return out;
    if (Clock::now() > stop) throw std::runtime_error(std::string(what) + " never completed");
  }
}

void finish(NetApi& net, void* request) {
  for (int done = 0; !done;) check(net.test(request, &done, nullptr), "test");
}

struct Comms {
  void* listen = nullptr;
  void* send = nullptr;
  void* recv = nullptr;
};

// One exchange with the other rank over the plugin.
void exchange(NetApi& net, Comms& c, void* out, void* in, size_t bytes) {
  size_t cap = bytes;
  int tag = 0;
  void* r = until([&](void** q) { return net.irecv(c.recv, 1, &in, &cap, &tag, q); }, "irecv");
  void* s = until([&](void** q) { return net.isend(c.send, out, bytes, 0, q); }, "isend");
  finish(net, s);
  finish(net, r);
}

// Connections for a new communicator: what NCCL does in ncclCommInitRank
// for one peer, up to the first message.
double createComms(NetApi& net, int rank, Comms* c) {
  auto t0 = Clock::now();
  char handle[kBlob] = {};
  check(net.listen(handle, &c->listen), "listen");
  auto all = Ranks::allgather(handle);
  std::string other = all[1 - rank];
  while (!c->send || !c->recv) {
    if (!c->send) check(net.connect(other.data(), &c->send), "connect");
    if (!c->recv) check(net.accept(c->listen, &c->recv), "accept");
  }
  int32_t x = rank, y = -1;
  exchange(net, *c, &x, &y, sizeof(x));
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

void closeComms(NetApi& net, Comms& c) {
  check(net.closeSend(c.send), "closeSend");
  check(net.closeRecv(c.recv), "closeRecv");
  check(net.closeListen(c.listen), "closeListen");
  c = {};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <typename Step>
double timeSteps(const Options& o, Step&& step) {
  for (int i = 0; i < o.warmup; ++i) step();
  auto t0 = Clock::now();
  for (int i = 0; i < o.iters; ++i) step();
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / o.iters;
}

void body(const Options& o, int rank) {
  const bool root = rank == 0;
  NetApi net(ECCL_NET_PLUGIN_PATH, o.version);
  check(net.init(), "init");
  Comms c;
  double first = createComms(net, rank, &c);
  closeComms(net, c);
  std::vector<double> again;
  for (int i = 0; i < o.recreate; ++i) {
    again.push_back(createComms(net, rank, &c));
    if (i + 1 < o.recreate) closeComms(net, c);
  }
  uint64_t stats[4];
  net.stats(stats);
  if (root) {
    std::printf("# eccl net plugin v%d (%s), 2 processes on this host\n", o.version, net.name());
    std::printf("# communicator connections (listen, handle exchange, connect/accept, first message):\n");
    std::printf("#   first %.1f us, re-created over the pool %.1f us (median of %d): %.1fx; %llu connections "
                "opened in all\n",
                first, median(again), o.recreate, first / median(again), static_cast<unsigned long long>(stats[0]));
  }

  // eccl's own point-to-point between the same two processes.
  ecclUniqueId id{};
  if (root && ecclGetUniqueId(&id) != ecclSuccess) throw std::runtime_error("ecclGetUniqueId failed");
  auto ids = Ranks::allgather(&id);
  std::memcpy(&id, ids[0].data(), sizeof(id));
  ecclComm_t comm = nullptr;
  if (ecclCommInitRank(&comm, 2, id, rank) != ecclSuccess) throw std::runtime_error("ecclCommInitRank failed");

  if (root) {
    std::printf("#\n# sendrecv: each rank sends to the other and receives from it (busbw = algbw)\n");
    std::printf("# %10s %12s %6s %6s %6s  %9s %7s %7s %6s  %9s %7s %7s %6s  %6s\n", "size", "count", "type", "redop",
                "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong", "ratio");
    std::printf("# %10s %12s %6s %6s %6s  %9s %7s %7s %6s  %9s %7s %7s %6s  %6s\n", "(B)", "(elements)", "", "", "",
                "(us)", "(GB/s)", "(GB/s)", "plugin", "(us)", "(GB/s)", "(GB/s)", "eccl", "p/e");
  }
  std::vector<uint8_t> out(o.maxBytes), in(o.maxBytes);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(i * 7 + rank);
  for (size_t bytes = o.minBytes; bytes <= o.maxBytes; bytes *= o.factor) {
    double plugin = timeSteps(o, [&] { exchange(net, c, out.data(), in.data(), bytes); });
    int wrongPlugin = 0;
    for (size_t i = 0; i < bytes; i += 4093) wrongPlugin += in[i] != static_cast<uint8_t>(i * 7 + (1 - rank));
    double own = timeSteps(o, [&] {
      ecclRequest_t r = nullptr, s = nullptr;
      if (ecclIrecv(in.data(), bytes, ecclUint8, 1 - rank, comm, &r) != ecclSuccess ||
          ecclIsend(out.data(), bytes, ecclUint8, 1 - rank, comm, &s) != ecclSuccess || ecclWait(s) != ecclSuccess ||
          ecclWait(r) != ecclSuccess)
        throw std::runtime_error("eccl send/recv failed");
    });
    int wrongOwn = 0;
    for (size_t i = 0; i < bytes; i += 4093) wrongOwn += in[i] != static_cast<uint8_t>(i * 7 + (1 - rank));
    if (root) {
      double bwPlugin = static_cast<double>(bytes) / plugin / 1e3, bwOwn = static_cast<double>(bytes) / own / 1e3;
      std::printf("  %10zu %12zu %6s %6s %6d  %9.1f %7.2f %7.2f %6d  %9.1f %7.2f %7.2f %6d  %6.2f\n", bytes, bytes,
                  "uint8", "none", -1, plugin, bwPlugin, bwPlugin, wrongPlugin, own, bwOwn, bwOwn, wrongOwn,
                  bwPlugin / bwOwn);
      std::fflush(stdout);
    }
  }
  ecclCommDestroy(comm);
  closeComms(net, c);
}

size_t parseBytes(const std::string& s) {
  size_t end = 0;
  double v = std::stod(s, &end);
  char unit = end < s.size() ? s[end] : 'B';
  double scale = unit == 'K' ? 1 << 10 : unit == 'M' ? 1 << 20 : unit == 'G' ? 1 << 30 : 1;
  return static_cast<size_t>(v * scale);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  std::string minBytes = "8", maxBytes = "64M";
  eccl::cli::App app{"The NCCL net plugin against eccl's own point-to-point, and its connection pool"};
  app.option("--version", o.version, "ncclNetPlugin version to load (8 to 12)").range(8, 12);
  app.option("-b,--minbytes", minBytes);
  app.option("-e,--maxbytes", maxBytes);
  app.option("-f,--stepfactor", o.factor).range(2, 1024);
  app.option("-n,--iters", o.iters).positive();
  app.option("-w,--warmup_iters", o.warmup).nonNegative();
  app.option("--recreate", o.recreate, "re-creations to time").positive();
  if (int status = app.parse(argc, argv); status >= 0) return status;
  o.minBytes = parseBytes(minBytes);
  o.maxBytes = parseBytes(maxBytes);
  if (!getenv("ECCL_SOCKET_IFNAME")) setenv("ECCL_SOCKET_IFNAME", "lo", 1);
  auto outcome = Ranks::run(2, [&](int rank, int) { body(o, rank); }, std::chrono::seconds(600));
  int failed = 0;
  for (size_t r = 0; r < outcome.size(); ++r)
    if (!outcome[r].empty()) std::fprintf(stderr, "plugin_perf: rank %zu: %s\n", r, outcome[r].c_str()), failed = 1;
  return failed;
}
