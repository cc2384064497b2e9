// Time to accuracy (docs/time_to_accuracy.md): poseidon train's padded compute and accuracy curve,
// and poseidon bench --accuracy end to end on a small emulated cluster (when this machine can
// build one: root and iproute2; skipped with the reason otherwise).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_helpers.h"
#include "poseidon/bench/cluster.h"

namespace poseidon {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;
namespace fs = std::filesystem;

nlohmann::json readJson(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

TEST(TimeToAccuracy, PaddedStepsAndTheCurveOfModelCopies) {
  TempDir dir;
  const double padMs = 40;
  auto p = testing::runCli({"train", "--workers", "4", "--train-limit", "2048", "--epochs", "2", "--max-steps", "12",
                            "--pad-ms", "40", "--curve-every", "4", "--quiet", "--timeout", "60000", "--summary",
                            dir.path + "/s.json"},
                           dir.path + "/log");
  ASSERT_EQ(p.exitCode(), 0) << p.stderrText();
  EXPECT_THAT(p.stdoutText(), HasSubstr("compute padded to 40.0 ms per step"));
  auto s = readJson(dir.path + "/s.json");
  ASSERT_EQ(s["curve"].size(), 3u) << s["curve"].dump();
  double previous = 0;
  for (size_t i = 0; i < 3; ++i) {
    const auto& c = s["curve"][i];
    EXPECT_EQ(c["step"], 4 * (i + 1));
    // Every step lasts at least the pad: the clock cannot be below steps x pad.
    EXPECT_GE(c["seconds"].get<double>(), c["step"].get<double>() * padMs / 1000) << c.dump();
    EXPECT_GT(c["seconds"].get<double>(), previous);
    previous = c["seconds"].get<double>();
    EXPECT_GT(c["train_loss"].get<double>(), 0);
  }
  EXPECT_DOUBLE_EQ(s["train_clock_seconds"].get<double>(), previous);
  // The last copy is the final model; tested on the whole test set, it scores what the sharded
  // evaluation over all ranks scored (the same 10,000 images; at most one argmax tie apart).
  EXPECT_NEAR(s["curve"][2]["test_accuracy"].get<double>(), s["test_accuracy"].get<double>(), 1e-4);
  // Every rank reports its overruns, and a rank whose compute never exceeded the pad has none.
  ASSERT_EQ(s["pad_overruns_per_rank"].size(), 4u);
  for (size_t r = 0; r < 4; ++r) {
    double overruns = s["pad_overruns_per_rank"][r].get<double>(), maxMs = s["max_compute_ms_per_rank"][r].get<double>();
    EXPECT_GT(maxMs, 0);
    EXPECT_LE(overruns, 12);
    if (maxMs <= padMs) {
      EXPECT_EQ(overruns, 0) << "rank " << r;
    }
    if (overruns > 0) {
      EXPECT_GT(maxMs, padMs) << "rank " << r;
    }
  }
}

TEST(TimeToAccuracy, JitterWithoutAPadIsAnError) {
  TempDir dir;
  auto p = testing::runCli({"train", "--workers", "1", "--pad-jitter-ms", "10", "--max-steps", "1"}, dir.path + "/log");
  EXPECT_NE(p.exitCode(), 0);
  EXPECT_THAT(p.stderrText(), HasSubstr("--pad-jitter-ms needs --pad-ms"));
}

TEST(TimeToAccuracy, BenchRejectsASystemWhoseGroupsDoNotDivideTheNodes) {
  TempDir dir;
  auto p = testing::runCli({"bench", "--accuracy", "--nodes", "4", "--systems", "bsp,g3"}, dir.path + "/log");
  EXPECT_EQ(p.exitCode(), 2);
  EXPECT_THAT(p.stderrText(), HasSubstr("system g3: 3 groups must divide 4 nodes"));
  auto q = testing::runCli({"bench", "--accuracy", "--systems", "bsp", "--hyper", "g2=0.1:0.5"}, dir.path + "/log2");
  EXPECT_EQ(q.exitCode(), 2);
  EXPECT_THAT(q.stderrText(), HasSubstr("--hyper names 'g2', which is not in --systems"));
}

TEST(TimeToAccuracy, BenchTrainsPoseidonGroupsAndDdpOnTheEmulatedCluster) {
  std::string why;
  if (!bench::EmulatedCluster::available(&why)) GTEST_SKIP() << "no emulated cluster here: " << why;
  TempDir dir;
  auto p = testing::runCli({"bench", "--accuracy", "--nodes", "2", "--systems", "bsp,g2,ddp", "--rates", "100",
                            "--steps", "8", "--curve-every", "4", "--pad-ms", "30", "--hyper", "g2=0.02:0.3",
                            "--target-accuracy", "0.2", "--json", dir.path + "/r.json", "--markdown",
                            dir.path + "/r.md", "--plots", dir.path + "/plots"},
                           dir.path + "/log", {}, 600);
  ASSERT_EQ(p.exitCode(), 0) << p.stdoutText() << p.stderrText();
  auto r = readJson(dir.path + "/r.json");
  ASSERT_EQ(r["runs"].size(), 3u);
  for (const auto& run : r["runs"]) {
    ASSERT_TRUE(run["ok"].get<bool>()) << run.dump();
    ASSERT_EQ(run["curve"].size(), 2u) << run.dump();
    EXPECT_EQ(run["curve"][1]["step"], 8);
    EXPECT_GE(run["seconds_per_step"].get<double>(), 0.030) << run.dump();
    // Eight steps of LeNet leave chance (10%) behind on every system; the first curve point at
    // or above 20% is what the table reports.
    EXPECT_GT(run["final_test_accuracy"].get<double>(), 0.2) << run.dump();
    int64_t steps = run["steps_to_accuracy"].get<int64_t>();
    ASSERT_TRUE(steps == 4 || steps == 8) << run.dump();
    const auto& at = run["curve"][steps / 4 - 1];
    EXPECT_GE(at["test_accuracy"].get<double>(), 0.2);
    EXPECT_DOUBLE_EQ(run["time_to_accuracy_s"].get<double>(), at["seconds"].get<double>());
  }
  EXPECT_EQ(r["runs"][1]["lr"], 0.02);
  EXPECT_EQ(r["runs"][1]["momentum"], 0.3);
  EXPECT_TRUE(r["runs"][1].contains("staleness_histogram"));
  std::ifstream md(dir.path + "/r.md");
  std::string table((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
  EXPECT_THAT(table, HasSubstr("| g2 | 0.02 | 0.3 |"));
  EXPECT_TRUE(fs::exists(dir.path + "/plots/accuracy-100mbit.png"));
}

}  // namespace
}  // namespace poseidon
