// The crash report (common/crash.h): a fatal signal names itself and prints the stack, and the
// process still dies of that signal.
#include "poseidon/common/crash.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>

namespace poseidon {
namespace {

[[gnu::noinline]] void crashWith(int sig) { ::raise(sig); }

TEST(CrashReportDeathTest, ASegfaultNamesItselfPrintsTheStackAndStillKillsWithTheSignal) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        installCrashReport("poseidon test");
        crashWith(SIGSEGV);
      },
      testing::KilledBySignal(SIGSEGV),
      "poseidon test: fatal signal SIGSEGV in pid [0-9]+; the crashing thread's stack.*\n.*core_tests");
}

TEST(CrashReportDeathTest, AnAbortIsReportedTooAndStaysAnAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        installCrashReport("poseidon test");
        std::abort();
      },
      testing::KilledBySignal(SIGABRT), "poseidon test: fatal signal SIGABRT in pid [0-9]+");
}

}  // namespace
}  // namespace poseidon
