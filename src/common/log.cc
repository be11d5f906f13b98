#include "common/log.h"

#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <mutex>
#include <string>

#include "common/params.h"

namespace eccl::log {

Level threshold() {
  static const Level level = [] {
    std::string v = params::debugLevel();
    if (v == "TRACE") return Level::kTrace;
    if (v == "INFO") return Level::kInfo;
    if (v == "NONE") return Level::kNone;
    return Level::kWarn;
  }();
  return level;
}

void write(Level level, std::string_view msg) {
  static const char* names[] = {"", "WARN", "INFO", "TRACE"};
  static char host[64] = {0};
  if (!host[0]) gethostname(host, sizeof(host) - 1);
  // TRACE lines carry the monotonic clock (shared by the processes of a
  // host), so several ranks' traces merge into one timeline by sorting.
  std::string stamp;
  if (level == Level::kTrace) {
    timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    stamp = fmt::format("{}.{:06} ", now.tv_sec, now.tv_nsec / 1000);
  }
  std::string line = fmt::format("{}:{} eccl {} {}{}\n", host, getpid(),
                                 names[static_cast<int>(level)], stamp, msg);
  fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace eccl::log
