// Time to accuracy (docs/time_to_accuracy.md): poseidon train's padded compute and accuracy curve,
// and poseidon bench --accuracy end to end on a small emulated cluster (when this machine can
// build one: root and iproute2; skipped with the reason otherwise). poseidon tune's runs on it:
// tune_accuracy_test.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_helpers.h"
#include "poseidon/bench/cluster.h"
#include "poseidon/common/error.h"
#include "poseidon/common/file.h"
#include "poseidon/data/fashion_mnist.h"
#include "poseidon/torch/models.h"

namespace poseidon {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::readJson;
using testing::TempDir;
namespace fs = std::filesystem;

TEST(TimeToAccuracy, PaddedStepsAndTheCurveOfModelCopies) {
  TempDir dir;
  const double padMs = 40;
  auto p = testing::runCli(
      {"train", "--workers", "4", "--train-limit", "2048", "--epochs", "2", "--max-steps", "12", "--pad-ms", "40",
       "--curve-every", "4", "--quiet", "--timeout", "60000", "--summary", dir.path + "/s.json"},
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
    double overruns = s["pad_overruns_per_rank"][r].get<double>(),
           maxMs = s["max_compute_ms_per_rank"][r].get<double>();
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

// --curve-loss-samples (poseidon tune's probe signal): each model copy's mean loss on N fixed training
// images, evenly spaced over the (limited) training set. The last copy is the final model, so its
// score must equal the same loss computed here, from the saved parameters, in double.
TEST(TimeToAccuracy, SampleLossScoresEachCopyOnFixedTrainingImages) {
  TempDir dir;
  const int64_t limit = 2048, n = 500;
  auto p = testing::runCli({"train", "--workers", "1", "--train-limit", std::to_string(limit), "--max-steps", "6",
                            "--curve-every", "3", "--curve-loss-samples", std::to_string(n), "--threads", "1",
                            "--quiet", "--save-params", dir.path + "/final.bin", "--summary", dir.path + "/s.json"},
                           dir.path + "/log");
  ASSERT_EQ(p.exitCode(), 0) << p.stderrText();
  auto s = readJson(dir.path + "/s.json");
  ASSERT_EQ(s["curve"].size(), 2u) << s["curve"].dump();

  pt::AnyNet net = pt::makeModel("lenet");
  auto params = net.module->parameters();
  std::vector<float> saved = testing::readFloats(dir.path + "/final.bin");
  size_t at = 0;
  torch::NoGradGuard guard;
  for (auto& t : params) {
    ASSERT_LE(at + static_cast<size_t>(t.numel()), saved.size());
    t.copy_(torch::from_blob(saved.data() + at, t.sizes(), torch::kFloat));
    at += static_cast<size_t>(t.numel());
  }
  ASSERT_EQ(at, saved.size());
  net.module->eval();
  data::Dataset train = data::loadFashionMnist(data::kDefaultFashionMnistDir, true);
  const int64_t px = static_cast<int64_t>(train.rows) * train.cols;
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t index = i * limit / n;  // evenly spaced over the 2048 images trained on
    torch::Tensor x = torch::empty({1, 1, train.rows, train.cols});
    data::normalizeInto(train, index, x.data_ptr<float>());
    torch::Tensor logp = torch::log_softmax(net.forward(x), 1);
    sum -= logp[0][train.labels[static_cast<size_t>(index)]].item<double>();
  }
  ASSERT_EQ(px, 784);
  const double expected = sum / static_cast<double>(n);
  const double last = s["curve"][1]["sample_loss"].get<double>(), first = s["curve"][0]["sample_loss"].get<double>();
  EXPECT_NEAR(last, expected, 1e-5 * expected);
  // Six steps move the model: the step-3 copy scores differently (and both are real losses).
  EXPECT_GT(first, 0);
  EXPECT_GT(std::fabs(first - last), 1e-4) << first << " " << last;

  auto bad =
      testing::runCli({"train", "--workers", "1", "--curve-loss-samples", "10", "--max-steps", "1"}, dir.path + "/bad");
  EXPECT_EQ(bad.exitCode(), 2);
  EXPECT_THAT(bad.stderrText(),
              HasSubstr("--curve-loss-samples scores the curve's model copies: it needs --curve-every"));
}

// --allow-divergence: a diverged run is a result. In BSP the job stops at the step whose mean gradient
// is not finite (checked against the same job run up to the step before, which does not diverge, and
// up to that step, which fails with it), the rest of that epoch is not trained, no checkpoint of the
// diverged model is written, and the curve ends at that step.
TEST(TimeToAccuracy, AllowDivergenceEndsTheJobWhereTheModelStopsBeingFinite) {
  TempDir dir;
  // 2 workers x batch 32 over 256 images: 4 steps an epoch; lr 1 with momentum 0.9 (no warm-up)
  // diverges in a few. Every layer by PS, so that one compute group trains the same model bit for bit
  // (below).
  const std::vector<std::string> job{"train",  "--workers",     "2",   "--batch",  "32",   "--lr",
                                     "1",      "--warmup-steps", "0",   "--momentum", "0.9", "--scheme",
                                     "ps",     "--train-limit",  "256", "--epochs", "10",   "--threads",
                                     "1",      "--quiet"};
  auto args = [&](std::vector<std::string> more) {
    std::vector<std::string> a = job;
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  // --curve-every 40: no point is due before the budget; the one point is the diverged model's.
  auto p = testing::runCli(args({"--max-steps", "40", "--curve-every", "40", "--allow-divergence", "--checkpoint",
                                 dir.path + "/ck", "--summary", dir.path + "/s.json"}),
                           dir.path + "/log");
  ASSERT_EQ(p.exitCode(), 0) << p.stdoutText() << p.stderrText();
  auto s = readJson(dir.path + "/s.json");
  ASSERT_TRUE(s["diverged_at_step"].is_number()) << s.dump();
  EXPECT_EQ(s["diverged"], true);
  const int d = s["diverged_at_step"];
  ASSERT_GE(d, 2);
  ASSERT_LT(d, 36);  // well inside the budget: the job stopped, not ran out
  EXPECT_EQ(s["steps"], d);
  EXPECT_EQ(s["epochs_run"].size(), static_cast<size_t>((d + 3) / 4));  // stopped at the end of d's epoch
  ASSERT_EQ(s["curve"].size(), 1u) << s["curve"].dump();
  EXPECT_EQ(s["curve"][0]["step"], d);
  EXPECT_TRUE(s["curve"][0]["train_loss"].is_null() || s["curve"][0]["train_loss"].get<double>() > 10)
      << s["curve"].dump();
  EXPECT_THAT(p.stdoutText(), HasSubstr("stopped: the model diverged at step " + std::to_string(d)));
  EXPECT_THAT(p.stderrText(), Not(HasSubstr("error")));
  // Per-epoch checkpoints: those of the epochs before d's, none of the diverged model.
  std::vector<std::string> saved;
  for (const auto& e : fs::directory_iterator(dir.path + "/ck")) {
    if (e.path().filename() != DirectoryLock::kFileName) saved.push_back(e.path().filename().string());  // rank 0's
  }
  std::sort(saved.begin(), saved.end());
  std::vector<std::string> expected;
  for (int step = 4; step < d; step += 4) {
    char name[32];
    std::snprintf(name, sizeof name, "step-%09d", step);
    expected.push_back(name);
  }
  EXPECT_EQ(saved, expected);
  // The same job without the flag: up to step d - 1 it trains a finite model; up to d it is an error
  // at step d, with the model of step d - 1 (the diverged update is not applied).
  auto upTo = [&](int steps) {
    const std::string out = strCat(dir.path, "/p", steps, ".bin");
    auto q = testing::runCli(args({"--max-steps", std::to_string(steps), "--save-params", out}),
                             strCat(dir.path, "/ref", steps));
    std::vector<float> v = testing::readFloats(out);
    EXPECT_GT(v.size(), 400000u);
    EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); }));
    return std::make_pair(std::move(q), std::move(v));
  };
  auto [before, beforeParams] = upTo(d - 1);
  EXPECT_EQ(before.exitCode(), 0) << before.stderrText();
  auto [at, atParams] = upTo(d);
  EXPECT_EQ(at.exitCode(), 3) << at.stderrText();
  EXPECT_THAT(at.stderrText(), HasSubstr(strCat("poseidon train: error: the training diverged at step ", d)));
  EXPECT_EQ(atParams, beforeParams);

  // One compute group trains BSP's model, but the shards apply each update: the first look at step d's
  // is round d + 1's pull. That round runs (its push keeps the shards' rounds whole) and is not
  // counted: the job reports the same step, steps and clock as BSP.
  // A curve point every step: the last, at d, is the diverged model (its sample loss is not finite, so
  // null), not the model step d started from, which its point held until the next pull showed more.
  auto one = testing::runCli(args({"--groups", "1", "--max-steps", "40", "--allow-divergence", "--curve-every", "1",
                                   "--curve-loss-samples", "64", "--summary", dir.path + "/one.json"}),
                             dir.path + "/one");
  ASSERT_EQ(one.exitCode(), 0) << one.stdoutText() << one.stderrText();
  auto os = readJson(dir.path + "/one.json");
  EXPECT_EQ(os["diverged_at_step"], d) << os.dump();
  EXPECT_EQ(os["steps"], d);
  EXPECT_THAT(one.stdoutText(), HasSubstr("stopped: the model diverged at step " + std::to_string(d)));
  ASSERT_EQ(os["curve"].size(), static_cast<size_t>(d)) << os["curve"].dump();
  EXPECT_EQ(os["curve"][d - 1]["step"], d);
  EXPECT_TRUE(os["curve"][d - 1]["sample_loss"].is_null()) << os["curve"].dump();
  EXPECT_TRUE(os["curve"][d - 2]["sample_loss"].is_number()) << os["curve"].dump();

  // Compute groups: each group stops on its own pulled model; the job still ends cleanly at the
  // epoch's end, across the groups' checkpoints (collectives the skipped steps keep), with no
  // checkpoint after the reported step (the first any rank found).
  auto g = testing::runCli({"train",
                            "--workers",
                            "4",
                            "--groups",
                            "2",
                            "--batch",
                            "16",
                            "--lr",
                            "1",
                            "--momentum",
                            "0.9",
                            "--warmup-steps",
                            "0",
                            "--train-limit",
                            "512",
                            "--epochs",
                            "10",
                            "--max-steps",
                            "40",
                            "--threads",
                            "1",
                            "--quiet",
                            "--allow-divergence",
                            "--checkpoint",
                            dir.path + "/gck",
                            "--checkpoint-every",
                            "2",
                            "--summary",
                            dir.path + "/g.json"},
                           dir.path + "/glog");
  ASSERT_EQ(g.exitCode(), 0) << g.stdoutText() << g.stderrText();
  auto gs = readJson(dir.path + "/g.json");
  ASSERT_TRUE(gs["diverged_at_step"].is_number()) << gs.dump();
  const int gd = gs["diverged_at_step"];
  EXPECT_EQ(gs["steps"], gd);
  // gd steps ran on a finite model. The job stopped at the end of the epoch where that was found: gd's,
  // or, where gd ends an epoch whose evaluation still saw a finite model (another group's update can
  // come after it), the next one.
  const size_t epochs = gs["epochs_run"].size();
  EXPECT_TRUE(epochs == static_cast<size_t>((gd + 7) / 8) || (gd % 8 == 0 && epochs == static_cast<size_t>(gd / 8 + 1)))
      << epochs << " epochs for step " << gd;
  // Some group found it after step gd (in the model it pulled for the next round): the shards' model
  // was not finite by then, so no later checkpoint was saved.
  EXPECT_THAT(g.stdoutText(), HasSubstr(strCat("stopped: the model diverged at step ", gd)));
  EXPECT_TRUE(gs["diverged_rank"].is_number()) << gs.dump();
  for (const auto& e : fs::directory_iterator(dir.path + "/gck")) {
    const std::string name = e.path().filename().string();
    if (name == DirectoryLock::kFileName) continue;
    EXPECT_LE(std::stoi(name.substr(5)), gd) << name;
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
  auto m = testing::runCli({"bench", "--accuracy", "--nodes", "4", "--systems", "g3fc"}, dir.path + "/log3");
  EXPECT_EQ(m.exitCode(), 2);
  EXPECT_THAT(m.stderrText(), HasSubstr("system g3fc: 3 groups must divide 4 nodes"));
  auto f = testing::runCli({"bench", "--accuracy", "--systems", "fc"}, dir.path + "/log4");
  EXPECT_EQ(f.exitCode(), 2);
  auto w = testing::runCli({"bench", "--accuracy", "--systems", "bsp-overlap-w100"}, dir.path + "/log5");
  EXPECT_EQ(w.exitCode(), 2);
  EXPECT_THAT(w.stderrText(), HasSubstr("the send window of system bsp-overlap-w100 must be in [4096, 1073741824]"));
  EXPECT_THAT(f.stderrText(),
              HasSubstr("unknown system 'fc' (expected bsp, bsp-overlap, either with -wBYTES, ddp, gG or gGfc, "
                        "e.g. g4 or g8fc)"));
}

TEST(TimeToAccuracy, BenchTrainsPoseidonGroupsAndDdpOnTheEmulatedCluster) {
  std::string why;
  if (!bench::EmulatedCluster::available(&why)) GTEST_SKIP() << "no emulated cluster here: " << why;
  TempDir dir;
  auto p = testing::runCli({"bench",
                            "--accuracy",
                            "--nodes",
                            "2",
                            "--systems",
                            "bsp,bsp-overlap-w4096,g2,ddp",
                            "--rates",
                            "100",
                            "--steps",
                            "8",
                            "--curve-every",
                            "4",
                            "--pad-ms",
                            "30",
                            "--hyper",
                            "g2=0.02:0.3",
                            "--target-accuracy",
                            "0.2",
                            "--tcp-rcvbuf",
                            "32768",
                            "--group-push-window",
                            "2",
                            "--json",
                            dir.path + "/r.json",
                            "--markdown",
                            dir.path + "/r.md",
                            "--plots",
                            dir.path + "/plots"},
                           dir.path + "/log", {}, 600);
  ASSERT_EQ(p.exitCode(), 0) << p.stdoutText() << p.stderrText();
  auto r = readJson(dir.path + "/r.json");
  ASSERT_EQ(r["runs"].size(), 4u);
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
  // bsp-overlap-w4096 is bsp with the overlapped step over priority links: the same model at every curve point.
  EXPECT_EQ(r["runs"][1]["system"], "bsp-overlap-w4096");
  EXPECT_EQ(r["runs"][1]["overlap_forward"], true);
  EXPECT_EQ(r["runs"][1]["send_window"], 4096);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(r["runs"][0]["curve"][i]["test_accuracy"], r["runs"][1]["curve"][i]["test_accuracy"]) << i;
    EXPECT_EQ(r["runs"][0]["curve"][i]["train_loss"], r["runs"][1]["curve"][i]["train_loss"]) << i;
  }
  // --tcp-rcvbuf reaches every Poseidon rank (their summaries say what they ran with), not DDP's.
  EXPECT_EQ(r["config"]["tcp_rcvbuf"], 32768);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(r["runs"][i]["tcp_rcvbuf"], 32768) << i;
  EXPECT_FALSE(r["runs"][3].contains("tcp_rcvbuf"));
  // --group-push-window reaches the compute groups' ranks only, which say how many pushes it paced.
  EXPECT_EQ(r["config"]["group_push_window"], 2);
  EXPECT_EQ(r["runs"][0]["group_push_window"], 0);
  EXPECT_EQ(r["runs"][2]["group_push_window"], 2);
  EXPECT_TRUE(r["runs"][2]["paced_pushes"].is_number()) << r["runs"][2].dump();
  EXPECT_FALSE(r["runs"][3].contains("group_push_window"));
  EXPECT_EQ(r["runs"][2]["lr"], 0.02);
  EXPECT_EQ(r["runs"][2]["momentum"], 0.3);
  EXPECT_TRUE(r["runs"][2].contains("staleness_histogram"));
  std::ifstream md(dir.path + "/r.md");
  std::string table((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
  EXPECT_THAT(table, HasSubstr("| g2 | 0.02 | 0.3 |"));
  EXPECT_THAT(table, HasSubstr("Poseidon's ranks ran with a 32768-byte TCP receive buffer per connection"));
  EXPECT_TRUE(fs::exists(dir.path + "/plots/accuracy-100mbit.png"));
}

// A run that diverges is a result of the benchmark, said as such: Poseidon's (poseidon train
// --allow-divergence) and DDP's (bench/ddp_train.py) stop at the step whose mean gradient is not
// finite, exit 0, and the JSON, the run's line and the table say where.
TEST(TimeToAccuracy, BenchSaysWhereARunDiverged) {
  std::string why;
  if (!bench::EmulatedCluster::available(&why)) GTEST_SKIP() << "no emulated cluster here: " << why;
  TempDir dir;
  auto p = testing::runCli({"bench", "--accuracy", "--nodes", "2", "--systems", "bsp,ddp", "--rates", "100", "--steps",
                            "16", "--curve-every", "8", "--pad-ms", "10", "--hyper", "bsp=50:0.9,ddp=50:0.9", "--json",
                            dir.path + "/r.json", "--markdown", dir.path + "/r.md"},
                           dir.path + "/log", {}, 600);
  ASSERT_EQ(p.exitCode(), 0) << p.stdoutText() << p.stderrText();
  auto r = readJson(dir.path + "/r.json");
  ASSERT_EQ(r["runs"].size(), 2u);
  std::ifstream md(dir.path + "/r.md");
  std::string table((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
  for (const auto& run : r["runs"]) {
    ASSERT_TRUE(run["ok"].get<bool>()) << run.dump();
    ASSERT_TRUE(run["diverged_at_step"].is_number()) << run.dump();
    const int64_t d = run["diverged_at_step"];
    EXPECT_GE(d, 1);
    EXPECT_LT(d, 16) << "lr 50 diverges within a few steps";
    EXPECT_EQ(run["curve"].back()["step"], d) << run.dump();  // the curve ends where the run stopped
    const std::string name = run["system"];
    EXPECT_THAT(p.stdoutText(), HasSubstr(strCat("DIVERGED at step ", d, ": stopped there")));
    EXPECT_THAT(table, HasSubstr(strCat("diverged at step ", d))) << name;
  }
}

}  // namespace
}  // namespace poseidon
