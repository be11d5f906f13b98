// The programs' command-line parser: what a user types, and what it says
// when the user is wrong.
#include "cli/cli.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

using eccl::cli::App;

struct Parsed {
  int status;
  std::string err, out;
};

Parsed run(App& app, std::vector<std::string> args) {
  testing::internal::CaptureStderr();
  testing::internal::CaptureStdout();
  int status = app.parse("/usr/bin/prog", args);
  std::string out = testing::internal::GetCapturedStdout();
  return {status, testing::internal::GetCapturedStderr(), out};
}

TEST(Cli, EverySpellingOfAValue) {
  App app{"test"};
  int n = 0;
  double d = 0;
  std::string s;
  bool f = false;
  app.option("-n,--iters", n, "iterations");
  app.option("--ratio", d);
  app.option("-s", s);
  app.flag("--json", f);
  EXPECT_EQ(run(app, {"--iters=7", "--ratio", "2.5e-1", "-sabc", "--json"}).status, -1);
  EXPECT_EQ(n, 7);
  EXPECT_EQ(d, 0.25);
  EXPECT_EQ(s, "abc");
  EXPECT_TRUE(f);
  EXPECT_TRUE(app.given("--iters"));
  EXPECT_TRUE(app.given("-n"));
  App again{"test"};
  again.option("-n,--iters", n);
  EXPECT_EQ(run(again, {"-n", "-3"}).status, -1);  // a value may look like an option
  EXPECT_EQ(n, -3);
  EXPECT_FALSE(App{"x"}.parse("p", {}) >= 0);
}

TEST(Cli, ListsReplaceTheirDefaultsAndSplit) {
  App app{"test"};
  std::vector<size_t> sizes{1, 2};
  std::vector<std::string> kills;
  app.option("--sizes", sizes).delimiter(',').range(3, 1024);
  app.option("--kill", kills);
  EXPECT_EQ(run(app, {"--sizes", "4,5", "--kill", "1@2", "--sizes=8", "--kill", "2@3,4"}).status, -1);
  EXPECT_EQ(sizes, (std::vector<size_t>{4, 5, 8}));
  EXPECT_EQ(kills, (std::vector<std::string>{"1@2", "2@3,4"}));
  App bad{"test"};
  bad.option("--sizes", sizes).delimiter(',').range(3, 1024);
  Parsed p = run(bad, {"--sizes", "4,2"});
  EXPECT_EQ(p.status, 2);
  EXPECT_NE(p.err.find("prog: --sizes: 2 is not in [3, 1024]"), std::string::npos) << p.err;
}

TEST(Cli, WrongInputNamesTheOptionAndTheText) {
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {{"--np", "x"}, "--np: 'x' is not an integer"},
           {{"--np", "5000"}, "--np: 5000 is not in [1, 4096]"},
           {{"--np", "3", "--count", "-1"}, "--count: '-1' is not a non-negative integer"},
           {{"--np", "3", "--count", "0"}, "--count: 0 must be positive"},
           {{"--np", "3", "--ratio", "1x"}, "--ratio: '1x' is not a number"},
           {{"--np", "99999999999"}, "--np: 99999999999 does not fit"},
           {{"--np"}, "--np needs a value"},
           {{"--bogus"}, "unknown option '--bogus'"},
           {{"--np", "2", "--json=1"}, "--json takes no value"},
           {{"--json"}, "--np is required"},
           {{"--np", "2", "stray"}, "unexpected argument 'stray'"},
       }) {
    App app{"test"};
    int np = 0;
    unsigned count = 1;
    double ratio = 0;
    bool json = false;
    app.option("--np", np).required().range(1, 4096);
    app.option("--count", count).positive();
    app.option("--ratio", ratio).nonNegative();
    app.flag("--json", json);
    Parsed p = run(app, c.args);
    EXPECT_EQ(p.status, 2) << c.says;
    EXPECT_NE(p.err.find("prog: " + c.says + "\n"), std::string::npos) << p.err;
  }
}

TEST(Cli, APrefixCommandKeepsItsOwnArguments) {
  App app{"launcher"};
  int np = 0;
  bool verbose = false;
  app.option("--np", np).required();
  app.flag("-v", verbose);
  app.alias("-np", "--np");
  app.prefixCommand();
  EXPECT_EQ(run(app, {"-np", "4", "prog", "-np", "2", "--help", "-v"}).status, -1);
  EXPECT_EQ(np, 4);
  EXPECT_FALSE(verbose);
  EXPECT_EQ(app.remaining(), (std::vector<std::string>{"prog", "-np", "2", "--help", "-v"}));
  App dashes{"launcher"};
  dashes.prefixCommand();
  EXPECT_EQ(run(dashes, {"--", "-x"}).status, -1);
  EXPECT_EQ(dashes.remaining(), (std::vector<std::string>{"-x"}));
}

TEST(Cli, SubcommandsAndHelp) {
  App app{"tool: does things"};
  int rank = -1;
  std::string id;
  App& serve = app.subcommand("serve", "run it");
  App& migrate = app.subcommand("migrate", "move a rank");
  migrate.option("--rank", rank, "the rank to move").required().nonNegative();
  migrate.option("--id", id);
  EXPECT_EQ(run(app, {"migrate", "--rank", "2", "--id", "abc"}).status, -1);
  EXPECT_TRUE(migrate.chosen());
  EXPECT_FALSE(serve.chosen());
  EXPECT_EQ(rank, 2);
  App none{"tool"};
  none.subcommand("serve", "run it");
  EXPECT_NE(run(none, {}).err.find("a subcommand is required"), std::string::npos);
  App helped{"tool: does things"};
  App& sub = helped.subcommand("migrate", "move a rank");
  sub.option("--rank", rank, "the rank to move").required();
  Parsed top = run(helped, {"--help"});
  EXPECT_EQ(top.status, 0);
  EXPECT_NE(top.out.find("migrate\n      move a rank"), std::string::npos) << top.out;
  Parsed inner = run(helped, {"migrate", "-h"});
  EXPECT_EQ(inner.status, 0);
  EXPECT_NE(inner.out.find("--rank VALUE (required)\n      the rank to move"), std::string::npos) << inner.out;
}

TEST(Cli, AProgrammingMistakeIsNotAUsageError) {
  App app{"test"};
  std::string s;
  int n;
  app.option("--name", s);
  EXPECT_THROW(app.option("--name", n), std::logic_error);
  EXPECT_THROW(app.option("--other", s).range(1, 2), std::logic_error);
  EXPECT_THROW(app.option("--three", n).delimiter(','), std::logic_error);
  EXPECT_THROW(app.option("name", n), std::logic_error);
  EXPECT_THROW(app.given("--missing"), std::logic_error);
}

}  // namespace
