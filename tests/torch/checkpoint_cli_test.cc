// Checkpoints through the real CLI: a disk that fills up while a job checkpoints.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "checkpoint_helpers.h"
#include "cli_helpers.h"

namespace poseidon {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

using testing::TempDir;

// 2 workers x batch 16 over 1024 images (32 iterations per epoch), the MLP:
// checkpoints every 5 iterations.
std::vector<std::string> job(const std::string& ck, int maxSteps, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> a{"train",       "--workers",   "2",          "--batch",   "16",    "--train-limit",
                             "1024",        "--quiet",     "--model",    "mlp",       "--timeout", "10000",
                             "--max-steps", std::to_string(maxSteps), "--checkpoint-every", "5", "--checkpoint", ck};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

std::set<std::string> entries(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

// Room for one MLP checkpoint and a half: the one at iteration 5 fits, the one
// at 10 does not. Rank 0 stops with one line naming the checkpoint and the
// errno (no SIGABRT, no stack dump), the job exits non-zero, the launcher's
// restart resumes from the checkpoint at 5 and runs out of room again; nothing
// of step 10 is left. Once there is room, the same command resumes from 5 and
// finishes.
TEST(CheckpointCli, DiskFullFailsWithOneLineAndResumesFromTheOlderCheckpoint) {
  TempDir dir;
  uint64_t one = 0;
  {
    testing::TrainState mlp("mlp");
    std::string p = mlp.save(dir.path + "/scratch", 1);
    one = testing::pagesFor(fs::file_size(p + "/model.pt")) + testing::pagesFor(fs::file_size(p + "/optimizer.pt")) +
          4096;
  }
  testing::SmallDisk disk(dir.path + "/disk", one + one / 2);
  if (!disk.mounted()) GTEST_SKIP() << disk.skipReason();
  const std::string ck = disk.path() + "/ck";

  auto full = testing::runCli(job(ck, 10, {"--max-restarts", "1"}), dir.path + "/full", {}, 240);
  ASSERT_FALSE(full.killed) << "the job hung after the disk filled up";
  EXPECT_EQ(full.exitCode(), 1) << full.stderrText();
  const std::string err = full.stderrText();
  EXPECT_THAT(err, HasSubstr("poseidon train: error: cannot write checkpoint " + ck + "/step-000000010: "));
  EXPECT_THAT(err, HasSubstr(".pt: No space left on device (the checkpoints already in " + ck + " are untouched)"));
  EXPECT_THAT(err, Not(HasSubstr("terminate called")));
  EXPECT_THAT(err, Not(HasSubstr("c10::Error")));
  EXPECT_THAT(err, HasSubstr("poseidon train: rank 0 exited with code 1: poseidon train: error: cannot write checkpoint"));
  // The restart (docs/reliability.md): from the intact checkpoint at 5, into the same full disk.
  EXPECT_THAT(err, HasSubstr("restarting from the checkpoint at iteration 5"));
  EXPECT_THAT(full.stdoutText(), HasSubstr("resuming from " + ck + "/step-000000005 (iteration 5: "));
  EXPECT_EQ(entries(ck), std::set<std::string>{"step-000000005"});

  ASSERT_TRUE(disk.resize(4 * one));
  auto roomy = testing::runCli(job(ck, 10), dir.path + "/roomy", {}, 240);
  ASSERT_EQ(roomy.exitCode(), 0) << roomy.stderrText();
  EXPECT_THAT(roomy.stdoutText(), HasSubstr("resuming from " + ck + "/step-000000005 (iteration 5: "));
  EXPECT_TRUE(fs::exists(ck + "/step-000000010/meta.json"));
}

}  // namespace
}  // namespace poseidon
