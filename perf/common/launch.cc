#include "perf/common/launch.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>

extern char** environ;

namespace eccl::perf {

std::string selfPath() { return std::filesystem::read_symlink("/proc/self/exe"); }

std::string defaultLauncher() {
  std::filesystem::path self = selfPath();
  for (auto candidate : {self.parent_path() / "eccl-run", self.parent_path().parent_path() / "bootstrap" / "eccl-run",
                         self.parent_path().parent_path().parent_path() / "bootstrap" / "eccl-run"})
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  return "eccl-run";
}

std::string runAndCapture(const std::vector<std::string>& argv, int* status) {
  std::string out = std::filesystem::temp_directory_path() / ("eccl-perf-" + std::to_string(getpid()) + ".out");
  std::vector<std::string> args = argv;
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid;
  int rc = posix_spawnp(&pid, cargs[0], &fa, nullptr, cargs.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw std::runtime_error("cannot run " + args[0] + ": " + strerror(rc));
  waitpid(pid, status, 0);
  std::string text;
  if (FILE* f = fopen(out.c_str(), "r")) {
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
    fclose(f);
  }
  unlink(out.c_str());
  return text;
}

std::string rankZeroResult(const std::string& output) {
  size_t pos = 0;
  while ((pos = output.find("[0] ", pos)) != std::string::npos) {
    size_t end = output.find('\n', pos);
    std::string line = output.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    size_t r = line.find("RESULT ");
    if (r != std::string::npos) return line.substr(r + 7);
    pos = end == std::string::npos ? output.size() : end;
  }
  return "";
}

}  // namespace eccl::perf
