// The TCP back end: a listening socket on the chosen interface, and one
// socket per lane.
#pragma once

#include <memory>
#include <string>

#include "common/netif.h"
#include "transport/conduit.h"

namespace eccl::transport {

class TcpBackend final : public Backend {
 public:
  explicit TcpBackend(const std::string& ifnameSpec);
  const char* name() const override { return "tcp"; }
  int listenFd() const override { return listenFd_.get(); }
  Fd dial(MemberId member, const SockAddr& address, Deadline deadline, const std::string& what,
          const std::function<bool()>& giveUp) override;
  Fd accept(std::string* from) override;
  std::unique_ptr<Conduit> openDialed(Fd stream, Deadline deadline, const std::string& what) override;
  std::unique_ptr<Conduit> openAccepted(Fd stream, Deadline deadline, const std::string& what) override;

  const SockAddr& address() const { return address_; }
  const NetInterface& interface() const { return nic_; }

 private:
  NetInterface nic_;
  SockAddr address_;
  Fd listenFd_;
};

}  // namespace eccl::transport
