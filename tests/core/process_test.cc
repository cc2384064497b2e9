// The one fork/exec helper: where a child's output goes, its environment,
// failures to exec, and stopping a child together with what it started.
#include "poseidon/launch/process.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "../integration/events.h"
#include "poseidon/common/error.h"

namespace poseidon {
namespace {

using ::testing::HasSubstr;

std::string readFd(int fd) {
  std::string out;
  char buf[256];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

TEST(Process, PipesKeepStdoutAndStderrApartAndPassTheEnvironment) {
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", "echo out $POSEIDON_PROCESS_TEST; echo err >&2; exit 3"};
  o.env = {{"POSEIDON_PROCESS_TEST", "value"}};
  o.stdoutTo = Output::kPipe;
  o.stderrTo = Output::kPipe;
  ChildProcess c = ChildProcess::spawn(o);
  EXPECT_EQ(readFd(c.stdoutFd()), "out value\n");
  EXPECT_EQ(readFd(c.stderrFd()), "err\n");
  int status = c.wait();
  EXPECT_TRUE(c.exited());
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 3);
  EXPECT_EQ(describeExit(status), "exited with code 3");
}

// The bench's ranks ask for a 1 ns timer slack (bench/ranks.h): set between fork and exec, it must
// reach a program that the child execs in turn (ip netns exec runs the rank that way).
TEST(Process, TimerSlackReachesWhatTheChildExecs) {
  std::ifstream self("/proc/self/timerslack_ns");
  std::string inherited;
  ASSERT_TRUE(std::getline(self, inherited)) << "no /proc/self/timerslack_ns";
  for (unsigned long slack : {0ul, 1ul, 7000ul}) {
    SpawnOptions o;
    o.argv = {"/bin/sh", "-c", "cat /proc/self/timerslack_ns"};
    o.stdoutTo = Output::kPipe;
    o.timerSlackNs = slack;
    ChildProcess c = ChildProcess::spawn(o);
    EXPECT_EQ(readFd(c.stdoutFd()), (slack == 0 ? inherited : std::to_string(slack)) + "\n") << slack;
    EXPECT_EQ(c.wait(), 0);
  }
}

TEST(Process, FileGetsBothStreams) {
  std::string path = strCat("/tmp/poseidon-process-test-", getpid(), ".log");
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", "echo one; echo two >&2"};
  o.stdoutTo = Output::kFile;
  o.stderrTo = Output::kLikeStdout;
  o.file = path;
  ChildProcess c = ChildProcess::spawn(o);
  EXPECT_EQ(c.stdoutFd(), -1);
  EXPECT_EQ(c.wait(), 0);
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_EQ(ss.str(), "one\ntwo\n");
  std::remove(path.c_str());
}

TEST(Process, AProgramThatCannotRunExits127AndSaysWhy) {
  CommandResult r = runCommand({"/nonexistent/poseidon-no-such-program", "x"});
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(describeExit(r.status), "exited with code 127");
  EXPECT_THAT(r.output, HasSubstr("cannot run '/nonexistent/poseidon-no-such-program': No such file or directory"));
  CommandResult ok = runCommand({"echo", "hello"});
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(ok.output, "hello\n");
}

TEST(Process, PollReapsAndKillReachesTheProcessGroup) {
  // The shell starts a grandchild that would outlive it; with its own
  // process group, kill() stops both.
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", "sleep 30 & echo $!; wait"};
  o.stdoutTo = Output::kPipe;
  o.ownProcessGroup = true;
  ChildProcess c = ChildProcess::spawn(o);
  std::string line;
  char ch;
  while (::read(c.stdoutFd(), &ch, 1) == 1 && ch != '\n') line += ch;
  pid_t grandchild = static_cast<pid_t>(std::atol(line.c_str()));
  ASSERT_GT(grandchild, 0);
  EXPECT_FALSE(c.poll());
  c.kill(SIGKILL);
  int status = c.wait();
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(describeExit(status), "was killed by signal 9 (Killed)");
  // The grandchild is reparented (to init or a subreaper) and reaped there, maybe already: its pidfd
  // turns readable once it has exited. The deadline only has to stay below the grandchild's own 30 s
  // (past it, its exit would not tell that kill() reached it), and is far above the milliseconds it takes.
  const int pidfd = testing::openPidfd(grandchild);
  bool gone = pidfd < 0 && errno == ESRCH;
  if (pidfd >= 0) {
    std::vector<pollfd> fds{{pidfd, POLLIN, 0}};
    gone = testing::pollReadable(fds, std::chrono::steady_clock::now() + std::chrono::seconds(20)) > 0;
    ::close(pidfd);
  }
  EXPECT_TRUE(gone) << "pidfd_open: " << (pidfd < 0 ? std::strerror(errno) : "ok");
  c.kill(SIGKILL);  // reaped: nothing happens
}

TEST(Process, SpawnFailuresThrow) {
  SpawnOptions o;
  EXPECT_THROW(ChildProcess::spawn(o), InvalidArgument);
  o.argv = {"true"};
  o.stdoutTo = Output::kFile;
  o.file = "/nonexistent-dir/poseidon.log";
  EXPECT_THROW(ChildProcess::spawn(o), IoError);
}

}  // namespace
}  // namespace poseidon
