// leaveAtExit (common/at_exit.h): a registered leave runs when the process exits, once, and only in
// the process that registered it; a withdrawn one does not. Each case runs in a forked child whose
// leaves write to a pipe the test reads after the child is gone.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "poseidon/common/at_exit.h"

namespace poseidon {
namespace {

void say(int fd, const char* what) {
  ssize_t ignored = ::write(fd, what, std::char_traits<char>::length(what));
  (void)ignored;
}

// Runs body in a child that then calls exit(0); returns what the child (and its children) wrote.
template <typename Body>
std::string afterExitOf(Body body) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    body(fds[1]);
    std::exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buf[256];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  return out;
}

int gKey, gOther;

TEST(AtExit, RegisteredLeavesRunOnceAtExitNewestFirst) {
  EXPECT_EQ(afterExitOf([](int fd) {
              leaveAtExit(&gKey, [fd] { say(fd, "a"); });
              leaveAtExit(&gOther, [fd] { say(fd, "c"); });
              leaveAtExit(&gKey, [fd] { say(fd, "b"); });  // the same key: replaces the first
            }),
            "bc");  // newest first, as destructors go
}

TEST(AtExit, AWithdrawnLeaveDoesNotRun) {
  EXPECT_EQ(afterExitOf([](int fd) {
              leaveAtExit(&gKey, [fd] { say(fd, "a"); });
              leaveAtExit(&gOther, [fd] { say(fd, "c"); });
              withdrawLeaveAtExit(&gKey);
            }),
            "c");
}

// A leave that withdraws itself (its owner's teardown) while the handler runs it: no deadlock, and it
// runs once. One that throws does not keep the others from running.
TEST(AtExit, ALeaveMayWithdrawItselfOrThrow) {
  EXPECT_EQ(afterExitOf([](int fd) {
              leaveAtExit(&gKey, [fd] {
                withdrawLeaveAtExit(&gKey);
                say(fd, "a");
                throw std::runtime_error("ignored");
              });
              leaveAtExit(&gOther, [fd] { say(fd, "c"); });
            }),
            "ca");
}

// A forked child inherits the registrations but not the threads they need: its exit runs none of
// them, and the parent's exit still runs its own.
TEST(AtExit, AForkedChildRunsNoneOfItsParentsLeaves) {
  EXPECT_EQ(afterExitOf([](int fd) {
              leaveAtExit(&gKey, [fd] { say(fd, "parent"); });
              const pid_t child = ::fork();
              if (child == 0) std::exit(0);
              ::waitpid(child, nullptr, 0);
              say(fd, "-");
            }),
            "-parent");
}

}  // namespace
}  // namespace poseidon
