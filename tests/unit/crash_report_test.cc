// A rank that faults says where before it dies, with the function's name.
// Release trees only: a sanitizer reports faults itself and its handler stays.
#include "tests/support/crash_report.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/support/multiproc.h"

namespace eccl::test {
namespace {

[[gnu::noinline]] void writeThroughNullInCrashReportTest(volatile int* p) { *p = 42; }

TEST(CrashReport, AFaultingRankPrintsItsStackWithFunctionNamesAndStillDiesOfTheSignal) {
  char path[] = "/tmp/eccl-crash-report-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  const std::string file = path;
  ProcessGroup group(1, [file](int, int, const ecclUniqueId&) {
    const int out = open(file.c_str(), O_WRONLY | O_TRUNC);
    dup2(out, STDERR_FILENO);
    writeThroughNullInCrashReportTest(nullptr);
  });
  auto outcomes = group.wait(std::chrono::seconds(30));
  std::stringstream report;
  report << std::ifstream(file).rdbuf();
  unlink(path);
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_FALSE(outcomes[0].exited) << describe(outcomes);
  EXPECT_EQ(outcomes[0].signal, SIGSEGV) << describe(outcomes);
  EXPECT_NE(report.str().find("rank 0: Segmentation fault (signal 11)"), std::string::npos) << report.str();
  EXPECT_NE(report.str().find("writeThroughNullInCrashReportTest"), std::string::npos) << report.str();
}

}  // namespace
}  // namespace eccl::test
