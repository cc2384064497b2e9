// poseidon tune: Omnivore's automatic optimizer (cli/tuner.h; how it decides: cli/tuner.cc) on the
// time-to-accuracy harness, at each --rates link rate; its summary JSON and Markdown.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <thread>
#include <tuple>

#include "poseidon/bench/cluster.h"
#include "poseidon/cli/accuracy_harness.h"
#include "poseidon/cli/bench_util.h"
#include "poseidon/cli/commands.h"
#include "poseidon/cli/flags.h"
#include "poseidon/cli/limits.h"
#include "poseidon/cli/tuner.h"
#include "poseidon/common/error.h"
#include "poseidon/common/file.h"
#include "poseidon/launch/env.h"
#include "poseidon/model/zoo.h"
#include "poseidon/planner/planner.h"

namespace poseidon::cli {
namespace fs = std::filesystem;
namespace {

std::string fmt(double v, const char* f) {
  if (!(v >= 0)) return "-";  // not reached, or NaN
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

void writeMarkdown(const std::string& path, const nlohmann::json& result) {
  std::ofstream md(path);
  const auto& c = result["config"];
  md << "# Omnivore's optimizer on the emulated cluster (`poseidon tune`)\n\n`" << c["command"].get<std::string>()
     << "`\n\nLeNet on Fashion-MNIST, " << c["nodes"] << " nodes, batch " << c["batch"]
     << " per worker, compute padded to " << c["pad_ms"] << " ms per step; " << c["steps"]
     << " steps of the trained model, a cold start of " << c.value("cold_start_steps", 0) << ", epochs of "
     << c["epoch_steps"] << ", probes of " << c["probe_steps"] << ". A run's loss is "
     << (c.value("probe_samples", 0) > 0
             ? strCat("its end model's mean loss on ", c["probe_samples"].get<int64_t>(), " fixed training images")
             : std::string("rank 0's mean training loss over its second half"))
     << ". Times are training-clock seconds summed over every run (probes "
     << "included); a point of the trained model is at its own clock plus the tuning spent before it.\n\n";
  for (const auto& r : result["runs"]) {
    md << "## " << r["mbit"].get<double>() << " Mbit/s\n\n";
    md << "Chosen: g = " << r["chosen"]["groups"] << ", momentum " << r["chosen"]["momentum"] << ", lr "
       << r["chosen"]["lr"] << ". Time to " << 100 * c["target_accuracy"].get<double>()
       << "% test accuracy: " << fmt(r["time_to_accuracy_s"].get<double>(), "%.1f s") << " (" << r["steps_to_accuracy"]
       << " steps); to loss " << c["target_loss"] << ": " << fmt(r["time_to_loss_s"].get<double>(), "%.1f s")
       << "; final accuracy " << fmt(100 * curveNumber(r, "final_test_accuracy"), "%.1f%%") << ". Training clock "
       << fmt(r["clock_seconds"].get<double>(), "%.1f s") << ", of which tuning (the probes that lost) "
       << fmt(r["tuning_seconds"].get<double>(), "%.1f s") << " ("
       << fmt(100 * r["tuning_share"].get<double>(), "%.0f%%") << ").\n\n";
    md << "| stage | g | lr | momentum | steps | loss | seconds | kept |\n|---|---|---|---|---|---|---|---|\n";
    for (const auto& s : r["stages"]) {
      md << "| " << s["kind"].get<std::string>() << " | " << s["groups"] << " | " << s["lr"] << " | " << s["momentum"]
         << " | " << s["from_step"] << "-" << s["to_step"] << " | "
         << (s["loss"].is_number() ? fmt(s["loss"].get<double>(), "%.4f")
             : s.value("diverged_at_step", nlohmann::json()).is_number()
                 ? strCat("diverged at step ", s["diverged_at_step"].get<int>())
                 : std::string("diverged"))
         << " | " << fmt(s["clock_seconds"].get<double>(), "%.1f") << " | " << (s["won"].get<bool>() ? "yes" : "")
         << " |\n";
    }
    md << "\n";
  }
}

// poseidon tune's settings, as its flags set them.
struct TuneArgs {
  std::string ratesFlag = "100,30", groupsFlag, lrsFlag, momentaFlag, jsonPath, mdPath;
  AccuracyHarness h;
  TuneConfig cfg;
  int64_t seed = 1;
  int probeSteps = 0, coldSteps = 0;
  bool keep = false;
};

void addTuneFlags(FlagSet& flags, TuneArgs& a) {
  flags.addString("rates", &a.ratesFlag, "comma-separated link rates in Mbit/s: one tuned run each", "LIST");
  flags.addInt("nodes", &a.h.nodes, "nodes (workers), one process each", "N", IntRange::closed(2, 64));
  flags.addInt64("batch", &a.h.batch, "per-worker batch", "K", IntRange::closed(1, 60000));
  flags.addDouble("pad-ms", &a.h.padMs, "modeled compute time per step, in milliseconds", "MS",
                  RealRange::leftOpen(0, kMaxPadMs));
  flags.addInt64("pair-bytes", &a.h.pairBytes, "Poseidon's KV pair size", "BYTES", IntRange::closed(4, 1 << 30));
  flags.addInt("steps", &a.cfg.steps, "steps of the trained model (cold start included): the budget", "N",
               IntRange::atLeast(2));
  flags.addInt("epoch-steps", &a.cfg.epochSteps, "steps of an optimizer epoch (the paper: an hour)", "N",
               IntRange::atLeast(2));
  flags.addInt("probe-steps", &a.probeSteps,
               "steps of a probe (default: 1/60 of an epoch and at least 2; the paper: a minute per hour)", "N",
               IntRange::atLeast(2));
  flags.addInt("cold-start-steps", &a.coldSteps,
               "steps of the synchronous cold start, its probes included (default: the first multiple of the probe "
               "length from a tenth of an epoch)",
               "N", IntRange::atLeast(2));
  flags.addString("groups-list", &a.groupsFlag,
                  "the numbers of groups to choose from, each dividing --nodes and 1 among them (default: the powers "
                  "of 2 that divide --nodes)",
                  "LIST");
  flags.addString("lrs", &a.lrsFlag, "the cold start's learning rates (default: 1e-5,1e-4,1e-3,1e-2,1e-1)", "LIST");
  flags.addString("momenta", &a.momentaFlag, "the momenta each epoch probes (default: 0,0.3,0.6,0.9)", "LIST");
  flags.addDouble("target-accuracy", &a.h.targetAccuracy, "target test accuracy", "A", RealRange::leftOpen(0, 1));
  flags.addDouble("target-loss", &a.h.targetLoss, "target training loss", "L", RealRange::above(0));
  flags.addInt64("seed", &a.seed, "seed of the data order and the initial weights", "S", IntRange::atLeast(0));
  flags.addString("data", &a.h.dataDir, "Fashion-MNIST directory (default: Debian's)", "DIR");
  flags.addInt("run-timeout", &a.h.timeoutS, "seconds before a run is declared failed", "S",
               IntRange::closed(1, 86400));
  flags.addString("json", &a.jsonPath, "write every probe, decision and the trained model's curve as JSON to FILE",
                  "FILE");
  flags.addString("markdown", &a.mdPath, "write the tables as Markdown to FILE", "FILE");
  flags.addBool("merged-fc", &a.cfg.mergedFc,
                "train every run with merged FC (poseidon train --merged-fc); the first g is then the smallest that "
                "saturates the FC server (predicted load >= 95%, the paper's rule; the largest listed when none "
                "does), from its time per sample measured in the cold start");
  flags.addInt64("probe-samples", &a.cfg.probeSamples,
                 "a run's loss: its end model's mean loss on N fixed training images, scored after the run off the "
                 "training clock (0: rank 0's mean training loss over the run's second half, minibatch noise and all)",
                 "N", IntRange::closed(0, 60000));
  flags.addBool("keep", &a.keep, "keep the per-rank logs and checkpoints (printed path)");
}

// The optimizer's settings from the flags: the probe length, the grids of g, eta and mu, checked.
void finishConfig(TuneArgs& a) {
  a.h.seed = static_cast<uint64_t>(a.seed);
  if (a.cfg.epochSteps > a.cfg.steps) {
    throw InvalidArgument(strCat("--epoch-steps ", a.cfg.epochSteps, " exceeds --steps ", a.cfg.steps));
  }
  const bool probeGiven = a.probeSteps > 0;
  a.cfg.probeSteps = probeGiven ? a.probeSteps : std::max(2, a.cfg.epochSteps / 60);
  const std::string probeText =
      strCat("--probe-steps ", a.cfg.probeSteps, probeGiven ? "" : " (1/60 of --epoch-steps, at least 2)");
  if (a.cfg.epochSteps % a.cfg.probeSteps != 0) {
    throw InvalidArgument(strCat(probeText, " must divide --epoch-steps ", a.cfg.epochSteps));
  }
  if (a.cfg.steps % a.cfg.probeSteps != 0) {
    throw InvalidArgument(strCat(probeText, " must divide --steps ", a.cfg.steps));
  }
  if (a.coldSteps > 0) {
    if (a.coldSteps % a.cfg.probeSteps != 0) {
      throw InvalidArgument(strCat(probeText, " must divide --cold-start-steps ", a.coldSteps));
    }
    a.cfg.coldSteps = a.coldSteps;
  } else {
    const int tenth = std::max(1, a.cfg.epochSteps / 10);
    a.cfg.coldSteps = (tenth + a.cfg.probeSteps - 1) / a.cfg.probeSteps * a.cfg.probeSteps;
  }
  if (a.cfg.coldSteps > a.cfg.steps) {
    throw InvalidArgument(strCat("--cold-start-steps ", a.cfg.coldSteps, " exceeds --steps ", a.cfg.steps));
  }
  if (a.groupsFlag.empty()) {
    for (int g = 1; g <= a.h.nodes; g *= 2)
      if (a.h.nodes % g == 0) a.cfg.groups.push_back(g);
  } else {
    for (const auto& item : splitList(a.groupsFlag)) {
      const int g = static_cast<int>(parseIntIn("each --groups-list entry", item, IntRange::closed(1, a.h.nodes)));
      if (a.h.nodes % g != 0)
        throw InvalidArgument(strCat("--groups-list: ", g, " does not divide --nodes ", a.h.nodes));
      a.cfg.groups.push_back(g);
    }
    std::sort(a.cfg.groups.begin(), a.cfg.groups.end());
    a.cfg.groups.erase(std::unique(a.cfg.groups.begin(), a.cfg.groups.end()), a.cfg.groups.end());
    if (a.cfg.groups.front() != 1)
      throw InvalidArgument("--groups-list must include 1 (the cold start is synchronous)");
  }
  if (!a.lrsFlag.empty()) {
    a.cfg.lrs.clear();
    for (const auto& item : splitList(a.lrsFlag))
      a.cfg.lrs.push_back(parseRealIn("each --lrs entry", item, RealRange::above(0)));
    std::sort(a.cfg.lrs.begin(), a.cfg.lrs.end());
  }
  if (!a.momentaFlag.empty()) {
    a.cfg.momenta.clear();
    for (const auto& item : splitList(a.momentaFlag))
      a.cfg.momenta.push_back(parseRealIn("each --momenta entry", item, RealRange::rightOpen(0, 1)));
    std::sort(a.cfg.momenta.begin(), a.cfg.momenta.end());
  }
  if (a.cfg.lrs.empty() || a.cfg.momenta.empty()) throw InvalidArgument("--lrs and --momenta must not be empty");
  if (a.cfg.momenta.front() != 0) throw InvalidArgument("--momenta must include 0 (it decides when to halve g)");
}

// One tuned run per link rate on one emulated cluster; the JSON and Markdown rewritten after each.
void tuneAtEachRate(TuneArgs& a, const std::vector<double>& rates, nlohmann::json& result) {
  AccuracyHarness& h = a.h;
  const TuneConfig& cfg = a.cfg;
  const std::string &jsonPath = a.jsonPath, &mdPath = a.mdPath;
  nlohmann::json runs = nlohmann::json::array();
  bench::EmulatedCluster cluster(h.nodes, bench::LinkSpec{rates.front(), 0}, h.tcpCongestion);
  h.cluster = &cluster;
  std::printf(
      "poseidon tune: %d-node emulated cluster, LeNet on Fashion-MNIST, batch %lld per worker, compute padded "
      "to %g ms; %d steps, a cold start of %d, epochs of %d, probes of %d\n",
      h.nodes, static_cast<long long>(h.batch), h.padMs, cfg.steps, cfg.coldSteps, cfg.epochSteps, cfg.probeSteps);
  for (double rate : rates) {
    cluster.setLink({rate, 0});
    std::printf("%g Mbit/s:\n", rate);
    nlohmann::json r = tune(&h, cfg, rate);
    // The JSON keeps -1 for "not reached"; the line says it in words.
    const double toAccuracy = r["time_to_accuracy_s"].get<double>();
    const std::string reached =
        toAccuracy < 0 ? "not reached"
                       : strCat(fmt(toAccuracy, "%.1f s"), " (", r["steps_to_accuracy"].get<int64_t>(), " steps)");
    std::printf(
        "  %g Mbit/s: to %.0f%% test accuracy %s, final %.1f%%; training clock %.1f s, tuning %.1f s (%.0f%%)\n",
        rate, 100 * h.targetAccuracy, reached.c_str(), 100 * curveNumber(r, "final_test_accuracy"),
        r["clock_seconds"].get<double>(), r["tuning_seconds"].get<double>(), 100 * r["tuning_share"].get<double>());
    std::fflush(stdout);
    runs.push_back(std::move(r));
    // Written after each rate: a long tune stopped later keeps what it finished.
    result["runs"] = runs;
    if (!jsonPath.empty()) writeFileAtomically(jsonPath, result.dump(2) + "\n", "--json");
    if (!mdPath.empty()) writeMarkdown(mdPath, result);
  }
  h.cluster = nullptr;
}

}  // namespace

int tuneCommand(const std::vector<std::string>& given) {
  std::vector<std::string> args = given;
  if (takeModeFlag(args, "regret")) return tuneRegretCommand(args);
  TuneArgs a;
  AccuracyHarness& h = a.h;
  FlagSet flags("tune", "poseidon tune [--rates LIST] [--steps N] [--epoch-steps N] [flags]",
                "Omnivore's automatic optimizer (Algorithm 1; docs/omnivore.md) on the time-to-accuracy mode:\n"
                "real training of LeNet on Fashion-MNIST on the emulated cluster (needs root), compute padded to\n"
                "--pad-ms per step. It picks the number of compute groups, the explicit momentum and the learning\n"
                "rate by short probes of real training (1/60 of an epoch each, the paper's minute per hour), trains\n"
                "an epoch with the winner, and repeats: a synchronous cold start over the learning rates; then the\n"
                "first g from the planner's hardware-efficiency model; each epoch a grid over momentum and learning\n"
                "rate, halving g while momentum 0 wins. Ties are decided by the probes' own spread. Prints every\n"
                "probe and decision with its margin; --json writes them all.\n"
                "With --regret (no root needed): the regret experiment on a virtual clock instead\n"
                "(poseidon tune --regret --help).");
  addTuneFlags(flags, a);
  flags.parse(args);
  if (flags.helpRequested()) {
    std::cout << flags.helpText();
    return 0;
  }
  checkResultOutputs(a.jsonPath, a.mdPath);
  finishConfig(a);
  std::vector<double> rates = parseRates(a.ratesFlag);
  if (rates.empty()) throw InvalidArgument("--rates must not be empty");
  requireEmulatedCluster();
  const WorkDir work("poseidon-tune", a.keep, "logs and checkpoints");
  h.prepare(work.path());

  nlohmann::json result;
  result["config"] = h.config(commandLine("poseidon tune", args), rates);
  const TuneConfig& cfg = a.cfg;
  result["config"].update({{"steps", cfg.steps},
                           {"epoch_steps", cfg.epochSteps},
                           {"probe_steps", cfg.probeSteps},
                           {"cold_start_steps", cfg.coldSteps},
                           {"groups_list", cfg.groups},
                           {"lrs", cfg.lrs},
                           {"momenta", cfg.momenta},
                           {"merged_fc", cfg.mergedFc},
                           {"probe_samples", cfg.probeSamples}});
  tuneAtEachRate(a, rates, result);
  if (!a.jsonPath.empty()) std::printf("results: %s\n", a.jsonPath.c_str());
  if (!a.mdPath.empty()) std::printf("table: %s\n", a.mdPath.c_str());
  finishOutput();
  return 0;
}

}  // namespace poseidon::cli
