// Every numeric flag of the real poseidon binary is range-checked when it is
// parsed: a bad value exits 2 at once with one line naming the flag and its
// range, before anything starts (no rendezvous, no cluster, no root needed).
// `poseidon train` is covered with LibTorch in tests/torch/train_cli_test.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "../torch/cli_helpers.h"  // runCli: no LibTorch in it
#include "process.h"

namespace poseidon {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct Rejection {
  std::vector<std::string> args;
  std::string message;
};

void expectRejected(const Rejection& c) {
  std::string dir = testing::makeTempDir("flags");
  const testing::Proc p = testing::runCli(c.args, dir + "/cli", {}, 30);
  EXPECT_EQ(p.exitCode(), 2) << c.args[0] << ": " << p.stderrText();
  EXPECT_LT(p.seconds, 10);
  EXPECT_EQ(p.stderrText(), "poseidon " + c.args[0] + ": error: " + c.message + "\n");
  std::filesystem::remove_all(dir);
}

TEST(CliFlags, PlanRejectsOutOfRangeValues) {
  expectRejected({{"plan", "--workers", "0"}, "--workers must be in [1, 65536], got 0"});
  expectRejected({{"plan", "--servers", "70000"}, "--servers must be in [1, 65536], got 70000"});
  expectRejected({{"plan", "--batch", "0"}, "--batch must be in [1, 16777216], got 0"});
  expectRejected({{"plan", "--pair-bytes", "0"}, "--pair-bytes must be in [4, 1073741824], got 0"});
  expectRejected({{"plan", "--width-scale", "1.5"}, "--width-scale must be in (0, 1], got 1.5"});
  expectRejected({{"plan", "--predict", "--local-ranks", "0"}, "--local-ranks must be in [1, 64], got 0"});
  expectRejected({{"plan", "--predict", "--urgent-layers", "-2"}, "--urgent-layers must be in [-1, 1048576], got -2"});
  expectRejected({{"plan", "--local-ranks", "4"}, "--local-ranks is for the planner (--predict, --sweep or --check)"});
  expectRejected({{"plan", "--workers", "2", "--servers", "100"}, "--servers 100 exceeds --workers 2 (shards are nodes)"});
  // vgg19 in 4-byte pairs at 64 workers: 9e9 simulated messages, days, with a header printed first.
  expectRejected({{"plan", "--predict", "--pair-bytes", "4", "--workers", "64"},
                  "--pair-bytes 4 cuts vgg19 into 143667240 KV pairs: at 64 workers a prediction would simulate "
                  "hours of messages; give --pair-bytes 736 or more (or fewer workers)"});
  expectRejected({{"plan", "--predict", "--groups", "2", "--local-ranks", "2"},
                  "--local-ranks and --groups cannot be combined (compute groups have no local aggregation)"});
}

// Found by a first-run audit: `version --bogus` exited 0, and a path flag took the next flag as its
// value (`train --summary --quiet` wrote the summary to a file named "--quiet").
TEST(CliFlags, NoCommandTakesAFlagForAValueOrIgnoresAnArgument) {
  expectRejected({{"version", "--bogus"}, "unexpected argument '--bogus': 'poseidon version' takes none"});
  expectRejected({{"plan", "--model", "--wire", "bf16"},
                  "flag --model needs a value (NAME|FILE), got the flag --wire (write --model=--wire for a value "
                  "that starts with --)"});
}

// The cost table's totals say whose they are: BestScheme's hybrid, or the schemes --scheme forced.
TEST(CliFlags, PlanNamesForcedSchemesTotalsAsSuch) {
  std::string dir = testing::makeTempDir("plan");
  const testing::Proc hybrid = testing::runCli({"plan"}, dir + "/hybrid", {}, 60);
  ASSERT_EQ(hybrid.exitCode(), 0) << hybrid.stderrText();
  EXPECT_THAT(hybrid.stdoutText(), HasSubstr("hybrid (chosen schemes): 89,112,800 floats per node per iteration; "
                                             "all-PS: 502,803,168 (5.64x less with hybrid)\n"));
  const testing::Proc adam = testing::runCli({"plan", "--scheme", "adam"}, dir + "/adam", {}, 60);
  ASSERT_EQ(adam.exitCode(), 0) << adam.stderrText();
  EXPECT_THAT(adam.stdoutText(), HasSubstr("these schemes (--scheme): 945,034,720 floats per node per iteration; "
                                           "all-PS: 502,803,168 (1.88x more with these schemes)\n"));
  EXPECT_THAT(adam.stdoutText(), HasSubstr("MB per node per iteration (these schemes)"));
  EXPECT_THAT(adam.stdoutText(), Not(HasSubstr("hybrid")));
  std::filesystem::remove_all(dir);
}

// Fewer pairs than shards: an empty shard has no max/min ratio (it said "max/min 0.000"); the table
// says how many are empty, and the JSON counts them.
TEST(CliFlags, PlanSaysWhichShardsHoldNoPair) {
  std::string dir = testing::makeTempDir("plan");
  const testing::Proc text = testing::runCli({"plan", "--model", "lenet", "--workers", "8"}, dir + "/text", {}, 60);
  ASSERT_EQ(text.exitCode(), 0) << text.stderrText();
  EXPECT_THAT(text.stdoutText(), HasSubstr("KV store: 4 pairs of at most 2097152 bytes over 8 shards; shard load "
                                           "0.00-1.60 MB (4 of 8 shards hold no pair: a smaller --pair-bytes makes "
                                           "more)\n"));
  EXPECT_THAT(text.stdoutText(), Not(HasSubstr("max/min")));
  const testing::Proc four =
      testing::runCli({"plan", "--model", "lenet", "--workers", "4", "--json"}, dir + "/json", {}, 60);
  ASSERT_EQ(four.exitCode(), 0) << four.stderrText();
  EXPECT_EQ(nlohmann::json::parse(four.stdoutText())["totals"]["empty_shards"], 0);
  std::filesystem::remove_all(dir);
}

// --wire changes the byte totals only: the same floats and schemes at 2 bytes each.
TEST(CliFlags, PlanCountsTheWiresBytes) {
  std::map<std::string, nlohmann::json> plans;
  for (const std::string wire : {"fp32", "bf16"}) {
    std::string dir = testing::makeTempDir("plan");
    std::vector<testing::Proc> procs{
        testing::spawn({POSEIDON_CLI, "plan", "--model", "vgg19", "--json", "--wire", wire}, {}, dir + "/cli")};
    testing::waitAll(procs, std::chrono::seconds(30));
    ASSERT_EQ(procs[0].exitCode(), 0) << procs[0].stderrText();
    plans[wire] = nlohmann::json::parse(procs[0].stdoutText());
    std::filesystem::remove_all(dir);
  }
  const auto &a = plans["fp32"]["totals"], &b = plans["bf16"]["totals"];
  EXPECT_EQ(plans["bf16"]["wire"], "bf16");
  EXPECT_EQ(a["hybrid_cost"], b["hybrid_cost"]);
  EXPECT_EQ(a["hybrid_bytes"].get<double>(), 4 * a["hybrid_cost"].get<double>());
  EXPECT_EQ(b["hybrid_bytes"].get<double>(), 2 * b["hybrid_cost"].get<double>());
  EXPECT_EQ(b["ps_bytes"].get<double>(), 2 * b["ps_cost"].get<double>());
  expectRejected({{"plan", "--wire", "fp8"}, "unknown wire precision 'fp8' (expected fp32, bf16 or fp16)"});
}

// `poseidon plan` with these arguments: its JSON output (the test fails on another exit code).
// `poseidon plan --json ARGS`'s JSON; `error`: the error line it must exit 1 with (a --check that
// predicted no point prints its JSON, then fails).
nlohmann::json planJson(const std::vector<std::string>& args, const std::string& error = "") {
  std::string dir = testing::makeTempDir("plan");
  std::vector<std::string> argv{POSEIDON_CLI, "plan", "--json"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<testing::Proc> procs{testing::spawn(argv, {}, dir + "/cli")};
  testing::waitAll(procs, std::chrono::seconds(120));
  const int want = error.empty() ? 0 : 1;
  EXPECT_EQ(procs[0].exitCode(), want) << procs[0].stderrText();
  if (want) {
    EXPECT_EQ(procs[0].stderrText(), "poseidon plan: error: " + error + "\n");
  }
  nlohmann::json j = procs[0].exitCode() == want ? nlohmann::json::parse(procs[0].stdoutText()) : nlohmann::json{};
  std::filesystem::remove_all(dir);
  return j;
}

// --scheme adam (Project Adam's server for the FC layers, the paper's baseline) is counted as Adam's
// cost, not PS's (it was parsed, then totalled as PS).
TEST(CliFlags, PlanCountsAdamsServer) {
  const nlohmann::json adam = planJson({"--workers", "8", "--scheme", "adam"});
  const auto& t = adam["totals"];
  EXPECT_EQ(t["adam_layers"], 3);
  EXPECT_EQ(t["sfb_layers"], 0);
  double expected = 0;
  for (const auto& l : adam["layers"]) expected += l["scheme"] == "adam" ? l["adam_cost"].get<double>() : l["ps_cost"].get<double>();
  EXPECT_DOUBLE_EQ(t["hybrid_cost"].get<double>(), expected);
  EXPECT_GT(t["hybrid_cost"].get<double>(), t["ps_cost"].get<double>());
}

// The planner (docs/planner.md) from the CLI: predictions, a sweep, the lowest link rate for an
// efficiency (and that rate reaching it), and --check against a results file.
TEST(CliFlags, PlanPredictsSweepsAndChecksAResultsFile) {
  const nlohmann::json one =
      planJson({"--predict", "--model", "googlenet", "--workers", "8", "--rate", "3", "--systems", "poseidon,ddp"});
  ASSERT_EQ(one["predictions"].size(), 2u);
  for (const auto& p : one["predictions"]) {
    EXPECT_GT(p["max_node_tx_bytes"].get<double>(), 0);
    // The lowest rate it reports for 90%: 5% below it the system falls short of 90%.
    const double minGbit = p["min_link_gbit"];
    const nlohmann::json below = planJson({"--predict", "--model", "googlenet", "--workers", "8", "--rate",
                                           std::to_string(minGbit * 0.95), "--systems", p["system"]});
    EXPECT_LT(below["predictions"][0]["efficiency"].get<double>(), 0.9) << p["system"];
    // A one-entry sweep predicts the same as --predict (without the lowest rate).
    const nlohmann::json sweep1 =
        planJson({"--sweep", "8", "--model", "googlenet", "--rate", "3", "--systems", p["system"]});
    EXPECT_EQ(sweep1["predictions"][0]["iteration_seconds"], p["iteration_seconds"]);
    EXPECT_FALSE(sweep1["predictions"][0].contains("min_link_gbit"));
  }
  EXPECT_EQ(one["predictions"][0]["system"], "poseidon");
  EXPECT_EQ(one["urgent_layers"], -1);  // the runtime's rule unless --urgent-layers says otherwise
  EXPECT_EQ(one["host_queue"], "fifo");
  EXPECT_NEAR(one["compute_seconds"].get<double>(), 128 / 257.0, 1e-9);  // ATC'17's Caffe googlenet
  // A model without a timing: the user's seconds per iteration.
  const nlohmann::json lenet = planJson(
      {"--predict", "--model", "lenet", "--compute-seconds", "0.05", "--workers", "2", "--systems", "poseidon"});
  EXPECT_DOUBLE_EQ(lenet["compute_seconds"].get<double>(), 0.05);

  const nlohmann::json sweep =
      planJson({"--sweep", "1,4", "--model", "alexnet", "--rate", "1", "--systems", "ps-naive,poseidon"});
  ASSERT_EQ(sweep["predictions"].size(), 4u);
  EXPECT_EQ(sweep["predictions"][0]["workers"], 1);
  EXPECT_DOUBLE_EQ(sweep["predictions"][0]["speedup"].get<double>(), 1.0);  // one worker: its compute
  EXPECT_EQ(sweep["predictions"][3]["system"], "poseidon");
  EXPECT_EQ(sweep["predictions"][3]["workers"], 4);
  // WFBP and the hybrid beat naive PS on alexnet over 1 Gbit/s.
  EXPECT_LT(sweep["predictions"][3]["iteration_seconds"].get<double>(),
            sweep["predictions"][2]["iteration_seconds"].get<double>());

  // --check: a results file with one point it models, one HOST-BOUND and one it does not model.
  std::string dir = testing::makeTempDir("plancheck");
  const nlohmann::json run{{"model", "vgg19"},    {"system", "poseidon"},     {"nodes", 4},
                           {"link_mbit", 30.0},   {"iteration_seconds", 9.0}, {"ok", true},
                           {"host_bound", false}, {"device", "gpu"}};
  nlohmann::json hostBound = run, other = run;
  hostBound["host_bound"] = true;
  other["system"] = "sfb";
  const nlohmann::json results{
      {"config",
       {{"scale", 0.1},
        {"devices",
         {{{"name", "gpu"}, {"crypto_bytes_per_s", 1.75e9}, {"gemm_flops", 5e12}, {"sum_bytes_per_s", 22.5e9}}}}}},
      {"runs", {run, hostBound, other}}};
  std::ofstream(dir + "/results.json") << results.dump();
  const nlohmann::json check = planJson({"--check", dir + "/results.json"});
  EXPECT_EQ(check["points"], 1);
  EXPECT_EQ(check["skipped"], 2);
  ASSERT_EQ(check["rows"].size(), 1u);
  const double predicted = check["rows"][0]["predicted_seconds"];
  EXPECT_GT(predicted, 0.9);  // vgg19's compute, at least
  EXPECT_DOUBLE_EQ(check["rows"][0]["error"].get<double>(), predicted / 9.0 - 1);
  EXPECT_EQ(check["beyond"], 1);  // 9 s measured is far from it
  // A file without timer_slack_ns was made while each charged sleep woke 70-75 us late: checked with
  // the receive loop's 60 us per message of then; one with it, with today's 30; --message-us rules both.
  EXPECT_DOUBLE_EQ(check["message_us"].get<double>(), 60);
  nlohmann::json slack = results;
  slack["config"]["timer_slack_ns"] = 1;
  std::ofstream(dir + "/slack.json") << slack.dump();
  EXPECT_DOUBLE_EQ(planJson({"--check", dir + "/slack.json"})["message_us"].get<double>(), 30);
  EXPECT_DOUBLE_EQ(planJson({"--check", dir + "/slack.json", "--message-us", "45"})["message_us"].get<double>(), 45);
  EXPECT_DOUBLE_EQ(planJson({"--check", dir + "/results.json", "--message-us", "45"})["message_us"].get<double>(), 45);
  // A file made with whole batches: vgg19 at its recorded width 3/32, its links at emulated_mbit. A
  // point at the same full-width rate predicts within a few percent of the old rule's (the same
  // bytes per second of link, SFB's factors 6% heavier), and a width that is not vgg19's is refused.
  nlohmann::json whole = results;
  whole["config"]["model_scales"] = {{"vgg19", 0.09375}};
  whole["runs"] = {run};
  whole["runs"][0]["emulated_mbit"] = 30 * 0.9375 * 0.9375;
  std::ofstream(dir + "/whole.json") << whole.dump();
  const nlohmann::json wholeCheck = planJson({"--check", dir + "/whole.json"});
  ASSERT_EQ(wholeCheck["rows"].size(), 1u) << wholeCheck.dump();
  EXPECT_NEAR(wholeCheck["rows"][0]["predicted_seconds"].get<double>() / predicted, 1, 0.06);
  EXPECT_DOUBLE_EQ(wholeCheck["rows"][0]["link_mbit"].get<double>(), 30);  // the column's rate
  whole["config"]["model_scales"]["vgg19"] = 0.1;
  std::ofstream(dir + "/wrong.json") << whole.dump();
  const nlohmann::json wrongCheck = planJson(
      {"--check", dir + "/wrong.json"}, "--check: no run of '" + dir + "/wrong.json' could be predicted (1 skipped: the rows say why)");
  EXPECT_EQ(wrongCheck["points"], 0) << wrongCheck.dump();
  EXPECT_EQ(wrongCheck["skipped"], 1) << wrongCheck.dump();
  // A file made before the bench recorded the rates it charged its own work at says so on its row.
  nlohmann::json old = results;
  old["config"].erase("devices");
  old["runs"] = {run};
  std::ofstream(dir + "/old.json") << old.dump();
  {
    std::vector<testing::Proc> procs{testing::spawn({POSEIDON_CLI, "plan", "--check", dir + "/old.json"}, {}, dir + "/old")};
    testing::waitAll(procs, std::chrono::seconds(120));
    EXPECT_EQ(procs[0].exitCode(), 1) << procs[0].stderrText();
    EXPECT_THAT(procs[0].stdoutText(),
                HasSubstr("(no rates of the runtime's own work in the file: made before the bench recorded them)"));
  }
  // A node count past what the planner models is a skipped row, not minutes of silence.
  nlohmann::json huge = results;
  huge["runs"] = {run};
  huge["runs"][0]["nodes"] = 100000;
  std::ofstream(dir + "/huge.json") << huge.dump();
  {
    std::vector<testing::Proc> procs{testing::spawn({POSEIDON_CLI, "plan", "--check", dir + "/huge.json"}, {}, dir + "/huge")};
    testing::waitAll(procs, std::chrono::seconds(120));
    EXPECT_EQ(procs[0].exitCode(), 1) << procs[0].stderrText();
    EXPECT_THAT(procs[0].stdoutText(), HasSubstr("(more than 4096 ranks, past what the planner models)"));
  }
  std::ofstream(dir + "/bad.json") << R"({"runs": []})";
  expectRejected({{"plan", "--check", dir + "/bad.json"},
                  "--check: '" + dir + "/bad.json' is not a poseidon bench results file (no config and runs)"});
  expectRejected({{"plan", "--check", dir + "/none.json"}, "--check: cannot open '" + dir + "/none.json'"});
  std::filesystem::remove_all(dir);

  expectRejected({{"plan", "--predict", "--systems", "adam"},
                  "unknown system 'adam' (the planner models poseidon, poseidon-overlap, ps-wfbp, ps-naive, ddp, "
                  "ddp-fp16)"});
  expectRejected(
      {{"plan", "--check", "r.json", "--limits"},
       "--limits does not apply to --check: each run's model, cluster and rates come from the results file"});
  expectRejected({{"plan", "--sweep", "4,0"}, "each --sweep entry must be in [1, 4096], got 0"});
  expectRejected({{"plan", "--predict", "--rate", "0"}, "--rate must be > 0, got 0"});
  expectRejected({{"plan", "--check", "r.json", "--model", "vgg19"},
                  "--model does not apply to --check: each run's model, cluster and rates come from the results file"});
  expectRejected({{"plan", "--rate", "3"}, "--rate is for the planner (--predict, --sweep or --check)"});
  expectRejected(
      {{"plan", "--predict", "--host-queue", "red"}, "--host-queue must be fifo, tos or pfifo_fast, got 'red'"});
  expectRejected({{"plan", "--check", "r.json", "--host-queue", "tos"},
                  "--host-queue does not apply to --check: each run's model, cluster and rates come from the results "
                  "file"});
  expectRejected({{"plan", "--predict", "--links", "fair"}, "--links must be as-built, credits or ideal, got 'fair'"});
  expectRejected({{"plan", "--predict", "--credit-window", "65536"}, "--credit-window is for --links credits"});
  expectRejected({{"plan", "--predict", "--switch-queue", "red"}, "--switch-queue must be fifo or tos, got 'red'"});
  expectRejected({{"plan", "--check", "r.json", "--links", "ideal"},
                  "--links does not apply to --check: each run's model, cluster and rates come from the results "
                  "file"});
  expectRejected({{"plan", "--predict", "--groups", "2", "--credit-window", "65536"},
                  "--credit-window does not apply to --groups (group mode sends dense fp32 gradients and pulls "
                  "through the shards)"});
  expectRejected({{"plan", "--sweep", "2,4", "--workers", "8"},
                  "--workers does not apply to --sweep (it gives the worker counts)"});
  expectRejected({{"plan", "--predict", "--workers", "5000"}, "--predict models at most 4096 workers, got 5000"});
  expectRejected({{"plan", "--predict", "--scheme", "ps"},
                  "--scheme is for the cost table; the planner models BestScheme's choice at full width"});
  expectRejected({{"plan", "--predict", "--model", "lenet"},
                  "--predict needs the model's compute time: 'lenet' has no single-GPU timing (those with one: "
                  "vgg19, vgg19-22k, googlenet, inception-v3, resnet-152, alexnet); give --compute-seconds T, one "
                  "worker's seconds per iteration"});
}

// Today's hardware (docs/planner.md): H200 compute with its host copies, DDP's fp16 hook, and where
// each of the runtime's own costs binds (--limits): CURVE on two I/O threads binds vgg19 at 8 nodes
// below 100 GbE, and more I/O threads push that rate up.
TEST(CliFlags, PlanSaysWhereTheRuntimesOwnCostsBind) {
  auto limits = [](const std::string& ioThreads) {
    return planJson({"--predict", "--model", "vgg19", "--compute", "h200", "--workers", "8", "--rate", "100",
                     "--systems", "poseidon,ddp-fp16", "--limits", "--io-threads", ioThreads});
  };
  const nlohmann::json two = limits("2"), sixteen = limits("16");
  EXPECT_DOUBLE_EQ(two["copy_gbytes_per_s"].get<double>(), 55);  // the H200's pinned rate by default
  EXPECT_EQ(two["io_threads"], 2);
  ASSERT_EQ(two["predictions"].size(), 2u);
  EXPECT_EQ(two["predictions"][1]["system"], "ddp-fp16");
  ASSERT_EQ(two["limits"].size(), 5u);  // poseidon's five costs; DDP's are not modelled
  auto curve = [](const nlohmann::json& j) {
    for (const auto& row : j["limits"])
      if (row["cost"] == "CURVE encryption") return row;
    return nlohmann::json();
  };
  EXPECT_EQ(curve(two)["charged"], true);
  EXPECT_LT(curve(two)["binds_from_gbit"].get<double>(), 100);
  EXPECT_GT(curve(sixteen)["binds_from_gbit"].is_null() ? 1e9 : curve(sixteen)["binds_from_gbit"].get<double>(),
            curve(two)["binds_from_gbit"].get<double>());
  EXPECT_LT(sixteen["predictions"][0]["iteration_seconds"].get<double>(),
            two["predictions"][0]["iteration_seconds"].get<double>());
  // Without CURVE that cost is off; no host copies on the paper's Titan X.
  const nlohmann::json plain = planJson({"--predict", "--model", "vgg19", "--workers", "8", "--rate", "10", "--systems",
                                         "poseidon", "--limits", "--crypto", "0"});
  EXPECT_DOUBLE_EQ(plain["copy_gbytes_per_s"].get<double>(), 0);
  for (const auto& row : plain["limits"]) {
    if (row["cost"] == "CURVE encryption" || row["cost"] == "host copies") {
      EXPECT_EQ(row["charged"], false) << row;
    }
  }
  expectRejected({{"plan", "--predict", "--io-threads", "0"}, "--io-threads must be in [1, 64], got 0"});
}

// Compute groups (Omnivore's HE model): each g's step and update time, HE(g) / HE(1) against the
// g = 1 row, merged FC's, and --check on a time-to-accuracy file.
TEST(CliFlags, PlanModelsComputeGroupsAndChecksTimeToAccuracyFiles) {
  const nlohmann::json groups =
      planJson({"--predict", "--model", "lenet", "--compute-seconds", "0.3", "--batch", "32", "--workers", "8",
                "--rate", "0.03", "--pair-bytes", "65536", "--groups", "1,2,8"});
  ASSERT_EQ(groups["groups"].size(), 3u);
  EXPECT_EQ(groups["workers"], 8);
  const auto& g1 = groups["groups"][0];
  EXPECT_EQ(g1["groups"], 1);
  EXPECT_EQ(g1["group_size"], 8);
  EXPECT_DOUBLE_EQ(g1["he_ratio"].get<double>(), 1.0);
  for (const auto& row : groups["groups"]) {
    const double step = row["step_seconds"], g = row["groups"].get<double>();
    EXPECT_GT(step, 0.3) << row;  // compute, and a link of 30 Mbit/s on top
    // Symmetric groups: updates every step / g, samples at 8 x 32 per step (to the simulation's rounding).
    EXPECT_NEAR(row["update_seconds"].get<double>(), step / g, 1e-3 * step) << row;
    EXPECT_NEAR(row["samples_per_second"].get<double>(), 8 * 32 / step, 1e-3 * 8 * 32 / step) << row;
    EXPECT_DOUBLE_EQ(row["he_ratio"].get<double>(),
                     g1["samples_per_second"].get<double>() / row["samples_per_second"].get<double>());
  }
  EXPECT_EQ(groups["groups"][2]["group_size"], 1);

  // One model server (train --servers 1, Omnivore's): every pull and push goes through node 0's link, so one
  // synchronous group is slower than over every node's shard, and asynchrony wins more (HE(8) lower).
  const nlohmann::json oneServer =
      planJson({"--predict", "--model", "lenet", "--compute-seconds", "0.3", "--batch", "32", "--workers", "8",
                "--rate", "0.03", "--pair-bytes", "65536", "--groups", "1,2,8", "--servers", "1"});
  EXPECT_EQ(oneServer["servers"], 1);
  EXPECT_EQ(groups["servers"], 8);
  EXPECT_GT(oneServer["groups"][0]["step_seconds"].get<double>(), groups["groups"][0]["step_seconds"].get<double>());
  EXPECT_LT(oneServer["groups"][2]["he_ratio"].get<double>(), groups["groups"][2]["he_ratio"].get<double>());

  // Merged FC: LeNet's ip1 and ip2 on one FC server, 800 floats of activations a sample each way instead of
  // their 405,510 parameters through the shards: asynchronous groups step faster at 30 Mbit/s, and the
  // server's load grows with g. (One group of 8 is not faster: the server's work on its 8 x 32 rows waits
  // between the forward and the backward, while the shards' replies overlap the pushes, wait-free.)
  const nlohmann::json fcServer =
      planJson({"--predict", "--model", "lenet", "--compute-seconds", "0.3", "--batch", "32", "--workers", "8",
                "--rate", "0.03", "--pair-bytes", "65536", "--groups", "1,2,8", "--merged-fc"});
  EXPECT_EQ(fcServer["merged_fc"], true);
  EXPECT_EQ(fcServer["activation_floats"], 800);
  ASSERT_EQ(fcServer["groups"].size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const auto& row = fcServer["groups"][i];
    if (i > 0) {
      EXPECT_LT(row["step_seconds"].get<double>(), groups["groups"][i]["step_seconds"].get<double>()) << row;
    }
    EXPECT_GT(row["fc_server_busy"].get<double>(), 0) << row;
    EXPECT_LE(row["fc_server_busy"].get<double>(), 1) << row;
    if (i > 0) {
      EXPECT_GT(row["fc_server_busy"].get<double>(), fcServer["groups"][i - 1]["fc_server_busy"].get<double>());
    }
  }

  // --check on a `bench --accuracy` file: bsp, ddp, gG and gGfc are modelled; failed runs and jittered pads are not.
  std::string dir = testing::makeTempDir("plancheck-acc");
  const nlohmann::json g2{{"system", "g2"}, {"groups", 2}, {"mbit", 30.0}, {"seconds_per_step", 1.5}, {"ok", true}};
  nlohmann::json bsp = g2, failed = g2, merged = g2;
  bsp["system"] = "bsp";
  bsp["groups"] = 0;
  failed["ok"] = false;
  merged["system"] = "g2fc";
  merged["merged_fc"] = true;
  merged["fc_server_ms_per_update"] = 5.0;
  const nlohmann::json config{{"nodes", 8}, {"pad_ms", 300.0}, {"batch", 32}, {"pair_bytes", 65536}};
  std::ofstream(dir + "/acc.json") << nlohmann::json{{"config", config}, {"runs", {g2, bsp, failed, merged}}}.dump();
  const nlohmann::json check = planJson({"--check", dir + "/acc.json", "--host-cores", "2"});
  EXPECT_DOUBLE_EQ(check["message_us"].get<double>(), 60);  // made before the ranks' 1 ns timer slack
  nlohmann::json slack = config;
  slack["timer_slack_ns"] = 1;
  std::ofstream(dir + "/acc-slack.json") << nlohmann::json{{"config", slack}, {"runs", {g2}}}.dump();
  EXPECT_DOUBLE_EQ(planJson({"--check", dir + "/acc-slack.json", "--host-cores", "2"})["message_us"].get<double>(), 30);
  EXPECT_EQ(check["points"], 3);
  EXPECT_EQ(check["skipped"], 1);
  ASSERT_EQ(check["rows"].size(), 3u);
  for (const auto& row : check["rows"]) {
    const double predicted = row["predicted_seconds"];
    EXPECT_GT(predicted, 0.3) << row;  // the pad, at least
    EXPECT_DOUBLE_EQ(row["error"].get<double>(), predicted / 1.5 - 1);
  }
  EXPECT_EQ(check["rows"][0]["groups"], 2);
  // The merged run moves activations instead of the FC layers' parameters: predicted faster than g2.
  EXPECT_EQ(check["rows"][2]["system"], "g2fc");
  EXPECT_LT(check["rows"][2]["predicted_seconds"].get<double>(), check["rows"][0]["predicted_seconds"].get<double>());
  // With one server the file's mean-rate step (every worker's, bench --accuracy --servers) is what is checked.
  nlohmann::json oneShard = config, g2rate = g2;
  oneShard["servers"] = 1;
  g2rate["mean_rate_seconds_per_step"] = 1.2;
  std::ofstream(dir + "/one.json") << nlohmann::json{{"config", oneShard}, {"runs", {g2rate}}}.dump();
  const nlohmann::json one = planJson({"--check", dir + "/one.json", "--host-cores", "2"});
  ASSERT_EQ(one["rows"].size(), 1u);
  EXPECT_DOUBLE_EQ(one["rows"][0]["measured_seconds"].get<double>(), 1.2);
  EXPECT_EQ(one["rows"][0]["measured"], "mean_rate");
  EXPECT_EQ(check["rows"][0]["measured"], "rank0");
  EXPECT_GT(one["rows"][0]["predicted_seconds"].get<double>(), check["rows"][0]["predicted_seconds"].get<double>());
  // A shallow switch queue drops packets under incast, which the planner does not model.
  nlohmann::json shallow = config;
  shallow["queue_ms"] = 5.0;
  std::ofstream(dir + "/shallow.json") << nlohmann::json{{"config", shallow}, {"runs", {g2}}}.dump();
  expectRejected({{"plan", "--check", dir + "/shallow.json"},
                  "--check: the planner models no drops, and the file's switch queue (queue_ms 5) drops packets "
                  "under incast; it checks runs with the default 100 ms"});
  nlohmann::json jittered = config;
  jittered["pad_jitter_ms"] = 300.0;
  std::ofstream(dir + "/jitter.json") << nlohmann::json{{"config", jittered}, {"runs", {g2}}}.dump();
  const nlohmann::json none = planJson(
      {"--check", dir + "/jitter.json"}, "--check: no run of '" + dir + "/jitter.json' could be predicted (1 skipped: the rows say why)");
  EXPECT_EQ(none["points"], 0);
  EXPECT_EQ(none["skipped"], 1);
  std::filesystem::remove_all(dir);

  expectRejected({{"plan", "--predict", "--workers", "8", "--groups", "3"}, "--groups 3 does not divide --workers 8"});
  expectRejected(
      {{"plan", "--predict", "--workers", "8", "--groups", "16"}, "each --groups entry must be in [1, 8], got 16"});
  expectRejected({{"plan", "--predict", "--groups", "2", "--systems", "ddp"},
                  "--systems does not apply to --groups (group mode sends dense fp32 gradients and pulls through the "
                  "shards)"});
  expectRejected({{"plan", "--groups", "2"}, "--groups is for the planner (--predict, --sweep or --check)"});
  expectRejected({{"plan", "--predict", "--merged-fc"}, "--merged-fc is a compute-group mode: it needs --groups"});
  expectRejected({{"plan", "--merged-fc"}, "--merged-fc is for the planner (--predict, --sweep or --check)"});
  expectRejected({{"plan", "--predict", "--servers", "2"},
                  "--servers is for the cost table and --groups; the planner's other systems have every node a worker "
                  "and a server shard"});
  expectRejected({{"plan", "--predict", "--groups", "1", "--workers", "8", "--servers", "9"},
                  "--servers 9 exceeds --workers 8 (shards are nodes)"});
  expectRejected(
      {{"bench", "--accuracy", "--nodes", "4", "--servers", "5"}, "--servers 5 exceeds --nodes 4 (shards are nodes)"});
}

TEST(CliFlags, TuneRejectsInconsistentBudgets) {
  expectRejected(
      {{"tune", "--epoch-steps", "100", "--probe-steps", "30"}, "--probe-steps 30 must divide --epoch-steps 100"});
  expectRejected({{"tune", "--steps", "255", "--epoch-steps", "120"},
                  "--probe-steps 2 (1/60 of --epoch-steps, at least 2) must divide --steps 255"});
  expectRejected({{"tune", "--steps", "300", "--epoch-steps", "120", "--cold-start-steps", "5"},
                  "--probe-steps 2 (1/60 of --epoch-steps, at least 2) must divide --cold-start-steps 5"});
  expectRejected({{"tune", "--steps", "300", "--epoch-steps", "120", "--cold-start-steps", "302"},
                  "--cold-start-steps 302 exceeds --steps 300"});
  expectRejected({{"tune", "--regret", "--ratios", "7"},
                  "--ratios 7: a probe of --epoch-steps 600 / 7 must be a whole number of at least 2 steps that "
                  "divides --steps 1800"});
  expectRejected(
      {{"tune", "--regret", "--groups-list", "2,4"}, "--groups-list must include 1 (the cold start is synchronous)"});
  expectRejected({{"tune", "--regret", "--groups-list", "1,3"}, "--groups-list: 3 does not divide --nodes 8"});
  expectRejected({{"tune", "--regret", "--epoch-steps", "3600"}, "--epoch-steps 3600 exceeds --steps 1800"});
  expectRejected({{"tune", "--steps", "100", "--epoch-steps", "200"}, "--epoch-steps 200 exceeds --steps 100"});
  expectRejected({{"tune", "--groups-list", "2,4"}, "--groups-list must include 1 (the cold start is synchronous)"});
  expectRejected({{"tune", "--groups-list", "1,3"}, "--groups-list: 3 does not divide --nodes 8"});
  expectRejected({{"tune", "--momenta", "0.3,0.9"}, "--momenta must include 0 (it decides when to halve g)"});
  expectRejected({{"tune", "--momenta", "0,1"}, "each --momenta entry must be in [0, 1), got 1"});
  expectRejected({{"tune", "--lrs", "0.1,0"}, "each --lrs entry must be > 0, got 0"});
  expectRejected({{"tune", "--probe-samples", "-1"}, "--probe-samples must be in [0, 60000], got -1"});
}

TEST(CliFlags, LaunchRejectsOutOfRangeValues) {
  expectRejected(
      {{"launch", "--master-port", "70000", "--", "true"}, "--master-port must be in [0, 65535], got 70000"});
  expectRejected({{"launch", "-n", "0", "--", "true"}, "-n must be in [1, 65536], got 0"});
  expectRejected({{"launch", "--n", "0", "--", "true"}, "-n must be in [1, 65536], got 0"});
  expectRejected({{"launch", "-n"}, "flag -n needs a value (N)"});
  expectRejected({{"launch", "--max-restarts", "-1", "--", "true"}, "--max-restarts must be >= 0, got -1"});
}

// With --max-restarts the launcher restarts a failed job, but not one that would fail the same way
// again: exit code 2 (a usage error the ranks found), 126 or 127 (a program that could not be run).
TEST(CliFlags, LaunchDoesNotRestartWhatWouldFailAgain) {
  std::string dir = testing::makeTempDir("flags");
  for (const std::string code : {"2", "126", "127"}) {
    SCOPED_TRACE(code);
    const testing::Proc p = testing::runCli(
        {"launch", "-n", "2", "--max-restarts", "2", "--", "/bin/sh", "-c", "exit " + code}, dir + "/exit" + code, {},
        60);
    EXPECT_EQ(p.exitCode(), std::stoi(code));
    EXPECT_THAT(p.stderrText(), HasSubstr("; not restarted: exit code " + code +
                                          (code == "2" ? " is a usage error" : " means the program could not be run") +
                                          ", which a restart would repeat"));
    EXPECT_THAT(p.stderrText(), Not(HasSubstr("restart 1 of 2")));
  }
  std::filesystem::remove_all(dir);
}

// A program the ranks could not run is refused once, before any rank starts (it was one "cannot
// run" line per rank and, with --max-restarts, a restart).
TEST(CliFlags, LaunchRefusesAProgramItCannotRun) {
  expectRejected({{"launch", "-n", "2", "--max-restarts", "1", "--", "/nonexistent/poseidon-cmd"},
                  "cannot run '/nonexistent/poseidon-cmd': No such file or directory"});
  expectRejected({{"launch", "-n", "2", "--", "poseidon-no-such-program-on-path"},
                  "cannot run 'poseidon-no-such-program-on-path': not found on PATH"});
  expectRejected({{"launch", "-n", "2", "--", "/tmp"}, "cannot run '/tmp': it is a directory"});
}

TEST(CliFlags, BenchRejectsOutOfRangeValues) {
  expectRejected({{"bench", "--iterations", "0"}, "--iterations must be >= 1, got 0"});
  expectRejected({{"bench", "--scale", "0"}, "--scale must be in (0, 1], got 0"});
  expectRejected({{"bench", "--latency-ms", "-1"}, "--latency-ms must be >= 0, got -1"});
  expectRejected({{"bench", "--run-timeout", "3000000"}, "--run-timeout must be in [1, 2147483], got 3000000"});
  expectRejected({{"bench", "--nodes", "1,65"}, "each --nodes entry must be in [1, 64], got 65"});
  expectRejected({{"bench", "--rates", "100,0"}, "each --rates entry (Mbit/s) must be > 0, got 0"});
  expectRejected({{"bench", "--repeat", "0"}, "--repeat must be in [1, 100], got 0"});
  expectRejected({{"bench", "--local-ranks", "0"}, "--local-ranks must be in [1, 16], got 0"});
  expectRejected({{"bench", "--local-ranks", "2", "--systems", "poseidon,adam"},
                  "--local-ranks 2: the adam baseline has no local aggregation (its one server per layer takes "
                  "every rank's factors); run it without --local-ranks"});
  expectRejected(
      {{"bench", "--compute", "titanx,tpu"}, "unknown --compute 'tpu' (titanx, h200, h200-bf16, cpu:C, none)"});
  expectRejected({{"bench", "--compute", "cpu:0"}, "--compute cpu:C needs a core count C in [1, 256], got 'cpu:0'"});
  expectRejected({{"bench", "--compute", "h200,titanx"},
                  "--compute names two GPUs, h200 and titanx; one run models one GPU's compute (run them separately)"});
  expectRejected({{"bench", "--device", "gpu"},
                  "--device is now --compute (titanx replaces gpu; cpu:C and none as before); --device names where a "
                  "model's tensors live, in train"});
  expectRejected({{"bench", "--report-from", "/nonexistent/r.json", "--markdown", "/dev/null"},
                  "--report-from: cannot read /nonexistent/r.json"});
  expectRejected({{"bench", "--report-from", "/dev/null"}, "--report-from needs --markdown or --plots"});
  expectRejected({{"bench", "--io-threads", "0"}, "--io-threads must be in [1, 64], got 0"});
  expectRejected({{"bench", "--pair-bytes", "2"}, "--pair-bytes must be in [4, 1073741824], got 2"});
  expectRejected({{"bench", "--queue-ms", "0"}, "--queue-ms must be in [1, 1000], got 0"});
  expectRejected({{"bench", "--tcp-cc", "cubic;reboot"},
                  "--tcp-cc: 'cubic;reboot' is not a congestion-control name (e.g. cubic, reno, bbr)"});
  expectRejected({{"bench", "--accuracy", "--tcp-cc", ""},
                  "--tcp-cc: '' is not a congestion-control name (e.g. cubic, reno, bbr)"});
  expectRejected({{"bench", "--accuracy", "--tcp-rcvbuf", "-2"}, "--tcp-rcvbuf must be in [-1, 1073741824], got -2"});
  expectRejected({{"bench", "--systems", "poseidon,poseidon-overlap", "--warmup", "0"},
                  "poseidon-overlap needs --warmup 1 or more (each iteration carries the one before's tail)"});
  expectRejected({{"bench", "--systems", "poseidon-overlap-bf16", "--warmup", "0"},
                  "poseidon-overlap needs --warmup 1 or more (each iteration carries the one before's tail)"});
  expectRejected({{"bench", "--systems", "poseidon-fp8"},
                  "unknown system 'poseidon-fp8' (the systems: poseidon, poseidon-overlap, ps-wfbp, ps-naive, adam, sfb, "
                  "ddp, ddp-tuned, ddp-fp16, ddp-powersgd1, ddp-powersgd4; a Poseidon one takes -nocurve last, and all "
                  "but adam -bf16 or -fp16 before it)"});
  expectRejected({{"bench", "--machine-rates", "78,9.7"},
                  "--machine-rates needs three rates, GEMM GFLOP/s, sums GB/s and CURVE GB/s (e.g. 78,9.7,1.4), got "
                  "'78,9.7'"});
  expectRejected({{"bench", "--machine-rates", "78,9.7,0"}, "--machine-rates' CURVE GB/s must be > 0, got 0"});
  expectRejected({{"bench", "--send-window", "100"}, "--send-window must be 0 or [4096, 1073741824], got 100"});
  expectRejected({{"bench", "--host-queue", "prio"}, "--host-queue must be fifo, tos or pfifo_fast, got 'prio'"});
  expectRejected({{"bench", "--switch-queue", "prio"}, "--switch-queue must be fifo or tos, got 'prio'"});
  // A switch port is not a Linux host's queue.
  expectRejected({{"bench", "--switch-queue", "pfifo_fast"}, "--switch-queue must be fifo or tos, got 'pfifo_fast'"});
  expectRejected({{"bench", "--urgent-layers", "-2"}, "--urgent-layers must be in [-1, 1048576], got -2"});
  expectRejected({{"bench", "--systems", "poseidon,ddp", "--urgent-layers", "2"},
                  "--urgent-layers is for the poseidon-overlap systems (their priority links), and --systems has "
                  "none"});
  expectRejected({{"bench", "--time-dilation", "0.5"}, "--time-dilation must be in [1, 32], got 0.5"});
  // A script the user names is that file or an error, before the root check (not the checkout's own).
  expectRejected({{"bench", "--systems", "ddp", "--ddp-script", "/nonexistent/ddp_worker.py"},
                  "--ddp-script /nonexistent/ddp_worker.py: no such file (the DDP baseline's script, "
                  "bench/ddp_worker.py in the repository)"});
  expectRejected({{"bench", "--accuracy", "--systems", "ddp", "--ddp-script", "/tmp"},
                  "--ddp-script /tmp: not a file (the DDP baseline's script, bench/ddp_train.py in the repository)"});
  expectRejected({{"bench", "--systems", "ddp-bf16"},
                  "unknown system 'ddp-bf16' (a DDP baseline takes no -bf16 suffix: ddp-fp16 is DDP with its fp16 "
                  "compression hook)"});
  expectRejected({{"bench", "--systems", "ddp-nocurve"},
                  "unknown system 'ddp-nocurve' (DDP's Gloo links are never encrypted: -nocurve is for Poseidon's)"});
  expectRejected(
      {{"bench", "--systems", "poseidon-nocurve-bf16"}, "unknown system 'poseidon-nocurve-bf16' (-nocurve goes last)"});
  expectRejected(
      {{"bench", "--systems", "adam-bf16"}, "unknown system 'adam-bf16' (the adam baseline has no 16-bit wire)"});
}

// --report-from rewrites a `bench --accuracy` file's tables too: with one model server (--servers 1) the
// groups' mean-rate step (every worker's) stands beside rank 0's, and the table says where the shards were.
TEST(CliFlags, BenchRewritesAnAccuracyReport) {
  std::string dir = testing::makeTempDir("accreport");
  const nlohmann::json config{{"command", "poseidon bench --accuracy --servers 1"},
                              {"nodes", 8},
                              {"batch", 32},
                              {"pad_ms", 300.0},
                              {"pad_jitter_ms", 0.0},
                              {"steps", 20},
                              {"curve_every", 20},
                              {"target_accuracy", 0.8},
                              {"target_loss", 0.6},
                              {"rates_mbit", {30.0}},
                              {"servers", 1}};
  const nlohmann::json run{{"system", "g8"},
                           {"groups", 8},
                           {"lr", 0.005},
                           {"momentum", 0.6},
                           {"mbit", 30.0},
                           {"ok", true},
                           {"seconds_per_step", 0.34},
                           {"mean_rate_seconds_per_step", 1.755},
                           {"time_to_accuracy_s", -1.0},
                           {"steps_to_accuracy", -1},
                           {"time_to_loss_s", -1.0},
                           {"steps_to_loss", -1},
                           {"final_test_accuracy", 0.428},
                           {"pad_overruns", 1.0}};
  std::ofstream(dir + "/acc.json") << nlohmann::json{{"config", config}, {"runs", {run}}}.dump();
  std::vector<testing::Proc> procs{testing::spawn(
      {POSEIDON_CLI, "bench", "--report-from", dir + "/acc.json", "--markdown", dir + "/acc.md"}, {}, dir + "/cli")};
  testing::waitAll(procs, std::chrono::seconds(30));
  ASSERT_EQ(procs[0].exitCode(), 0) << procs[0].stderrText();
  std::ifstream in(dir + "/acc.md");
  const std::string md((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_THAT(md, HasSubstr("Poseidon's shards on nodes 0..0 only (`--servers 1`"));
  EXPECT_THAT(md, HasSubstr("| g8 | 0.005 | 0.6 | 0.340 | 1.755 | - | - | - | - | 42.8% | 1 | - | - |"));
  std::filesystem::remove_all(dir);
}

TEST(CliFlags, TrainRejectsOutOfRangeNetworkKnobs) {
  expectRejected({{"train", "--io-threads", "-1"}, "--io-threads must be in [0, 64], got -1"});
  expectRejected({{"train", "--tcp-rcvbuf", "-2"}, "--tcp-rcvbuf must be in [-1, 1073741824], got -2"});
  expectRejected({{"train", "--wire", "fp8"}, "unknown wire precision 'fp8' (expected fp32, bf16 or fp16)"});
  expectRejected({{"train", "--host-queue", "pfifo_fast"}, "--host-queue must be auto, fifo or tos, got 'pfifo_fast'"});
  expectRejected(
      {{"train", "--host-queue", "tos"},
       "--host-queue tos chooses the automatic urgent layers and send window: it needs --send-window, and no "
       "--urgent-layers unless --send-window -1"});
  expectRejected(
      {{"train", "--host-queue", "fifo", "--overlap-forward", "--send-window", "8192", "--urgent-layers", "2"},
       "--host-queue fifo chooses the automatic urgent layers and send window: it needs --send-window, and no "
       "--urgent-layers unless --send-window -1"});
  expectRejected(
      {{"train", "--wire", "fp16", "--plain"}, "--wire fp16 and --plain cannot be combined (--plain sends nothing)"});
  expectRejected({{"train", "--wire", "bf16", "--groups", "2"},
                  "--wire bf16 and --groups cannot be combined (the groups' pulls carry the model itself)"});
  expectRejected({{"train", "--local-ranks", "3"}, "--local-ranks 3 must divide --workers 4"});
  expectRejected({{"train", "--local-ranks", "-1"}, "--local-ranks must be in [0, 4096], got -1"});
  expectRejected(
      {{"train", "--local-ranks", "2", "--groups", "2"}, "--local-ranks 2 cannot be combined with --groups"});
  expectRejected(
      {{"train", "--local-ranks", "2", "--servers", "1"}, "--local-ranks 2 cannot be combined with --servers"});
}

// Options no rank could train with are refused once, by poseidon train itself, before it starts a
// worker: one line (each worker used to print its own, and the launcher a last one).
TEST(CliFlags, TrainRefusesBadOptionsOnceBeforeAnyWorkerStarts) {
  expectRejected({{"train", "--workers", "2", "--model", "nosuch"},
                  "unknown model 'nosuch' (expected lenet, cifar10-quick or mlp)"});
  expectRejected({{"train", "--workers", "2", "--servers", "5"}, "--servers 5 exceeds the job's 2 ranks (each shard is a rank)"});
  expectRejected({{"train", "--workers", "2", "--plain"}, "--plain runs the plain LibTorch loop and needs --workers 1"});
  // The adam baseline's exclusions (JobSettings::conflictError): refused here, not once every worker
  // has loaded the data and met at the rendezvous.
  expectRejected({{"train", "--workers", "2", "--scheme", "adam", "--wire", "bf16"},
                  "--wire bf16 does not apply to the adam baseline (use --wire fp32)"});
  expectRejected({{"train", "--workers", "2", "--scheme", "adam", "--local-ranks", "2"},
                  "--local-ranks 2 cannot be combined with the adam baseline"});
  expectRejected({{"train", "--workers", "2", "--scheme", "adam", "--groups", "2"},
                  "--groups does not apply to the adam baseline"});
  expectRejected(
      {{"train", "--workers", "2", "--scheme", "adam", "--drop-stragglers", "1", "--straggler-timeout", "100"},
       "straggler dropping does not apply to the adam baseline"});
  // Found by the coordinator at rendezvous, the model and the transport before; now before any worker.
  expectRejected({{"train", "--workers", "2", "--drop-stragglers", "2", "--straggler-timeout", "100"},
                  "--drop-stragglers 2 must be less than the 2 workers"});
  expectRejected({{"train", "--workers", "2", "--groups", "2", "--merged-fc", "--model", "mlp"},
                  "--merged-fc needs a model with conv features and an FC classifier (lenet, cifar10-quick); mlp is "
                  "all FC"});
  // 192.0.2.1: TEST-NET-1 (RFC 5737), no machine's own address.
  expectRejected({{"train", "--workers", "2", "--bind", "192.0.2.1"},
                  "--bind 192.0.2.1: the workers cannot listen there (Cannot assign requested address); it must be an "
                  "address or interface of this machine"});
}

// A list with an empty entry is a typo, not a shorter list; a results path that cannot be written is
// the user's mistake, said with its reason before any run.
TEST(CliFlags, ListsAndOutputPathsAreCheckedWhole) {
  expectRejected({{"plan", "--predict", "--model", "lenet", "--sweep", "1,,2"},
                  "the list '1,,2' has an empty entry (comma-separated values, e.g. 1,2,4)"});
  expectRejected({{"plan", "--predict", "--model", "lenet", "--sweep", "1,2,"},
                  "the list '1,2,' has an empty entry (comma-separated values, e.g. 1,2,4)"});
  expectRejected({{"experiment", "implicit-momentum", "--groups", "1,2,"},
                  "--groups expects a comma-separated list of integers >= 1, got '1,2,'"});
}

// bench and tune check every path they write before the first run (and before they ask for root), not
// at the end of a sweep of hours whose results the typo would lose; --bisect names systems and sizes
// that are run. Nothing is left where the checks looked.
TEST(CliFlags, BenchAndTuneCheckTheirOutputsBeforeTheFirstRun) {
  const std::string dir = testing::makeTempDir("outputs");
  const std::string file = dir + "/file";
  std::ofstream(file) << "not a directory";
  const std::string nowhere = "/nonexistent/x.json";
  const std::string noDir = "cannot create files in /nonexistent: No such file or directory";
  expectRejected({{"bench", "--json", nowhere}, "--json " + nowhere + ": " + noDir});
  expectRejected({{"bench", "--markdown", dir}, "--markdown " + dir + ": is a directory, expected a file name"});
  expectRejected({{"bench", "--plots", file}, "--plots " + file + ": is a file, expected a directory"});
  expectRejected({{"bench", "--trace", file}, "--trace " + file + ": is a file, expected a directory"});
  expectRejected({{"bench", "--plots", file + "/sub"}, "--plots " + file + "/sub: cannot create it: Not a directory"});
  expectRejected({{"bench", "--accuracy", "--plots", file}, "--plots " + file + ": is a file, expected a directory"});
  expectRejected({{"bench", "--accuracy", "--json", nowhere}, "--json " + nowhere + ": " + noDir});
  expectRejected({{"tune", "--json", nowhere}, "--json " + nowhere + ": " + noDir});
  expectRejected({{"tune", "--markdown", dir}, "--markdown " + dir + ": is a directory, expected a file name"});
  expectRejected({{"tune", "--regret", "--json", nowhere}, "--json " + nowhere + ": " + noDir});
  expectRejected({{"experiment", "implicit-momentum", "--json", nowhere}, "--json " + nowhere + ": " + noDir});
  expectRejected({{"experiment", "implicit-momentum", "--json", dir},
                  "--json " + dir + ": is a directory, expected a file name"});
  expectRejected({{"bench", "--report-from", dir, "--markdown", dir + "/t.md"},
                  "--report-from " + dir + ": is a directory, expected a results JSON file"});
  expectRejected({{"bench", "--bisect", "ddp-tuned", "--compute", "none"},
                  "--bisect: 'ddp-tuned' is not one of the systems run (--systems "
                  "poseidon,ps-wfbp,ps-naive,adam,ddp,ddp-fp16,ddp-powersgd1,ddp-powersgd4); it needs that system's "
                  "runs"});
  expectRejected({{"bench", "--bisect", "ddp", "--nodes", "8", "--compute", "none"},
                  "--bisect needs --nodes to hold 1 (each system's baseline) and a larger size, got 8"});
  // The probes removed what they made: the file, and nothing else.
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(dir)) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"file"});
  std::filesystem::remove_all(dir);
}

// A number beyond its type names the bound it passed (not "expects a number"); a value the flag's
// range leaves out is refused, not read as "not given" (--compute-seconds 0); a missing dataset fails
// before any output; no command at all is a usage error on stderr.
TEST(CliFlags, NumbersBeyondTheirTypeAndMissingInputsSayWhatIsWrong) {
  expectRejected({{"plan", "--workers", "99999999999999999999"},
                  "--workers must be at most 65536, got 99999999999999999999"});
  expectRejected({{"plan", "--workers", "-99999999999999999999"},
                  "--workers must be in [1, 65536], got -99999999999999999999"});
  expectRejected({{"train", "--lr", "1e999"}, "--lr must be a finite number, got 1e999 (beyond a double's range)"});
  expectRejected({{"train", "--lr", "1e-400"}, "--lr must be > 0, got 1e-400 (too close to 0 for a double)"});
  expectRejected({{"train", "--lr", "inf"}, "--lr expects a number, got 'inf'"});
  expectRejected({{"plan", "--predict", "--model", "vgg19", "--compute-seconds", "0"},
                  "--compute-seconds must be > 0, got 0"});

  std::string dir = testing::makeTempDir("flags");
  const testing::Proc noData =
      testing::runCli({"experiment", "implicit-momentum", "--data", dir + "/none"}, dir + "/data", {}, 60);
  EXPECT_EQ(noData.exitCode(), 2);
  EXPECT_EQ(noData.stdoutText(), "");  // no header before the error
  EXPECT_THAT(noData.stderrText(), HasSubstr("Fashion-MNIST not found at " + dir + "/none: install it"));
  std::ofstream(dir + "/file") << "not the dataset";
  expectRejected({{"train", "--data", dir + "/file"},
                  "Fashion-MNIST: " + dir + "/file is a file, not a directory (--data names the directory of the four "
                  "IDX files)"});
  // tune and bench --accuracy check the dataset before they build a cluster (after the root check
  // that every cluster command makes first: run as root, as CI does).
  if (::geteuid() == 0) {
    const std::string missing = "Fashion-MNIST not found at " + dir +
                                "/none: install it with 'apt-get install dataset-fashion-mnist' or pass --data DIR";
    expectRejected({{"tune", "--data", dir + "/none"}, missing});
    expectRejected({{"bench", "--accuracy", "--data", dir + "/none", "--systems", "bsp"}, missing});
  }

  const testing::Proc bare = testing::runCli({}, dir + "/bare", {}, 30);
  EXPECT_EQ(bare.exitCode(), 2);
  EXPECT_EQ(bare.stdoutText(), "");
  EXPECT_THAT(bare.stderrText(), HasSubstr("usage: poseidon <command> [flags]"));
  const testing::Proc noExperiment = testing::runCli({"experiment"}, dir + "/noexp", {}, 30);
  EXPECT_EQ(noExperiment.exitCode(), 2);
  EXPECT_EQ(noExperiment.stdoutText(), "");
  EXPECT_THAT(noExperiment.stderrText(), HasSubstr("usage: poseidon experiment <name>"));
  std::filesystem::remove_all(dir);
}

// What the environment says is checked once, before any worker starts, and the error names the
// variable; restarts belong to whoever starts the ranks.
TEST(CliFlags, EnvironmentIsCheckedOnceAndNamed) {
  std::string dir = testing::makeTempDir("flags");
  auto rejected = [&](const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
                      const std::string& message, const std::string& prefix = "") {
    const testing::Proc p = testing::runCli(args, dir + "/env", env, 60);
    EXPECT_EQ(p.exitCode(), 2) << p.stderrText();
    EXPECT_EQ(p.stdoutText(), "");
    EXPECT_EQ(p.stderrText(), prefix + "poseidon " + args[0] + ": error: " + message + "\n");
  };
  rejected({"plan"}, {{"POSEIDON_LOG", "verbose"}},
           "POSEIDON_LOG: unknown log level 'verbose' (expected debug, info, warning, error or off)");
  rejected({"train", "--workers", "2"}, {{"POSEIDON_TRANSPORT_SECURITY", "off"}},
           "POSEIDON_TRANSPORT_SECURITY must be curve or none, got 'off'");
  // The ranks read the variable before the flag replaces it: refused with the flag too.
  rejected({"train", "--workers", "2", "--transport-security", "none"}, {{"POSEIDON_TRANSPORT_SECURITY", "off"}},
           "POSEIDON_TRANSPORT_SECURITY must be curve or none, got 'off'");
  rejected({"launch", "-n", "2", "--", "true"}, {{"POSEIDON_TRANSPORT_SECURITY", "off"}},
           "POSEIDON_TRANSPORT_SECURITY must be curve or none, got 'off'");
  rejected({"train", "--max-restarts", "1"}, {{"RANK", "0"}, {"WORLD_SIZE", "1"}},
           "--max-restarts is for a train that starts its own workers; started by torchrun (RANK=0 WORLD_SIZE=1), "
           "give the restarts to that launcher (poseidon launch --max-restarts R)",
           "[rank 0] ");  // a rank's lines carry its rank
  // The fault-injection hooks of the reliability tests name a rank of the job, and only such a rank:
  // another made a fault that never happened, and its test passed for nothing.
  rejected({"train", "--workers", "2"}, {{"POSEIDON_FAULT", "5:3:kill"}},
           "POSEIDON_FAULT names rank 5, but the job's ranks are 0..1");
  rejected({"train", "--workers", "2"}, {{"POSEIDON_FAULT", "-1:3:kill"}},
           "POSEIDON_FAULT='-1:3:kill' is not RANK:ITERATION:kill|stop (RANK, ITERATION >= 0)");
  rejected({"train", "--workers", "2"}, {{"POSEIDON_SLOW", "2:50"}},
           "POSEIDON_SLOW names rank 2, but the job's ranks are 0..1");
  // Each field whole (sscanf took trailing text and spaces, and read an overflowing rank as 1215752191),
  // and a fault past --max-steps never fires: refused.
  rejected({"train", "--workers", "2"}, {{"POSEIDON_FAULT", "1:1:kill extra"}},
           "POSEIDON_FAULT='1:1:kill extra' is not RANK:ITERATION:kill|stop (RANK, ITERATION >= 0)");
  rejected({"train", "--workers", "2"}, {{"POSEIDON_FAULT", "99999999999:3:kill"}},
           "POSEIDON_FAULT='99999999999:3:kill' is not RANK:ITERATION:kill|stop (RANK, ITERATION >= 0)");
  rejected({"train", "--workers", "2"}, {{"POSEIDON_SLOW", "1: 5"}},
           "POSEIDON_SLOW='1: 5' is not RANK:MS (RANK >= 0, MS in [0, 3600000] milliseconds per step)");
  rejected({"train", "--workers", "2", "--max-steps", "3"}, {{"POSEIDON_FAULT", "1:100:kill"}},
           "POSEIDON_FAULT fires at iteration 100, but --max-steps 3 ends the job before it (iterations 0..2)");
  // A step of 1e300 ms overflowed the wait and was not padded at all, reported as padded.
  rejected({"train", "--workers", "2"}, {{"POSEIDON_SLOW", "1:1e300"}},
           "POSEIDON_SLOW='1:1e300' is not RANK:MS (RANK >= 0, MS in [0, 3600000] milliseconds per step)");
  // Empty is unset, as for every other variable: the error is the next one.
  rejected({"train", "--workers", "2", "--servers", "5"}, {{"POSEIDON_FAULT", ""}, {"POSEIDON_SLOW", ""}},
           "--servers 5 exceeds the job's 2 ranks (each shard is a rank)");
  // WORLD_SIZE without RANK would train alone and report success.
  rejected({"train"}, {{"WORLD_SIZE", "2"}},
           "WORLD_SIZE=2 is set but RANK is not: each process of the world needs its own (torchrun convention); "
           "unset WORLD_SIZE to run alone");
  // Errors about the world name the variables that made it.
  rejected({"train", "--workers", "3"},
           {{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_ID", "0"}, {"MASTER_ADDR", "127.0.0.1"}},
           "--workers 3 disagrees with the launcher's world size 2 (slurm: SLURM_PROCID=1 SLURM_NTASKS=2)",
           "[rank 1] ");
  // More than one rank and no MASTER_ADDR: refused at once, not a 127.0.0.1 that a rank on another
  // machine would wait out its timeout for.
  rejected({"train"}, {{"RANK", "1"}, {"WORLD_SIZE", "2"}},
           "started by torchrun (RANK=1 WORLD_SIZE=2) but MASTER_ADDR is not set: export MASTER_ADDR=<address of "
           "rank 0's machine> (127.0.0.1 when every rank runs on this one)");
  // An empty POSEIDON_LOG is unset, as every other variable; DEBUG is debug.
  for (const char* level : {"", "DEBUG"}) {
    const testing::Proc p = testing::runCli({"plan"}, dir + "/log", {{"POSEIDON_LOG", level}}, 60);
    EXPECT_EQ(p.exitCode(), 0) << level << ": " << p.stderrText();
  }
  std::filesystem::remove_all(dir);
}

// A flag that acts only with another one is refused alone, not silently ignored.
TEST(CliFlags, TrainRefusesFlagsThatNeedAnother) {
  expectRejected({{"train", "--checkpoint-every", "3"},
                  "--checkpoint-every needs --checkpoint DIR; without it the flag would change nothing"});
  expectRejected({{"train", "--straggler-timeout", "100"},
                  "--straggler-timeout needs --drop-stragglers D; without it the flag would change nothing"});
  expectRejected({{"train", "--group-push-window", "4"},
                  "--group-push-window needs --groups G; without it the flag would change nothing"});
  expectRejected({{"train", "--pad-forward-share", "0.5"},
                  "--pad-forward-share needs --pad-ms MS and --overlap-forward; without it the flag would change "
                  "nothing"});
  expectRejected({{"train", "--pad-ms", "10", "--pad-forward-share", "0.5"},
                  "--pad-forward-share needs --pad-ms MS and --overlap-forward; without it the flag would change "
                  "nothing"});
  // A curve point past the run's end: the summary's curve was empty, without a word.
  expectRejected({{"train", "--curve-every", "100", "--max-steps", "5"},
                  "--curve-every 100 is past the run's --max-steps 5: the curve would have no point"});
  // A pad past ~1e16 ms overflowed the wait: the steps were not padded, the run said they were.
  expectRejected({{"train", "--pad-ms", "1e300"}, "--pad-ms must be in [0, 3600000], got 1e300"});
}

// bench --accuracy and tune --regret pick another flag set; as the boolean flags --help lists them,
// they take =true / =false too (--accuracy=true ran the throughput benchmark before).
TEST(CliFlags, ModeFlagsTakeABooleanValue) {
  std::string dir = testing::makeTempDir("flags");
  auto help = [&](const std::vector<std::string>& args) {
    const testing::Proc p = testing::runCli(args, dir + "/cli", {}, 30);
    EXPECT_EQ(p.exitCode(), 0) << p.stderrText();
    return p.stdoutText();
  };
  EXPECT_THAT(help({"bench", "--accuracy=true", "--help"}), HasSubstr("usage: poseidon bench --accuracy "));
  EXPECT_THAT(help({"bench", "--accuracy=false", "--help"}), HasSubstr("usage: poseidon bench [--quick]"));
  EXPECT_THAT(help({"tune", "--regret=yes", "--help"}), HasSubstr("usage: poseidon tune --regret "));
  expectRejected({{"bench", "--accuracy=maybe"}, "--accuracy expects true or false, got 'maybe'"});
  std::filesystem::remove_all(dir);
}

// A results file or model table that is not one: one line naming it, exit 2; never a crash or a
// library's bare exception (an empty per-node array used to crash --check).
TEST(CliFlags, PlanRefusesMalformedFiles) {
  std::string dir = testing::makeTempDir("flags");
  expectRejected({{"plan", "--check", dir}, "--check: '" + dir + "' is a directory, not a results file"});
  expectRejected({{"plan", "--model", dir}, "model table '" + dir + "' is a directory"});
  // A bare name that is no zoo model but is there is the path meant, not an "unknown model".
  const std::string bare = "poseidon-model-dir-" + std::to_string(::getpid());
  std::filesystem::create_directory(bare);
  expectRejected({{"plan", "--model", bare}, "model table '" + bare + "' is a directory"});
  std::filesystem::remove(bare);
  // The JSON library's own tag ("[json.exception.parse_error.101]") is not the user's business.
  std::ofstream(dir + "/bad.json") << "x";
  const testing::Proc badJson = testing::runCli({"plan", "--model", dir + "/bad.json"}, dir + "/badjson", {}, 30);
  EXPECT_EQ(badJson.exitCode(), 2);
  EXPECT_THAT(badJson.stderrText(), HasSubstr("poseidon plan: error: model table '" + dir +
                                              "/bad.json' is not valid JSON: parse error at line 1, column 1"));
  EXPECT_THAT(badJson.stderrText(), Not(HasSubstr("json.exception")));
  std::ofstream(dir + "/config5.json") << R"({"config":5,"runs":[]})";
  const testing::Proc config5 = testing::runCli({"plan", "--check", dir + "/config5.json"}, dir + "/cli5", {}, 30);
  EXPECT_EQ(config5.exitCode(), 2);
  EXPECT_EQ(config5.stderrText(), "poseidon plan: error: --check: '" + dir + "/config5.json': config is not a JSON object\n");
  // A hand-edited field of the wrong type is named with its run (it said "type must be number, but is
  // string"); a run without a link rate is skipped by name (it ended the check: "the planner needs a link
  // rate > 0"); a file with nothing to predict fails (it exited 0, as if checked).
  const std::string ddp = R"({"system":"ddp","model":"vgg19","nodes":2,"iteration_seconds":1,"ok":true,)";
  std::ofstream(dir + "/typed.json") << R"({"config":{},"runs":[)" << ddp << R"("link_mbit":100},)" << ddp
                                     << R"("link_mbit":"fast"}]})";
  expectRejected({{"plan", "--check", dir + "/typed.json"},
                  "--check: '" + dir + "/typed.json': run 1 (vgg19 ddp): \"link_mbit\" is \"fast\", expected a number"});
  std::ofstream(dir + "/rate.json") << R"({"config":{},"runs":[)" << ddp << R"("link_mbit":100},)" << ddp
                                    << R"("link_mbit":-30}]})";
  const testing::Proc rate = testing::runCli({"plan", "--check", dir + "/rate.json"}, dir + "/rate", {}, 60);
  EXPECT_EQ(rate.exitCode(), 0) << rate.stderrText();
  EXPECT_THAT(rate.stdoutText(), HasSubstr("vgg19        ddp                   2      -30         -          -  (no link rate)\n"));
  EXPECT_THAT(rate.stdoutText(), HasSubstr("\n1 points predicted (1 skipped"));
  std::ofstream(dir + "/norun.json") << R"({"config":{},"runs":[]})";
  planJson({"--check", dir + "/norun.json"}, "--check: no run of '" + dir + "/norun.json' could be predicted (it lists no runs)");
  std::ofstream(dir + "/empty-tx.json") << R"({"config":{},"runs":[{"system":"ddp","model":"vgg19","nodes":2,)"
                                        << R"("link_mbit":100,"iteration_seconds":1,"ok":true,"tx_bytes_per_iteration":[]}]})";
  const nlohmann::json checked = planJson({"--check", dir + "/empty-tx.json"});
  EXPECT_EQ(checked["points"], 1) << checked.dump();
  ASSERT_EQ(checked["rows"].size(), 1u) << checked.dump();
  EXPECT_TRUE(checked["rows"][0]["measured_max_node_tx_bytes"].is_null());
  std::filesystem::remove_all(dir);
}

TEST(CliFlags, BenchWorkerRejectsOutOfRangeValues) {
  expectRejected(
      {{"bench-worker", "--out", "/dev/null", "--pair-bytes", "2"}, "--pair-bytes must be in [4, 1073741824], got 2"});
  expectRejected({{"bench-worker", "--out", "/dev/null", "--timeout", "0"}, "--timeout must be >= 1, got 0"});
  expectRejected({{"bench-worker", "--out", "/dev/null", "--warmup", "-1"}, "--warmup must be >= 0, got -1"});
  expectRejected({{"bench-worker", "--out", "/dev/null", "--system", "poseidon-overlap", "--warmup", "0"},
                  "--overlap-forward needs --warmup 1 or more (each iteration carries the one before's tail)"});
  expectRejected(
      {{"bench-worker", "--out", "/dev/null", "--io-threads", "65"}, "--io-threads must be in [1, 64], got 65"});
  expectRejected({{"bench-worker", "--out", "/dev/null", "--system", "poseidon-bf16", "--wire", "fp16"},
                  "--wire and a system with a wire suffix ('poseidon-bf16') cannot be combined"});
  expectRejected({{"bench-worker", "--out", "/dev/null", "--wire", "fp64"},
                  "unknown wire precision 'fp64' (expected fp32, bf16 or fp16)"});
}

// poseidon links the core alone; train, experiment and tune --regret run in poseidon-torch, beside it, by
// exec (cli/torch_forward.cc). LD_DEBUG=libs makes the dynamic loader name every library it loads on stderr.
TEST(CliFlags, OnlyTheLibTorchCommandsLoadLibTorch) {
  namespace fs = std::filesystem;
  const fs::path torchHalf = fs::path(POSEIDON_CLI).parent_path() / "poseidon-torch";
  if (!fs::exists(torchHalf)) GTEST_SKIP() << "this build has no LibTorch integration (no " << torchHalf << ")";
  std::string dir = testing::makeTempDir("flags");
  std::vector<testing::Proc> procs{
      testing::spawn({POSEIDON_CLI, "plan", "--model", "lenet"}, {{"LD_DEBUG", "libs"}}, dir + "/plan"),
      testing::spawn({POSEIDON_CLI, "train", "--help"}, {{"LD_DEBUG", "libs"}}, dir + "/train")};
  testing::waitAll(procs, std::chrono::seconds(60));
  EXPECT_EQ(procs[0].exitCode(), 0) << procs[0].stderrText().substr(0, 2000);
  EXPECT_THAT(procs[0].stdoutText(), HasSubstr("ip1"));
  EXPECT_THAT(procs[0].stderrText(), HasSubstr("libzmq"));  // the loader did report what it loaded
  EXPECT_THAT(procs[0].stderrText(), Not(HasSubstr("libtorch")));
  EXPECT_EQ(procs[1].exitCode(), 0);
  EXPECT_THAT(procs[1].stdoutText(), HasSubstr("usage: poseidon train"));
  EXPECT_THAT(procs[1].stderrText(), HasSubstr("libtorch_cpu"));
  // Without its other half, poseidon train is one line that says where it looked.
  fs::create_directories(dir + "/alone");
  fs::copy_file(POSEIDON_CLI, dir + "/alone/poseidon");
  std::vector<testing::Proc> alone{testing::spawn({dir + "/alone/poseidon", "train"}, {}, dir + "/alone/log")};
  testing::waitAll(alone, std::chrono::seconds(30));
  EXPECT_EQ(alone[0].exitCode(), 1);
  EXPECT_EQ(alone[0].stderrText(),
            "poseidon train: error: poseidon train runs in poseidon-torch, the LibTorch half of the poseidon command, "
            "which should be at " +
                dir +
                "/alone/poseidon-torch (No such file or directory); build it (cmake --build) "
                "or install both\n");
  fs::remove_all(dir);
}

TEST(CliFlags, HelpShowsTheRanges) {
  std::string dir = testing::makeTempDir("flags");
  std::vector<testing::Proc> procs{testing::spawn({POSEIDON_CLI, "launch", "--help"}, {}, dir + "/help")};
  testing::waitAll(procs, std::chrono::seconds(30));
  EXPECT_EQ(procs[0].exitCode(), 0);
  EXPECT_THAT(procs[0].stdoutText(),
              HasSubstr("coordinator port (0: pick a free one; a restart always picks a fresh one) (in [0, 65535]; "
                        "default: 0)"));
  // A real default in full, not rounded to six digits (it read 1.04858e+06).
  const std::string plan = testing::runCli({"plan", "--help"}, dir + "/plan", {}, 30).stdoutText();
  EXPECT_THAT(plan, HasSubstr("(>= 4096; default: 16777216)"));  // --credit-window
  // --send-window's default is the runtime's rule: no number beside it.
  EXPECT_THAT(plan, HasSubstr("256 KB past 8 peers with --host-queue tos; --check: the results file's) (>= 4096)\n"));
  // --host-cores' default is the results file's: no machine's core count beside it.
  EXPECT_THAT(plan, HasSubstr("this machine's for a file that does not say) (in [1, 4096])\n"));
  // A third to six digits, not fifteen.
  const std::string train = testing::runCli({"train", "--help"}, dir + "/train", {}, 30).stdoutText();
  EXPECT_THAT(train, HasSubstr("default: 0.333333)"));
  EXPECT_THAT(train, Not(HasSubstr("0.3333333")));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace poseidon
