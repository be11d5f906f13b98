// ecclcoord: the membership coordinator as a daemon, and its tool.
//   ecclcoord serve [--id-file F]        run a coordinator; print the job's id
//   ecclcoord serve --etcd EPS [--etcd-prefix P] [--etcd-ttl S] [--listen IP[:PORT]]
//                   [--replicas N] [--id-file F]
//                                        one of a job's replicated coordinators
//   ecclcoord status [--id ID | --id-file F]
//   ecclcoord migrate --rank R [--id ID | --id-file F]
// The id defaults to $ECCL_UNIQUE_ID. eccl-run --id-file F writes the id of
// its embedded coordinator, so the tool works against either.
#include "cli/cli.h"
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <cstdio>
#include <fstream>
#include <thread>

#include "membership/coordinator.h"
#include "membership/replica.h"
#include "membership/unique_id.h"
#include "common/error.h"
#include "common/params.h"

namespace {

volatile sig_atomic_t stopRequested = 0;
void onStop(int) { stopRequested = 1; }

std::string readId(const std::string& id, const std::string& idFile) {
  if (!id.empty()) return id;
  if (!idFile.empty()) {
    std::ifstream in(idFile);
    std::string text;
    if (!(in >> text)) throw std::runtime_error("cannot read a job id from " + idFile);
    return text;
  }
  std::string env = eccl::params::envUniqueId();
  if (env.empty()) throw std::runtime_error("no job id: pass --id, --id-file, or set ECCL_UNIQUE_ID");
  return env;
}

void announce(const std::string& text, const std::string& idFile) {
  if (!idFile.empty()) {
    std::string tmp = idFile + ".tmp";
    {
      std::ofstream out(tmp);
      out << text << "\n";
      if (!out) throw std::runtime_error("cannot write " + tmp);
    }
    if (rename(tmp.c_str(), idFile.c_str()) != 0) throw std::runtime_error("cannot rename " + tmp + " to " + idFile);
  }
  printf("ECCL_UNIQUE_ID=%s\n", text.c_str());
  fflush(stdout);
}

void onSignalsStop() {
  struct sigaction sa {};
  sa.sa_handler = onStop;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

// A replica campaigns and serves on a thread of its own; SIGINT/SIGTERM
// stop it in order (it resigns, and the next replica takes over at once).
int serveReplicated(const std::string& idFile, const eccl::membership::ReplicaOptions& options) {
  onSignalsStop();
  std::atomic<bool> stop{false};
  std::exception_ptr failure;
  std::atomic<bool> failed{false};
  std::thread replica([&] {
    try {
      eccl::membership::runReplica(options, stop, [&](const std::string& text) { announce(text, idFile); });
    } catch (...) {
      failure = std::current_exception();
      failed = true;
    }
  });
  while (!stopRequested && !failed) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  stop = true;
  replica.join();
  if (failure) std::rethrow_exception(failure);
  fprintf(stderr, "ecclcoord: stopping\n");
  return 0;
}

int serve(const std::string& idFile) {
  ecclUniqueId id;
  auto coordinator = eccl::membership::createJob(&id);
  announce(eccl::membership::uniqueIdToText(id), idFile);
  struct sigaction sa {};
  sa.sa_handler = onStop;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  while (!stopRequested) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  fprintf(stderr, "ecclcoord: stopping\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  eccl::cli::App app{"ecclcoord: eccl's membership coordinator and its tool"};
  std::string id, idFile;
  int rank = -1;
  int64_t timeoutMs = 5000;
  auto* serveCmd = &app.subcommand("serve", "run a coordinator until SIGINT/SIGTERM and print the job id");
  serveCmd->option("--id-file", idFile, "also write the id to this file");
  eccl::membership::ReplicaOptions replica;
  serveCmd->option("--etcd", replica.etcdEndpoints,
                       "replicate through this etcd cluster (IP:port,...): one of the job's coordinators leads, "
                       "the others take over when it dies");
  serveCmd->option("--etcd-prefix", replica.prefix, "the job's keys in etcd (default /eccl/job/)");
  serveCmd->option("--etcd-ttl", replica.ttlSeconds, "seconds a dead leader holds the lead (default 2)")
      .range(1, 60);
  serveCmd->option("--listen", replica.listen,
                       "with --etcd: this replica's address, IP[:PORT] (default: ECCL_SOCKET_IFNAME's, any port)");
  serveCmd->option("--replicas", replica.replicas,
                       "with --etcd: how many replicas the job's id names; the first leader waits up to 30 s for "
                       "them to register (start them all before the job's ranks)")
      .range(1, 13);
  auto* statusCmd = &app.subcommand("status", "print the view, standbys and health");
  auto* migrateCmd = &app.subcommand("migrate", "move a rank to a registered standby (expected migration)");
  migrateCmd->option("--rank", rank, "the rank to move").required().nonNegative();
  for (auto* cmd : {statusCmd, migrateCmd}) {
    cmd->option("--id", id, "the job's unique id (default: $ECCL_UNIQUE_ID)");
    cmd->option("--id-file", idFile, "read the job's unique id from this file");
    cmd->option("--timeout-ms", timeoutMs, "deadline for the coordinator's answer");
  }
  if (int status = app.parse(argc, argv); status >= 0) return status;
  try {
    if (serveCmd->chosen() && !replica.etcdEndpoints.empty()) {
      replica.coordinator = eccl::membership::coordinatorOptionsFromEnv();
      return serveReplicated(idFile, replica);
    }
    if (serveCmd->chosen()) return serve(idFile);
    ecclUniqueId uid = eccl::membership::uniqueIdFromText(readId(id, idFile));
    auto data = eccl::membership::decodeUniqueId(uid);
    auto deadline = eccl::deadlineAfterMs(timeoutMs);
    std::string text = statusCmd->chosen() ? eccl::membership::queryCoordinatorStatus(data, deadline)
                                           : eccl::membership::requestMigration(data, rank, deadline);
    fputs(text.c_str(), stdout);
    return 0;
  } catch (const std::exception& e) {
    fprintf(stderr, "ecclcoord: %s\n", e.what());
    return 1;
  }
}
