#include <fmt/ranges.h>

#include <algorithm>

#include "common/error.h"
#include "transport/backend.h"

// The build writes one ECCL_BACKEND(name) line per entry of
// ECCL_TRANSPORT_BACKENDS, each folder's eccl::transport::name::backendSpec().
#define ECCL_BACKEND(name) \
  namespace eccl::transport::name { BackendSpec backendSpec(); }
#include "transport_backends.inc"
#undef ECCL_BACKEND

namespace eccl::transport {

namespace {

std::vector<BackendSpec>& registry() {
#define ECCL_BACKEND(name) name::backendSpec(),
  static std::vector<BackendSpec> specs = {
#include "transport_backends.inc"
  };
#undef ECCL_BACKEND
  return specs;
}

}  // namespace

const std::vector<BackendSpec>& registeredBackends() { return registry(); }

void registerBackend(const BackendSpec& spec) {
  for (const BackendSpec& b : registry())
    if (std::string(b.name) == spec.name) fail(ecclInvalidArgument, "a back end named '{}' is registered already", spec.name);
  registry().push_back(spec);
}

std::string registeredBackendNames() {
  std::vector<std::string> names;
  for (const BackendSpec& spec : registeredBackends()) names.push_back(spec.name);
  return fmt::format("{}", fmt::join(names, ","));
}

std::vector<std::string> parseBackendList(const std::string& spec) {
  std::vector<std::string> chosen;
  if (spec == "auto" || spec.empty()) {
    for (const BackendSpec& b : registeredBackends())
      if (!b.onlyByName) chosen.push_back(b.name);
    return chosen;
  }
  for (size_t begin = 0; begin <= spec.size();) {
    size_t end = std::min(spec.find(',', begin), spec.size());
    std::string name = spec.substr(begin, end - begin);
    bool known = std::any_of(registeredBackends().begin(), registeredBackends().end(),
                             [&](const BackendSpec& b) { return name == b.name; });
    if (!known)
      fail(ecclInvalidArgument, "ECCL_TRANSPORT='{}': '{}' is not a back end of this build (auto or a list of: {})",
           spec, name, registeredBackendNames());
    if (std::find(chosen.begin(), chosen.end(), name) == chosen.end()) chosen.push_back(name);
    begin = end + 1;
  }
  return chosen;
}

std::string joinAddress(const std::vector<std::pair<std::string, std::string>>& parts) {
  std::vector<std::string> entries;
  for (auto& [name, part] : parts) entries.push_back(name + ":" + part);
  return fmt::format("{}", fmt::join(entries, ","));
}

std::vector<std::pair<std::string, std::string>> splitAddress(const std::string& address) {
  std::vector<std::pair<std::string, std::string>> parts;
  for (size_t begin = 0; begin < address.size();) {
    size_t end = std::min(address.find(',', begin), address.size());
    std::string entry = address.substr(begin, end - begin);
    size_t colon = entry.find(':');
    if (colon == std::string::npos || colon == 0)
      fail(ecclInvalidArgument, "member address '{}': entry '{}' is not name:address", address, entry);
    parts.emplace_back(entry.substr(0, colon), entry.substr(colon + 1));
    begin = end + 1;
  }
  return parts;
}

std::string displayAddress(const std::string& address) {
  std::vector<std::pair<std::string, std::string>> parts;
  try {
    parts = splitAddress(address);
  } catch (const Error&) {
    return address;
  }
  for (auto& [name, part] : parts)
    for (const BackendSpec& spec : registeredBackends())
      if (name == spec.name && spec.reachesOtherHosts) return part;
  return parts.empty() ? address : parts.front().first + ":" + parts.front().second;
}

}  // namespace eccl::transport
