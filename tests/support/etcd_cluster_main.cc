// etcd_cluster N [HOST]: a real N-node etcd cluster for shell tests, its
// clients served at HOST (default 127.0.0.1), its peers on loopback.
// Prints "ETCD_ENDPOINTS=IP:port,..." once it is healthy, then holds it
// until SIGTERM/SIGINT or its standard input closes; the nodes and their
// data go with it.
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "tests/support/etcd_cluster.h"

namespace {
volatile sig_atomic_t stopRequested = 0;
void onStop(int) { stopRequested = 1; }
}  // namespace

int main(int argc, char** argv) {
  const int nodes = argc > 1 ? std::atoi(argv[1]) : 3;
  if (nodes < 1 || nodes > 7) {
    fprintf(stderr, "usage: etcd_cluster [NODES (1-7)] [CLIENT_HOST]\n");
    return 2;
  }
  if (eccl::test::EtcdCluster::binary().empty()) {
    fprintf(stderr, "etcd_cluster: no etcd binary (scripts/setup.sh installs etcd-server)\n");
    return 77;
  }
  struct sigaction sa {};
  sa.sa_handler = onStop;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  try {
    eccl::test::EtcdCluster cluster(nodes, argc > 2 ? argv[2] : "127.0.0.1");
    printf("ETCD_ENDPOINTS=%s\n", cluster.endpoints().c_str());
    fflush(stdout);
    while (!stopRequested) {
      pollfd in{0, POLLIN, 0};
      if (poll(&in, 1, 200) > 0 && (in.revents & (POLLHUP | POLLERR))) break;
      if (in.revents & POLLIN) {
        char buf[256];
        if (read(0, buf, sizeof buf) <= 0) break;
      }
    }
  } catch (const std::exception& e) {
    fprintf(stderr, "etcd_cluster: %s\n", e.what());
    return 1;
  }
  return 0;
}
