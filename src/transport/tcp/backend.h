// The TCP back end: a listening socket on the chosen interface, and one
// socket per lane.
#pragma once

#include <memory>
#include <string>

#include "common/netif.h"
#include "transport/backend.h"

namespace eccl::transport::tcp {

class TcpBackend final : public Backend {
 public:
  explicit TcpBackend(const BackendOptions& options);
  const char* name() const override { return "tcp"; }
  std::string address() const override { return address_.str(); }
  std::string describe() const override;
  int listenFd() const override { return listenFd_.get(); }
  bool placeThread() override;
  Fd dial(MemberId member, const std::string& address, Deadline deadline, const std::string& what,
          const std::function<bool()>& giveUp) override;
  Fd accept(std::string* from) override;
  std::unique_ptr<Conduit> openDialed(Fd stream, Deadline deadline, const std::string& what) override;
  std::unique_ptr<Conduit> openAccepted(Fd stream, Deadline deadline, const std::string& what) override;

 private:
  NetInterface nic_;
  SockAddr address_;
  Fd listenFd_;
};

BackendSpec backendSpec();

}  // namespace eccl::transport::tcp
