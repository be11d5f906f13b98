#include "tests/support/crash_report.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>

namespace eccl::test {
namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

int crashedRank = -1;
char alternateStack[64 * 1024];

void say(const char* text) { [[maybe_unused]] ssize_t n = write(STDERR_FILENO, text, strlen(text)); }

// addr2line names the function at `offset` in `module` (it is in binutils,
// which every machine that builds this has).
void symbolize(const char* module, uintptr_t offset) {
  char address[32];
  snprintf(address, sizeof(address), "%#lx", static_cast<unsigned long>(offset));
  pid_t child = fork();
  if (child == 0) {
    dup2(STDERR_FILENO, STDOUT_FILENO);
    const char* argv[] = {"addr2line", "-f", "-C", "-i", "-p", "-e", module, address, nullptr};
    execvp(argv[0], const_cast<char* const*>(argv));
    _exit(127);
  }
  if (child > 0) waitpid(child, nullptr, 0);
}

// Where the fault happened (not a return address: no byte back).
uintptr_t faultingInstruction(void* context) {
  if (!context) return 0;
  const auto* uc = static_cast<const ucontext_t*>(context);
#if defined(__x86_64__)
  return static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]);
#elif defined(__aarch64__)
  return static_cast<uintptr_t>(uc->uc_mcontext.pc);
#else
  (void)uc;
  return 0;
#endif
}

void onFault(int sig, siginfo_t* info, void* context) {
  char line[256];
  snprintf(line, sizeof(line), "rank %d: %s (signal %d) at address %p; its stack:\n", crashedRank, strsignal(sig),
           sig, info ? info->si_addr : nullptr);
  say(line);
  void* frames[48];
  const int n = backtrace(frames, 48);
  // The handler's own frames and the kernel's trampoline come first.
  const uintptr_t fault = faultingInstruction(context);
  int first = 0;
  for (int i = 0; i < n; ++i)
    if (reinterpret_cast<uintptr_t>(frames[i]) == fault) first = i;
  for (int i = first; i < n; ++i) {
    Dl_info where{};
    // A return address points past its call: one byte back is inside it.
    const auto pc = reinterpret_cast<uintptr_t>(frames[i]) - (i > first ? 1 : 0);
    if (!dladdr(reinterpret_cast<void*>(pc), &where) || !where.dli_fname) {
      snprintf(line, sizeof(line), "  #%d %p\n", i - first, frames[i]);
      say(line);
      continue;
    }
    const uintptr_t offset = pc - reinterpret_cast<uintptr_t>(where.dli_fbase);
    snprintf(line, sizeof(line), "  #%d %s+%#lx: ", i - first, where.dli_fname, static_cast<unsigned long>(offset));
    say(line);
    symbolize(where.dli_fname, offset);
  }
  // SA_RESETHAND put the default action back: the rank still dies of it.
  raise(sig);
}

}  // namespace

void reportCrashes(int rank) {
  if (kSanitized) return;
  crashedRank = rank;
  void* warm[1];
  backtrace(warm, 1);  // loads the unwinder now, not inside the handler
  stack_t stack{};
  stack.ss_sp = alternateStack;
  stack.ss_size = sizeof(alternateStack);
  sigaltstack(&stack, nullptr);  // a stack overflow still reports
  struct sigaction action{};
  action.sa_sigaction = onFault;
  action.sa_flags = SA_SIGINFO | SA_RESETHAND | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) sigaction(sig, &action, nullptr);
}

}  // namespace eccl::test
