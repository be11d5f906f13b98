// The one internal error model: eccl::Error carries an ecclResult_t and a
// message saying what, where and which peer. src/api/ is the only place that
// turns it into a result code.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

#include "eccl.h"

namespace eccl {

class Error : public std::runtime_error {
 public:
  Error(ecclResult_t code, const std::string& what) : std::runtime_error(what), code_(code) {}
  ecclResult_t code() const { return code_; }

 private:
  ecclResult_t code_;
};

template <typename... Args>
[[noreturn]] void fail(ecclResult_t code, fmt::format_string<Args...> f, Args&&... args) {
  throw Error(code, fmt::format(f, std::forward<Args>(args)...));
}

// Usage errors are the caller's fault and leave everything unchanged.
#define ECCL_CHECK_ARG(cond, ...)                                  \
  do {                                                             \
    if (!(cond)) ::eccl::fail(ecclInvalidArgument, __VA_ARGS__);   \
  } while (0)

}  // namespace eccl
