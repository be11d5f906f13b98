#include "common/netif.h"

#include <ifaddrs.h>
#include <net/if.h>

#include <cstring>
#include <vector>

#include "common/error.h"

namespace eccl {
namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    if (comma > start) out.push_back(s.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

bool matches(const std::string& name, const std::string& spec) {
  if (spec.empty()) return true;
  bool exclude = spec[0] == '^';
  std::string body = exclude ? spec.substr(1) : spec;
  bool exact = !body.empty() && body[0] == '=';
  if (exact) body = body.substr(1);
  bool hit = false;
  for (const auto& pat : split(body))
    hit = hit || (exact ? name == pat : name.rfind(pat, 0) == 0);
  return exclude ? !hit : hit;
}

}  // namespace

NetInterface pickInterface(const std::string& spec) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) fail(ecclSystemError, "getifaddrs: {}", strerror(errno));
  std::vector<NetInterface> found;
  for (ifaddrs* it = list; it; it = it->ifa_next) {
    if (!it->ifa_addr || !(it->ifa_flags & IFF_UP)) continue;
    int family = it->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    if (family == AF_INET6 &&
        IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<sockaddr_in6*>(it->ifa_addr)->sin6_addr))
      continue;
    bool loopback = it->ifa_flags & IFF_LOOPBACK;
    if (spec.empty() && loopback) continue;
    if (!matches(it->ifa_name, spec)) continue;
    NetInterface ni;
    ni.name = it->ifa_name;
    ni.addr.len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    std::memcpy(&ni.addr.storage, it->ifa_addr, ni.addr.len);
    ni.addr.setPort(0);
    found.push_back(ni);
  }
  freeifaddrs(list);
  // IPv4 first: it is what most clusters route.
  for (const auto& ni : found)
    if (ni.addr.storage.ss_family == AF_INET) return ni;
  if (!found.empty()) return found.front();
  if (spec.empty()) return pickInterface("lo");
  fail(ecclInvalidArgument, "ECCL_SOCKET_IFNAME='{}' matches no interface that is up", spec);
}

}  // namespace eccl
