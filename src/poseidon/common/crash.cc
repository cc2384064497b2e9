#include "poseidon/common/crash.h"

#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <initializer_list>

namespace poseidon {
namespace {

const char* gProgram = "poseidon";

void writeStr(const char* s) {
  ssize_t ignored = ::write(STDERR_FILENO, s, strlen(s));
  (void)ignored;
}

// Only async-signal-safe calls (write, backtrace_symbols_fd; backtrace after its first call, which
// loads libgcc_s and is made at install time), then the default action.
void onFatalSignal(int sig) {
  char pid[24];
  int n = 0;
  char digits[24];
  for (long v = static_cast<long>(::getpid()); v > 0; v /= 10) digits[n++] = static_cast<char>('0' + v % 10);
  for (int i = 0; i < n; ++i) pid[i] = digits[n - 1 - i];
  pid[n] = '\0';
  writeStr(gProgram);
  writeStr(": fatal signal SIG");
  writeStr(sigabbrev_np(sig) ? sigabbrev_np(sig) : "?");
  writeStr(" in pid ");
  writeStr(pid);
  writeStr("; the crashing thread's stack (addr2line -f -C -e BINARY +OFFSET):\n");
  void* frames[64];
  int depth = ::backtrace(frames, 64);
  ::backtrace_symbols_fd(frames, depth, STDERR_FILENO);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

void installCrashReport(const char* program, bool onlyUnhandled) {
  gProgram = program;
  void* warm[1];
  (void)::backtrace(warm, 1);  // loads the unwinder now, not inside the handler
  // A stack overflow's SIGSEGV needs a stack of its own (this thread's; the others have none).
  static char altStack[64 * 1024];
  stack_t current{};
  ::sigaltstack(nullptr, &current);
  if (!onlyUnhandled || (current.ss_flags & SS_DISABLE)) {
    stack_t ss{};
    ss.ss_sp = altStack;
    ss.ss_size = sizeof(altStack);
    ::sigaltstack(&ss, nullptr);
  }
  struct sigaction sa {};
  sa.sa_handler = onFatalSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_ONSTACK | SA_RESETHAND;
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) {
    struct sigaction before {};
    ::sigaction(sig, nullptr, &before);
    if (onlyUnhandled && ((before.sa_flags & SA_SIGINFO) || before.sa_handler != SIG_DFL)) continue;
    ::sigaction(sig, &sa, nullptr);
  }
}

}  // namespace poseidon
