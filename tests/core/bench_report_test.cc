// The bench report: speedups, headline ratios, the traffic histogram and the
// Markdown tables, from runs made up here (the harness itself needs root and
// is covered by integration/bench_smoke_test.cc).
#include "poseidon/bench/report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "poseidon/common/error.h"

namespace poseidon::bench {
namespace {

using ::testing::HasSubstr;

RunResult run(const std::string& system, int nodes, double mbit, double seconds) {
  RunResult r;
  r.model = "vgg19";
  r.system = system;
  r.nodes = nodes;
  r.mbit = mbit;
  r.ok = true;
  r.iterSeconds = seconds;
  r.imagesPerSec = nodes * 3 / seconds;
  r.idealSeconds = 1.0;
  r.txPerIter.assign(static_cast<size_t>(nodes), 2e6);
  r.rxPerIter.assign(static_cast<size_t>(nodes), 1e6);
  return r;
}

TEST(BenchReport, SpeedupsHeadlineAndHistogram) {
  std::vector<RunResult> runs{run("poseidon", 1, 100, 1.0), run("ddp", 1, 100, 1.0), run("poseidon", 8, 30, 1.25),
                              run("ddp", 8, 30, 2.5)};
  RunResult failed = run("ddp", 8, 100, 0);
  failed.ok = false;
  runs.push_back(failed);
  computeSpeedups(runs);
  EXPECT_EQ(runs[0].speedup, 1);
  EXPECT_DOUBLE_EQ(runs[2].speedup, 6.4);  // 8 x 1.0 / 1.25
  EXPECT_DOUBLE_EQ(runs[3].speedup, 3.2);
  EXPECT_EQ(runs[4].speedup, 0);

  nlohmann::json headline = headlineRatios(runs, {"vgg19"}, {30}, 8);
  ASSERT_EQ(headline.size(), 1u);
  EXPECT_EQ(headline[0].get<std::string>(),
            "vgg19, 8 nodes, 30 Mbit/s: poseidon 6.40x speedup (80% efficiency), measured/ideal 1.25; vs ddp 2.00x "
            "throughput");

  nlohmann::json h = trafficHistogram(runs, "vgg19", 8, 30);
  ASSERT_FALSE(h.is_null());
  EXPECT_EQ(h["bytes_per_node"]["poseidon"].size(), 8u);
  EXPECT_EQ(h["bytes_per_node"]["poseidon"][0].get<double>(), 3e6);  // sent + received
  EXPECT_TRUE(trafficHistogram(runs, "vgg19", 1, 100).is_null());    // one node: nothing crosses a link
}

TEST(BenchReport, MarkdownTables) {
  std::vector<RunResult> runs{run("poseidon", 1, 30, 1.0), run("poseidon", 8, 30, 1.25)};
  computeSpeedups(runs);
  nlohmann::json result;
  result["config"] = {{"command", "poseidon bench --quick"}, {"scale", 0.1}, {"iterations", 5}, {"warmup", 2}};
  result["runs"] = nlohmann::json::array();
  for (const auto& r : runs) result["runs"].push_back(r.toJson());
  result["headline"] = headlineRatios(runs, {"vgg19"}, {30}, 8);
  std::string path = strCat("/tmp/poseidon-report-test-", getpid(), ".md");
  writeMarkdown(path, result);
  std::ifstream f(path);
  std::stringstream md;
  md << f.rdbuf();
  std::remove(path.c_str());
  EXPECT_THAT(md.str(), HasSubstr("Command: `poseidon bench --quick`"));
  EXPECT_THAT(md.str(), HasSubstr("## vgg19 at 30 Mbit/s (3 Gbit/s at full width)"));
  EXPECT_THAT(md.str(), HasSubstr("| poseidon | 1.00x | 6.40x | 1.250 | 1.25 |"));
  EXPECT_THAT(md.str(), HasSubstr("- vgg19, 8 nodes, 30 Mbit/s: poseidon 6.40x speedup"));
}

}  // namespace
}  // namespace poseidon::bench
