// Checkpoints through the real CLI: a disk that fills up while a job
// checkpoints, and damaged checkpoint files at resume.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "checkpoint_helpers.h"
#include "cli_helpers.h"
#include "poseidon/common/file.h"

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

// What is in a checkpoint directory but the job's lock file (ADirectoryInUseIsRefusedNamingItsHolder's).
std::set<std::string> entries(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename() != DirectoryLock::kFileName) out.insert(e.path().filename().string());
  }
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
  EXPECT_THAT(err,
              HasSubstr("poseidon train: rank 0 exited with code 1: poseidon train: error: cannot write checkpoint"));
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

// Each checkpoint file damaged in turn in the newer of two checkpoints: the
// job warns, naming the checkpoint and the file, resumes from the older one,
// and finishes.
TEST(CheckpointCli, DamagedCheckpointIsRefusedByNameAndResumeFallsBack) {
  TempDir dir;
  auto first = testing::runCli(job(dir.path + "/ck", 10), dir.path + "/first", {}, 240);
  ASSERT_EQ(first.exitCode(), 0) << first.stderrText();
  ASSERT_EQ(entries(dir.path + "/ck"), (std::set<std::string>{"step-000000005", "step-000000010"}));

  struct Case {
    std::string file;
    std::function<void(const std::string&)> damage;
  };
  const Case cases[] = {
      {"model.pt", [](const std::string& p) { testing::zeroBytes(p, fs::file_size(p) / 2, 4096); }},
      {"optimizer.pt", [](const std::string& p) { testing::flipByte(p, fs::file_size(p) / 2); }},
      {"meta.json", [](const std::string& p) { testing::alterIteration(p); }},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.file);
    const std::string ck = dir.path + "/ck-" + c.file;
    fs::copy(dir.path + "/ck", ck, fs::copy_options::recursive);
    c.damage(ck + "/step-000000010/" + c.file);
    auto resumed = testing::runCli(job(ck, 12), dir.path + "/resume-" + c.file, {}, 240);
    ASSERT_EQ(resumed.exitCode(), 0) << resumed.stderrText();
    EXPECT_THAT(resumed.stderrText(), HasSubstr("[rank 0] warning: checkpoint " + ck + "/step-000000010 is damaged: " +
                                                c.file));
    EXPECT_THAT(resumed.stderrText(), HasSubstr("resuming from the older " + ck + "/step-000000005"));
    EXPECT_THAT(resumed.stdoutText(), HasSubstr("resuming from " + ck + "/step-000000005 (iteration 5: "));
    // The run wrote an intact checkpoint at 10 again; resume is exact, so its parameters are
    // byte for byte the first run's (optimizer.pt is not compared: LibTorch keys its state by
    // tensor addresses).
    testing::TrainState mlp("mlp");
    pt::CheckpointMeta expect = mlp.meta;
    expect.workers = 2;
    expect.batch = 16;
    expect.trainLimit = 1024;
    EXPECT_NO_THROW(pt::loadCheckpoint(ck + "/step-000000010", expect, *mlp.net.module, mlp.optimizer));
    EXPECT_TRUE(testing::readBytes(ck + "/step-000000010/model.pt") ==
                testing::readBytes(dir.path + "/ck/step-000000010/model.pt"));
  }
}

// A new checkpoint directory says so (a typo of the one meant is never a silent restart from 0); the
// same command again, resumed where the job ended, trains nothing and reports the checkpoint's own
// accuracy (the model the first run evaluated last), not the 0 of a model never evaluated.
TEST(CheckpointCli, TheSameCommandAgainReportsTheCheckpointsAccuracy) {
  TempDir dir;
  const std::string ck = dir.path + "/ck";
  auto first = testing::runCli(job(ck, 10, {"--summary", dir.path + "/first.json"}), dir.path + "/first", {}, 240);
  ASSERT_EQ(first.exitCode(), 0) << first.stderrText();
  EXPECT_THAT(first.stdoutText(), HasSubstr("no checkpoint in " + ck + " yet: starting from iteration 0\n"));
  // Under restarts (their launcher's flag, in its = form, which the workers do not get) as well.
  auto again = testing::runCli(job(ck, 10, {"--summary", dir.path + "/again.json", "--max-restarts=1"}),
                               dir.path + "/again", {}, 240);
  ASSERT_EQ(again.exitCode(), 0) << again.stderrText();
  EXPECT_THAT(again.stdoutText(), HasSubstr("resuming from " + ck + "/step-000000010 (iteration 10: "));
  EXPECT_THAT(again.stdoutText(),
              HasSubstr("nothing left to train: the checkpoint is at iteration 10, --max-steps 10; evaluating it\n"));
  EXPECT_THAT(again.stdoutText(), Not(HasSubstr("no checkpoint in")));
  // No step, so no traffic against Table 1 and no images/s: the lines would read 0.
  EXPECT_THAT(again.stdoutText(), Not(HasSubstr("bytes on the wire")));
  EXPECT_THAT(again.stdoutText(), HasSubstr("% (the checkpoint's; no step trained), "));
  const double accuracy = testing::readJson(dir.path + "/first.json")["test_accuracy"].get<double>();
  EXPECT_GT(accuracy, 0.1);
  EXPECT_EQ(testing::readJson(dir.path + "/again.json")["test_accuracy"].get<double>(), accuracy);
  EXPECT_EQ(entries(ck), (std::set<std::string>{"step-000000005", "step-000000010"}));  // nothing rewritten
  // The summary says what the run was and where it started from.
  const nlohmann::json one = testing::readJson(dir.path + "/first.json"), two = testing::readJson(dir.path + "/again.json");
  EXPECT_TRUE(one["resumed_from"].is_null());
  EXPECT_EQ(one["start_iteration"], 0);
  EXPECT_EQ(one["max_steps"], 10);
  EXPECT_EQ(one["train_limit"], 1024);
  EXPECT_EQ(one["seed"], 1);
  EXPECT_EQ(two["resumed_from"], ck + "/step-000000010");
  EXPECT_EQ(two["start_iteration"], 10);
}

// A job that --max-steps stops off the checkpoints' beat is saved where it stopped: the same command
// with more steps goes on from there, and ends byte for byte where one run of all the steps ends.
// Before, the steps since the last checkpoint were lost (with per-epoch checkpoints, every step of a
// run stopped mid-epoch), and the next run redid them.
TEST(CheckpointCli, AStopAtMaxStepsIsSavedWhereItStopped) {
  TempDir dir;
  const std::string ck = dir.path + "/ck", straight = dir.path + "/straight";
  auto first = testing::runCli(job(ck, 7), dir.path + "/first", {}, 240);
  ASSERT_EQ(first.exitCode(), 0) << first.stderrText();
  EXPECT_EQ(entries(ck), (std::set<std::string>{"step-000000005", "step-000000007"}));
  // The epoch it cut short is not "done" (it said "epoch 1/5 done in").
  EXPECT_THAT(first.stdoutText(), HasSubstr("epoch 1/5 stopped after 7 of 32 steps (--max-steps 7) in "));
  auto more = testing::runCli(job(ck, 12), dir.path + "/more", {}, 240);
  ASSERT_EQ(more.exitCode(), 0) << more.stderrText();
  EXPECT_THAT(more.stdoutText(), HasSubstr("resuming from " + ck + "/step-000000007 (iteration 7: "));
  EXPECT_EQ(entries(ck), (std::set<std::string>{"step-000000010", "step-000000012"}));  // the newest two kept
  auto whole = testing::runCli(job(straight, 12), dir.path + "/whole", {}, 240);
  ASSERT_EQ(whole.exitCode(), 0) << whole.stderrText();
  EXPECT_TRUE(testing::readBytes(ck + "/step-000000012/model.pt") ==
              testing::readBytes(straight + "/step-000000012/model.pt"));
  // Per-epoch checkpoints (no --checkpoint-every): a stop mid-epoch is saved too, once.
  std::vector<std::string> perEpoch = job(dir.path + "/epoch", 3);
  const auto every = std::find(perEpoch.begin(), perEpoch.end(), "--checkpoint-every");
  perEpoch.erase(every, every + 2);
  auto epoch = testing::runCli(perEpoch, dir.path + "/epoch-run", {}, 240);
  ASSERT_EQ(epoch.exitCode(), 0) << epoch.stderrText();
  EXPECT_EQ(entries(dir.path + "/epoch"), (std::set<std::string>{"step-000000003"}));
}

// A job whose epochs end off the --checkpoint-every beat is saved where it ended (32 iterations, every
// 5): the same command again has nothing left to train. It kept only step 30 and redid 30..32 each
// time; an epoch shorter than --checkpoint-every left no checkpoint at all and trained from 0 again.
TEST(CheckpointCli, TheLastEpochIsSavedOffTheBeat) {
  TempDir dir;
  const std::string ck = dir.path + "/ck";
  auto first = testing::runCli(job(ck, 1000, {"--epochs", "1"}), dir.path + "/first", {}, 240);
  ASSERT_EQ(first.exitCode(), 0) << first.stderrText();
  EXPECT_EQ(entries(ck), (std::set<std::string>{"step-000000030", "step-000000032"}));
  auto again = testing::runCli(job(ck, 1000, {"--epochs", "1"}), dir.path + "/again", {}, 240);
  ASSERT_EQ(again.exitCode(), 0) << again.stderrText();
  EXPECT_THAT(again.stdoutText(), HasSubstr("nothing left to train: the checkpoint is at iteration 32, the end of "
                                            "--epochs 1 (raise --epochs to train on); evaluating it\n"));
  std::vector<std::string> rare = job(dir.path + "/rare", 1000, {"--epochs", "1"});
  *(std::find(rare.begin(), rare.end(), "--checkpoint-every") + 1) = "1000";
  auto once = testing::runCli(rare, dir.path + "/rare-run", {}, 240);
  ASSERT_EQ(once.exitCode(), 0) << once.stderrText();
  EXPECT_EQ(entries(dir.path + "/rare"), (std::set<std::string>{"step-000000032"}));
}

// Two jobs given one --checkpoint directory: the second is refused before it trains, naming the job
// that holds the directory, and the first one's checkpoints are untouched. Before, both wrote and
// pruned there, and a restart of either resumed from whichever had saved last: another job's model,
// silently (the layouts match when only the learning rate differs). The holder here is this test
// process, through the same lock rank 0 of poseidon train takes; the kernel's flock excludes any
// other process alike, and drops the lock when its holder ends.
TEST(CheckpointCli, ADirectoryInUseIsRefusedNamingItsHolder) {
  TempDir dir;
  const std::string ck = dir.path + "/ck";
  auto first = testing::runCli(job(ck, 5), dir.path + "/first", {}, 240);
  ASSERT_EQ(first.exitCode(), 0) << first.stderrText();
  // Rank 0 held it for the run and said who it was.
  EXPECT_THAT(testing::readBytes(ck + "/" + DirectoryLock::kFileName), HasSubstr("poseidon train (rank 0 of 2), pid "));
  const std::set<std::string> saved = entries(ck);
  ASSERT_EQ(saved, std::set<std::string>{"step-000000005"});
  const std::string refusal =
      "checkpoint directory " + ck + " is in use by job A (a test), pid " + std::to_string(::getpid()) + " on ";
  const std::string why = " (it holds " + ck + "/" + DirectoryLock::kFileName +
                          "): two jobs writing one directory would resume from and delete each other's files; "
                          "give each job its own directory, or wait for that one to end\n";
  {
    DirectoryLock jobA(ck, "checkpoint directory", "job A (a test)");
    EXPECT_THROW(DirectoryLock(ck, "checkpoint directory", "job B"), InvalidArgument);  // this process again, too
    // poseidon train starting its workers: refused once, before any starts.
    auto own = testing::runCli(job(ck, 10), dir.path + "/own", {}, 240);
    EXPECT_EQ(own.exitCode(), 2) << own.stderrText();
    EXPECT_THAT(own.stderrText(), HasSubstr("poseidon train: error: " + refusal));
    EXPECT_THAT(own.stderrText(), HasSubstr(why));
    EXPECT_THAT(own.stdoutText(), Not(HasSubstr("epoch")));
    // Ranks started by poseidon launch: rank 0, the writer, refuses, and the launcher stops the others.
    auto launched =
        testing::runCli({"launch", "-n", "2", "--", POSEIDON_CLI, "train", "--batch", "16", "--train-limit", "1024",
                         "--quiet", "--model", "mlp", "--timeout", "10000", "--max-steps", "10", "--checkpoint", ck},
                        dir.path + "/launched", {}, 240);
    EXPECT_NE(launched.exitCode(), 0);
    EXPECT_THAT(launched.stderrText(), HasSubstr(refusal));
    EXPECT_THAT(launched.stderrText(), HasSubstr("poseidon launch: rank 0 exited with code "));
    EXPECT_EQ(entries(ck), saved);
    EXPECT_THAT(testing::readBytes(ck + "/" + DirectoryLock::kFileName), HasSubstr("job A (a test), pid "));
  }
  // Job A ended: the same command goes on from its checkpoint.
  auto after = testing::runCli(job(ck, 10), dir.path + "/after", {}, 240);
  ASSERT_EQ(after.exitCode(), 0) << after.stderrText();
  EXPECT_THAT(after.stdoutText(), HasSubstr("resuming from " + ck + "/step-000000005 (iteration 5: "));
}

}  // namespace
}  // namespace poseidon
