// Command-line parsing for eccl's programs (eccl-run, ecclcoord, perf/).
//
// Options are bound to variables: `--name VALUE`, `--name=VALUE`, `-n VALUE`
// and `-nVALUE`; a flag takes no value. A list option takes one value per
// occurrence (and, with a delimiter, several in one). Errors name the option
// and the text: `eccl-run: --standby: 5000 is not in [0, 4096]`.
//
// It replaced CLI11, whose templates cost 7 s of compile per program (13 s
// under a sanitizer): the conversions live in cli.cc, a program instantiates
// one small lambda per option.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace eccl::cli {

// Wrong input on the command line; parse() prints it and the program exits 2.
// Programs throw it for values they check themselves (a malformed R@S).
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Text to a value; UsageError when the whole text is not one.
int64_t toInteger(std::string_view text);
uint64_t toUnsigned(std::string_view text);
double toDouble(std::string_view text);

class Option {
 public:
  Option& required();
  // Every value (each element of a list) within [low, high].
  Option& range(double low, double high);
  Option& positive();
  Option& nonNegative();
  // A list option: each occurrence's text split at this character.
  Option& delimiter(char separator);

 private:
  friend class App;
  std::vector<std::string> names_;  // "-b", "--minbytes"
  std::string help_;
  bool takesValue_ = true, required_ = false, numeric_ = false, hasRange_ = false, lowOpen_ = false;
  char delimiter_ = 0;
  double low_ = 0, high_ = 0;
  int count_ = 0;
  // Stores one value (appends, for a list) and returns it as a number
  // (numeric options) for the range check.
  std::function<double(const std::string&)> store_;
  std::function<void()> clearList_;  // a list's defaults go at its first value
};

class App {
 public:
  explicit App(std::string description);
  App(const App&) = delete;
  App& operator=(const App&) = delete;
  ~App();

  template <class T>
  Option& option(const std::string& names, T& target, std::string help = "");
  Option& flag(const std::string& names, bool& target, std::string help = "");
  // A subcommand (ecclcoord serve); exactly one is then required.
  App& subcommand(const std::string& name, std::string help);
  // Everything from the first argument that is not an option on belongs to
  // the program being launched (remaining()).
  void prefixCommand() { prefixCommand_ = true; }
  // Another spelling of an option's name (mpirun's "-np" for "--np"),
  // matched whole: short names are otherwise one letter.
  void alias(std::string spelling, std::string name) { aliases_.emplace_back(std::move(spelling), std::move(name)); }

  // Returns -1 to go on, else the status to exit with: 0 after --help, 2
  // after printing an error.
  int parse(int argc, char** argv);
  int parse(const std::string& program, const std::vector<std::string>& args);
  // The named option appeared on the command line.
  bool given(std::string_view name) const;
  // This subcommand was chosen.
  bool chosen() const { return chosen_; }
  const std::vector<std::string>& remaining() const { return remaining_; }
  std::string help() const;

 private:
  Option& add(const std::string& names, std::string help);
  const Option* find(std::string_view name) const;
  Option* find(std::string_view name);
  // Parses args from index i on; throws UsageError.
  void parseFrom(const std::vector<std::string>& args, size_t i);
  void store(Option& option, const std::string& text);
  void checkRequired() const;

  std::string description_, name_;
  std::vector<std::unique_ptr<Option>> options_;
  std::vector<std::unique_ptr<App>> subcommands_;
  bool prefixCommand_ = false, chosen_ = false;
  std::vector<std::string> remaining_;
  std::vector<std::pair<std::string, std::string>> aliases_;
};

namespace detail {
template <class T>
struct IsVector : std::false_type {};
template <class T>
struct IsVector<std::vector<T>> : std::true_type {
  using Element = T;
};

template <class T>
double assign(T& target, const std::string& text) {
  if constexpr (std::is_same_v<T, std::string>) {
    target = text;
    return 0;
  } else if constexpr (std::is_floating_point_v<T>) {
    target = static_cast<T>(toDouble(text));
    return static_cast<double>(target);
  } else if constexpr (std::is_signed_v<T>) {
    int64_t v = toInteger(text);
    if (v < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
        v > static_cast<int64_t>(std::numeric_limits<T>::max()))
      throw UsageError(text + " does not fit");
    target = static_cast<T>(v);
    return static_cast<double>(v);
  } else {
    static_assert(std::is_unsigned_v<T> && !std::is_same_v<T, bool>, "unsupported option type");
    uint64_t v = toUnsigned(text);
    if (v > static_cast<uint64_t>(std::numeric_limits<T>::max())) throw UsageError(text + " does not fit");
    target = static_cast<T>(v);
    return static_cast<double>(v);
  }
}
}  // namespace detail

template <class T>
Option& App::option(const std::string& names, T& target, std::string help) {
  Option& o = add(names, std::move(help));
  if constexpr (detail::IsVector<T>::value) {
    using E = typename detail::IsVector<T>::Element;
    o.numeric_ = std::is_arithmetic_v<E>;
    o.clearList_ = [&target] { target.clear(); };
    o.store_ = [&target](const std::string& text) {
      E value{};
      double number = detail::assign(value, text);
      target.push_back(std::move(value));
      return number;
    };
  } else {
    o.numeric_ = std::is_arithmetic_v<T>;
    o.store_ = [&target](const std::string& text) { return detail::assign(target, text); };
  }
  return o;
}

}  // namespace eccl::cli
