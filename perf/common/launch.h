// Runs a job under eccl-run from a benchmark driver and returns its output,
// so one binary can measure things that need N processes.
#pragma once

#include <string>
#include <vector>

namespace eccl::perf {

// eccl-run next to this binary (build tree or install), else from PATH.
std::string defaultLauncher();
// /proc/self/exe.
std::string selfPath();
// Runs `argv` (argv[0] is the program) to completion; returns stdout and
// stderr together; *status is the wait status.
std::string runAndCapture(const std::vector<std::string>& argv, int* status);
// The JSON text after "RESULT " on the line rank 0 printed ("[0] ... RESULT {...}"), or "".
std::string rankZeroResult(const std::string& output);

}  // namespace eccl::perf
