// Exact checkpoint/restart, automatic recovery and bad user input, through
// the real CLI (real processes, real LibTorch, a subset of the real data).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_helpers.h"
#include "poseidon/launch/env.h"

namespace poseidon {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

using testing::readBytes;
using testing::readJson;
using testing::TempDir;

testing::Proc run(const std::vector<std::string>& args, const std::string& log, std::map<std::string, std::string> env = {},
                  int timeoutSeconds = 240) {
  return testing::runCli(args, log, env, timeoutSeconds);
}

// 4 workers x batch 16 over 1024 images: 16 iterations per epoch, so 20
// iterations cross an epoch boundary and a checkpoint at 10 is mid-epoch.
std::vector<std::string> job(const std::string& scheme, const std::vector<std::string>& extra) {
  std::vector<std::string> a{"train", "--workers", "4", "--batch", "16", "--train-limit", "1024", "--epochs", "2",
                             "--quiet", "--scheme", scheme, "--model", "mlp", "--timeout", "10000"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

class ExactResume : public ::testing::TestWithParam<std::string> {};

// Train 10 iterations and stop, resume, train 10 more: bit-identical to 20
// uninterrupted iterations (PS sums in a fixed order, SFB rebuilds with the
// same GEMM over the same inputs, and checkpoints hold the whole state).
TEST_P(ExactResume, TenPlusTenEqualsTwenty) {
  TempDir dir;
  const std::string scheme = GetParam();
  auto straight = run(job(scheme, {"--max-steps", "20", "--save-params", dir.path + "/straight.bin"}), dir.path + "/a");
  ASSERT_EQ(straight.exitCode(), 0) << straight.stderrText();
  auto first = run(job(scheme, {"--max-steps", "10", "--checkpoint-every", "5", "--checkpoint", dir.path + "/ck"}),
                   dir.path + "/b");
  ASSERT_EQ(first.exitCode(), 0) << first.stderrText();
  EXPECT_TRUE(fs::exists(dir.path + "/ck/step-000000010/optimizer.pt"));
  EXPECT_TRUE(fs::exists(dir.path + "/ck/step-000000005/meta.json"));
  auto second = run(job(scheme, {"--max-steps", "20", "--checkpoint-every", "5", "--checkpoint", dir.path + "/ck",
                                 "--save-params", dir.path + "/resumed.bin"}),
                    dir.path + "/c");
  ASSERT_EQ(second.exitCode(), 0) << second.stderrText();
  EXPECT_THAT(second.stdoutText(), HasSubstr("/ck/step-000000010 (iteration 10: epoch 1, step 10)"));
  std::string a = readBytes(dir.path + "/straight.bin"), b = readBytes(dir.path + "/resumed.bin");
  ASSERT_GT(a.size(), 1000000u);
  EXPECT_TRUE(a == b) << "resumed parameters differ from the uninterrupted run (" << scheme << ")";
  // Only the newest two checkpoints are kept.
  EXPECT_FALSE(fs::exists(dir.path + "/ck/step-000000005"));
  EXPECT_TRUE(fs::exists(dir.path + "/ck/step-000000015"));
  EXPECT_TRUE(fs::exists(dir.path + "/ck/step-000000020"));
}

INSTANTIATE_TEST_SUITE_P(Schemes, ExactResume, ::testing::Values("auto", "ps", "sfb"));

// A worker is SIGKILLed at iteration 13; the launcher stops the others,
// reports what was lost since the checkpoint at 10, restarts the job, which
// resumes and ends exactly where an undisturbed run ends.
TEST(AutoRecovery, KilledWorkerRestartsFromCheckpointExactly) {
  TempDir dir;
  auto straight = run(job("auto", {"--max-steps", "20", "--save-params", dir.path + "/straight.bin"}), dir.path + "/a");
  ASSERT_EQ(straight.exitCode(), 0) << straight.stderrText();
  auto recovered = run(job("auto", {"--max-steps", "20", "--checkpoint-every", "5", "--checkpoint", dir.path + "/ck",
                                    "--max-restarts", "1", "--save-params", dir.path + "/recovered.bin"}),
                       dir.path + "/b", {{"POSEIDON_FAULT", "2:13:kill"}});
  ASSERT_EQ(recovered.exitCode(), 0) << recovered.stderrText();
  EXPECT_THAT(recovered.stderrText(), HasSubstr("poseidon train: rank 2 was killed by signal 9"));
  EXPECT_THAT(recovered.stderrText(),
              HasSubstr("job failed at iteration 13; restarting from the checkpoint at iteration 10 (3 iterations "
                        "lost), restart 1 of 1"));
  EXPECT_THAT(recovered.stdoutText(), HasSubstr("resuming from " + dir.path + "/ck/step-000000010"));
  EXPECT_TRUE(readBytes(dir.path + "/straight.bin") == readBytes(dir.path + "/recovered.bin"));
}

// One worker runs in poseidon train's own process unless it may be restarted: with --max-restarts
// it is the launcher's child like any larger world, and recovers the same way (it was killed for
// good before, the flag silently ignored).
TEST(AutoRecovery, OneWorkerRestartsFromCheckpointToo) {
  TempDir dir;
  auto one = [](std::vector<std::string> extra) {
    std::vector<std::string> a{"train", "--workers", "1", "--batch", "16", "--train-limit", "1024", "--epochs", "1",
                               "--quiet", "--model", "mlp", "--timeout", "10000", "--max-steps", "12"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  auto straight = run(one({"--save-params", dir.path + "/straight.bin", "--summary", dir.path + "/straight.json"}),
                      dir.path + "/a");
  ASSERT_EQ(straight.exitCode(), 0) << straight.stderrText();
  auto recovered = run(one({"--checkpoint-every", "5", "--checkpoint", dir.path + "/ck", "--max-restarts", "1",
                            "--save-params", dir.path + "/recovered.bin", "--summary", dir.path + "/recovered.json"}),
                       dir.path + "/b", {{"POSEIDON_FAULT", "0:7:kill"}});
  ASSERT_EQ(recovered.exitCode(), 0) << recovered.stderrText();
  EXPECT_THAT(recovered.stderrText(), HasSubstr("poseidon train: rank 0 was killed by signal 9"));
  EXPECT_THAT(recovered.stderrText(), HasSubstr("restarting from the checkpoint at iteration 5"));
  EXPECT_THAT(recovered.stdoutText(), HasSubstr("resuming from " + dir.path + "/ck/step-000000005"));
  EXPECT_TRUE(readBytes(dir.path + "/straight.bin") == readBytes(dir.path + "/recovered.bin"));
  // The summary is the last attempt's, and says that it was one: restarted once, from step 5.
  const nlohmann::json s = readJson(dir.path + "/recovered.json"), first = readJson(dir.path + "/straight.json");
  EXPECT_EQ(s["restarts"], 1);
  EXPECT_EQ(s["start_iteration"], 5);
  EXPECT_EQ(s["resumed_from"], dir.path + "/ck/step-000000005");
  EXPECT_EQ(s["steps"], 7);
  EXPECT_EQ(first["restarts"], 0);
  EXPECT_EQ(first["steps"], 12);
}

TEST(AutoRecovery, GivesUpAfterMaxRestarts) {
  TempDir dir;
  // An earlier run's summary: a failed run must not leave it to read as its own.
  const std::string summary = dir.path + "/summary.json";
  std::ofstream(summary) << R"({"test_accuracy": 0.9, "diverged": false})";
  // The fault fires in the first run only, so with 0 restarts the job fails.
  auto p = run(job("auto", {"--max-steps", "20", "--max-restarts", "0", "--summary", summary}), dir.path + "/a",
               {{"POSEIDON_FAULT", "1:3:kill"}});
  EXPECT_NE(p.exitCode(), 0);
  EXPECT_THAT(p.stderrText(), HasSubstr("poseidon train: rank 1 was killed by signal 9"));
  EXPECT_FALSE(std::filesystem::exists(summary));
}

TEST(BadInput, PortInUseUnreachableCoordinatorAndBadCheckpoint) {
  TempDir dir;
  // Port in use: hold the port with a rank-0 job that waits for a rank that never comes.
  int port = freePort("127.0.0.1");
  std::map<std::string, std::string> env0{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"},
                                          {"MASTER_PORT", std::to_string(port)}};
  const int holderTimeoutMs = 60000;
  std::vector<testing::Proc> holder{testing::spawn(
      {POSEIDON_CLI, "train", "--timeout", std::to_string(holderTimeoutMs), "--train-limit", "64", "--quiet"}, env0,
      dir.path + "/holder")};
  // Wait for the event (the holder's coordinator listens), not for a head start in time; past the
  // holder's own timeout it has given up.
  ASSERT_TRUE(
      testing::waitForPolled([&] { return testing::listening(port); }, std::chrono::milliseconds(holderTimeoutMs)))
      << "the holder never bound port " << port << ": " << holder[0].stderrText();
  auto clash = run({"train", "--timeout", "3000", "--train-limit", "64", "--quiet"}, dir.path + "/clash", env0, 60);
  EXPECT_EQ(clash.exitCode(), 1);
  EXPECT_THAT(clash.stderrText(), HasSubstr("cannot start the coordinator on 127.0.0.1:" + std::to_string(port)));
  EXPECT_THAT(clash.stderrText(), HasSubstr("the port is in use"));
  // MASTER_PORT was set: the hint must not tell the user to set it.
  EXPECT_THAT(clash.stderrText(), HasSubstr("another job or a leftover process holds it"));
  EXPECT_THAT(clash.stderrText(), ::testing::Not(HasSubstr("set MASTER_PORT")));
  kill(holder[0].pid, SIGKILL);
  testing::waitAll(holder, std::chrono::seconds(10));

  // Unreachable coordinator: rank 1 of 2 with nobody at MASTER_ADDR:MASTER_PORT.
  int nobody = freePort("127.0.0.1");
  auto lonely = run({"train", "--timeout", "2000", "--train-limit", "64", "--quiet"}, dir.path + "/lonely",
                    {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(nobody)}},
                    60);
  EXPECT_EQ(lonely.exitCode(), 1);
  // It waits 1.5x the timeout for the coordinator; the rest is process start
  // (LibTorch, the dataset), which a loaded CI machine can stretch.
  EXPECT_GE(lonely.seconds, 3.0);
  EXPECT_LT(lonely.seconds, 3.0 + 12);
  EXPECT_THAT(lonely.stderrText(), HasSubstr("no answer from the coordinator at 127.0.0.1:" + std::to_string(nobody)));
  EXPECT_EQ(lonely.stderrText().find("terminate called"), std::string::npos);

  // A checkpoint written by another job layout cannot be resumed exactly.
  auto first = run(job("auto", {"--max-steps", "5", "--checkpoint-every", "5", "--checkpoint", dir.path + "/ck"}),
                   dir.path + "/first");
  ASSERT_EQ(first.exitCode(), 0) << first.stderrText();
  auto other = run({"train", "--workers", "2", "--batch", "16", "--train-limit", "1024", "--quiet", "--model", "mlp",
                    "--checkpoint", dir.path + "/ck"},
                   dir.path + "/other");
  // Said once, by train before it starts a worker (each worker and the launcher used to say it).
  EXPECT_EQ(other.exitCode(), 2);
  EXPECT_EQ(other.stderrText(), "poseidon train: error: checkpoint " + dir.path +
                                    "/ck/step-000000005 was written with --workers 4, this run has 2; resume with the "
                                    "same settings or use another --checkpoint DIR\n");
}

}  // namespace
}  // namespace poseidon

namespace poseidon {
namespace {

// Straggler dropping through the trainer: every step of rank 3 takes 4 straggler timeouts longer (a
// time derived from the timeout, not a factor of the step's own time, which a fast machine makes
// shorter than the timeout); with D = 1 the others do not wait for it beyond the timeout, and the
// summary shows what was dropped and skipped.
TEST(Stragglers, TrainerSummaryShowsDrops) {
  TempDir dir;
  const int timeoutMs = 50;
  auto p = run({"train", "--workers", "4", "--batch", "16", "--train-limit", "4096", "--epochs", "1", "--model", "mlp",
                "--quiet", "--max-steps", "30", "--drop-stragglers", "1", "--straggler-timeout",
                std::to_string(timeoutMs), "--summary", dir.path + "/s.json"},
               dir.path + "/a", {{"POSEIDON_SLOW", "3:" + std::to_string(4 * timeoutMs)}});
  ASSERT_EQ(p.exitCode(), 0) << p.stderrText();
  std::ifstream f(dir.path + "/s.json");
  auto s = nlohmann::json::parse(f);
  auto dropped = s["dropped_contributions_per_rank"], skipped = s["skipped_iterations_per_rank"];
  // The printed line says what the summary says.
  auto list = [](const nlohmann::json& v) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i].get<int64_t>());
    return out + "]";
  };
  EXPECT_THAT(p.stdoutText(), HasSubstr("straggler dropping: dropped layer contributions per rank " + list(dropped) +
                                        ", skipped iterations per rank " + list(skipped)));
  // The slowed rank is the one left behind. (Whether a fast rank is also dropped now and then
  // depends on how loaded this machine is, against a 50 ms straggler timeout: not asserted.)
  auto lost = [&](int r) { return dropped[r].get<double>() + skipped[r].get<double>(); };
  for (int r = 0; r < 3; ++r) {
    EXPECT_GT(lost(3), lost(r)) << r;
    EXPECT_LT(skipped[r].get<double>(), skipped[3].get<double>()) << r;
  }
  EXPECT_GT(skipped[3].get<double>(), 0);
}

TEST(Stragglers, NeedsATimeout) {
  TempDir dir;
  auto p = run({"train", "--drop-stragglers", "1"}, dir.path + "/a");
  EXPECT_EQ(p.exitCode(), 2);
  EXPECT_THAT(p.stderrText(), HasSubstr("--drop-stragglers needs --straggler-timeout MS"));
}

}  // namespace
}  // namespace poseidon
