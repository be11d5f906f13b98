// Compiled, never linked, by ctest (tests/CMakeLists.txt): an entry point
// that uses a communicator without entering it (api::Entered drains the
// stream proxy, then holds the caller role) must not compile under clang's
// thread-safety analysis; with ECCL_ENTERS it enters, and compiles.
#include "api/guard.h"

ecclResult_t entryPointUnderTest(const float* in, float* out, size_t count, ecclComm_t comm) {
  return eccl::api::guarded(comm, "entryPointUnderTest", [&] {
    eccl::Communicator& c = eccl::api::impl(comm, "entryPointUnderTest");
#ifdef ECCL_ENTERS
    eccl::api::Entered entered(comm, c.callerRole());
#endif
    c.allReduce(in, out, count, ecclFloat32, ecclSum);  // needs the role
  });
}
