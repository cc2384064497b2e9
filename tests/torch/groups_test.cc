// Omnivore's compute groups through the real CLI (docs/omnivore.md): one group is the BSP path
// bit for bit; every worker its own group runs asynchronously with its staleness measured; SSP's
// bound holds against a group slowed 10x.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_helpers.h"

namespace poseidon {
namespace {

using ::testing::HasSubstr;
using testing::readFloats;
using testing::TempDir;
namespace fs = std::filesystem;

// 4 workers x batch 64 over 2048 images (8 steps per epoch), quiet; lr 0.05 without a warm-up (the
// settings these tests' margins were measured with, before the main job's defaults changed).
std::vector<std::string> job(const std::vector<std::string>& extra) {
  std::vector<std::string> a{"train",   "--workers", "4",       "--train-limit",  "2048", "--quiet",
                             "--timeout", "60000",   "--lr",    "0.05",           "--warmup-steps", "0"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// Runs job(extra) saving its final parameters as DIR/NAME.bin, and returns them (none after a failed run).
std::vector<float> trainedParameters(const TempDir& dir, const std::string& name, std::vector<std::string> extra) {
  extra.insert(extra.end(), {"--save-params", dir.path + "/" + name + ".bin"});
  auto p = testing::runCli(job(extra), dir.path + "/" + name);
  EXPECT_EQ(p.exitCode(), 0) << p.stderrText();
  return p.exitCode() == 0 ? readFloats(dir.path + "/" + name + ".bin") : std::vector<float>{};
}

// The main job's LeNet (431,080 parameters) came out the same from both runs, bit for bit.
void expectSameParameters(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), 431080u);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(testing::countDiffering(a, b), 0u) << "of " << a.size() << " parameters";
}

TEST(ComputeGroups, OneGroupGivesTheBspParametersBitForBit) {
  TempDir dir;
  // BSP with every layer by PS (the shards take dense pushes in group mode too), and one group; then
  // the same with the learning rate warmed up over the 20 steps (the shards must take each round's
  // rate before its pushes, which go out during the backward).
  for (const std::string warmup : {"0", "20"}) {
    SCOPED_TRACE("--warmup-steps " + warmup);
    const auto bsp = trainedParameters(dir, "bsp", {"--max-steps", "20", "--scheme", "ps", "--warmup-steps", warmup});
    const auto one = trainedParameters(
        dir, "one",
        {"--max-steps", "20", "--groups", "1", "--warmup-steps", warmup, "--summary", dir.path + "/one.json"});
    expectSameParameters(bsp, one);
    ASSERT_FALSE(HasFailure());
    auto s = testing::readJson(dir.path + "/one.json");
    EXPECT_EQ(s["groups"], 1);
    EXPECT_EQ(s["staleness_histogram"], nlohmann::json({{"0", 80}}));  // 20 rounds x 4 layers, one pair each
    EXPECT_EQ(s["max_group_lead"], 0);
  }
}

TEST(ComputeGroups, OneModelServerGivesTheSameParametersAndCarriesEveryPushAndPull) {
  TempDir dir;
  // --servers 1: the whole model on rank 0's shard (Omnivore's one model server); the other ranks
  // are workers only. Where the shards live changes no arithmetic: one group gives the parameters of
  // one group over every rank's shard, bit for bit.
  const auto spread = trainedParameters(dir, "spread", {"--max-steps", "20", "--groups", "1"});
  const auto one = trainedParameters(
      dir, "one", {"--max-steps", "20", "--groups", "1", "--servers", "1", "--summary", dir.path + "/one.json"});
  expectSameParameters(spread, one);
  ASSERT_FALSE(HasFailure());
  auto s = testing::readJson(dir.path + "/one.json");
  // Table 1 with P1 = 4, P2 = 1: three worker-only ranks move 2 MN each, rank 0 2 MN (P1 + P2 - 2) / P2 =
  // 6 MN; every byte sent is received once, so moved = 2 x sent (frame headers on top).
  const double sent = s["bytes_sent_by_scheme"]["ps"], predicted = s["predicted_bytes_by_scheme"]["ps"];
  EXPECT_NEAR(2 * sent / predicted, 1.0, 0.05) << s["bytes_sent_by_scheme"] << s["predicted_bytes_by_scheme"];
  // Where the bytes went: rank 0's shard takes every push and answers every pull, so it sends what the
  // three other ranks receive and receives what they send (over every rank's shard, about a quarter).
  EXPECT_EQ(s["servers"], 1);
  ASSERT_EQ(s["ps_bytes_received_per_rank"].size(), 4u);
  const auto received = s["ps_bytes_received_per_rank"].get<std::vector<double>>();
  const auto sentBy = s["ps_bytes_sent_per_rank"].get<std::vector<double>>();
  EXPECT_NEAR(sentBy[0] / (received[1] + received[2] + received[3]), 1.0, 0.01) << s["ps_bytes_sent_per_rank"];
  EXPECT_NEAR(received[0] / (sentBy[1] + sentBy[2] + sentBy[3]), 1.0, 0.01) << s["ps_bytes_received_per_rank"];
  // Every rank's clock and steps, for the rate through all workers (bench --accuracy's mean-rate step).
  ASSERT_EQ(s["steps_per_rank"].size(), 4u);
  ASSERT_EQ(s["train_clock_seconds_per_rank"].size(), 4u);
  for (size_t r = 0; r < 4; ++r) {
    EXPECT_EQ(s["steps_per_rank"][r].get<double>(), 20) << r;
    EXPECT_GT(s["train_clock_seconds_per_rank"][r].get<double>(), 0) << r;
  }
  EXPECT_EQ(s["train_clock_seconds_per_rank"][0], s["train_clock_seconds"]);
  auto tooMany = testing::runCli(job({"--max-steps", "1", "--servers", "5"}), dir.path + "/five");
  EXPECT_NE(tooMany.exitCode(), 0);
  EXPECT_THAT(tooMany.stderrText(), HasSubstr("--servers 5 exceeds the job's 4 ranks (each shard is a rank)"));
}

TEST(ComputeGroups, PushesPacedByTheRepliesKeepTheParametersExact) {
  TempDir dir;
  // 64 KB pairs: ip1's 1.6 MB is 25 of them, so with --group-push-window 4 a member sends its pair i
  // once the reply to pair i - 4 is back. Pacing changes when a pair leaves, not what is summed: one
  // group on one server gives BSP's parameters bit for bit, paced or not (the default).
  auto args = [](std::vector<std::string> extra) {
    extra.insert(extra.end(), {"--max-steps", "10", "--pair-bytes", "65536"});
    return extra;
  };
  const auto bsp = trainedParameters(dir, "bsp", args({"--scheme", "ps"}));
  const auto paced = trainedParameters(
      dir, "paced",
      args({"--groups", "1", "--servers", "1", "--group-push-window", "4", "--summary", dir.path + "/paced.json"}));
  const auto unpaced = trainedParameters(
      dir, "unpaced", args({"--groups", "1", "--servers", "1", "--summary", dir.path + "/unpaced.json"}));
  expectSameParameters(bsp, paced);
  expectSameParameters(bsp, unpaced);
  ASSERT_FALSE(HasFailure());
  const auto s = testing::readJson(dir.path + "/paced.json"), u = testing::readJson(dir.path + "/unpaced.json");
  EXPECT_EQ(s["group_push_window"], 4);
  // Only ip1's pairs 4..24 can wait: at most 10 rounds x 4 workers x 21; the first of them always
  // does (its reply needs every worker's pair 0 at rank 0 and back), so some must have waited.
  EXPECT_GT(s["paced_pushes"].get<int64_t>(), 0);
  EXPECT_LE(s["paced_pushes"].get<int64_t>(), 10 * 4 * 21);
  EXPECT_EQ(u["group_push_window"], 0);
  EXPECT_EQ(u["paced_pushes"], 0);
  auto bad =
      testing::runCli(job({"--max-steps", "1", "--groups", "1", "--group-push-window", "-1"}), dir.path + "/bad");
  EXPECT_NE(bad.exitCode(), 0);
  EXPECT_THAT(bad.stderrText(), HasSubstr("--group-push-window"));
}

TEST(ComputeGroups, EveryWorkerItsOwnGroupRunsAsynchronouslyWithItsStalenessReported) {
  TempDir dir;
  // Four asynchronous groups carry an implicit momentum of about 1 - 1/4 (Omnivore, Sec. 4); on top
  // of an explicit 0.3 at lr 0.05 the total passes 1 and a loaded machine (more staleness) could make
  // it diverge. Explicit momentum 0 at lr 0.03 is the setting Omnivore's optimizer would pick.
  auto p = testing::runCli(
      job({"--max-steps", "40", "--groups", "4", "--momentum", "0", "--lr", "0.03", "--summary", dir.path + "/s.json"}),
      dir.path + "/g4");
  ASSERT_EQ(p.exitCode(), 0) << p.stderrText();
  EXPECT_THAT(p.stdoutText(), HasSubstr("compute groups: 4 groups of 1 workers; staleness of 640 pair updates"));
  auto s = testing::readJson(dir.path + "/s.json");
  double updates = 0, stale = 0;
  for (auto it = s["staleness_histogram"].begin(); it != s["staleness_histogram"].end(); ++it) {
    updates += it.value().get<double>();
    if (it.key() != "0") stale += it.value().get<double>();
  }
  EXPECT_EQ(updates, 640);                                 // 40 rounds x 4 groups x 4 layers
  EXPECT_GT(stale, 0) << s["staleness_histogram"].dump();  // asynchronous: updates land on a moved model
  // Each worker asks for rounds 1..40 with its round's first push, ahead of every push of the round
  // on the same connection: each of those pulls reaches its shard before the update it waits for.
  // Asked after the step (behind the pushes), a group of one would have none.
  EXPECT_EQ(s["early_pulls"], 640);
  EXPECT_GT(s["test_accuracy"].get<double>(), 0.5) << "it learns; staleness " << s["staleness_histogram"].dump();
}

// Each step of rank 3 (its own group) takes 300 ms longer (a time, not a factor of its step, which a
// fast machine makes a few ms: the others' steps stay far shorter than it). With --staleness 1 no
// other group runs more than one update ahead of it; unbounded, they do. At a quarter of job()'s
// learning rate: the unbounded run's updates land on a model up to a dozen updates on, and at 0.05
// one CI run diverged at step 18 (the lead, which this test checks, does not depend on the rate).
TEST(ComputeGroups, SspKeepsEveryGroupWithinTheBoundOfASlowOne) {
  TempDir dir;
  const std::map<std::string, std::string> slow{{"POSEIDON_SLOW", "3:300"}};
  auto bounded = testing::runCli(job({"--max-steps", "24", "--groups", "4", "--momentum", "0.3", "--staleness", "1",
                                      "--lr", "0.0125", "--summary", dir.path + "/bounded.json"}),
                                 dir.path + "/bounded", slow);
  ASSERT_EQ(bounded.exitCode(), 0) << bounded.stderrText();
  auto b = testing::readJson(dir.path + "/bounded.json");
  EXPECT_LE(b["max_group_lead"].get<int>(), 1);
  auto free = testing::runCli(job({"--max-steps", "24", "--groups", "4", "--momentum", "0.3", "--lr", "0.0125",
                                   "--summary", dir.path + "/free.json"}),
                              dir.path + "/free", slow);
  ASSERT_EQ(free.exitCode(), 0) << free.stderrText();
  EXPECT_GT(testing::readJson(dir.path + "/free.json")["max_group_lead"].get<int>(), 1);
}

// Merged FC with one group is data-parallel SGD on the same model: the FC server's gradient over
// the group's rows is the mean of the members' gradients. Only the order of the float sums differs
// (one matrix product over 4 x 64 rows against four summed in member order), so the parameters agree
// to rounding, not bit for bit. Two steps: training amplifies a rounding difference about tenfold a
// step (a max-pool's choice flips), so with OpenBLAS's blocked sums the two runs are 7e-9 apart after
// 1-2 steps and 6e-4 after 10 (the reference BLAS summed rows in one order and hid it). A wrong
// scaling or a missed member would be off by about lr x gradient (1e-3) at the first step.
TEST(MergedFc, OneGroupTrainsTheSameModelAsWithoutIt) {
  TempDir dir;
  auto run = [&](const std::string& name, std::vector<std::string> extra) {
    extra.insert(extra.end(), {"--max-steps", "2", "--groups", "1", "--save-params", dir.path + "/" + name + ".bin",
                               "--summary", dir.path + "/" + name + ".json"});
    auto p = testing::runCli(job(extra), dir.path + "/" + name);
    EXPECT_EQ(p.exitCode(), 0) << p.stderrText();
    return readFloats(dir.path + "/" + name + ".bin");
  };
  auto plain = run("plain", {});
  auto merged = run("merged", {"--merged-fc"});
  auto otherLr = run("lr", {"--merged-fc", "--lr", "0.04"});
  ASSERT_EQ(plain.size(), 431080u);
  ASSERT_EQ(merged.size(), plain.size());
  ASSERT_EQ(otherLr.size(), plain.size());
  double diff = 0, lrDiff = 0, fcDiff = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::abs(plain[i] - merged[i])));
    lrDiff = std::max(lrDiff, static_cast<double>(std::abs(otherLr[i] - merged[i])));
    if (i >= 25570) fcDiff = std::max(fcDiff, static_cast<double>(std::abs(otherLr[i] - merged[i])));  // ip1, ip2
  }
  EXPECT_LT(diff, 1e-6);
  EXPECT_GT(lrDiff, 1e-4);  // the comparison sees a change of the learning rate...
  EXPECT_GT(fcDiff, 1e-4);  // ...in the FC server's layers too
  auto s = testing::readJson(dir.path + "/merged.json");
  EXPECT_EQ(s["merged_fc"], true);
  EXPECT_EQ(s["fc_server_updates"], 2);                             // one per round of the one group
  EXPECT_EQ(s["staleness_histogram"], nlohmann::json({{"0", 4}}));  // conv1, conv2 only, on the shards
  EXPECT_EQ(s["layers"][2]["scheme"], "fc-server");
  EXPECT_EQ(s["layers"][0]["scheme"], "ps");
}

// A merged-FC checkpoint holds the FC server's parameters and momentum next to the shards': with one
// group (deterministic), 10 steps + resume + 10 steps give the uninterrupted 20 bit for bit. Its
// optimizer.pt is laid out as without merged FC, so either mode resumes it.
TEST(MergedFc, CheckpointsHoldTheFcServersStateAndResumeExactly) {
  TempDir dir;
  const std::vector<std::string> merged{"--groups", "1", "--merged-fc", "--momentum", "0.9"};
  auto args = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), merged.begin(), merged.end());
    return job(extra);
  };
  auto straight =
      testing::runCli(args({"--max-steps", "20", "--save-params", dir.path + "/straight.bin"}), dir.path + "/straight");
  ASSERT_EQ(straight.exitCode(), 0) << straight.stderrText();
  const std::string ck = dir.path + "/ck";
  auto first =
      testing::runCli(args({"--max-steps", "10", "--checkpoint", ck, "--checkpoint-every", "10"}), dir.path + "/first");
  ASSERT_EQ(first.exitCode(), 0) << first.stderrText();
  auto resumed =
      testing::runCli(args({"--max-steps", "20", "--checkpoint", ck, "--save-params", dir.path + "/resumed.bin"}),
                      dir.path + "/resumed");
  ASSERT_EQ(resumed.exitCode(), 0) << resumed.stderrText();
  EXPECT_THAT(resumed.stdoutText(), HasSubstr("resuming from " + ck + "/step-000000010"));
  EXPECT_EQ(testing::readBytes(dir.path + "/straight.bin"), testing::readBytes(dir.path + "/resumed.bin"));
  // The unmerged run below resumes the merged run's checkpoint at its epoch's end (16), not the one at
  // 20 where --max-steps stopped it, and trains its last 4 steps.
  const std::string ckUnmerged = dir.path + "/ck-unmerged";
  fs::copy(ck, ckUnmerged, fs::copy_options::recursive);
  ASSERT_TRUE(fs::remove_all(ckUnmerged + "/step-000000020") > 0);
  // Without the FC server's momentum (a resume that zeroed it) the continuation would differ: the
  // unmerged mode resumes the same files and trains on to a model within rounding of the merged one.
  auto unmerged = testing::runCli(job({"--max-steps", "20", "--groups", "1", "--momentum", "0.9", "--checkpoint",
                                       ckUnmerged, "--save-params", dir.path + "/unmerged.bin"}),
                                  dir.path + "/unmerged");
  ASSERT_EQ(unmerged.exitCode(), 0) << unmerged.stderrText();
  EXPECT_THAT(unmerged.stdoutText(), HasSubstr("resuming from " + ckUnmerged + "/step-000000016"));
  auto a = readFloats(dir.path + "/straight.bin"), b = readFloats(dir.path + "/unmerged.bin");
  ASSERT_EQ(a.size(), b.size());
  double diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, static_cast<double>(std::abs(a[i] - b[i])));
  EXPECT_LT(diff, 1e-6);

  // Two groups: no group goes on while the first worker reads the shards' and the FC server's state,
  // so the checkpoint is the state at its round, and a resume without further steps serves it exactly.
  const std::string ck2 = dir.path + "/ck2";
  const std::vector<std::string> two{"--groups", "2", "--merged-fc", "--momentum", "0.3", "--checkpoint", ck2};
  auto withTwo = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), two.begin(), two.end());
    return job(extra);
  };
  auto twoRun =
      testing::runCli(withTwo({"--max-steps", "10", "--checkpoint-every", "5", "--save-params", dir.path + "/two.bin"}),
                      dir.path + "/two");
  ASSERT_EQ(twoRun.exitCode(), 0) << twoRun.stderrText();
  auto again =
      testing::runCli(withTwo({"--max-steps", "10", "--save-params", dir.path + "/again.bin"}), dir.path + "/again");
  ASSERT_EQ(again.exitCode(), 0) << again.stderrText();
  EXPECT_THAT(again.stdoutText(), HasSubstr("resuming from " + ck2 + "/step-000000010"));
  EXPECT_EQ(testing::readBytes(dir.path + "/two.bin"), testing::readBytes(dir.path + "/again.bin"));
  // The step-5 checkpoint, taken while both groups go on afterwards, holds exactly 5 rounds of each
  // (a group let go before the state was read could have pushed round 6 into it).
  for (auto [step, version] : {std::pair<std::string, int>{"000000005", 10}, {"000000010", 20}}) {
    std::ifstream meta(ck2 + "/step-" + step + "/meta.json");
    ASSERT_TRUE(meta.good()) << step;
    EXPECT_EQ(nlohmann::json::parse(meta)["group_version"], version) << step;
  }
}

// Four groups of one: the FC server serves each group's rounds as they come, one update per round
// (staleness 0 for the FC layers), while the conv layers go stale on the shards; the model learns.
TEST(MergedFc, FourGroupsShareOneFcServer) {
  TempDir dir;
  auto p = testing::runCli(job({"--max-steps", "40", "--groups", "4", "--merged-fc", "--momentum", "0", "--lr", "0.03",
                                "--summary", dir.path + "/s.json"}),
                           dir.path + "/g4");
  ASSERT_EQ(p.exitCode(), 0) << p.stderrText();
  EXPECT_THAT(p.stdoutText(), HasSubstr("merged FC: the FC server applied 160 updates (staleness 0)"));
  auto s = testing::readJson(dir.path + "/s.json");
  EXPECT_EQ(s["fc_server_updates"], 160);  // 40 rounds x 4 groups
  double updates = 0;
  for (auto it = s["staleness_histogram"].begin(); it != s["staleness_histogram"].end(); ++it) {
    updates += it.value().get<double>();
  }
  EXPECT_EQ(updates, 320);  // 40 rounds x 4 groups x 2 conv layers
  EXPECT_GT(s["test_accuracy"].get<double>(), 0.5);
}

// --group-batch B (the paper's setting): each group's batch split over its members. One group of four
// with B = 64 is BSP with batch 16 per worker, bit for bit; two groups of two take 32 per worker each,
// with the default rate for batch 64 (0.025 x sqrt(64 / 256)).
TEST(ComputeGroups, GroupBatchSplitsEachGroupsBatchOverItsMembers) {
  TempDir dir;
  auto bsp = testing::runCli(
      job({"--max-steps", "10", "--scheme", "ps", "--batch", "16", "--save-params", dir.path + "/bsp.bin"}),
      dir.path + "/bsp");
  ASSERT_EQ(bsp.exitCode(), 0) << bsp.stderrText();
  auto one = testing::runCli(job({"--max-steps", "10", "--groups", "1", "--group-batch", "64", "--save-params",
                                  dir.path + "/one.bin", "--summary", dir.path + "/one.json"}),
                             dir.path + "/one");
  ASSERT_EQ(one.exitCode(), 0) << one.stderrText();
  auto a = readFloats(dir.path + "/bsp.bin"), b = readFloats(dir.path + "/one.bin");
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(testing::countDiffering(a, b), 0u) << "of " << a.size() << " parameters";
  auto s = testing::readJson(dir.path + "/one.json");
  EXPECT_EQ(s["batch"], 16);
  EXPECT_EQ(s["group_batch"], 64);
  auto two =
      testing::runCli({"train", "--workers", "4", "--train-limit", "2048", "--quiet", "--timeout", "60000", "--groups",
                       "2", "--group-batch", "64", "--max-steps", "4", "--summary", dir.path + "/two.json"},
                      dir.path + "/two");
  ASSERT_EQ(two.exitCode(), 0) << two.stderrText();
  auto t = testing::readJson(dir.path + "/two.json");
  EXPECT_EQ(t["batch"], 32);
  EXPECT_EQ(t["group_batch"], 64);
  EXPECT_DOUBLE_EQ(t["lr"].get<double>(), 0.0125);
}

// --overlap-forward with compute groups: the next round's pull starts as soon as the round's pushes
// are out and each layer is awaited just before it runs. One group's rounds are deterministic, so
// the model is the one without it, bit for bit; four groups train with it.
TEST(ComputeGroups, OverlappedForwardAwaitsEachLayerOfTheNextRoundsPull) {
  TempDir dir;
  for (const std::string name : {"plain", "overlap"}) {
    std::vector<std::string> extra{"--max-steps",   "12",
                                   "--groups",      "1",
                                   "--save-params", dir.path + "/" + name + ".bin",
                                   "--summary",     dir.path + "/" + name + ".json"};
    if (name == "overlap") extra.push_back("--overlap-forward");
    auto p = testing::runCli(job(extra), dir.path + "/" + name);
    ASSERT_EQ(p.exitCode(), 0) << p.stderrText();
  }
  auto a = readFloats(dir.path + "/plain.bin"), b = readFloats(dir.path + "/overlap.bin");
  ASSERT_EQ(a.size(), 431080u);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(testing::countDiffering(a, b), 0u) << "of " << a.size() << " parameters";
  auto plain = testing::readJson(dir.path + "/plain.json"), overlap = testing::readJson(dir.path + "/overlap.json");
  EXPECT_EQ(plain["test_accuracy"], overlap["test_accuracy"]);
  EXPECT_EQ(plain["staleness_histogram"], overlap["staleness_histogram"]);
  EXPECT_EQ(overlap["overlap_forward"], true);
  EXPECT_EQ(plain["updates_in_forward"], 0);
  // 12 steps, 8 per epoch: the first forward and the one after the epoch's evaluation (which waits
  // for the whole pull) have no pull pending; the other 10 await LeNet's 4 layers each.
  EXPECT_EQ(overlap["updates_in_forward"], 10 * 4);
  auto four = testing::runCli(job({"--max-steps", "40", "--groups", "4", "--momentum", "0", "--lr", "0.03",
                                   "--overlap-forward", "--summary", dir.path + "/four.json"}),
                              dir.path + "/four");
  ASSERT_EQ(four.exitCode(), 0) << four.stderrText();
  auto s = testing::readJson(dir.path + "/four.json");
  EXPECT_GT(s["updates_in_forward"].get<int64_t>(), 0);
  EXPECT_GT(s["test_accuracy"].get<double>(), 0.5);
}

TEST(ComputeGroups, FlagsThatDoNotFitAreOneLineErrors) {
  TempDir dir;
  auto p = testing::runCli(job({"--groups", "3"}), dir.path + "/three");
  EXPECT_EQ(p.exitCode(), 2);
  EXPECT_THAT(p.stderrText(), HasSubstr("--groups 3 must divide the 4 workers"));
  auto q = testing::runCli(job({"--staleness", "2"}), dir.path + "/nogroups");
  EXPECT_EQ(q.exitCode(), 2);
  EXPECT_THAT(q.stderrText(), HasSubstr("--staleness bounds the lead of compute groups: it needs --groups"));
  auto m = testing::runCli(job({"--merged-fc"}), dir.path + "/merged");
  EXPECT_EQ(m.exitCode(), 2);
  EXPECT_THAT(m.stderrText(), HasSubstr("--merged-fc runs the conv layers in compute groups and the FC layers on one "
                                        "FC server: it needs --groups"));
  auto mlp = testing::runCli(job({"--merged-fc", "--groups", "2", "--model", "mlp"}), dir.path + "/mlp");
  EXPECT_EQ(mlp.exitCode(), 2);
  EXPECT_THAT(mlp.stderrText(), HasSubstr("--merged-fc needs a model with conv features and an FC classifier"));
  auto uneven = testing::runCli(job({"--groups", "2", "--group-batch", "63"}), dir.path + "/uneven");
  EXPECT_EQ(uneven.exitCode(), 2);
  EXPECT_THAT(
      uneven.stderrText(),
      HasSubstr("--group-batch 63 does not split evenly over the 2 workers of a group (4 workers in 2 groups)"));
  auto bsp = testing::runCli(job({"--group-batch", "64"}), dir.path + "/gbsp");
  EXPECT_EQ(bsp.exitCode(), 2);
  EXPECT_THAT(bsp.stderrText(), HasSubstr("--group-batch splits each compute group's batch over its members: it needs "
                                          "--groups"));
  auto both = testing::runCli(job({"--groups", "2", "--group-batch", "64", "--batch", "8"}), dir.path + "/both");
  EXPECT_EQ(both.exitCode(), 2);
  EXPECT_THAT(both.stderrText(), HasSubstr("--batch is per worker and --group-batch per compute group"));
}

}  // namespace
}  // namespace poseidon

namespace poseidon {
namespace {

// The shards' state (parameters, momentum buffers, version clock) goes into the checkpoint: with one
// group, 10 steps + resume + 10 steps give the uninterrupted run's parameters bit for bit, which
// needs the momentum back exactly; with two groups, a resume without further steps serves exactly
// the checkpoint's model.
TEST(ComputeGroups, CheckpointsHoldTheShardsStateAndResumeExactly) {
  TempDir dir;
  auto straight = testing::runCli(
      job({"--max-steps", "20", "--groups", "1", "--save-params", dir.path + "/straight.bin"}), dir.path + "/straight");
  ASSERT_EQ(straight.exitCode(), 0) << straight.stderrText();
  const std::string ck = dir.path + "/ck";
  auto first = testing::runCli(
      job({"--max-steps", "10", "--groups", "1", "--checkpoint", ck, "--checkpoint-every", "5"}), dir.path + "/first");
  ASSERT_EQ(first.exitCode(), 0) << first.stderrText();
  std::ifstream meta(ck + "/step-000000010/meta.json");
  auto m = nlohmann::json::parse(meta);
  EXPECT_EQ(m["groups"], 1);
  EXPECT_EQ(m["group_version"], 10);  // every pair had 10 updates
  auto resumed = testing::runCli(job({"--max-steps", "20", "--groups", "1", "--checkpoint", ck, "--checkpoint-every",
                                      "5", "--save-params", dir.path + "/resumed.bin"}),
                                 dir.path + "/resumed");
  ASSERT_EQ(resumed.exitCode(), 0) << resumed.stderrText();
  EXPECT_THAT(resumed.stdoutText(), HasSubstr("resuming from " + ck + "/step-000000010"));
  EXPECT_EQ(testing::readBytes(dir.path + "/straight.bin"), testing::readBytes(dir.path + "/resumed.bin"));

  const std::string ck2 = dir.path + "/ck2";
  auto two = testing::runCli(job({"--max-steps", "10", "--groups", "2", "--momentum", "0.3", "--checkpoint", ck2,
                                  "--checkpoint-every", "10", "--save-params", dir.path + "/two.bin"}),
                             dir.path + "/two");
  ASSERT_EQ(two.exitCode(), 0) << two.stderrText();
  auto again = testing::runCli(job({"--max-steps", "10", "--groups", "2", "--momentum", "0.3", "--checkpoint", ck2,
                                    "--save-params", dir.path + "/again.bin"}),
                               dir.path + "/again");
  ASSERT_EQ(again.exitCode(), 0) << again.stderrText();
  EXPECT_EQ(testing::readBytes(dir.path + "/two.bin"), testing::readBytes(dir.path + "/again.bin"));
  // A checkpoint of one layout is not resumed with another.
  auto other = testing::runCli(job({"--max-steps", "12", "--groups", "4", "--checkpoint", ck2}), dir.path + "/other");
  EXPECT_EQ(other.exitCode(), 2);
  EXPECT_THAT(other.stderrText(), HasSubstr("was written with --groups 2, this run has 4 (--regroup allows it)"));
  const std::string otherErr = other.stderrText();
  EXPECT_EQ(std::count(otherErr.begin(), otherErr.end(), '\n'), 1) << otherErr;  // once, not once per worker
  // Unless asked for (poseidon tune changes g between its epochs): the shards then serve exactly
  // the checkpoint's model to four groups, and go on from it.
  auto regrouped = testing::runCli(job({"--max-steps", "10", "--groups", "4", "--regroup", "--checkpoint", ck2,
                                        "--save-params", dir.path + "/regrouped.bin"}),
                                   dir.path + "/regrouped");
  ASSERT_EQ(regrouped.exitCode(), 0) << regrouped.stderrText();
  EXPECT_EQ(testing::readBytes(dir.path + "/two.bin"), testing::readBytes(dir.path + "/regrouped.bin"));
  auto onward = testing::runCli(job({"--max-steps", "12", "--groups", "4", "--momentum", "0", "--regroup",
                                     "--checkpoint", ck2, "--summary", dir.path + "/onward.json"}),
                                dir.path + "/onward");
  ASSERT_EQ(onward.exitCode(), 0) << onward.stderrText();
  EXPECT_THAT(onward.stdoutText(), HasSubstr("resuming from " + ck2 + "/step-000000010"));
  EXPECT_EQ(testing::readJson(dir.path + "/onward.json")["groups"], 4);
  auto noGroups = testing::runCli(job({"--max-steps", "12", "--regroup", "--checkpoint", ck2}), dir.path + "/nogroups");
  EXPECT_EQ(noGroups.exitCode(), 2);
  EXPECT_THAT(noGroups.stderrText(), HasSubstr("--regroup resumes a compute-group checkpoint with another number of "
                                               "groups: it needs --groups"));
}

}  // namespace
}  // namespace poseidon
