// `poseidon tune --regret` (docs/omnivore.md): the grid, the target, the tuner's decisions and the
// regret are consistent with each other and with Algorithm 1's rules, on a scaled-down run (the
// virtual clock: real gradients, no root, seconds here).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "cli_helpers.h"

namespace poseidon {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;
constexpr double kInf = std::numeric_limits<double>::infinity();

double orInf(const nlohmann::json& v) { return v.is_number() ? v.get<double>() : kInf; }

TEST(TuneRegret, GridTargetTunerAndRegretAgree) {
  TempDir dir;
  auto p = testing::runCli({"tune",          "--regret",
                            "--steps",       "120",
                            "--epoch-steps", "40",
                            "--ratios",      "10",
                            "--seeds",       "3",
                            "--tuner-seeds", "2",
                            "--groups-list", "1,2",
                            "--lrs",         "0.03,0.3",
                            "--momenta",     "0,0.6",
                            "--threads",     "2",
                            "--json",        dir.path + "/r.json",
                            "--markdown",    dir.path + "/r.md"},
                           dir.path + "/log");
  ASSERT_EQ(p.exitCode(), 0) << p.stdoutText() << p.stderrText();
  std::ifstream f(dir.path + "/r.json");
  const auto r = nlohmann::json::parse(f);

  // The grid: 2 g x 2 momenta x 2 lrs, sorted by time; a time is the median of the seeds'.
  const auto& grid = r["grid"];
  ASSERT_EQ(grid.size(), 8u);
  double target = kInf;
  for (size_t i = 0; i < grid.size(); ++i) {
    const auto& seeds = grid[i]["time_s_per_seed"];
    ASSERT_EQ(seeds.size(), 3u);
    std::vector<double> t{orInf(seeds[0]), orInf(seeds[1]), orInf(seeds[2])};
    std::sort(t.begin(), t.end());
    EXPECT_DOUBLE_EQ(orInf(grid[i]["time_s"]), t[1]) << grid[i].dump();
    if (i > 0) {
      EXPECT_GE(orInf(grid[i]["time_s"]), orInf(grid[i - 1]["time_s"]));
    }
    target = std::min(target, orInf(grid[i]["median_loss_at_target_time"]));
  }
  // The target is the best median loss at 60% of T, so two of the best configuration's three seeds
  // reach it by then.
  EXPECT_DOUBLE_EQ(r["target_loss"].get<double>(), target);
  const double best = r["grid_best_s"].get<double>();
  EXPECT_DOUBLE_EQ(best, orInf(grid[0]["time_s"]));
  EXPECT_LE(best, 0.6 * r["horizon_s"].get<double>() + 1e-9);
  // T: the budget's synchronous rounds, 0.3 + 0.3 s of compute and the planner's communication.
  EXPECT_NEAR(r["horizon_s"].get<double>(), 120 * (0.6 + r["comm_seconds"]["1"].get<double>()), 1e-9);
  EXPECT_GT(r["comm_seconds"]["1"].get<double>(), r["comm_seconds"]["2"].get<double>());

  ASSERT_EQ(r["chosen"].size(), 2u);
  std::vector<double> shares;
  for (const auto& c : r["chosen"]) {
    // Regret: the final choice from scratch over the grid's best; its rank among the grid's times.
    const double scratch = orInf(c["from_scratch_s"]);
    if (std::isfinite(scratch)) {
      EXPECT_DOUBLE_EQ(c["regret"].get<double>(), scratch / best);
    }
    int rank = 1;
    for (const auto& g : grid)
      if (orInf(g["time_s"]) < scratch) ++rank;
    EXPECT_EQ(c["rank"], rank);
    for (const auto& g : grid) {
      if (g["groups"] == c["groups"] && g["momentum"] == c["momentum"] && g["lr"] == c["lr"]) {
        EXPECT_EQ(g["time_s"], c["from_scratch_s"]);  // a grid configuration: the grid's own runs
      }
    }
    const auto& t = c["tuner"];
    EXPECT_DOUBLE_EQ(c["tuning_share"].get<double>(),
                     t["tuning_seconds"].get<double>() / t["clock_seconds"].get<double>());
    shares.push_back(c["tuning_share"].get<double>());

    // Algorithm 1's rules in the tuner's stages. Cold start: g = 1, momentum 0.9, lrs ascending, 4 steps
    // each; the cold start ends at 4 (the probe multiple from a tenth of the 40-step epoch).
    const auto& stages = t["stages"];
    size_t i = 0;
    for (; i < stages.size() && stages[i]["kind"] == "cold-start probe"; ++i) {
      EXPECT_EQ(stages[i]["groups"], 1);
      EXPECT_EQ(stages[i]["momentum"], 0.9);
      EXPECT_EQ(stages[i]["from_step"], 0);
      EXPECT_EQ(stages[i]["to_step"], 4);
      EXPECT_EQ(stages[i]["lr"], (std::vector<double>{0.03, 0.3})[i]);
    }
    ASSERT_GE(i, 1u);
    // Each epoch's grid: at eta* no momentum above the last epoch's; at eta* / 10 every momentum.
    double muLast = 0.9, etaLast = 0;
    for (const auto& s : stages)
      if (s["won"].get<bool>() && s["to_step"] == 4) etaLast = s["lr"];
    ASSERT_GT(etaLast, 0);
    int epochStart = 4;
    // Each epoch's rate decision (beyond the paper): eta* / 10 is probed only where it shows a plateau,
    // which is where a line through the epoch's curve, 2 standard errors steeper, promises at most 5%
    // over another epoch.
    std::map<int, bool> lowerAt;  // epoch end -> a tenth of the rate probed
    for (const auto& d : t["decisions"]) {
      if (d["what"] != "rate") continue;
      const bool lower = d["lower_rate_probed"];
      lowerAt[d["at_step"].get<int>()] = lower;
      if (d.contains("epoch_gain")) {
        EXPECT_EQ(lower, !(d["epoch_gain_upper"].get<double>() > 0.05)) << d.dump();
        EXPECT_NEAR(d["epoch_gain_upper"].get<double>(),
                    d["epoch_gain"].get<double>() + 2 * d["slope_se"].get<double>() * 40 / d["end_loss"].get<double>(),
                    1e-9);
        // The line's slope over the epoch's 40 steps, relative to the line's loss at the epoch's end.
        ASSERT_TRUE(d.contains("end_loss")) << d.dump();
        EXPECT_NEAR(d["epoch_gain"].get<double>(),
                    -d["slope_per_step"].get<double>() * 40 / d["end_loss"].get<double>(), 1e-9);
      } else {
        EXPECT_TRUE(lower) << d.dump();  // fewer than three points: Algorithm 1's search
      }
    }
    for (; i < stages.size(); ++i) {
      const auto& s = stages[i];
      if (s["kind"] == "epoch") {
        if (s["loss"] == "diverged") continue;  // run again at a tenth of its rate: the next stage
        EXPECT_TRUE(s["won"].get<bool>());
        const int end = s["to_step"];
        EXPECT_TRUE(end == 4 || end == 44 || end == 84 || end == 120) << s.dump();  // the phases' ends
        muLast = s["momentum"];
        etaLast = s["lr"];
        epochStart = end;
        continue;
      }
      if (s["kind"] == "probe") {
        EXPECT_EQ(s["from_step"], epochStart);
        EXPECT_EQ(s["to_step"].get<int>() - s["from_step"].get<int>(), 4);
        const double lr = s["lr"];
        if (std::fabs(lr - etaLast) < 1e-12) {
          EXPECT_LE(s["momentum"].get<double>(), muLast + 1e-12) << s.dump();
        } else {
          EXPECT_NEAR(lr, etaLast / 10, 1e-12) << s.dump();
          ASSERT_TRUE(lowerAt.count(epochStart)) << s.dump();
          // Only on a plateau, or where every probe at eta* diverged (a grid of its own then).
          bool divergedAtEta = true;
          for (const auto& q : stages)
            if (q["kind"] == "probe" && q["from_step"] == epochStart &&
                std::fabs(q["lr"].get<double>() - etaLast) < 1e-12)
              divergedAtEta = divergedAtEta && q["loss"] == "diverged";
          EXPECT_TRUE(lowerAt[epochStart] || divergedAtEta) << s.dump();
        }
      }
      if (s["kind"] == "rate up") {  // the adaptive grid: only above the epoch's rate, from its start
        EXPECT_GT(s["lr"].get<double>(), etaLast * 1.5) << s.dump();
        EXPECT_LE(s["lr"].get<double>(), 0.3 + 1e-12) << s.dump();
        EXPECT_EQ(s["from_step"], epochStart);
      }
      if (s["kind"] == "momentum check") {
        const double mu = s["momentum"];
        EXPECT_TRUE(mu == 0.1 || mu == 0.2) << s.dump();
        EXPECT_EQ(s["from_step"], epochStart);
      }
    }
    // Every decision: the margin is the runner-up's loss over the winner's; the band is 2 standard
    // errors of the difference (the probes' spread) capped at 5% of the lower loss (the winner's, or
    // the best's where the last epoch's configuration was kept on a tie), or 5% without a spread;
    // a runner-up inside the band is a tie.
    ASSERT_FALSE(t["decisions"].empty());
    for (const auto& d : t["decisions"]) {
      if (!d.contains("runner_up") || !d["runner_up"].contains("loss")) continue;
      // The last epoch's configuration stays against anything within the paper's 5%, spread or not.
      if (d["what"].get<std::string>().find("(the last epoch's configuration kept)") != std::string::npos) {
        EXPECT_EQ(d["band_from"], "5%") << d.dump();
        EXPECT_LE(d["margin"].get<double>(), 0) << d.dump();  // the runner-up had the lower loss
      }
      // A lower g stays out unless it beats the higher by more than 5% (groups 1, 2: two candidates).
      if (d["what"] == "against momentum 0 at more groups (the higher g kept)") {
        EXPECT_EQ(d["band_from"], "5%") << d.dump();
        EXPECT_LE(d["margin"].get<double>(), 0) << d.dump();
        EXPECT_GT(d["groups"], d["runner_up"]["groups"]) << d.dump();
      } else if (d["what"] == "against momentum 0 at more groups" && !d["extended"].get<bool>() &&
                 d["groups"] < d["runner_up"]["groups"]) {
        EXPECT_GT(d["margin"].get<double>(), 0.05 * d["loss"].get<double>()) << d.dump();
      }
      const double margin = d["margin"].get<double>(), band = d["band"].get<double>();
      const double lower = std::min(d["loss"].get<double>(), d["runner_up"]["loss"].get<double>());
      EXPECT_NEAR(margin, d["runner_up"]["loss"].get<double>() - d["loss"].get<double>(), 1e-12);
      if (d["band_from"] == "spread") {
        const double spread = 2 * std::hypot(d["loss_se"].get<double>(), d["runner_up"]["loss_se"].get<double>());
        EXPECT_NEAR(band, std::min(spread, 0.05 * lower), 1e-12);
      } else {
        EXPECT_NEAR(band, 0.05 * lower, 1e-12);
      }
      if (margin <= band) {
        EXPECT_GT(d["tied"].get<int>(), 0) << d.dump();
      }
    }
  }
  std::sort(shares.begin(), shares.end());
  EXPECT_DOUBLE_EQ(r["tuning_share_median"].get<double>(), (shares[0] + shares[1]) / 2);
  EXPECT_THAT(p.stdoutText(), HasSubstr("10:1: regret median"));
  std::ifstream md(dir.path + "/r.md");
  std::string table((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
  EXPECT_THAT(table, HasSubstr("| ratio | seed | choice | from scratch s | regret | rank | final choice |"));
}

}  // namespace
}  // namespace poseidon
