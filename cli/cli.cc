#include "cli/cli.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace eccl::cli {

namespace {

std::vector<std::string> splitNames(const std::string& names) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= names.size()) {
    size_t comma = names.find(',', start);
    if (comma == std::string::npos) comma = names.size();
    std::string name = names.substr(start, comma - start);
    if (name.size() < 2 || name[0] != '-' || (name.size() > 2 && name[1] != '-'))
      throw std::logic_error("option name '" + name + "' must be -x or --name");
    out.push_back(std::move(name));
    start = comma + 1;
  }
  return out;
}

// --help, seen where an option may stand: this App's help, nothing parsed.
struct HelpRequest {
  const App* app;
};

std::string formatNumber(double v) {
  char text[32];
  snprintf(text, sizeof(text), "%g", v);
  return text;
}

}  // namespace

namespace {

// The whole text as one integer of type T, or UsageError saying `what` it is not.
template <typename T>
T wholeInteger(std::string_view text, const char* what) {
  T v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size())
    throw UsageError("'" + std::string(text) + "' is not " + what);
  return v;
}

}  // namespace

int64_t toInteger(std::string_view text) { return wholeInteger<int64_t>(text, "an integer"); }

uint64_t toUnsigned(std::string_view text) { return wholeInteger<uint64_t>(text, "a non-negative integer"); }

double toDouble(std::string_view text) {
  // strtod, not from_chars: it also takes what a user types ("1e3", "+2", ".5").
  std::string owned(text);
  char* end = nullptr;
  errno = 0;
  double v = owned.empty() ? 0 : strtod(owned.c_str(), &end);
  if (owned.empty() || *end || errno == ERANGE || std::isnan(v))
    throw UsageError("'" + owned + "' is not a number");
  return v;
}

Option& Option::required() {
  required_ = true;
  return *this;
}

Option& Option::range(double low, double high) {
  if (!numeric_) throw std::logic_error("a range on " + names_.back() + ", which is not numeric");
  hasRange_ = true;
  low_ = low;
  high_ = high;
  return *this;
}

Option& Option::positive() {
  range(0, INFINITY);
  lowOpen_ = true;
  return *this;
}

Option& Option::nonNegative() { return range(0, INFINITY); }

Option& Option::delimiter(char separator) {
  if (!clearList_) throw std::logic_error("a delimiter on " + names_.back() + ", which is not a list");
  delimiter_ = separator;
  return *this;
}

App::App(std::string description) : description_(std::move(description)) {}
App::~App() = default;

Option& App::add(const std::string& names, std::string help) {
  auto o = std::make_unique<Option>();
  o->names_ = splitNames(names);
  for (auto& name : o->names_)
    if (find(name) || name == "-h" || name == "--help") throw std::logic_error("option " + name + " defined twice");
  o->help_ = std::move(help);
  options_.push_back(std::move(o));
  return *options_.back();
}

Option& App::flag(const std::string& names, bool& target, std::string help) {
  Option& o = add(names, std::move(help));
  o.takesValue_ = false;
  o.store_ = [&target](const std::string&) {
    target = true;
    return 1.0;
  };
  return o;
}

App& App::subcommand(const std::string& name, std::string help) {
  subcommands_.push_back(std::make_unique<App>(std::move(help)));
  subcommands_.back()->name_ = name;
  return *subcommands_.back();
}

const Option* App::find(std::string_view name) const {
  for (auto& o : options_)
    for (auto& n : o->names_)
      if (n == name) return o.get();
  return nullptr;
}

Option* App::find(std::string_view name) {
  return const_cast<Option*>(static_cast<const App*>(this)->find(name));
}

bool App::given(std::string_view name) const {
  const Option* o = find(name);
  if (!o) throw std::logic_error("no option " + std::string(name));
  return o->count_ > 0;
}

void App::store(Option& o, const std::string& text) {
  const std::string& name = o.names_.back();
  if (o.count_++ == 0 && o.clearList_) o.clearList_();
  std::vector<std::string> values;
  if (o.delimiter_) {
    size_t start = 0;
    for (;;) {
      size_t cut = text.find(o.delimiter_, start);
      values.push_back(text.substr(start, cut == std::string::npos ? std::string::npos : cut - start));
      if (cut == std::string::npos) break;
      start = cut + 1;
    }
  } else {
    values.push_back(text);
  }
  for (auto& value : values) {
    double number;
    try {
      number = o.store_(value);
    } catch (const UsageError& e) {
      throw UsageError(name + ": " + e.what());
    }
    if (o.hasRange_ && (number < o.low_ || number > o.high_ || (o.lowOpen_ && number == o.low_))) {
      std::string bound = o.lowOpen_ ? "must be positive"
                          : std::isinf(o.high_)
                              ? "must be at least " + formatNumber(o.low_)
                              : "is not in [" + formatNumber(o.low_) + ", " + formatNumber(o.high_) + "]";
      throw UsageError(name + ": " + value + " " + bound);
    }
  }
}

void App::checkRequired() const {
  for (auto& o : options_)
    if (o->required_ && o->count_ == 0) throw UsageError(o->names_.back() + " is required");
}

void App::parseFrom(const std::vector<std::string>& args, size_t i) {
  for (; i < args.size(); ++i) {
    std::string arg = args[i];
    for (auto& [spelling, alias] : aliases_)
      if (arg == spelling) arg = alias;
    if (arg == "--") {
      if (!prefixCommand_) throw UsageError("unexpected '--'");
      remaining_.assign(args.begin() + i + 1, args.end());
      break;
    }
    if (arg == "-h" || arg == "--help") throw HelpRequest{this};
    bool optionLike = arg.size() >= 2 && arg[0] == '-';
    if (!optionLike) {
      for (auto& sub : subcommands_)
        if (sub->name_ == arg) {
          sub->chosen_ = true;
          sub->parseFrom(args, i + 1);
          checkRequired();
          return;
        }
      if (!prefixCommand_) throw UsageError("unexpected argument '" + arg + "'");
      remaining_.assign(args.begin() + i, args.end());
      break;
    }
    std::string name = arg, value;
    bool inlineValue = false;
    if (arg[1] == '-') {
      size_t eq = arg.find('=');
      if (eq != std::string::npos) {
        name = arg.substr(0, eq);
        value = arg.substr(eq + 1);
        inlineValue = true;
      }
    } else if (arg.size() > 2 && !find(arg)) {  // -n5
      name = arg.substr(0, 2);
      value = arg.substr(2);
      inlineValue = true;
    }
    Option* o = find(name);
    if (!o) throw UsageError("unknown option '" + name + "'");
    if (!o->takesValue_) {
      if (inlineValue) throw UsageError(name + " takes no value");
      store(*o, "");
      continue;
    }
    if (!inlineValue) {
      if (i + 1 >= args.size()) throw UsageError(name + " needs a value");
      value = args[++i];
    }
    store(*o, value);
  }
  checkRequired();
  if (!subcommands_.empty()) {
    bool any = false;
    for (auto& sub : subcommands_) any = any || sub->chosen_;
    if (!any) throw UsageError("a subcommand is required");
  }
}

int App::parse(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  return parse(argv[0], args);
}

int App::parse(const std::string& program, const std::vector<std::string>& args) {
  std::string base = program.substr(program.rfind('/') == std::string::npos ? 0 : program.rfind('/') + 1);
  try {
    parseFrom(args, 0);
  } catch (const HelpRequest& request) {
    printf("%s", request.app->help().c_str());
    return 0;
  } catch (const UsageError& e) {
    fprintf(stderr, "%s: %s\nRun with --help for more information.\n", base.c_str(), e.what());
    return 2;
  }
  return -1;
}

std::string App::help() const {
  std::string out = description_ + "\n";
  if (!subcommands_.empty()) {
    out += "\nSubcommands:\n";
    for (auto& sub : subcommands_) out += "  " + sub->name_ + "\n      " + sub->description_ + "\n";
  }
  out += "\nOptions:\n  -h,--help\n      print this help and exit\n";
  for (auto& o : options_) {
    std::string names;
    for (auto& n : o->names_) names += (names.empty() ? "" : ",") + n;
    std::string value = !o->takesValue_ ? ""
                        : o->delimiter_ ? std::string(" VALUE[") + o->delimiter_ + "VALUE...]"
                        : o->clearList_ ? " VALUE (repeatable)"
                                        : " VALUE";
    out += "  " + names + value + (o->required_ ? " (required)" : "") + "\n";
    if (!o->help_.empty()) out += "      " + o->help_ + "\n";
  }
  if (prefixCommand_) out += "\nThe first argument that is not an option, and all after it: the program to run.\n";
  return out;
}

}  // namespace eccl::cli
