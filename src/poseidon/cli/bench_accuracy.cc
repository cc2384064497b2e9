// poseidon bench --accuracy: time to accuracy on the emulated cluster, with
// real training (docs/time_to_accuracy.md). Each system trains LeNet on
// Fashion-MNIST, one process per node in the node's namespace, every step's
// compute padded to a modeled device time (poseidon train --pad-ms, and
// bench/ddp_train.py for PyTorch DDP); rank 0 keeps a copy of its model every
// --curve-every steps and tests them after the run. The harness reads rank
// 0's curve and reports, per system and link rate, the time and the steps to
// a target test accuracy and to a target training loss.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "poseidon/bench/cluster.h"
#include "poseidon/bench/ranks.h"
#include "poseidon/bench/report.h"
#include "poseidon/bench/systems.h"
#include "poseidon/cli/accuracy_harness.h"
#include "poseidon/cli/bench_util.h"
#include "poseidon/cli/commands.h"
#include "poseidon/cli/flags.h"
#include "poseidon/cli/limits.h"
#include "poseidon/client/node.h"
#include "poseidon/common/error.h"
#include "poseidon/common/file.h"
#include "poseidon/data/fashion_mnist.h"
#include "poseidon/launch/env.h"
#include "poseidon/launch/process.h"
#include "poseidon/transport/security.h"
#include "poseidon/transport/van.h"

namespace poseidon::cli {
namespace fs = std::filesystem;
using bench::EmulatedCluster;

namespace {

// A number of a run's JSON, or `otherwise` where it is not a finite one (a diverged run's NaN is
// NaN in memory and null once written).
double finiteOr(const nlohmann::json& v, double otherwise) {
  return v.is_number() && std::isfinite(v.get<double>()) ? v.get<double>() : otherwise;
}

std::string fmtSeconds(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f s", s);
  return b;
}

}  // namespace

AccuracySystem defaultAccuracySystem(const std::string& name, int nodes) {
  AccuracySystem s;
  s.name = name;
  // The registry's systems (bench/systems.h): bsp, bsp-overlap (the overlapped step), either with
  // -wBYTES (priority links with that send window), and ddp.
  const size_t w = name.rfind("-w");
  const bool windowed = w != std::string::npos && bench::findAccuracySystem(name.substr(0, w)) != nullptr;
  const bench::SystemSpec* spec = bench::findAccuracySystem(windowed ? name.substr(0, w) : name);
  const std::string bspError =
      "unknown system '" + name + "' (expected bsp, bsp-overlap, or either with -wBYTES, e.g. bsp-overlap-w16384)";
  if (spec && !spec->ddp) {
    s.overlapForward = spec->overlapForward;
    if (windowed) {
      const std::string bytes = name.substr(w + 2);
      if (bytes.empty()) throw InvalidArgument(bspError);
      s.sendWindow = static_cast<int>(
          parseIntIn("the send window of system " + name, bytes, IntRange::closed(Van::kMinSendWindow, 1 << 30)));
    }
    return s;
  }
  if (name.rfind("bsp", 0) == 0) throw InvalidArgument(bspError);
  if (spec && !windowed) {  // ddp
    s.groups = -1;
    return s;
  }
  std::string g = name;
  if (g.size() > 2 && g.compare(g.size() - 2, 2, "fc") == 0) {
    s.mergedFc = true;
    g.resize(g.size() - 2);
  }
  if (g.size() < 2 || g[0] != 'g') {
    throw InvalidArgument("unknown system '" + name +
                          "' (expected bsp, bsp-overlap, either with -wBYTES, ddp, gG or gGfc, e.g. g4 or g8fc)");
  }
  s.groups = static_cast<int>(parseIntIn("the G of system " + name, g.substr(1), IntRange::closed(1, nodes)));
  if (nodes % s.groups != 0) {
    throw InvalidArgument(strCat("system ", name, ": ", s.groups, " groups must divide ", nodes, " nodes"));
  }
  s.momentum = s.groups == 1 ? 0.9 : s.groups == 2 ? 0.6 : s.groups == 4 ? 0.0 : 0.6;
  if (s.groups >= 8) s.lr = 0.005;
  return s;
}

nlohmann::json AccuracyRun::toJson() const {
  nlohmann::json j = {{"system", system.name},
                      {"groups", system.groups},
                      {"merged_fc", system.mergedFc},
                      {"overlap_forward", system.overlapForward},
                      {"send_window", system.sendWindow},
                      {"lr", system.lr},
                      {"momentum", system.momentum},
                      {"mbit", mbit},
                      {"ok", ok}};
  if (!ok) {
    j["error"] = error;
    return j;
  }
  j["seconds_per_step"] = secondsPerStep;
  if (meanRateSecondsPerStep > 0) j["mean_rate_seconds_per_step"] = meanRateSecondsPerStep;
  j["final_test_accuracy"] = finalAccuracy;
  j["diverged_at_step"] = divergedAt >= 0 ? nlohmann::json(divergedAt) : nlohmann::json(nullptr);
  j["pad_overruns"] = overruns;
  j["max_compute_ms"] = maxComputeMs;
  j["time_to_accuracy_s"] = accuracySeconds;
  j["steps_to_accuracy"] = accuracySteps;
  j["time_to_loss_s"] = lossSeconds;
  j["steps_to_loss"] = lossSteps;
  j["curve"] = summary["curve"];
  if (summary.contains("staleness_histogram")) j["staleness_histogram"] = summary["staleness_histogram"];
  for (const char* key :
       {"max_group_lead", "early_pulls", "paced_pushes", "group_push_window", "tcp_rcvbuf"})  // Poseidon's ranks only
    if (summary.contains(key)) j[key] = summary[key];
  for (const char* key : {"train_clock_seconds_per_rank", "steps_per_rank"})  // the mean-rate step's inputs
    if (summary.contains(key)) j[key] = summary[key];
  const double fcUpdates = finiteOr(summary.value("fc_server_updates", nlohmann::json(0)), 0);
  if (fcUpdates > 0) {  // merged FC: the FC server's measured time per group round (Omnivore's t_fc)
    j["fc_server_ms_per_update"] =
        1e3 * finiteOr(summary.value("fc_server_busy_seconds", nlohmann::json(0)), 0) / fcUpdates;
  }
  return j;
}

AccuracyHarness::AccuracyHarness() : secret(randomSecret()) {}

void AccuracyHarness::prepare(const std::string& workDir) {
  // Every rank loads both splits: a wrong --data is one line now, not a failed first run.
  for (const bool trainSplit : {false, true})
    (void)data::loadFashionMnist(dataDir.empty() ? data::kDefaultFashionMnistDir : dataDir, trainSplit);
  exe = selfExecutable();
  work = workDir;
}

nlohmann::json AccuracyHarness::config(const std::string& command, const std::vector<double>& rates) const {
  return {{"command", command},
          {"nodes", nodes},
          {"batch", batch},
          {"pad_ms", padMs},
          {"pair_bytes", pairBytes},
          {"servers", servers},
          {"tcp_rcvbuf", rcvbuf},
          {"group_push_window", pushWindow},
          {"queue_ms", queueMs},
          {"tcp_congestion_control", tcpCongestion},
          {"timer_slack_ns", bench::kRankTimerSlackNs},
          {"io_threads", bench::kBenchIoThreads},
          {"sum_threads", kDefaultSumThreads},  // poseidon train's, which the ranks run
          {"host_cores", static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))},
          {"target_accuracy", targetAccuracy},
          {"target_loss", targetLoss},
          {"rates_mbit", rates},
          {"seed", seed},
          {"ddp_python", ddpPython}};
}

int AccuracyHarness::epochsFor(int n) const {
  int64_t perRank = (60000 + nodes - 1) / nodes, perEpoch = (perRank + batch - 1) / batch;
  return static_cast<int>((n + perEpoch - 1) / perEpoch);
}

AccuracyRun AccuracyHarness::run(const AccuracySystem& sys, const RunExtras& extra) {
  const int maxSteps = extra.maxSteps > 0 ? extra.maxSteps : steps;
  const int every = extra.curveEvery > 0 ? extra.curveEvery : curveEvery;
  AccuracyRun r;
  r.system = sys;
  r.mbit = cluster->link().mbit;
  int p = port++;
  if (port > 29999) port = 29600;
  std::string base = strCat(work, "/", extra.tag.empty() ? sys.name : extra.tag, "-", r.mbit);
  std::vector<SpawnOptions> ranks;
  for (int i = 0; i < nodes; ++i) {
    SpawnOptions so = bench::rankSpawn(*cluster, i, nodes, p, secret, strCat(base, "-", i, ".log"));
    // What both trainers take alike: the hyperparameters, the data order, the modeled compute, the curve.
    const std::vector<std::string> shared = {
        "--batch",       std::to_string(batch), "--lr",     strCat(sys.lr), "--momentum",      strCat(sys.momentum),
        "--seed",        std::to_string(seed),  "--pad-ms", strCat(padMs),  "--pad-jitter-ms", strCat(padJitterMs),
        "--curve-every", std::to_string(every)};
    std::vector<std::string> data;
    if (!dataDir.empty()) data = {"--data", dataDir};
    if (sys.groups < 0) {
      so.argv = {ddpPython, ddpScript};
      so.argv.insert(so.argv.end(), shared.begin(), shared.end());
      so.argv.insert(so.argv.end(), {"--steps", std::to_string(maxSteps), "--timeout", std::to_string(timeoutS),
                                     "--out", base + ".json"});
      so.argv.insert(so.argv.end(), data.begin(), data.end());
    } else {
      so.argv = {exe, "train", "--model", "lenet"};
      so.argv.insert(so.argv.end(), shared.begin(), shared.end());
      so.argv.insert(
          so.argv.end(),
          {"--epochs", std::to_string(epochsFor(maxSteps)), "--max-steps", std::to_string(maxSteps), "--pair-bytes",
           std::to_string(pairBytes), "--threads", "1", "--bind", cluster->nodeAddress(i), "--io-threads",
           std::to_string(bench::kBenchIoThreads), "--timeout", std::to_string(timeoutS * 1000), "--quiet",
           // Fixed hyperparameters, as DDP's runs have them (no warm-up); a run that diverges is a
           // result (it stops there; its JSON and line say so), not a failed run.
           "--warmup-steps", "0", "--allow-divergence", "--summary", base + ".json"});
      if (sys.groups > 0) so.argv.insert(so.argv.end(), {"--groups", std::to_string(sys.groups)});
      if (sys.mergedFc) so.argv.push_back("--merged-fc");
      if (servers > 0) so.argv.insert(so.argv.end(), {"--servers", std::to_string(servers)});
      if (rcvbuf != 0) so.argv.insert(so.argv.end(), {"--tcp-rcvbuf", std::to_string(rcvbuf)});
      if (sys.groups > 0) so.argv.insert(so.argv.end(), {"--group-push-window", std::to_string(pushWindow)});
      if (sys.overlapForward) so.argv.push_back("--overlap-forward");
      if (sys.sendWindow > 0) so.argv.insert(so.argv.end(), {"--send-window", std::to_string(sys.sendWindow)});
      so.argv.insert(so.argv.end(), data.begin(), data.end());
      so.argv.insert(so.argv.end(), extra.trainArgs.begin(), extra.trainArgs.end());
    }
    ranks.push_back(std::move(so));
  }
  if (!extra.quiet) {
    std::printf("  %-5s (lr %g, momentum %g) @ %g Mbit/s: training %d steps ...\n", sys.name.c_str(), sys.lr,
                sys.momentum, r.mbit, maxSteps);
    std::fflush(stdout);
  }
  r.error = bench::runRanks(std::move(ranks), timeoutS, gStop);
  throwIfStopped();
  if (r.error.empty()) {
    try {
      std::ifstream f(base + ".json");
      r.summary = nlohmann::json::parse(f);
      read(r, extra.startStep);
      r.ok = true;
    } catch (const std::exception& e) {
      r.error = strCat("unreadable result ", base, ".json: ", jsonErrorText(e));
    }
  }
  if (!extra.quiet) print(r);
  return r;
}

void AccuracyHarness::read(AccuracyRun& r, int startStep) const {
  // A diverged run's losses and accuracies are NaN, which JSON writes as null.
  auto number = [](const nlohmann::json& p, const char* key) {
    const auto& v = p.at(key);
    return v.is_null() ? std::nan("") : v.get<double>();
  };
  const nlohmann::json& s = r.summary;
  const auto& curve = s.at("curve");
  if (curve.empty()) throw Error("no curve points");
  r.secondsPerStep = s.at("train_clock_seconds").get<double>() / (curve.back().at("step").get<double>() - startStep);
  r.finalAccuracy = number(curve.back(), "test_accuracy");
  if (s.contains("train_clock_seconds_per_rank") && s.contains("steps_per_rank")) {
    const auto clocks = s["train_clock_seconds_per_rank"].get<std::vector<double>>();
    const auto steps = s["steps_per_rank"].get<std::vector<double>>();
    double stepsPerSecond = 0;
    for (size_t i = 0; i < clocks.size() && i < steps.size(); ++i)
      if (clocks[i] > 0) stepsPerSecond += steps[i] / clocks[i];
    if (stepsPerSecond > 0) r.meanRateSecondsPerStep = static_cast<double>(clocks.size()) / stepsPerSecond;
  }
  const auto diverged = s.value("diverged_at_step", nlohmann::json());
  r.divergedAt = diverged.is_number() ? diverged.get<int64_t>() : -1;
  for (double o : s.at("pad_overruns_per_rank").get<std::vector<double>>()) r.overruns += o;
  for (double m : s.at("max_compute_ms_per_rank").get<std::vector<double>>()) {
    r.maxComputeMs = std::max(r.maxComputeMs, m);
  }
  for (const auto& p : curve) {
    if (r.accuracySteps < 0 && number(p, "test_accuracy") >= targetAccuracy) {
      r.accuracySteps = p.at("step").get<int64_t>();
      r.accuracySeconds = p.at("seconds").get<double>();
    }
    if (r.lossSteps < 0 && number(p, "train_loss") <= targetLoss) {
      r.lossSteps = p.at("step").get<int64_t>();
      r.lossSeconds = p.at("seconds").get<double>();
    }
  }
}

void AccuracyHarness::print(const AccuracyRun& r) const {
  if (!r.ok) {
    std::printf("  %-5s @ %g Mbit/s: FAILED: %s\n", r.system.name.c_str(), r.mbit, r.error.c_str());
  } else {
    auto at = [](double s, int64_t n) {
      return n < 0 ? std::string("not reached") : strCat(fmtSeconds(s), " (", n, " steps)");
    };
    std::printf(
        "  %-5s @ %g Mbit/s: %.3f s/step, %.1f%% test accuracy at the end%s; to %.0f%%: %s; to loss %.2f: %s; "
        "%.0f pad overruns (max compute %.0f ms)\n",
        r.system.name.c_str(), r.mbit, r.secondsPerStep, 100 * r.finalAccuracy,
        r.divergedAt >= 0 ? strCat(" (DIVERGED at step ", r.divergedAt, ": stopped there)").c_str() : "",
        100 * targetAccuracy,
        at(r.accuracySeconds, r.accuracySteps).c_str(), targetLoss, at(r.lossSeconds, r.lossSteps).c_str(), r.overruns,
        r.maxComputeMs);
  }
  std::fflush(stdout);
}

namespace {

std::string cell(double v, const char* f) {
  if (v < 0) return "-";
  char b[32];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

void writeMarkdown(const std::string& path, const nlohmann::json& result) {
  std::ofstream md(path);
  const auto& c = result["config"];
  md << "# Time to accuracy on the emulated cluster (real training)\n\n"
     << "`" << c["command"].get<std::string>() << "`\n\n"
     << "LeNet on Fashion-MNIST, " << c["nodes"] << " nodes, batch " << c["batch"] << " per worker, compute padded to "
     << c["pad_ms"] << " ms per step"
     << (c["pad_jitter_ms"].get<double>() > 0
             ? strCat(" + an exponential wait of mean ", c["pad_jitter_ms"].get<double>(), " ms")
             : std::string())
     << ", " << c["steps"] << " steps per run; targets: test accuracy " << 100 * c["target_accuracy"].get<double>()
     << "%, training loss " << c["target_loss"] << " (rank 0's mean loss over the " << c["curve_every"]
     << " steps before a curve point). Times are the training clock of rank 0 (seconds in training steps); *all "
        "workers* is every worker's step at the rate through all of them (compute groups step at their own "
        "paces).";
  if (c.value("servers", 0) > 0)
    md << " Poseidon's shards on nodes 0.." << c["servers"].get<int>() - 1 << " only (`--servers "
       << c["servers"].get<int>() << "`; 1 is Omnivore's one model server).";
  if (c.value("queue_ms", 100.0) != 100.0)
    md << " Each emulated port queues " << c["queue_ms"] << " ms (`--queue-ms`).";
  if (c.value("tcp_rcvbuf", 0) > 0)
    md << " Poseidon's ranks ran with a " << c["tcp_rcvbuf"].get<int>()
       << "-byte TCP receive buffer per connection (`--tcp-rcvbuf`); DDP's with the OS default.";
  else if (c.value("tcp_rcvbuf", 0) < 0)
    md << " Poseidon's ranks ran with the OS's TCP receive buffers (`--tcp-rcvbuf -1`).";
  if (c.value("group_push_window", 0) > 0)
    md << " Compute groups pushed a layer's pairs at most " << c["group_push_window"].get<int>()
       << " ahead of the replies to them (`--group-push-window`).";
  md << " " << bench::tcpCongestionSentence(c) << " " << bench::timerSlackSentence(c);
  md << "\n\n";
  for (double rate : c["rates_mbit"].get<std::vector<double>>()) {
    md << "## " << rate << " Mbit/s\n\n"
       << "| system | lr | momentum | s/step | all workers | time to acc. | steps | time to loss | steps | final acc. "
          "| "
          "overruns | vs ddp (acc.) | vs bsp (acc.) |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    double ddp = -1, bsp = -1;
    for (const auto& r : result["runs"]) {
      if (r["mbit"].get<double>() != rate || !r["ok"].get<bool>()) continue;
      if (r["system"] == "ddp") ddp = r["time_to_accuracy_s"].get<double>();
      if (r["system"] == "bsp") bsp = r["time_to_accuracy_s"].get<double>();
    }
    for (const auto& r : result["runs"]) {
      if (r["mbit"].get<double>() != rate) continue;
      md << "| " << r["system"].get<std::string>() << " | " << r["lr"] << " | " << r["momentum"] << " | ";
      if (!r["ok"].get<bool>()) {
        md << "failed: " << r["error"].get<std::string>() << " ||||||||||\n";
        continue;
      }
      double t = r["time_to_accuracy_s"].get<double>();
      md << cell(r["seconds_per_step"].get<double>(), "%.3f") << " | "
         << cell(r.value("mean_rate_seconds_per_step", -1.0), "%.3f") << " | " << cell(t, "%.1f s") << " | "
         << cell(static_cast<double>(r["steps_to_accuracy"].get<int64_t>()), "%.0f") << " | "
         << cell(r["time_to_loss_s"].get<double>(), "%.1f s") << " | "
         << cell(static_cast<double>(r["steps_to_loss"].get<int64_t>()), "%.0f") << " | "
         << (r.value("diverged_at_step", nlohmann::json()).is_number()
                 ? strCat("diverged at step ", r["diverged_at_step"].get<int64_t>())
                 : cell(finiteOr(r["final_test_accuracy"], -0.01) * 100, "%.1f%%"))
         << " | " << cell(r["pad_overruns"].get<double>(), "%.0f") << " | "
         << (t > 0 && ddp > 0 ? cell(ddp / t, "%.2fx") : "-") << " | "
         << (t > 0 && bsp > 0 ? cell(bsp / t, "%.2fx") : "-") << " |\n";
    }
    md << "\n";
  }
}

void writePlots(const std::string& dir, const nlohmann::json& result) {
  fs::create_directories(dir);
  for (double rate : result["config"]["rates_mbit"].get<std::vector<double>>()) {
    for (const std::string what : {"test_accuracy", "train_loss"}) {
      std::string base = strCat(dir, "/", what == "test_accuracy" ? "accuracy" : "loss", "-", rate, "mbit");
      std::ofstream gp(base + ".gp");
      gp << "set terminal pngcairo size 800,560\nset output '" << base << ".png'\n"
         << "set title '" << (what == "test_accuracy" ? "test accuracy" : "training loss") << " vs time: LeNet, "
         << result["config"]["nodes"] << " nodes, " << rate << " Mbit/s (emulated)'\n"
         << "set xlabel 'seconds (training clock)'\nset ylabel '"
         << (what == "test_accuracy" ? "test accuracy" : "training loss") << "'\nset grid\nset key "
         << (what == "test_accuracy" ? "right bottom" : "right top") << "\nplot ";
      bool first = true;
      for (const auto& r : result["runs"]) {
        if (r["mbit"].get<double>() != rate || !r["ok"].get<bool>()) continue;
        std::string name = r["system"].get<std::string>();
        std::ofstream dat(base + "-" + name + ".dat");
        for (const auto& p : r["curve"]) {
          const double v = finiteOr(p[what], std::nan(""));
          if (std::isfinite(v)) dat << p["seconds"].get<double>() << " " << v << "\n";  // a diverged run's NaN: a gap
        }
        gp << (first ? "" : ", ") << "'" << base << "-" << name << ".dat' with lines lw 2 title '" << name << "'";
        first = false;
      }
      gp << "\n";
      gp.close();
      if (first) continue;
      try {
        bench::run({"gnuplot", base + ".gp"});
      } catch (const Error& e) {
        std::cerr << "poseidon bench: plotting failed (install gnuplot-nox): " << e.what() << "\n";
      }
    }
  }
}

// poseidon bench --accuracy's settings, as its flags set them.
struct AccuracyArgs {
  std::string systemsFlag = "bsp,g1,g2,g4,g8,ddp", ratesFlag = "100,30";
  std::string hyperFlag, jsonPath, mdPath, plotDir, ddpScript;
  AccuracyHarness h;
  int64_t seed = 1;
  bool keep = false;
};

void addAccuracyFlags(FlagSet& flags, AccuracyArgs& a) {
  flags.addString("systems", &a.systemsFlag,
                  "comma-separated systems: bsp, bsp-overlap (bsp with the overlapped step, --overlap-forward), "
                  "either with -wBYTES (priority links with that send window, --send-window: bsp-w16384), ddp, "
                  "gG (G divides --nodes), gGfc (gG with merged FC)",
                  "LIST");
  flags.addString("rates", &a.ratesFlag, "comma-separated link rates in Mbit/s, > 0", "LIST");
  flags.addInt("nodes", &a.h.nodes, "nodes (workers), one process each", "N", IntRange::closed(2, 64));
  flags.addInt64("batch", &a.h.batch, "per-worker batch", "K", IntRange::closed(1, 60000));
  flags.addDouble("pad-ms", &a.h.padMs, "modeled compute time per step, in milliseconds", "MS",
                  RealRange::closed(0, kMaxPadMs));
  flags.addInt64("pair-bytes", &a.h.pairBytes,
                 "Poseidon's KV pair size (in one 2 MB pair LeNet's ip1, 1.6 MB, would sit on one shard)", "BYTES",
                 IntRange::closed(kMinPairBytes, kMaxPairBytes));
  flags.addInt("servers", &a.h.servers,
               "Poseidon's shards on nodes 0..N-1 only, the rest workers only (1: the whole model on one server, "
               "Omnivore's setting and its k-fold congestion; 0: every node a shard)",
               "N", IntRange::closed(0, 64));
  addQueueFlag(flags, &a.h.queueMs);
  addTcpCongestionFlag(flags, &a.h.tcpCongestion);
  flags.addInt("tcp-rcvbuf", &a.h.rcvbuf,
               "TCP receive buffer per connection into each Poseidon rank (0: train's default - the send window and "
               "a third with a send window, seven eighths of it past 8 peers, else the OS's; -1: the OS's; DDP keeps "
               "the OS's): a small one gives the "
               "k pushers into one model server (--servers 1) equal windows, where the OS default lets a few of "
               "them starve the rest (docs/omnivore.md)",
               "BYTES", IntRange::closed(-1, 1 << 30));
  flags.addInt("group-push-window", &a.h.pushWindow,
               "compute groups: each member pushes a layer's KV pairs at most this many ahead of the replies to "
               "the group's updates of them (train --group-push-window; 0: all at once, the default): the pushers "
               "into one model server then keep pace, where TCP lets a few of them starve the rest "
               "(docs/omnivore.md)",
               "PAIRS", IntRange::closed(0, 1 << 20));
  flags.addDouble("pad-jitter-ms", &a.h.padJitterMs,
                  "add to each step's pad an exponential wait of this mean (per rank): varying step times, "
                  "stragglers, Theorem 1's assumption",
                  "MS", RealRange::closed(0, kMaxPadMs));
  flags.addInt("steps", &a.h.steps, "training steps per run", "N", IntRange::atLeast(1));
  flags.addInt("curve-every", &a.h.curveEvery, "steps between the model copies tested for the curve", "N",
               IntRange::atLeast(1));
  flags.addDouble("target-accuracy", &a.h.targetAccuracy, "target test accuracy", "A", RealRange::leftOpen(0, 1));
  flags.addDouble("target-loss", &a.h.targetLoss, "target training loss", "L", RealRange::above(0));
  flags.addString("hyper", &a.hyperFlag, "per-system lr and momentum, e.g. g4=0.05:0.3,ddp=0.05:0.9", "LIST");
  flags.addInt64("seed", &a.seed, "seed of the data order (and of Poseidon's initial weights)", "S",
                 IntRange::atLeast(0));
  flags.addString("data", &a.h.dataDir, "Fashion-MNIST directory (default: Debian's)", "DIR");
  flags.addInt("run-timeout", &a.h.timeoutS, "seconds before a run is declared failed", "S",
               IntRange::closed(1, 86400));
  flags.addString("json", &a.jsonPath, "write all results as JSON to FILE", "FILE");
  flags.addString("markdown", &a.mdPath, "write the tables as Markdown to FILE", "FILE");
  flags.addString("plots", &a.plotDir, "write accuracy and loss curves (PNG, gnuplot) into DIR", "DIR");
  flags.addString("ddp-script", &a.ddpScript, "path to bench/ddp_train.py", "FILE");
  flags.addString("ddp-python", &a.h.ddpPython,
                  "the interpreter DDP trains in: one whose torch has torch.distributed, e.g. a pip install's "
                  "python3 where Debian's python3-torch is missing",
                  "FILE");
  flags.addBool("keep", &a.keep, "keep the per-rank logs and summaries (printed path)");
}

// --systems with their default hyperparameters, and --hyper's overrides.
std::vector<AccuracySystem> accuracySystems(const AccuracyArgs& a) {
  checkTcpCongestionName(a.h.tcpCongestion);
  if (a.h.servers > a.h.nodes)
    throw InvalidArgument(strCat("--servers ", a.h.servers, " exceeds --nodes ", a.h.nodes, " (shards are nodes)"));
  std::vector<AccuracySystem> systems;
  for (const auto& s : splitList(a.systemsFlag)) systems.push_back(defaultAccuracySystem(s, a.h.nodes));
  for (const auto& item : splitList(a.hyperFlag)) {
    size_t eq = item.find('='), colon = item.find(':');
    if (eq == std::string::npos || colon == std::string::npos || colon < eq) {
      throw InvalidArgument("each --hyper entry is SYSTEM=LR:MOMENTUM, got '" + item + "'");
    }
    std::string name = item.substr(0, eq);
    auto it = std::find_if(systems.begin(), systems.end(), [&](const AccuracySystem& s) { return s.name == name; });
    if (it == systems.end()) throw InvalidArgument("--hyper names '" + name + "', which is not in --systems");
    it->lr = parseRealIn("--hyper's lr of " + name, item.substr(eq + 1, colon - eq - 1), RealRange::above(0));
    it->momentum = parseRealIn("--hyper's momentum of " + name, item.substr(colon + 1), RealRange::rightOpen(0, 1));
  }
  return systems;
}

// Every system at every rate on one emulated cluster (removed when this returns or throws).
nlohmann::json runAccuracy(AccuracyHarness& h, const std::vector<AccuracySystem>& systems,
                           const std::vector<double>& rates, bool& allOk) {
  nlohmann::json runs = nlohmann::json::array();
  EmulatedCluster cluster(h.nodes, bench::LinkSpec{rates.front(), 0, h.queueMs}, h.tcpCongestion);
  h.cluster = &cluster;
  std::printf(
      "poseidon bench --accuracy: %d-node emulated cluster, LeNet on Fashion-MNIST, batch %lld per worker, "
      "compute padded to %g ms%s, %d steps per run\n",
      h.nodes, static_cast<long long>(h.batch), h.padMs,
      h.padJitterMs > 0 ? strCat(" + exponential jitter of mean ", h.padJitterMs, " ms").c_str() : "", h.steps);
  for (double rate : rates) {
    cluster.setLink({rate, 0, h.queueMs});
    for (const auto& s : systems) {
      AccuracyRun r = h.run(s);
      allOk = allOk && r.ok;
      runs.push_back(r.toJson());
    }
  }
  h.cluster = nullptr;
  return runs;
}

}  // namespace

void writeAccuracyReport(const nlohmann::json& result, const std::string& mdPath, const std::string& plotDir) {
  if (!mdPath.empty()) writeMarkdown(mdPath, result);
  if (!plotDir.empty()) writePlots(plotDir, result);
}

int benchAccuracyCommand(const std::vector<std::string>& args) {
  AccuracyArgs a;
  AccuracyHarness& h = a.h;
  FlagSet flags("bench --accuracy", "poseidon bench --accuracy [--systems LIST] [--rates LIST] [flags]",
                "Time to accuracy on the emulated cluster (needs root), with real training: LeNet on Fashion-MNIST,\n"
                "one process per node in its network namespace, links shaped with tc tbf. Every step's compute\n"
                "(forward + backward) is padded to --pad-ms, a modeled device, so that many workers on a few cores\n"
                "do not set the pace; steps whose real compute took longer are counted (overruns). Systems: bsp\n"
                "(Poseidon, WFBP + hybrid), gG (Omnivore's compute groups: G groups, asynchronous across), gGfc\n"
                "(gG with merged FC: the FC layers on one FC server), ddp (PyTorch DDP, bench/ddp_train.py).\n"
                "Default lr and momentum per system: Table III's best (gGfc: gG's)\n"
                "(bench/results/momentum_grid.md); --hyper overrides. Reports time and steps to the target test\n"
                "accuracy and training loss, the curves (--plots) and every run (--json).");
  addAccuracyFlags(flags, a);
  flags.parse(args);
  if (flags.helpRequested()) {
    std::cout << flags.helpText();
    return 0;
  }
  checkResultOutputs(a.jsonPath, a.mdPath, a.plotDir);
  h.seed = static_cast<uint64_t>(a.seed);
  if (h.steps < h.curveEvery) {
    throw InvalidArgument(
        strCat("--steps ", h.steps, " is less than --curve-every ", h.curveEvery, ": no curve point"));
  }
  const std::vector<AccuracySystem> systems = accuracySystems(a);
  const std::vector<double> rates = parseRates(a.ratesFlag);
  if (systems.empty() || rates.empty()) throw InvalidArgument("--systems and --rates must not be empty");
  const bool anyDdp =
      std::any_of(systems.begin(), systems.end(), [](const AccuracySystem& s) { return s.groups < 0; });
  if (anyDdp && !a.ddpScript.empty()) findBenchScript(a.ddpScript, "ddp_train.py");  // before the root check
  requireEmulatedCluster();

  if (anyDdp) {
    h.ddpScript = findDdpScript(a.ddpScript, "ddp_train.py", h.ddpPython);
  }
  const WorkDir work("poseidon-accuracy", a.keep, "logs");
  h.prepare(work.path());

  nlohmann::json result;
  result["config"] = h.config(commandLine("poseidon bench --accuracy", args), rates);
  result["config"].update({{"pad_jitter_ms", h.padJitterMs}, {"steps", h.steps}, {"curve_every", h.curveEvery}});
  bool allOk = true;
  auto t0 = std::chrono::steady_clock::now();
  result["runs"] = runAccuracy(h, systems, rates, allOk);
  result["wall_seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  writeResultsJson(a.jsonPath, result);
  if (!a.mdPath.empty()) {
    writeMarkdown(a.mdPath, result);
    std::printf("table: %s\n", a.mdPath.c_str());
  }
  if (!a.plotDir.empty()) {
    writePlots(a.plotDir, result);
    std::printf("plots: %s\n", a.plotDir.c_str());
  }
  finishOutput();
  return allOk ? 0 : 1;
}

}  // namespace poseidon::cli
