// Chooses the network interface eccl listens on.
#pragma once

#include <string>

#include "common/socket.h"

namespace eccl {

struct NetInterface {
  std::string name;
  SockAddr addr;  // port 0
};

// spec: ECCL_SOCKET_IFNAME syntax. "" = first non-loopback interface that is
// up, else loopback; "eth" = first whose name starts with eth; "^docker,lo"
// = first whose name starts with none of those; "=eth0" = exactly eth0.
NetInterface pickInterface(const std::string& spec);

}  // namespace eccl
