// The bench harness's own life (bench/README.md): whatever ends it - Ctrl-C, a closed output pipe, its
// own death - leaves no network namespace or work directory behind, and without root it says so.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "bench_cluster.h"
#include "poseidon/bench/cluster.h"
#include "process.h"

namespace poseidon {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

using testing::namespacesOf;
using testing::pidsIn;

// Ctrl-C: the cluster's namespaces and the work directory of logs are removed (bench --help says
// so), and the exit status is the shell's for SIGINT, 130, with one line saying why.
TEST(BenchSmoke, InterruptLeavesNothingBehind) {
  POSEIDON_REQUIRE_CLUSTER();
  std::string dir = testing::makeTempDir("bench-int");
  fs::create_directories(dir + "/tmp");  // its work directory goes here (TMPDIR), so that it can be seen
  std::vector<testing::Proc> procs{testing::spawn({POSEIDON_CLI, "bench", "--models", "vgg19", "--systems", "poseidon",
                                                   "--nodes", "1,4", "--rates", "100", "--iterations", "30"},
                                                  {{"TMPDIR", dir + "/tmp"}}, dir + "/log")};
  pid_t pid = procs[0].pid;
  // Generous deadlines (the waits end at the event): building the cluster, then starting its ranks.
  const bool seen = testing::waitForPolled([&] { return namespacesOf(pid).size() == 5; },  // 4 nodes + the switch
                                           std::chrono::seconds(30));
  ASSERT_TRUE(seen) << "the harness never built its cluster: " << procs[0].stderrText();
  // Interrupt once ranks run inside the node namespaces (the harder case to clean up).
  testing::waitForPolled(
      [&] {
        for (const auto& ns : namespacesOf(pid))
          if (ns.compare(ns.size() - 2, 2, "sw") != 0 && pidsIn(ns).empty()) return false;  // nodes, not the switch
        return true;
      },
      std::chrono::seconds(60));
  kill(pid, SIGINT);
  testing::waitAll(procs, std::chrono::seconds(60));
  EXPECT_FALSE(procs[0].killed);
  EXPECT_EQ(procs[0].exitCode(), 130);
  EXPECT_THAT(procs[0].stderrText(), ::testing::EndsWith("poseidon bench: error: interrupted by SIGINT\n"));
  EXPECT_TRUE(namespacesOf(pid).empty());
  EXPECT_TRUE(fs::is_empty(dir + "/tmp")) << "the work directory of logs was left behind";
  fs::remove_all(dir);
}

// `poseidon bench --nodes NODES | head -1`: the reader goes away after the first point. The harness
// stops as for Ctrl-C at its next line, cluster and logs removed, and exits 141 (128 + SIGPIPE), with
// one line saying why. Before, SIGPIPE's default ended it there and left both behind.
void expectAClosedPipeStopsIt(const std::string& nodes) {
  std::string dir = testing::makeTempDir("bench-pipe");
  fs::create_directories(dir + "/tmp");
  std::vector<std::string> env;  // made before the fork: the child only execs
  for (char** e = environ; *e; ++e)
    if (std::string(*e).rfind("TMPDIR=", 0) != 0) env.push_back(*e);
  env.push_back("TMPDIR=" + dir + "/tmp");  // its work directory goes here, so that it can be seen
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const std::vector<std::string> argv{POSEIDON_CLI, "bench", "--models", "alexnet", "--systems",  "poseidon", "--nodes",
                                      nodes,        "--rates", "100",    "--iterations", "1",         "--warmup", "0"};
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int out[2];
  ASSERT_EQ(::pipe2(out, O_CLOEXEC), 0);
  testing::Proc bench;
  bench.out = "/dev/null";
  bench.err = dir + "/err";
  const int err = ::open(bench.err.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ASSERT_GE(err, 0);
  bench.pid = ::fork();
  if (bench.pid == 0) {
    ::dup2(out[1], 1);  // (dup2's copies are not close-on-exec; the originals are)
    ::dup2(err, 2);
    ::signal(SIGPIPE, SIG_DFL);  // as a shell starts a pipeline's commands
    ::execve(POSEIDON_CLI, args.data(), envp.data());
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(err);
  std::string seen;  // up to the end of the first point's line, then the pipe is closed as head closes it
  char c = 0;
  while (::read(out[0], &c, 1) == 1) {
    seen += c;
    if (c == '\n' && seen.find(" 1 nodes @") != std::string::npos) break;
  }
  ::close(out[0]);
  std::vector<testing::Proc> procs{bench};
  testing::waitAll(procs, std::chrono::seconds(240));  // inside ctest's 300 s, so that a hang is ours to kill
  ASSERT_THAT(seen, HasSubstr(" 1 nodes @")) << procs[0].stderrText();
  ASSERT_FALSE(procs[0].killed) << procs[0].stderrText();
  ASSERT_TRUE(WIFEXITED(procs[0].status)) << "ended by signal " << WTERMSIG(procs[0].status);
  EXPECT_EQ(procs[0].exitCode(), 141);
  EXPECT_THAT(procs[0].stderrText(),
              ::testing::EndsWith("poseidon bench: error: interrupted by SIGPIPE (the reader of its output went away)\n"));
  EXPECT_TRUE(namespacesOf(bench.pid).empty());
  EXPECT_TRUE(fs::is_empty(dir + "/tmp")) << "the work directory of logs was left behind";
  fs::remove_all(dir);
}

// Gone before the last point: the 4-node run is not started.
TEST(BenchSmoke, AClosedOutputPipeStopsItAndLeavesNothingBehind) {
  POSEIDON_REQUIRE_CLUSTER();
  expectAClosedPipeStopsIt("1,2,4");
}

// Gone during the last lines (the 2-node point's line and the summary): 141 all the same, not 0 with
// the output cut short.
TEST(BenchSmoke, AReaderGoneDuringTheLastLinesIsAStopToo) {
  POSEIDON_REQUIRE_CLUSTER();
  expectAClosedPipeStopsIt("1,2");
}

TEST(BenchSmoke, LeftoversOfADeadHarnessAreSwept) {
  POSEIDON_REQUIRE_CLUSTER();
  // A namespace named after a process that no longer exists.
  pid_t dead = fork();
  if (dead == 0) _exit(0);
  waitpid(dead, nullptr, 0);
  std::string ns = "psd" + std::to_string(dead) + "n0";
  bench::run({"ip", "netns", "add", ns});
  ASSERT_EQ(namespacesOf(dead).size(), 1u);
  // (A harness running beside this test may sweep it first; either way it goes.)
  bench::EmulatedCluster::sweepLeftovers();
  EXPECT_TRUE(namespacesOf(dead).empty());
}

TEST(BenchSmoke, WithoutRootItSaysSo) {
  if (geteuid() != 0) {
    std::vector<testing::Proc> procs{testing::spawn({POSEIDON_CLI, "bench", "--quick"}, {}, "/tmp/poseidon-bench-noroot")};
    testing::waitAll(procs, std::chrono::seconds(30));
    EXPECT_EQ(procs[0].exitCode(), 1);
    EXPECT_THAT(procs[0].stderrText(), HasSubstr("needs root"));
    return;
  }
  if (access("/usr/sbin/runuser", X_OK) != 0) GTEST_SKIP() << "runuser not available to drop root";
  // The checkout may sit below a folder that 'nobody' cannot enter (a mktemp -d
  // folder is 0700): run a copy of the binary from a folder anyone can read.
  std::string dir = testing::makeTempDir("bench-noroot");
  fs::permissions(dir, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                           fs::perms::others_read | fs::perms::others_exec);
  const std::string binary = dir + "/poseidon";
  fs::copy_file(POSEIDON_CLI, binary);
  std::vector<testing::Proc> procs{
      testing::spawn({"/usr/sbin/runuser", "-u", "nobody", "--", binary, "bench", "--quick"}, {}, dir + "/log")};
  testing::waitAll(procs, std::chrono::seconds(30));
  EXPECT_EQ(procs[0].exitCode(), 1) << procs[0].stderrText();
  EXPECT_THAT(procs[0].stderrText(), HasSubstr("needs root"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace poseidon
