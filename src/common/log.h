// Leveled logging to stderr, controlled by ECCL_DEBUG (WARN, INFO, TRACE).
#pragma once

#include <fmt/format.h>

#include <string_view>

namespace eccl::log {

enum class Level { kNone = 0, kWarn = 1, kInfo = 2, kTrace = 3 };

Level threshold();
void write(Level level, std::string_view msg);

template <typename... Args>
void at(Level level, fmt::format_string<Args...> f, Args&&... args) {
  if (level <= threshold()) write(level, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) {
  at(Level::kWarn, f, std::forward<Args>(args)...);
}
template <typename... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
  at(Level::kInfo, f, std::forward<Args>(args)...);
}
template <typename... Args>
void trace(fmt::format_string<Args...> f, Args&&... args) {
  at(Level::kTrace, f, std::forward<Args>(args)...);
}

}  // namespace eccl::log
