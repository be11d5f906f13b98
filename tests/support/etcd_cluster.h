// A real etcd cluster on loopback for tests: N etcd processes (Debian's
// etcd-server) with their own data directories and free ports, started and
// waited for; any node can be killed, stopped and restarted with its data.
// The nodes are killed and their directories removed on destruction.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace eccl::test {

class EtcdCluster {
 public:
  // The etcd binary: $ECCL_ETCD_BINARY, else `etcd` on the PATH; empty if none.
  static std::string binary();

  // Clients reach the nodes at clientHost (an address of this namespace:
  // another namespace's process can reach one on a veth); peers on loopback.
  explicit EtcdCluster(int nodes, std::string clientHost = "127.0.0.1");
  ~EtcdCluster();
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  int size() const { return static_cast<int>(nodes_.size()); }
  // "HOST:p1,HOST:p2,..." for every node, or node i's alone.
  std::string endpoints() const;
  std::string endpoint(int node) const;

  void kill(int node);     // SIGKILL; its data stays for restart()
  void stop(int node);     // SIGSTOP (returns once stopped): it keeps its ports and answers nothing
  void resume(int node);   // SIGCONT
  void restart(int node);  // starts a killed node again on the same ports and data
  // Waits until a write through the cluster succeeds; throws on timeout.
  void waitHealthy(std::chrono::milliseconds timeout) const;
  // Whether a write through this node alone commits: it is back in the
  // quorum, not merely started.
  bool serves(int node) const;

 private:
  struct Node {
    std::string name, dir;
    int clientPort = 0, peerPort = 0;
    pid_t pid = -1;
  };
  void launch(Node& node, bool existing);

  std::string clientHost_;
  std::string root_;
  std::string initialCluster_;
  std::vector<Node> nodes_;
};

}  // namespace eccl::test
