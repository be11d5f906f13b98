// A rank that dies of a fault (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT)
// prints where, as function names, before it dies of the same signal:
// CI keeps only the output, and "signal 11 after 8.1 s" there names
// nothing to look at. The sanitizers' builds keep their own reports.
#pragma once

namespace eccl::test {

// In a forked rank, before its body runs.
void reportCrashes(int rank);

}  // namespace eccl::test
