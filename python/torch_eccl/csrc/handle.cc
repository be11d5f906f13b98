#include "handle.h"

#include <c10/util/Exception.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>

namespace torch_eccl {

std::string makeHandle(const HandleInfo& info) {
  char text[160];
  std::snprintf(text, sizeof(text), "{\"eccl_member\": \"%016" PRIx64 "\", \"job\": \"%016" PRIx64
                                    "\", \"rank\": %d, \"epoch\": %u}",
                info.member, info.job, info.rank, info.epoch);
  return text;
}

namespace {

// The value after "key": in a flat JSON object (the handle has no nesting).
std::string field(const std::string& handle, const std::string& key) {
  size_t at = handle.find("\"" + key + "\"");
  TORCH_CHECK_VALUE(at != std::string::npos, "eccl: reconfigure handle '", handle, "' has no \"", key,
                    "\" (not an eccl handle?)");
  size_t colon = handle.find(':', at);
  TORCH_CHECK_VALUE(colon != std::string::npos, "eccl: reconfigure handle '", handle, "' is malformed at \"", key, "\"");
  size_t start = handle.find_first_not_of(" \t\"", colon + 1);
  size_t end = handle.find_first_of(",}\"", start);
  TORCH_CHECK_VALUE(start != std::string::npos && end != std::string::npos, "eccl: reconfigure handle '", handle,
                    "' is malformed at \"", key, "\"");
  return handle.substr(start, end - start);
}

uint64_t hex(const std::string& handle, const std::string& key) {
  std::string v = field(handle, key);
  char* end = nullptr;
  uint64_t x = std::strtoull(v.c_str(), &end, 16);
  TORCH_CHECK_VALUE(!v.empty() && *end == '\0', "eccl: reconfigure handle '", handle, "': \"", key, "\" is not hex");
  return x;
}

int64_t integer(const std::string& handle, const std::string& key) {
  std::string v = field(handle, key);
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  TORCH_CHECK_VALUE(!v.empty() && *end == '\0', "eccl: reconfigure handle '", handle, "': \"", key,
                    "\" is not an integer");
  return x;
}

}  // namespace

HandleInfo parseHandle(const std::string& handle) {
  HandleInfo info;
  info.member = hex(handle, "eccl_member");
  info.job = hex(handle, "job");
  info.rank = static_cast<int>(integer(handle, "rank"));
  info.epoch = static_cast<uint32_t>(integer(handle, "epoch"));
  return info;
}

uint64_t jobTag(const std::string& text) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace torch_eccl
