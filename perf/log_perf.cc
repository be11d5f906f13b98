// log_perf: what the boundary-send log costs, all measured in one run on
// two ranks (eccl-run -np 2 log_perf): rank 0 sends to rank 1
//   plain    ecclSend/ecclRecv
//   logged   the same with every send teed into the log (tagged, the
//            previous iteration truncated each time)
//   replay   ecclLogReplay of `--records` logged messages vs the same
//            number of plain sends
// Plain and logged rounds alternate per size and the median is kept, so
// drift on a noisy machine hits both. Also prints the log's metadata per
// record against the payload. Targets: logged >= 95% of plain at >= 1 MiB,
// replay >= 90% of plain, metadata <= 1% of logged bytes.
#include "cli/cli.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "eccl.h"
#include "log/log_store.h"
#include "perf/common/rounds.h"

namespace {

using Clock = std::chrono::steady_clock;

void check(ecclResult_t r, ecclComm_t comm, const char* what) { eccl::perf::checkOrExit("log_perf", r, comm, what); }
using eccl::perf::median;

}  // namespace

int main(int argc, char** argv) {
  eccl::cli::App app{"log_perf: boundary-send log overhead against plain sends in the same run"};
  std::vector<size_t> sizes{1 << 20, 4 << 20, 16 << 20, 64 << 20};
  int iters = 10, rounds = 5, records = 8;
  bool json = false;
  app.option("--sizes", sizes, "message sizes in bytes").delimiter(',');
  app.option("-n,--iters", iters, "messages per timed round").range(1, 100000);
  app.option("--rounds", rounds, "alternating plain/logged rounds per size").range(1, 1000);
  app.option("--records", records, "records replayed per size").range(1, 100000);
  app.flag("--json", json, "one JSON object per size");
  if (int status = app.parse(argc, argv); status >= 0) return status;

  ecclComm_t comm;
  check(ecclCommInitFromEnv(&comm), nullptr, "ecclCommInitFromEnv");
  int rank, n;
  ecclCommUserRank(comm, &rank);
  ecclCommCount(comm, &n);
  if (n != 2) {
    fprintf(stderr, "log_perf: run it on 2 ranks (eccl-run -np 2 log_perf)\n");
    return 2;
  }
  const size_t maxBytes = *std::max_element(sizes.begin(), sizes.end());
  std::vector<uint8_t> buf(maxBytes, 7);
  int64_t iteration = 0;
  // Times `count` messages of `bytes` from rank 0 to rank 1; both ranks
  // return the receiver's time (the message is only done once it arrived).
  auto timed = [&](size_t bytes, int count, bool logged) {
    check(ecclBarrier(comm), comm, "barrier");
    auto t = Clock::now();
    for (int i = 0; i < count; ++i) {
      if (rank == 0) {
        if (logged) {
          check(ecclLogSetTag(comm, ++iteration, 0), comm, "tag");
          check(ecclLogTruncate(comm, iteration), comm, "truncate");
        }
        check(ecclSend(buf.data(), bytes, ecclUint8, 1, comm, nullptr), comm, "send");
      } else {
        check(ecclRecv(buf.data(), bytes, ecclUint8, 0, comm, nullptr), comm, "recv");
      }
    }
    double s = std::chrono::duration<double>(Clock::now() - t).count();
    check(ecclAllReduce(&s, &s, 1, ecclFloat64, ecclMax, comm, nullptr), comm, "report");
    return s;
  };
  if (rank == 0 && !json)
    printf("# log_perf: rank 0 -> rank 1, %d messages per round, median of %d rounds; %d records replayed\n"
           "# %10s %10s %10s %8s %10s %10s %8s %9s\n"
           "# %10s %10s %10s %8s %10s %10s %8s %9s\n",
           iters, rounds, records, "size", "plain", "logged", "logged/", "sends", "replay", "replay/", "metadata",
           "(B)", "(GB/s)", "(GB/s)", "plain", "(GB/s)", "(GB/s)", "sends", "(%)");
  for (size_t bytes : sizes) {
    ecclLogConfig_t cfg{};
    cfg.size = sizeof(cfg);
    cfg.capacityBytes = 2 * bytes + (1 << 20);
    // Logging is switched on only for the logged rounds (the arena is
    // allocated and touched by ecclLogConfigure, outside the timing).
    auto logging = [&](bool on) {
      if (rank == 0) check(ecclLogConfigure(comm, on ? &cfg : nullptr), comm, "configure");
    };
    logging(false);
    timed(bytes, 2, false);  // warm up both paths
    logging(true);
    timed(bytes, 2, true);
    std::vector<double> plain, logged;
    for (int r = 0; r < rounds; ++r) {
      logging(false);
      plain.push_back(timed(bytes, iters, false));
      logging(true);
      logged.push_back(timed(bytes, iters, true));
    }
    logging(false);
    // Replay: `records` plain sends, then the same messages logged once and
    // replayed `rounds` times (the records stay in the log).
    std::vector<double> sends, replays;
    for (int r = 0; r < rounds; ++r) sends.push_back(timed(bytes, records, false));
    cfg.capacityBytes = size_t(records) * bytes + (1 << 20);
    logging(true);
    ++iteration;
    if (rank == 0) check(ecclLogSetTag(comm, iteration, 0), comm, "tag");
    for (int i = 0; i < records; ++i) {
      if (rank == 0) check(ecclSend(buf.data(), bytes, ecclUint8, 1, comm, nullptr), comm, "send");
      else check(ecclRecv(buf.data(), bytes, ecclUint8, 0, comm, nullptr), comm, "recv");
    }
    for (int r = 0; r < rounds; ++r) {
      check(ecclBarrier(comm), comm, "barrier");
      auto t = Clock::now();
      if (rank == 0) {
        check(ecclLogReplay(comm, 1, iteration, iteration), comm, "replay");
      } else {
        for (int i = 0; i < records; ++i) check(ecclRecv(buf.data(), bytes, ecclUint8, 0, comm, nullptr), comm, "recv");
      }
      double sec = std::chrono::duration<double>(Clock::now() - t).count();
      check(ecclAllReduce(&sec, &sec, 1, ecclFloat64, ecclMax, comm, nullptr), comm, "report");
      replays.push_back(sec);
    }
    logging(false);
    double gbPlain = double(bytes) * iters / median(plain) / 1e9, gbLogged = double(bytes) * iters / median(logged) / 1e9;
    double gbSends = double(bytes) * records / median(sends) / 1e9, gbReplay = double(bytes) * records / median(replays) / 1e9;
    // Per record the log keeps its descriptor (tag, peer, epoch, sequence,
    // type, count, CRC, arena offset) in the record ring.
    double metaPct = 100.0 * double(eccl::log::LogStore::kRecordOverheadBytes) / double(bytes);
    if (rank != 0) continue;
    if (json) {
      printf("%s\n", nlohmann::json{{"size", bytes}, {"plain_gbs", gbPlain}, {"logged_gbs", gbLogged},
                                    {"logged_ratio", gbLogged / gbPlain}, {"sends_gbs", gbSends},
                                    {"replay_gbs", gbReplay}, {"replay_ratio", gbReplay / gbSends},
                                    {"metadata_pct", metaPct}}
                         .dump()
                         .c_str());
    } else {
      printf("  %10zu %10.3f %10.3f %8.3f %10.3f %10.3f %8.3f %9.5f\n", bytes, gbPlain, gbLogged, gbLogged / gbPlain,
             gbSends, gbReplay, gbReplay / gbSends, metaPct);
    }
    fflush(stdout);
  }
  check(ecclCommDestroy(comm), nullptr, "destroy");
  return 0;
}
