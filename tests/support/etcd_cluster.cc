#include "tests/support/etcd_cluster.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <thread>

#include "common/socket.h"
#include "membership/etcd_client.h"

namespace eccl::test {
namespace {

// A port nothing listens on; its socket is held until every node has its
// ports, so no two are handed the same one.
int freePort(std::vector<Fd>& held, const std::string& host) {
  auto [fd, addr] = listenOn(SockAddr::parse(host + ":0"));
  held.push_back(std::move(fd));
  return addr.port();
}

std::string url(const std::string& host, int port) { return "http://" + host + ":" + std::to_string(port); }

}  // namespace

std::string EtcdCluster::binary() {
  if (const char* set = std::getenv("ECCL_ETCD_BINARY"); set && *set) return set;
  for (const char* dir : {"/usr/bin", "/usr/local/bin", "/usr/sbin"}) {
    std::string path = std::string(dir) + "/etcd";
    if (::access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

EtcdCluster::EtcdCluster(int nodes, std::string clientHost) : clientHost_(std::move(clientHost)) {
  char tmpl[] = "/tmp/eccl-etcd-XXXXXX";
  root_ = mkdtemp(tmpl);
  nodes_.resize(nodes);
  std::vector<Fd> held;
  for (int i = 0; i < nodes; ++i) {
    Node& n = nodes_[i];
    n.name = "n" + std::to_string(i);
    n.dir = root_ + "/" + n.name;
    n.clientPort = freePort(held, clientHost_);
    n.peerPort = freePort(held, "127.0.0.1");
    initialCluster_ += (i ? "," : "") + n.name + "=" + url("127.0.0.1", n.peerPort);
  }
  held.clear();
  for (auto& n : nodes_) launch(n, false);
  waitHealthy(std::chrono::seconds(60));
}

EtcdCluster::~EtcdCluster() {
  for (auto& n : nodes_) kill(static_cast<int>(&n - nodes_.data()));
  std::error_code ignored;
  std::filesystem::remove_all(root_, ignored);
}

void EtcdCluster::launch(Node& n, bool existing) {
  std::vector<std::string> args = {binary(),
                                   "--name", n.name,
                                   "--data-dir", n.dir,
                                   "--listen-client-urls", url(clientHost_, n.clientPort),
                                   "--advertise-client-urls", url(clientHost_, n.clientPort),
                                   "--listen-peer-urls", url("127.0.0.1", n.peerPort),
                                   "--initial-advertise-peer-urls", url("127.0.0.1", n.peerPort),
                                   "--initial-cluster", initialCluster_,
                                   "--initial-cluster-state", existing ? "existing" : "new",
                                   "--initial-cluster-token", root_,
                                   // Elections in about half a second, so a lost node costs little.
                                   "--heartbeat-interval", "50",
                                   "--election-timeout", "500"};
  std::string log = root_ + "/" + n.name + ".log";
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("etcd cluster: fork failed");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  n.pid = pid;
}

std::string EtcdCluster::endpoint(int node) const {
  return clientHost_ + ":" + std::to_string(nodes_[node].clientPort);
}

std::string EtcdCluster::endpoints() const {
  std::string out;
  for (int i = 0; i < size(); ++i) out += (i ? "," : "") + endpoint(i);
  return out;
}

void EtcdCluster::kill(int node) {
  Node& n = nodes_[node];
  if (n.pid <= 0) return;
  ::kill(n.pid, SIGKILL);
  ::waitpid(n.pid, nullptr, 0);
  n.pid = -1;
}

// SIGSTOP lands asynchronously: wait until the node is stopped, so nothing
// it answers comes after stop() returns (a test times from then).
void EtcdCluster::stop(int node) {
  const pid_t pid = nodes_[node].pid;
  ::kill(pid, SIGSTOP);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < until) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    size_t close = text.rfind(')');
    if (close != std::string::npos && close + 2 < text.size() && text[close + 2] == 'T') return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  throw std::runtime_error("etcd node " + nodes_[node].name + " did not stop within 5 s of SIGSTOP");
}
void EtcdCluster::resume(int node) { ::kill(nodes_[node].pid, SIGCONT); }

void EtcdCluster::restart(int node) {
  if (nodes_[node].pid > 0) return;
  launch(nodes_[node], true);
}

void EtcdCluster::waitHealthy(std::chrono::milliseconds timeout) const {
  membership::EtcdClient client(endpoints(), std::chrono::milliseconds(2000));
  const auto until = std::chrono::steady_clock::now() + timeout;
  std::string last;
  while (std::chrono::steady_clock::now() < until) {
    try {
      client.put("/eccl-test/health", "ok");
      return;
    } catch (const std::exception& e) {
      last = e.what();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  throw std::runtime_error("etcd cluster in " + root_ + " not healthy in time: " + last);
}

bool EtcdCluster::serves(int node) const {
  try {
    membership::EtcdClient client(endpoint(node), std::chrono::milliseconds(1000));
    client.put("/eccl-test/health", "ok");
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace eccl::test
