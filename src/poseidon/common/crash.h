// A fatal signal (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT) prints one line naming it and the
// crashing thread's stack before the process dies of it, so a crash on a machine that has no debugger
// says where it happened: `addr2line -f -C -e BINARY OFFSET` turns each "BINARY(+OFFSET)" frame into a
// function and line. The signal is then raised again with its default action, so the parent (poseidon
// launch, bench, a test) still sees the process killed by it.
#pragma once

namespace poseidon {

// Installs the report for this process. `program` heads the line, e.g. "poseidon train"; a pointer to
// it is kept, so pass a string that lives as long as the process. `onlyUnhandled` (a library inside
// someone else's process, the Python package): only for the signals nobody handles yet, and the
// thread's alternate stack only if it has none.
void installCrashReport(const char* program, bool onlyUnhandled = false);

}  // namespace poseidon
