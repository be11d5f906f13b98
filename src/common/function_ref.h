// A non-owning reference to a callable, for a parameter called before the
// function returns: what std::function does for such a parameter, without
// its heap allocation when the lambda captures more than two pointers (a
// small collective pays for every allocation on its way).
#pragma once

#include <memory>
#include <type_traits>
#include <utility>

#include "common/mutex.h"

namespace eccl {

template <typename Signature>
class FunctionRef;

template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FunctionRef>>>
  FunctionRef(F&& f)  // NOLINT(google-explicit-constructor): used like std::function
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))), call_(&invoke<std::remove_reference_t<F>>) {}
  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

 private:
  // The callable's own annotations (a lambda that requires the caller
  // role) were checked where it was written and where this reference is
  // called; the thunk between them is as opaque as std::function's.
  template <typename F>
  static R invoke(void* object, Args... args) ECCL_TSA(no_thread_safety_analysis) {
    return (*static_cast<F*>(object))(std::forward<Args>(args)...);
  }
  void* object_;
  R (*call_)(void*, Args...);
};

}  // namespace eccl
