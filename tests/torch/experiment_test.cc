// `poseidon experiment implicit-momentum` (docs/omnivore.md): the fit is right where the answer is
// known (one group: synchronous SGD, a = 0 and b = lr), and with four asynchronous groups most
// updates land on a model that moved since their pull. The exact race (--exact-race) gives the
// theorem's staleness law and its heavy-ball trajectory.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_helpers.h"

namespace poseidon {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;

TEST(ImplicitMomentum, OneGroupFitsPlainSgdAndFourGroupsAreStale) {
  TempDir dir;
  auto p = testing::runCli({"experiment", "implicit-momentum", "--groups", "1,4", "--workers", "4", "--steps", "24",
                            "--batch", "256", "--lr", "0.05", "--step-ms", "5", "--runs", "4", "--burn-in", "4",
                            "--fit-sample", "256", "--json", dir.path + "/im.json"},
                           dir.path + "/im");
  ASSERT_EQ(p.exitCode(), 0) << p.stderrText();
  EXPECT_THAT(p.stdoutText(), HasSubstr("results written to " + dir.path + "/im.json"));
  std::ifstream f(dir.path + "/im.json");
  auto j = nlohmann::json::parse(f);
  ASSERT_EQ(j["results"].size(), 2u);
  const auto& one = j["results"][0];
  EXPECT_EQ(one["groups"], 1);
  EXPECT_EQ(one["updates"], 24);
  // Synchronous: every update is the gradient at the model it lands on (batches drawn from the
  // fit's sample, so the sample's gradient is their expectation; four runs leave some noise).
  EXPECT_NEAR(one["a"].get<double>(), 0.0, 0.1) << one.dump();
  EXPECT_NEAR(one["b"].get<double>(), 0.05, 0.01) << one.dump();
  EXPECT_EQ(one["staleness_histogram"], nlohmann::json({{"0", 96}}));  // 24 updates x 4 runs
  const auto& four = j["results"][1];
  EXPECT_EQ(four["groups"], 4);
  EXPECT_EQ(four["updates"], 96);  // 24 steps x 4 groups
  EXPECT_DOUBLE_EQ(four["predicted_a"].get<double>(), 0.75);
  // Loose on purpose: the staleness law depends on compute times, which a loaded machine stretches.
  EXPECT_GT(four["mean_staleness"].get<double>(), 1.0) << four.dump();
  EXPECT_LT(four["fresh_share"].get<double>(), 0.6) << four.dump();
}

TEST(ImplicitMomentum, TheExactRaceFollowsTheHeavyBallTrajectory) {
  TempDir dir;
  auto p = testing::runCli(
      {"experiment", "implicit-momentum", "--exact-race", "--groups", "1,4", "--workers", "4", "--steps", "8",
       "--batch", "64", "--runs", "16", "--fit-sample", "256", "--bootstrap", "200", "--json", dir.path + "/race.json"},
      dir.path + "/race");
  ASSERT_EQ(p.exitCode(), 0) << p.stderrText();
  std::ifstream f(dir.path + "/race.json");
  auto j = nlohmann::json::parse(f);
  EXPECT_EQ(j["mode"], "exact-race");
  EXPECT_EQ(j["g"], nlohmann::json({1, 4}));
  EXPECT_EQ(j["one_minus_inv_g"], nlohmann::json({0.0, 0.75}));
  const auto& one = j["results"][0];
  EXPECT_EQ(one["updates"], 8);
  EXPECT_EQ(one["staleness_histogram"], nlohmann::json({{"0", 128}}));  // 8 turns x 16 runs, all fresh
  // One group is plain SGD: no momentum, and its heavy-ball model (momentum 0) is SGD itself.
  EXPECT_NEAR(one["a"].get<double>(), 0.0, 0.1) << one.dump();
  EXPECT_DOUBLE_EQ(one["heavy_ball_error"].get<double>(), one["sgd_error"].get<double>());
  const auto& four = j["results"][1];
  EXPECT_EQ(four["updates"], 32);  // 8 turns per group on average, 32 in all
  int64_t updates = 0;
  for (const auto& [staleness, n] : four["staleness_histogram"].items()) updates += n.get<int64_t>();
  EXPECT_EQ(updates, 32 * 16);
  // The drawn order gives the geometric law: a fresh update with probability 1/4 (512 updates:
  // standard error 0.02), whatever the machine's timing.
  EXPECT_NEAR(four["fresh_share"].get<double>(), 0.25, 0.08) << four.dump();
  // The mean of 16 runs is near the heavy ball's trajectory, far from SGD's, and the fitted a with
  // its interval lands near 1 - 1/4.
  EXPECT_LT(four["heavy_ball_error"].get<double>(), 0.5 * four["sgd_error"].get<double>()) << four.dump();
  EXPECT_NEAR(four["a"].get<double>(), 0.75, 0.15) << four.dump();
  EXPECT_LE(four["a_ci95"][0].get<double>(), four["a"].get<double>());
  EXPECT_GE(four["a_ci95"][1].get<double>(), four["a"].get<double>());
}

TEST(ImplicitMomentum, BadFlagsAreOneLineErrors) {
  TempDir dir;
  auto p = testing::runCli({"experiment", "implicit-momentum", "--groups", "3", "--workers", "4"}, dir.path + "/a");
  EXPECT_EQ(p.exitCode(), 2);
  EXPECT_THAT(p.stderrText(), HasSubstr("--groups 3 does not divide --workers 4"));
  auto q = testing::runCli({"experiment", "momentum"}, dir.path + "/b");
  EXPECT_EQ(q.exitCode(), 2);
  EXPECT_THAT(q.stderrText(), HasSubstr("unknown experiment 'momentum' (try: implicit-momentum)"));
  auto r = testing::runCli({"experiment", "implicit-momentum", "--json", dir.path + "/no/such/dir/x.json"},
                           dir.path + "/c");
  EXPECT_EQ(r.exitCode(), 2);
  EXPECT_THAT(r.stderrText(), HasSubstr("--json " + dir.path + "/no/such/dir/x.json: cannot create files in " + dir.path +
                                        "/no/such/dir: No such file or directory"));
  auto s = testing::runCli({"experiment", "implicit-momentum", "--exact-race", "--fixed-times"}, dir.path + "/d");
  EXPECT_EQ(s.exitCode(), 2);
  EXPECT_THAT(s.stderrText(), HasSubstr("--fixed-times is the wall-clock mode's"));
  // A flag of the other mode would change nothing, and a burn-in past the run shrank to fit it.
  const std::pair<std::vector<std::string>, std::string> otherMode[] = {
      {{"--exact-race", "--step-ms", "5"}, "--step-ms is the wall-clock mode's; --exact-race draws the order"},
      {{"--exact-race", "--burn-in", "2"}, "--burn-in is the wall-clock mode's; --exact-race draws the order"},
      {{"--bootstrap", "10"}, "--bootstrap is the exact race's; it needs --exact-race"},
      {{"--lr-curvature", "0.5"}, "--lr-curvature is the exact race's; it needs --exact-race"},
      {{"--burn-in", "38", "--steps", "40", "--groups", "2,1"},
       "--burn-in 38 leaves fewer than 3 of the 40 updates to fit at --groups 1 (--steps 40 x 1)"},
  };
  for (const auto& [flags, message] : otherMode) {
    std::vector<std::string> args{"experiment", "implicit-momentum"};
    args.insert(args.end(), flags.begin(), flags.end());
    auto m = testing::runCli(args, dir.path + "/m");
    EXPECT_EQ(m.exitCode(), 2) << message;
    EXPECT_EQ(m.stderrText(), "poseidon experiment: error: " + message + "\n");
  }
  auto t = testing::runCli({"experiment", "implicit-momentum", "--exact-race", "--runs", "1"}, dir.path + "/e");
  EXPECT_EQ(t.exitCode(), 2);
  EXPECT_THAT(t.stderrText(), HasSubstr("--exact-race needs --runs >= 2"));
  auto u = testing::runCli({"experiment", "implicit-momentum", "--exact-race", "--groups", "8", "--runs", "5000",
                            "--steps", "40"},
                           dir.path + "/f");
  EXPECT_EQ(u.exitCode(), 2);
  EXPECT_THAT(u.stderrText(), HasSubstr("(2 x --runs 5000 x 319 updates x 7850 floats); the limit is 8 GiB"));
}

}  // namespace
}  // namespace poseidon
