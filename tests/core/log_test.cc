// Log lines carry the process's prefix once, even when the message names it.
#include "poseidon/common/log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "poseidon/common/error.h"

namespace poseidon {
namespace {

// Runs fn with stderr redirected to a file and returns what it wrote there.
template <typename Fn>
std::string capturedStderr(Fn fn) {
  std::string path = strCat("/tmp/poseidon-log-test-", getpid(), ".txt");
  std::fflush(stderr);
  int saved = dup(STDERR_FILENO);
  FILE* f = std::fopen(path.c_str(), "w");
  dup2(fileno(f), STDERR_FILENO);
  fn();
  dup2(saved, STDERR_FILENO);
  close(saved);
  std::fclose(f);
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::remove(path.c_str());
  return ss.str();
}

TEST(Log, AMessageNamingItsRankDoesNotRepeatThePrefix) {
  LogLevel level = logLevel();
  setLogLevel(LogLevel::kInfo);
  setLogPrefix("rank 1");
  std::string out = capturedStderr([] {
    POSEIDON_LOG(kError) << "rank 1: lost rank 0";
    POSEIDON_LOG(kInfo) << "rank 1 (both) joined job";
    POSEIDON_LOG(kWarning) << "rank 10: another rank";
  });
  EXPECT_EQ(out, "[rank 1] error: lost rank 0\n[rank 1] info: rank 1 (both) joined job\n"
                 "[rank 1] warning: rank 10: another rank\n");
  setLogPrefix("poseidon");
  setLogLevel(level);
}

// POSEIDON_LOG=DEBUG is debug; a word that is no level is refused as written.
TEST(Log, LevelsAreReadInAnyCase) {
  EXPECT_EQ(parseLogLevel("DEBUG"), LogLevel::kDebug);
  EXPECT_EQ(parseLogLevel("Warning"), LogLevel::kWarning);
  EXPECT_EQ(parseLogLevel("off"), LogLevel::kOff);
  try {
    parseLogLevel("Verbose");
    FAIL() << "expected an error";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), "unknown log level 'Verbose' (expected debug, info, warning, error or off)");
  }
}

}  // namespace
}  // namespace poseidon
