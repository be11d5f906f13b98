// The lock order of common/mutex.h, checked at run time in the sanitizer
// builds (ECCL_LOCK_ORDER_CHECKS), the only builds that register this
// test: in order passes, out of order aborts naming both mutexes.
#include <gtest/gtest.h>

#include "common/mutex.h"

namespace eccl {
namespace {

TEST(LockOrder, InOrderPassesAndOutOfOrderAbortsNamingBoth) {
  Mutex device{LockRank::kDevice}, error{LockRank::kCommError}, plain;
  {
    MutexLock outer(device);
    MutexLock inner(error);
    MutexLock any(plain);
  }
  {
    MutexLock alone(error);  // released above: nothing is held now
  }
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  EXPECT_DEATH(
      {
        MutexLock outer(error);
        MutexLock inner(device);
      },
      "lock order violated: taking the device's mutex while holding the communicator's error mutex");
}

}  // namespace
}  // namespace eccl
