// Omnivore's optimizer on the emulated cluster (docs/hyperparameters.md): poseidon tune end to end,
// scaled down, every probe a real two-node training run (skipped with the reason where this machine
// cannot build the cluster: root and iproute2). The time-to-accuracy runs it builds on are in
// accuracy_test.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "cli_helpers.h"
#include "poseidon/bench/cluster.h"
#include "poseidon/common/error.h"

namespace poseidon {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::readJson;
using testing::TempDir;

// Omnivore's optimizer end to end, scaled down: a cold start over three learning rates, then epochs
// of grids, every probe a real two-node training run from the epoch's checkpoint. What must hold
// whatever the probes' losses: the cold start's stopping rule, the accounting (every run's clock
// is the trained model's or tuning's), the trained model's path through the steps, the HE table.
TEST(TimeToAccuracy, TuneProbesAndTrainsEpochsOnTheEmulatedCluster) {
  std::string why;
  if (!bench::EmulatedCluster::available(&why)) GTEST_SKIP() << "no emulated cluster here: " << why;
  TempDir dir;
  auto p = testing::runCli({"tune",
                            "--nodes",
                            "2",
                            "--rates",
                            "100",
                            "--steps",
                            "8",
                            "--epoch-steps",
                            "4",
                            "--probe-steps",
                            "2",
                            "--cold-start-steps",
                            "4",
                            "--pad-ms",
                            "30",
                            "--lrs",
                            "0.001,0.01,0.1",
                            "--momenta",
                            "0,0.9",
                            "--probe-samples",
                            "1024",
                            "--json",
                            dir.path + "/t.json",
                            "--markdown",
                            dir.path + "/t.md"},
                           dir.path + "/log", {}, 900);
  ASSERT_EQ(p.exitCode(), 0) << p.stdoutText() << p.stderrText();
  auto r = readJson(dir.path + "/t.json");
  ASSERT_EQ(r["runs"].size(), 1u);
  EXPECT_EQ(r["config"]["probe_samples"], 1024);  // each run's loss: its end model's on 1024 training images
  const auto& run = r["runs"][0];
  ASSERT_EQ(run["he_model"].size(), 2u);  // g = 1, 2
  EXPECT_DOUBLE_EQ(run["he_model"][0]["he_ratio"].get<double>(), 1.0);
  auto lossOf = [](const nlohmann::json& s) {
    return s["loss"].is_number() ? s["loss"].get<double>() : std::numeric_limits<double>::infinity();
  };
  // Cold start: g = 1, momentum 0.9, learning rates from the lowest up while the loss does not get worse.
  std::vector<nlohmann::json> cold;
  for (const auto& s : run["stages"])
    if (s["kind"] == "cold-start probe") cold.push_back(s);
  ASSERT_GE(cold.size(), 1u);
  const std::vector<double> lrs{0.001, 0.01, 0.1};
  for (size_t i = 0; i < cold.size(); ++i) {
    EXPECT_EQ(cold[i]["groups"], 1);
    EXPECT_EQ(cold[i]["momentum"], 0.9);
    EXPECT_EQ(cold[i]["lr"], lrs[i]);
    EXPECT_EQ(cold[i]["from_step"], 0);
    EXPECT_EQ(cold[i]["to_step"], 2);
    if (i > 0 && i + 1 < cold.size()) {
      EXPECT_LE(lossOf(cold[i]), lossOf(cold[i - 1]));
    }
  }
  if (cold.size() < lrs.size()) {
    EXPECT_GT(lossOf(cold.back()), lossOf(cold[cold.size() - 2]));
  }
  // Accounting: every run is the trained model's (kept) or tuning's.
  double clock = 0, tuning = 0;
  for (const auto& s : run["stages"]) {
    clock += s["clock_seconds"].get<double>();
    if (!s["won"].get<bool>()) tuning += s["clock_seconds"].get<double>();
    EXPECT_EQ(s["from_step"].get<int>() % 2, 0);
    EXPECT_EQ(s["to_step"].get<int>() % 2, 0);
    if (s["kind"] == "epoch") {
      EXPECT_TRUE(s["won"].get<bool>());
      EXPECT_EQ(s["to_step"].get<int>() % 4, 0);  // epochs end on the epoch's boundary
    }
  }
  EXPECT_NEAR(run["clock_seconds"].get<double>(), clock, 1e-6);
  EXPECT_NEAR(run["tuning_seconds"].get<double>(), tuning, 1e-6);
  EXPECT_NEAR(run["tuning_share"].get<double>(), tuning / clock, 1e-9);
  // The trained model's path: its curve points go through the steps to the budget, in time order.
  const auto& path = run["path"];
  ASSERT_GE(path.size(), 2u);
  for (size_t i = 1; i < path.size(); ++i) {
    EXPECT_GT(path[i]["step"].get<int>(), path[i - 1]["step"].get<int>()) << path.dump();
    EXPECT_GE(path[i]["seconds"].get<double>(), path[i - 1]["seconds"].get<double>()) << path.dump();
  }
  EXPECT_EQ(path.back()["step"], 8);
  EXPECT_EQ(run["steps"], 8);
  // A run's loss is its end model's sample loss: for the kept runs, the path's point at its end.
  int checked = 0;
  for (const auto& s : run["stages"]) {
    if (!s["won"].get<bool>() || !s["loss"].is_number()) continue;
    for (const auto& q : path)
      if (q["step"] == s["to_step"]) {
        EXPECT_DOUBLE_EQ(s["loss"].get<double>(), q["sample_loss"].get<double>()) << s.dump();
        ++checked;
      }
  }
  EXPECT_GE(checked, 2);
  EXPECT_NEAR(path.back()["path_seconds"].get<double>(), clock - tuning, 1e-6);
  // After the cold start's epoch, the first grid runs at the HE model's first g (the smallest within
  // 5% of the best time per sample), every probe from the epoch's end state, with momenta up to the
  // cold start's 0.9 at eta*, and at eta* / 10 too where the cold start's curve says a plateau (the
  // "rate" decision: at most 5% over another epoch, from its epoch's train_loss points).
  double bestRatio = 1e9;
  for (const auto& h : run["he_model"]) bestRatio = std::min(bestRatio, h["he_ratio"].get<double>());
  int firstG = 0;
  for (const auto& h : run["he_model"])
    if (firstG == 0 && h["he_ratio"].get<double>() <= bestRatio * 1.05) firstG = h["groups"];
  int coldEnd = -1;  // where the first grid starts: the cold start's epoch's end
  for (const auto& s : run["stages"])
    if (s["kind"] == "probe" && coldEnd < 0) coldEnd = s["from_step"];
  ASSERT_EQ(coldEnd, 4);
  double coldLr = 0;  // the learning rate the cold start's epoch ended with (a kept run ending there)
  for (const auto& s : run["stages"])
    if (s["won"].get<bool>() && s["to_step"] == coldEnd) coldLr = s["lr"];
  ASSERT_GT(coldLr, 0);
  int lower = -1;  // the first grid's rate decision
  for (const auto& d : run["decisions"]) {
    if (d["what"] == "rate" && d["at_step"] == coldEnd) {
      lower = d["lower_rate_probed"].get<bool>();
      if (d.contains("epoch_gain")) {
        EXPECT_EQ(lower, !(d["epoch_gain"].get<double>() > 0.05)) << d.dump();
      }
    }
  }
  ASSERT_GE(lower, 0) << run["decisions"].dump();
  const int firstGrid = lower ? 4 : 2;  // 2 momenta x (eta*, and eta* / 10 on a plateau)
  int probes = 0;
  for (const auto& s : run["stages"]) {
    if (s["kind"] != "probe" || s["from_step"] != coldEnd) continue;
    ++probes;
    if (probes <= firstGrid) {
      EXPECT_EQ(s["groups"], firstG) << s.dump();
    }
    const double lr = s["lr"];
    if (lower) {
      EXPECT_TRUE(std::fabs(lr - coldLr) < 1e-12 || std::fabs(lr - coldLr / 10) < 1e-12) << s.dump();
    } else {
      EXPECT_NEAR(lr, coldLr, 1e-12) << s.dump();
    }
  }
  EXPECT_GE(probes, firstGrid);
  const int g = run["chosen"]["groups"];
  EXPECT_TRUE(g == 1 || g == 2) << g;
  std::ifstream md(dir.path + "/t.md");
  std::string table((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
  EXPECT_THAT(table, HasSubstr("| cold-start probe | 1 | 0.001 | 0.9 | 0-2 |"));
  EXPECT_THAT(table, HasSubstr("A run's loss is its end model's mean loss on 1024 fixed training images."));
}

// Every run of the tuner stops where its model stops being finite: the cold start's probe at lr 1e5
// ends a few steps in (the paper's early stop on divergence), loses, and is tuning's whole cost.
TEST(TimeToAccuracy, TuneStopsADivergingProbeEarly) {
  std::string why;
  if (!bench::EmulatedCluster::available(&why)) GTEST_SKIP() << "no emulated cluster here: " << why;
  TempDir dir;
  auto p = testing::runCli({"tune",
                            "--nodes",
                            "2",
                            "--rates",
                            "100",
                            "--steps",
                            "16",
                            "--epoch-steps",
                            "16",
                            "--probe-steps",
                            "8",
                            "--cold-start-steps",
                            "16",
                            "--pad-ms",
                            "30",
                            "--lrs",
                            "0.01,1e5",
                            "--momenta",
                            "0,0.9",
                            "--probe-samples",
                            "256",
                            "--json",
                            dir.path + "/t.json",
                            "--markdown",
                            dir.path + "/t.md"},
                           dir.path + "/log", {}, 900);
  ASSERT_EQ(p.exitCode(), 0) << p.stdoutText() << p.stderrText();
  const nlohmann::json r = readJson(dir.path + "/t.json");
  const auto& run = r["runs"][0];
  const auto& stages = run["stages"];
  ASSERT_EQ(stages.size(), 3u) << stages.dump();  // two cold-start probes, the cold start's epoch
  EXPECT_EQ(stages[0]["lr"], 0.01);
  EXPECT_TRUE(stages[0]["loss"].is_number());
  EXPECT_TRUE(stages[0]["diverged_at_step"].is_null());
  const auto& diverged = stages[1];
  EXPECT_EQ(diverged["lr"], 1e5);
  EXPECT_EQ(diverged["loss"], "diverged");
  ASSERT_TRUE(diverged["diverged_at_step"].is_number()) << diverged.dump();
  const int d = diverged["diverged_at_step"];
  EXPECT_GT(d, 0);
  EXPECT_LT(d, 8);  // stopped before the probe's end
  EXPECT_FALSE(diverged["won"].get<bool>());
  EXPECT_THAT(p.stdoutText(), HasSubstr(strCat("steps 0-8: diverged at step ", d, " (stopped)")));
  // The rate's closing line says the JSON's -1 in words, or the time and its steps.
  const double toAccuracy = run["time_to_accuracy_s"].get<double>();
  EXPECT_THAT(p.stdoutText(),
              HasSubstr(toAccuracy < 0 ? std::string("100 Mbit/s: to 80% test accuracy not reached, final ")
                                       : strCat(" s (", run["steps_to_accuracy"].get<int64_t>(), " steps), final ")));
  EXPECT_THAT(p.stdoutText(), Not(HasSubstr("-1 steps")));
  EXPECT_EQ(stages[2]["kind"], "epoch");
  EXPECT_EQ(stages[2]["lr"], 0.01);
  EXPECT_EQ(run["chosen"]["lr"], 0.01);
  EXPECT_NEAR(run["tuning_seconds"].get<double>(), diverged["clock_seconds"].get<double>(), 1e-9);
  std::ifstream md(dir.path + "/t.md");
  std::string table((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
  EXPECT_THAT(table, HasSubstr(strCat("| 0-8 | diverged at step ", d, " |")));
}

// With --merged-fc every run trains with the FC server; the cold start measures its time per sample,
// and the first g is the paper's: the smallest whose predicted FC server load is within 5% of the
// highest.
TEST(TimeToAccuracy, TuneWithMergedFcStartsWhereTheFcServerSaturates) {
  std::string why;
  if (!bench::EmulatedCluster::available(&why)) GTEST_SKIP() << "no emulated cluster here: " << why;
  TempDir dir;
  auto p = testing::runCli({"tune",
                            "--merged-fc",
                            "--nodes",
                            "2",
                            "--rates",
                            "100",
                            "--steps",
                            "6",
                            "--epoch-steps",
                            "2",
                            "--probe-steps",
                            "2",
                            "--pad-ms",
                            "30",
                            "--lrs",
                            "0.01,0.1",
                            "--momenta",
                            "0,0.9",
                            "--probe-samples",
                            "0",  // the old signal, still there
                            "--json",
                            dir.path + "/t.json"},
                           dir.path + "/log", {}, 900);
  ASSERT_EQ(p.exitCode(), 0) << p.stdoutText() << p.stderrText();
  EXPECT_THAT(p.stdoutText(), HasSubstr("HE model (planner, merged FC)"));
  auto r = readJson(dir.path + "/t.json");
  EXPECT_EQ(r["config"]["merged_fc"], true);
  EXPECT_EQ(r["config"]["probe_samples"], 0);
  const auto& run = r["runs"][0];
  ASSERT_EQ(run["he_model"].size(), 2u);  // g = 1, 2
  // The FC server's time per sample: its busy seconds over the samples it served, pooled over the
  // cold start's runs (g = 1: a round is both workers' 32 rows; 2 rounds a probe).
  double busy = 0, samples = 0;
  for (const auto& s : run["stages"]) {
    if (s["kind"] != "cold-start probe") continue;
    EXPECT_EQ(s["fc_server_samples"], 2 * 2 * 32) << s.dump();
    EXPECT_GT(s["fc_server_busy_seconds"].get<double>(), 0) << s.dump();
    busy += s["fc_server_busy_seconds"].get<double>();
    samples += s["fc_server_samples"].get<double>();
  }
  for (const auto& h : run["he_model"]) {
    EXPECT_NEAR(h["fc_server_seconds_per_sample"].get<double>(), busy / samples, 1e-12) << h;
  }
  // The first g: the smallest predicted to load the FC server to 95%, else the largest.
  int firstG = 0;
  for (const auto& h : run["he_model"])
    if (firstG == 0 && h["fc_server_busy"].get<double>() >= 0.95) firstG = h["groups"];
  if (firstG == 0) firstG = 2;
  // The first grid (from the cold start's epoch's end, step 2: 2 momenta x 2 lrs; a cold start of
  // one 2-step probe has too few points to call a plateau, so Algorithm 1's both rates) runs at that g.
  bool lower = false;
  for (const auto& d : run["decisions"])
    if (d["what"] == "rate" && d["at_step"] == 2)
      lower = d["lower_rate_probed"].get<bool>() && !d.contains("epoch_gain");
  EXPECT_TRUE(lower) << run["decisions"].dump();
  int probes = 0;
  for (const auto& s : run["stages"]) {
    if (s["kind"] != "probe" || s["from_step"] != 2) continue;
    if (++probes <= 4) {
      EXPECT_EQ(s["groups"], firstG) << s.dump();
    }
  }
  EXPECT_GE(probes, 4);
  EXPECT_EQ(run["steps"], 6);
  // --probe-samples 0: a kept run's loss is rank 0's training loss at its end point (the mean over
  // its second half), and no copy was scored on the sample.
  int checked = 0;
  for (const auto& s : run["stages"]) {
    if (!s["won"].get<bool>() || !s["loss"].is_number()) continue;
    for (const auto& q : run["path"])
      if (q["step"] == s["to_step"]) {
        EXPECT_DOUBLE_EQ(s["loss"].get<double>(), q["train_loss"].get<double>()) << s.dump();
        EXPECT_FALSE(q.contains("sample_loss")) << q.dump();
        ++checked;
      }
  }
  EXPECT_GE(checked, 2);
}

}  // namespace
}  // namespace poseidon
