// The bench report: speedups, headline ratios, the traffic histogram and the
// Markdown tables, from runs made up here (the harness itself needs root and
// is covered by integration/bench_smoke_test.cc).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "poseidon/bench/emulation.h"
#include "poseidon/bench/report.h"
#include "poseidon/common/error.h"

namespace poseidon::bench {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

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

// The results JSON that the harness writes, from these runs.
nlohmann::json resultOf(const std::vector<RunResult>& runs, nlohmann::json config) {
  nlohmann::json result;
  result["config"] = std::move(config);
  result["runs"] = nlohmann::json::array();
  for (const auto& r : runs) result["runs"].push_back(r.toJson());
  return result;
}

// writeMarkdown's file, read back.
std::string markdownOf(const nlohmann::json& result) {
  std::string path = strCat("/tmp/poseidon-report-test-", getpid(), ".md");
  writeMarkdown(path, result);
  std::ifstream f(path);
  std::stringstream md;
  md << f.rdbuf();
  std::remove(path.c_str());
  return md.str();
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
  // Without one-node runs there is no speedup to state, only the ratios.
  std::vector<RunResult> alone{run("poseidon", 8, 30, 1.25), run("ddp", 8, 30, 2.5)};
  computeSpeedups(alone);
  EXPECT_EQ(headlineRatios(alone, {"vgg19"}, {30}, 8)[0].get<std::string>(),
            "vgg19, 8 nodes, 30 Mbit/s: poseidon measured/ideal 1.25; vs ddp 2.00x throughput");

  nlohmann::json h = trafficHistogram(runs, "vgg19", 8, 30);
  ASSERT_FALSE(h.is_null());
  EXPECT_EQ(h["bytes_per_node"]["poseidon"].size(), 8u);
  EXPECT_EQ(h["bytes_per_node"]["poseidon"][0].get<double>(), 3e6);  // sent + received
  EXPECT_TRUE(trafficHistogram(runs, "vgg19", 1, 100).is_null());    // one node: nothing crosses a link
}

TEST(BenchReport, MarkdownTables) {
  std::vector<RunResult> runs{run("poseidon", 1, 30, 1.0), run("poseidon", 8, 30, 1.25)};
  computeSpeedups(runs);
  nlohmann::json result =
      resultOf(runs, {{"command", "poseidon bench --quick"}, {"scale", 0.1}, {"iterations", 5}, {"warmup", 2}});
  result["headline"] = headlineRatios(runs, {"vgg19"}, {30}, 8);
  const std::string md = markdownOf(result);
  EXPECT_THAT(md, HasSubstr("Command: `poseidon bench --quick`"));
  EXPECT_THAT(md, HasSubstr("## vgg19 at 30 Mbit/s (3 Gbit/s at full width)"));
  EXPECT_THAT(md, HasSubstr("| poseidon | 1.00x | 6.40x | 1.250 | 0.000 | 0.000 | 0.00 | 1.25 | - |"));
  EXPECT_THAT(md, HasSubstr("- vgg19, 8 nodes, 30 Mbit/s: poseidon 6.40x speedup"));
}

// A sweep without one-node runs has no speedup to show: "-", not 0.00x.
TEST(BenchReport, NoOneNodeRunNoSpeedup) {
  std::vector<RunResult> runs{run("poseidon-bf16", 8, 30, 1.25)};
  computeSpeedups(runs);
  const std::string md = markdownOf(
      resultOf(runs, {{"command", "poseidon bench --nodes 8"}, {"scale", 0.1}, {"iterations", 5}, {"warmup", 2}}));
  EXPECT_THAT(md, HasSubstr("| poseidon-bf16 | - | - | 1.250 |"));
}

TEST(BenchReport, OwnBoundIsTheBusiestNodesBytesOrCompute) {
  RunResult r = run("ddp", 2, 30, 1.0);
  r.txPerIter = {3e6, 1e6};
  r.rxPerIter = {1e6, 3.75e6};  // node 1 receives the most: 3.75 MB x 8 / 30 Mbit/s = 1.0 s
  EXPECT_DOUBLE_EQ(ownBoundSeconds(r, 0.5), 1.0);
  EXPECT_DOUBLE_EQ(ownBoundSeconds(r, 1.5), 1.5);  // compute-bound
  // A model at its whole-batch width ran its links slower than the column's rate: its bound is theirs.
  r.emulatedMbit = 24;
  EXPECT_DOUBLE_EQ(ownBoundSeconds(r, 0.5), 1.25);
}

TEST(BenchReport, RepeatedRunsChargesAndTunedBucketsInTheTable) {
  RunResult one = run("poseidon@cpu:1", 1, 30, 1.0);
  RunResult big = run("poseidon@cpu:1", 8, 30, 1.25);
  big.repeatSeconds = {1.3, 1.25, 1.2};
  big.minSeconds = 1.2;
  big.maxSeconds = 1.3;
  big.slowestRankSeconds = 1.28;
  big.ownBoundSeconds = ownBoundSeconds(big, 1.0);  // 2 MB sent per node: 0.533 s < compute
  big.charged = {{"gemm", 0.2}, {"sum", 0.01}, {"crypto", 0.05}};
  RunResult tunedOne = run("ddp-tuned", 1, 30, 1.0);
  RunResult tuned = run("ddp-tuned", 8, 30, 2.0);
  tuned.bucketMb = 0.05;  // 5 MB at full width (s = 0.1)
  tuned.tuning = {{"1", 2.2}, {"5", 2.0}, {"25", 2.1}};
  tuned.repeatSeconds = {2.0};
  tuned.minSeconds = tuned.maxSeconds = tuned.slowestRankSeconds = 2.0;
  tuned.ownBoundSeconds = 1.6;
  std::vector<RunResult> runs{one, big, tunedOne, tuned};
  computeSpeedups(runs);
  nlohmann::json result =
      resultOf(runs, {{"command", "poseidon bench"}, {"scale", 0.1}, {"iterations", 8}, {"warmup", 3}, {"repeat", 3}});
  EXPECT_DOUBLE_EQ(result["runs"][1]["measured_over_own_bound"].get<double>(), 1.25);
  const std::string md = markdownOf(result);
  EXPECT_THAT(md, HasSubstr("the median of 3 runs per point"));
  EXPECT_THAT(md,
              HasSubstr("| poseidon@cpu:1 | 1.00x | 6.40x | 1.250 (1.200-1.300) | 1.280 | 1.000 | 1.25 | 1.25 | 0.260 |"));
  EXPECT_THAT(md, HasSubstr("| ddp-tuned | 1.00x | 4.00x | 2.000 (2.000-2.000), 5 MB buckets | 2.000 | 1.600 | 1.25 "
                                  "| 2.00 | - |"));
  // A model that ran at its whole-batch width (model_scales) had its caps scaled by that width.
  std::vector<RunResult> wide = runs;
  wide[3].bucketMb = 5 * 0.09375 * 0.09375;
  const std::string wideMd = markdownOf(resultOf(wide, {{"command", "poseidon bench"},
                                                        {"scale", 0.1},
                                                        {"iterations", 8},
                                                        {"warmup", 3},
                                                        {"repeat", 3},
                                                        {"model_scales", {{wide[3].model, 0.09375}}}}));
  EXPECT_THAT(wideMd, HasSubstr("2.000 (2.000-2.000), 5 MB buckets"));
}

// What the scaling changes, said in the results' introduction: one run per point, Poseidon's receive
// buffer, and a batch that rounds at scale s (vgg19: 32 x 0.1 = 3.2 -> 3 rows of factors; googlenet's
// 128 x 0.1 = 12.8 -> 13), but not one that does not (alexnet's 256 x 0.125 = 32).
TEST(BenchReport, IntroductionSaysWhatTheScalingChanges) {
  std::vector<RunResult> runs{run("poseidon", 8, 30, 1.0)};
  computeSpeedups(runs);
  nlohmann::json batches{{"vgg19", {{"scaled", 3}, {"full", 32}}}, {"googlenet", {{"scaled", 13}, {"full", 128}}}};
  const std::string md = markdownOf(resultOf(runs, {{"command", "poseidon bench"},
                                                    {"scale", 0.1},
                                                    {"iterations", 4},
                                                    {"warmup", 2},
                                                    {"tcp_rcvbuf", 16384},
                                                    {"batches", batches}}));
  EXPECT_THAT(md, HasSubstr("warm-up ones; iteration time is rank 0's median; one run per point. Every node's TCP "
                            "ran the host's default congestion control (not recorded;"));
  EXPECT_THAT(markdownOf(resultOf(runs, {{"command", "poseidon bench"},
                                         {"scale", 0.1},
                                         {"iterations", 4},
                                         {"warmup", 2},
                                         {"tcp_congestion_control", "reno"}})),
              HasSubstr("one run per point. Every node's TCP ran reno (`--tcp-cc`)."));
  EXPECT_THAT(md, Not(HasSubstr("--tcp-quickack")));
  EXPECT_THAT(markdownOf(resultOf(runs, {{"command", "poseidon bench"},
                                         {"scale", 0.1},
                                         {"iterations", 4},
                                         {"warmup", 2},
                                         {"tcp_congestion_control", "cubic"},
                                         {"tcp_quickack", true}})),
              HasSubstr("Every node's TCP ran cubic (`--tcp-cc`). Every node acknowledged each segment at once "
                        "(`--tcp-quickack`: no delayed ACK)."));
  EXPECT_THAT(md, HasSubstr("Every rank ran with the kernel's default timer slack (not recorded; 50 us)"));
  EXPECT_THAT(
      markdownOf(resultOf(
          runs,
          {{"command", "poseidon bench"}, {"scale", 0.1}, {"iterations", 4}, {"warmup", 2}, {"timer_slack_ns", 1}})),
      HasSubstr("Every rank ran with a timer slack of 1 ns, so that the sleeps"));
  EXPECT_THAT(md,
              HasSubstr("Poseidon's ranks ran with a 16384-byte TCP receive buffer per connection (--tcp-rcvbuf)."));
  EXPECT_THAT(markdownOf(resultOf(runs, {{"command", "poseidon bench"},
                                         {"scale", 0.1},
                                         {"iterations", 4},
                                         {"warmup", 2},
                                         {"tcp_rcvbuf", 16384},
                                         {"systems", {"poseidon", "ddp-fp16"}}})),
              HasSubstr("(--tcp-rcvbuf); DDP's with the OS default."));
  // The runtime's own receive buffer (priority links) is said only by files that ran it; -1 is the OS's.
  const nlohmann::json overlap{"poseidon-overlap", "ddp-fp16"};
  EXPECT_THAT(markdownOf(resultOf(runs, {{"command", "poseidon bench"},
                                         {"scale", 0.1},
                                         {"iterations", 4},
                                         {"warmup", 2},
                                         {"receive_buffer_auto", true},
                                         {"systems", overlap}})),
              HasSubstr("The poseidon-overlap systems' ranks ran with the runtime's TCP receive buffer per connection, "
                        "the send window and a third (VanOptions::receiveBufferBytes); DDP's with the OS default."));
  // Files of rule 3 (seven eighths of the window past 8 peers, FIFO nodes) say so.
  EXPECT_THAT(markdownOf(resultOf(runs, {{"command", "poseidon bench"},
                                         {"scale", 0.1},
                                         {"iterations", 4},
                                         {"warmup", 2},
                                         {"receive_buffer_auto", true},
                                         {"receive_buffer_rule", 3},
                                         {"systems", overlap}})),
              HasSubstr("the runtime's TCP receive buffer per connection, the send window and a third up to 8 peers "
                        "and seven eighths of it past them (VanOptions::receiveBufferBytes); DDP's"));
  // Since rule 3, ranks told their queue is two-band keep the window and a third at any size (rule 2,
  // a trial, took seven eighths on any queue).
  nlohmann::json told{{"command", "poseidon bench"},
                      {"scale", 0.1},
                      {"iterations", 4},
                      {"warmup", 2},
                      {"receive_buffer_auto", true},
                      {"receive_buffer_rule", 3},
                      {"host_queue", "tos"},
                      {"systems", overlap}};
  EXPECT_THAT(markdownOf(resultOf(runs, told)),
              HasSubstr("per connection, the send window and a third (VanOptions::receiveBufferBytes); DDP's"));
  told["receive_buffer_rule"] = 2;
  EXPECT_THAT(markdownOf(resultOf(runs, told)), HasSubstr("and seven eighths of it past them"));
  told["receive_buffer_rule"] = 4;  // since 2026-12-04 on any queue again
  EXPECT_THAT(markdownOf(resultOf(runs, told)), HasSubstr("and seven eighths of it past them"));
  EXPECT_THAT(
      markdownOf(resultOf(
          runs,
          {{"command", "poseidon bench"}, {"scale", 0.1}, {"iterations", 4}, {"warmup", 2}, {"systems", overlap}})),
      Not(HasSubstr("receive buffer")));
  EXPECT_THAT(markdownOf(resultOf(runs, {{"command", "poseidon bench"},
                                         {"scale", 0.1},
                                         {"iterations", 4},
                                         {"warmup", 2},
                                         {"tcp_rcvbuf", -1},
                                         {"systems", overlap}})),
              HasSubstr("Poseidon's ranks ran with the OS's TCP receive buffers (--tcp-rcvbuf -1)."));
  EXPECT_THAT(md, HasSubstr("vgg19's SFB factors carry K = 3 rows a worker where 32 x s is 3.2: 0.94x the bytes"));
  EXPECT_THAT(md, HasSubstr("googlenet's SFB factors carry K = 13 rows a worker where 128 x s is 12.8: 1.02x"));
  nlohmann::json whole = nlohmann::json::object();
  whole["alexnet"] = {{"scaled", 32}, {"full", 256}};
  const std::string exact = markdownOf(resultOf(
      runs, {{"command", "poseidon bench"}, {"scale", 0.125}, {"iterations", 4}, {"warmup", 2}, {"batches", whole}}));
  EXPECT_THAT(exact, Not(HasSubstr("SFB factors carry")));
  EXPECT_THAT(exact, Not(HasSubstr("receive buffer")));
  // Files that record each model's width (every bench since whole batches) say where it ran instead.
  nlohmann::json scales{{"vgg19", 0.09375}, {"googlenet", 0.1015625}};
  nlohmann::json wholeBatches{{"vgg19", {{"scaled", 3}, {"full", 32}}}, {"googlenet", {{"scaled", 13}, {"full", 128}}}};
  const std::string widths = markdownOf(resultOf(runs, {{"command", "poseidon bench"},
                                                        {"scale", 0.1},
                                                        {"iterations", 4},
                                                        {"warmup", 2},
                                                        {"batches", wholeBatches},
                                                        {"model_scales", scales}}));
  EXPECT_THAT(widths, HasSubstr("vgg19 ran at width 0.09375, where its batch is whole (32 x 0.09375 = 3 rows a "
                                "worker; 32 x 0.1 is 3.2), its links at 0.8789 x each rate"));
  EXPECT_THAT(widths, HasSubstr("googlenet ran at width 0.101562, where its batch is whole (128 x 0.101562 = 13 "
                                "rows a worker; 128 x 0.1 is 12.8), its links at 1.031 x each rate"));
  EXPECT_THAT(widths, Not(HasSubstr("SFB factors carry")));
}

// A model whose batch x s is not whole runs at the width s' where it is, its links at rate x (s'/s)^2:
// every message, SFB's factors included, is then s'^2 of full width's, where rounding K s to 3 left
// vgg19's factors 6% light.
TEST(BenchEmulation, AModelRunsAtTheWidthWhereItsBatchIsWhole) {
  const EmulatedModel vgg = emulatedModel("vgg19", 0.1);
  EXPECT_DOUBLE_EQ(vgg.scale, 3.0 / 32);
  EXPECT_EQ(vgg.batch, 3);
  EXPECT_EQ(vgg.fullBatch, 32);
  EXPECT_DOUBLE_EQ(wholeBatchScale("vgg19", 0.1), 0.09375);
  EXPECT_DOUBLE_EQ(emulatedMbit(vgg.scale, 30, 0.1), 30 * 0.9375 * 0.9375);
  // fc7 (4096 x 4096) at width 3/32 is 384 x 384: a worker's factors K (M + N) are s'^2 of full width's.
  const ModelDesc full = emulatedModel("vgg19", 1.0).desc;
  auto sfbFloats = [](const ModelDesc& d, int64_t batch) {
    for (const auto& l : d.layers)
      if (l.name == "fc7")
        return static_cast<double>(batch) * static_cast<double>(l.params[0].shape[0] + l.params[0].shape[1]);
    return 0.0;
  };
  const double ratio = sfbFloats(vgg.desc, vgg.batch) / sfbFloats(full, 32);
  EXPECT_DOUBLE_EQ(ratio, vgg.scale * vgg.scale);
  // The old rule (still how older results files are read): width s, the batch rounded, 6% light.
  const EmulatedModel old = emulatedModel("vgg19", 0.1, "titanx", /*wholeBatch=*/false);
  EXPECT_DOUBLE_EQ(old.scale, 0.1);
  EXPECT_EQ(old.batch, 3);
  EXPECT_NEAR(sfbFloats(old.desc, old.batch) / sfbFloats(full, 32) / (0.1 * 0.1), 0.9375, 0.01);
  // Whole already: unchanged. Full width: unchanged.
  EXPECT_DOUBLE_EQ(emulatedModel("vgg19", 0.125).scale, 0.125);
  EXPECT_DOUBLE_EQ(emulatedModel("vgg19", 1.0).scale, 1.0);
  EXPECT_DOUBLE_EQ(emulatedMbit(emulatedModel("vgg19", 0.125).scale, 30, 0.125), 30);
  // At least one row a worker.
  EXPECT_DOUBLE_EQ(wholeBatchScale("vgg19", 0.001), 1.0 / 32);
  EXPECT_THROW(emulatedModel("vgg19", 0), InvalidArgument);
  EXPECT_THROW(emulatedModel("vgg19", 1.5), InvalidArgument);
}

TEST(BenchReport, HostBoundRunsAreMarked) {
  std::vector<RunResult> runs{run("poseidon", 1, 30, 1.0), run("poseidon", 8, 30, 1.25)};
  runs[1].cpuPerIter.assign(8, 0.3);
  runs[1].hostCpuShare = 0.9;  // 8 ranks x 0.3 s per 1.25 s iteration on 2 cores would be 0.96
  EXPECT_TRUE(runs[1].hostBound());
  runs[0].hostCpuShare = 0.8;
  EXPECT_FALSE(runs[0].hostBound());
  computeSpeedups(runs);
  nlohmann::json result =
      resultOf(runs, {{"command", "poseidon bench"}, {"scale", 0.1}, {"iterations", 8}, {"warmup", 3}});
  EXPECT_TRUE(result["runs"][1]["host_bound"].get<bool>());
  EXPECT_EQ(result["runs"][1]["cpu_seconds_per_iteration"].size(), 8u);
  const std::string md = markdownOf(result);
  EXPECT_THAT(md, HasSubstr("| poseidon | 1.00x | 6.40x | 1.250 HOST-BOUND (90% of the host's CPU) |"));
}

}  // namespace
}  // namespace poseidon::bench
