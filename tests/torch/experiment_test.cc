// `poseidon experiment implicit-momentum` (docs/omnivore.md): the fit is right where the answer is
// known (one group: synchronous SGD, a = 0 and b = lr), and with four asynchronous groups most
// updates land on a model that moved since their pull.
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
  EXPECT_NE(r.exitCode(), 0);
  EXPECT_THAT(r.stderrText(), HasSubstr("results file"));
}

}  // namespace
}  // namespace poseidon
