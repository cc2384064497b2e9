// poseidon launch prefixes every line of rank R with "[rank R] ". A rank's
// own lines often start with their rank already (its log prefix, its error
// line, messages that name it); the launcher replaces that marker instead of
// adding a second one, in the output and in the failure it reports.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "process.h"

namespace poseidon {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(LaunchOutput, EachLineCarriesItsRankOnce) {
  std::string dir = testing::makeTempDir("launch-out");
  // Rank 1 fails only once rank 0 has printed (an event, not a head start in time): its line is
  // then always there to be forwarded, however loaded the machine. The event is a FIFO: rank 1's
  // open for reading returns once rank 0 opens it for writing, after its line.
  const std::string said = dir + "/rank0-printed";
  ASSERT_EQ(::mkfifo(said.c_str(), 0600), 0) << std::strerror(errno);
  const std::string script =
      "if [ \"$RANK\" = 1 ]; then\n"
      "  read x < " +
      said +
      "\n"
      "  echo '[rank 1] warning: from the log' >&2\n"
      "  echo 'rank 1: fault injection' >&2\n"
      "  echo '[rank 0] is about another rank' >&2\n"
      "  echo '[rank 1] poseidon train: error: lost rank 0' >&2\n"
      "  exit 5\n"
      "fi\n"
      "echo \"[rank $RANK] plain output\"\n"
      ": > " +
      said +
      "\n"
      "exec sleep 30\n";
  std::vector<testing::Proc> procs{
      testing::spawn({POSEIDON_CLI, "launch", "-n", "2", "--", "/bin/sh", "-c", script}, {}, dir + "/l")};
  testing::waitAll(procs, std::chrono::seconds(60));
  EXPECT_EQ(procs[0].exitCode(), 5);
  const std::string err = procs[0].stderrText();
  EXPECT_THAT(err, HasSubstr("[rank 1] warning: from the log\n"));
  EXPECT_THAT(err, HasSubstr("[rank 1] fault injection\n"));
  EXPECT_THAT(err, HasSubstr("[rank 1] [rank 0] is about another rank\n"));
  EXPECT_THAT(err, HasSubstr("[rank 1] poseidon train: error: lost rank 0\n"));
  EXPECT_THAT(err, HasSubstr("poseidon launch: rank 1 exited with code 5: poseidon train: error: lost rank 0; "
                             "stopped the other ranks\n"));
  EXPECT_THAT(err, Not(HasSubstr("[rank 1] [rank 1]")));
  EXPECT_THAT(err, Not(HasSubstr("[rank 1] rank 1:")));
  EXPECT_THAT(procs[0].stdoutText(), HasSubstr("[rank 0] plain output\n"));
  EXPECT_THAT(procs[0].stdoutText(), Not(HasSubstr("[rank 0] [rank 0]")));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace poseidon
