#include "poseidon/cli/plan_predict.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <thread>
#include <tuple>

#include "poseidon/bench/emulation.h"
#include "poseidon/bench/systems.h"
#include "poseidon/common/error.h"
#include "poseidon/model/zoo.h"

namespace poseidon::cli {
namespace {

// A --check's tally: each predicted point's error against the tolerance, and the closing report.
struct CheckTally {
  std::string path;
  double tolerance = 0;
  int cores = 0;
  double messageUs = 0;  // the receive loop's time per message the points were predicted with
  nlohmann::json rows = nlohmann::json::array();
  int points = 0, beyond = 0, skipped = 0;
  double worst = 0;

  // A point predicted: its relative error, counted.
  double add(double measured, double predicted) {
    const double error = predicted / measured - 1;
    ++points;
    beyond += std::fabs(error) > tolerance;
    worst = std::max(worst, std::fabs(error));
    return error;
  }
  const char* mark(double error) const { return std::fabs(error) > tolerance ? "  BEYOND" : ""; }
  // The file's JSON (--json) or its closing line; `skippedWhy` says what a skipped point was.
  void report(bool json, const std::string& skippedWhy) const {
    if (json) {
      std::cout << nlohmann::json{{"file", path},        {"points", points},        {"skipped", skipped},
                                  {"beyond", beyond},    {"tolerance", tolerance},  {"worst_error", worst},
                                  {"host_cores", cores}, {"message_us", messageUs}, {"rows", rows}}
                       .dump(2)
                << "\n";
    } else {
      std::printf(
          "\n%d points predicted (%d skipped%s); worst error %.1f%%; %d beyond %.0f%%; host of %d cores; %.0f us per "
          "message on a receive loop\n",
          points, skipped, skippedWhy.c_str(), worst * 100, beyond, tolerance * 100, cores, messageUs);
    }
  }
};

using planner::Cluster;
using planner::Prediction;
using planner::System;

planner::Workload workloadOf(const PredictRequest& r) {
  if (r.computeSeconds > 0) {
    ModelDesc desc = resolveModel(r.model);
    int64_t batch = r.batch > 0 ? r.batch : 32;
    for (const auto& e : zooEntries())
      if (e.name == r.model && r.batch <= 0) batch = e.defaultBatch;
    return planner::workloadFor(std::move(desc), batch, r.computeSeconds);
  }
  const auto& known = bench::emulatedModelNames();
  if (std::find(known.begin(), known.end(), r.model) == known.end()) {
    std::string names;
    for (const auto& n : known) names += (names.empty() ? "" : ", ") + n;
    throw InvalidArgument("--predict needs the model's compute time: '" + r.model +
                          "' has no single-GPU timing (those with one: " + names +
                          "); give --compute-seconds T, one worker's seconds per iteration");
  }
  planner::Workload w = planner::zooWorkload(r.model, 1.0, r.compute);
  if (r.batch > 0 && r.batch != w.batch) {
    // The compute tables are per published batch: scale the time with the batch.
    const double k = static_cast<double>(r.batch) / static_cast<double>(w.batch);
    for (auto& f : w.forwardSeconds) f *= k;
    for (auto& b : w.backwardSeconds) b *= k;
    w.batch = r.batch;
  }
  return w;
}

nlohmann::json toJson(const Prediction& p, double linkBytes, double minLink) {
  nlohmann::json j{{"system", planner::systemName(p.system)},
                   {"workers", p.workers},
                   {"iteration_seconds", p.iterationSeconds},
                   {"compute_seconds", p.computeSeconds},
                   {"speedup", p.speedup},
                   {"efficiency", p.efficiency},
                   {"max_node_tx_bytes", p.maxNodeTxBytes},
                   {"own_bound_seconds", p.boundSeconds},
                   {"sfb_layers", p.sfbLayers},
                   {"link_gbit", linkBytes * 8 / 1e9}};
  if (minLink >= 0)
    j["min_link_gbit"] = std::isinf(minLink) ? nlohmann::json(nullptr) : nlohmann::json(minLink * 8 / 1e9);
  return j;
}

std::string gbit(double bytesPerSecond) {
  if (std::isinf(bytesPerSecond)) return "never";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", bytesPerSecond * 8 / 1e9);
  return buf;
}

// --groups: HE(g) for each g, next to each other.
int planGroups(const PredictRequest& r, const planner::Workload& whole) {
  const int P = r.workers.front();
  Cluster c = r.cluster;
  c.workers = P;
  // Merged FC: the workers keep the layers below the top FC ones; the FC server computes those.
  planner::Workload w = whole;
  planner::MergedFc fc;
  if (r.mergedFc) std::tie(w, fc) = planner::splitMergedFc(whole);
  const planner::MergedFc* merged = r.mergedFc ? &fc : nullptr;
  std::vector<planner::GroupPrediction> ps;
  for (int g : r.groups) ps.push_back(planner::predictGroups(w, c, g, merged));
  // HE(1) per sample: g = 1 (in the same mode) is always the reference, modelled if the list does not have it.
  const double samples1 = planner::predictGroups(w, c, 1, merged).samplesPerSecond;
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& p : ps) {
    rows.push_back({{"groups", p.groups},
                    {"group_size", p.groupSize},
                    {"step_seconds", p.stepSeconds},
                    {"update_seconds", p.updateSeconds},
                    {"samples_per_second", p.samplesPerSecond},
                    {"he_ratio", samples1 / p.samplesPerSecond},
                    {"max_node_tx_bytes", p.maxNodeTxBytes}});
    if (merged) rows.back()["fc_server_busy"] = p.fcServerBusy;
  }
  if (r.json) {
    std::cout << nlohmann::json{{"model", w.model.name},
                                {"batch", w.batch},
                                {"workers", P},
                                {"compute_seconds", w.computeSeconds()},
                                {"link_gbit", c.linkBytes * 8 / 1e9},
                                {"crypto_gbytes_per_s", c.cryptoBytes / 1e9},
                                {"merged_fc", r.mergedFc},
                                {"servers", c.servers > 0 ? c.servers : P},
                                {"fc_server_seconds_per_sample", fc.serverSecondsPerSample},
                                {"activation_floats", fc.activationFloats},
                                {"groups", rows}}
                     .dump(2)
              << "\n";
    return 0;
  }
  std::printf("model %s, K=%lld per worker, %.3f s of compute per step; %d workers, links %s Gbit/s each way\n",
              w.model.name.c_str(), static_cast<long long>(w.batch), w.computeSeconds(), P, gbit(c.linkBytes).c_str());
  const std::string shards =
      c.servers > 0 && c.servers < P ? strCat("the shards of nodes 0..", c.servers - 1) : std::string("the shards");
  if (merged) {
    std::printf(
        "compute groups (Omnivore) with merged FC: the FC layers (%.1f ms per sample, %.0f floats of activations "
        "each way) on one FC server, the rest on %s\n\n",
        1e3 * fc.serverSecondsPerSample, fc.activationFloats, shards.c_str());
  } else {
    std::printf("compute groups (Omnivore): groups synchronous inside, asynchronous across, the model on %s\n\n",
                shards.c_str());
  }
  std::printf("%6s %6s %9s %10s %10s %12s %12s%s\n", "groups", "size", "s/step", "s/update", "samples/s", "HE(g)/HE(1)",
              "tx MB/step", merged ? "  FC server busy" : "");
  for (const auto& p : ps) {
    std::printf("%6d %6d %9.3f %10.4f %10.1f %12.3f %12.2f", p.groups, p.groupSize, p.stepSeconds, p.updateSeconds,
                p.samplesPerSecond, samples1 / p.samplesPerSecond, p.maxNodeTxBytes / 1e6);
    if (merged) std::printf("  %14.0f%%", 100 * p.fcServerBusy);
    std::printf("\n");
  }
  std::printf(
      "\ns/step: one worker's round (pull the model, compute, push); s/update: between updates of the shared model\n"
      "(Omnivore's time per iteration; s/step / g when the groups step alike); HE(g)/HE(1): time per sample against "
      "one group (below 1: "
      "faster)\n");
  return 0;
}

// One core of this machine multiplies at about this rate (bench/device.h measures it): the SFB
// GEMM of the time-to-accuracy runs, which train on the host's CPUs.
constexpr double kHostGemmFlops = 77e9;

// A `poseidon bench --accuracy` file: real training of LeNet with each step's compute padded to
// pad_ms. bsp, ddp and the compute groups are modelled; the pad sits between the forward and the
// backward, so the syncs start after it (the real backward's few ms of WFBP overlap are left out).
int planCheckAccuracy(const std::string& path, const nlohmann::json& results, const Cluster& calibration, int hostCores,
                      double tolerance, bool json) {
  const auto& config = results["config"];
  const int cores =
      hostCores > 0 ? hostCores
                    : config.value("host_cores", static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  const int nodes = config.value("nodes", 0);
  const double padSeconds = config.value("pad_ms", 0.0) / 1e3, jitterMs = config.value("pad_jitter_ms", 0.0);
  const planner::Workload w =
      planner::paddedWorkload(resolveModel("lenet"), config.value("batch", 32), std::max(padSeconds, 1e-9));
  CheckTally t{path, tolerance, cores, calibration.messageSeconds * 1e6};
  int width = 8;  // the system column: the longest name (bsp-overlap-w16384)
  for (const auto& run : results["runs"]) width = std::max(width, static_cast<int>(run.value("system", "").size()));
  if (!json) {
    std::printf("%-*s %5s %8s %10s %10s %7s\n", width, "system", "nodes", "Mbit/s", "measured", "predicted", "error");
  }
  for (const auto& run : results["runs"]) {
    const std::string system = run.value("system", "");
    const int groups = run.value("groups", 0);
    const double mbit = run.value("mbit", 0.0);
    // Compute groups step at their own paces (with one server, its own group never waits for the link):
    // where the file has it, every worker's step at the rate through all of them, against the model's
    // (the samples per second of all workers, Omnivore's hardware efficiency); else rank 0's step.
    const double meanRate = groups > 0 ? run.value("mean_rate_seconds_per_step", 0.0) : 0.0;
    const double measured = meanRate > 0 ? meanRate : run.value("seconds_per_step", 0.0);
    auto groupStep = [&](const planner::GroupPrediction& p) {
      return meanRate > 0 ? static_cast<double>(nodes) * static_cast<double>(w.batch) / p.samplesPerSecond
                          : p.stepSeconds;
    };
    std::string why;
    if (jitterMs > 0) why = "jittered pads: not modelled";
    if (why.empty() && !(padSeconds > 0)) why = "no pad: the host's own compute is not modelled";
    if (why.empty() && !run.value("ok", false)) why = "failed run";
    if (why.empty() && !(measured > 0 && mbit > 0 && nodes > 1)) why = "incomplete run";
    if (why.empty() && system != "bsp" && system != "ddp" && groups < 1) why = "not modelled";
    if (!why.empty()) {
      ++t.skipped;
      if (!json)
        std::printf("%-*s %5d %8.0f %10s %10s  (%s)\n", width, system.c_str(), nodes, mbit, "-", "-", why.c_str());
      continue;
    }
    Cluster c = planner::emulatedCluster(calibration, nodes, mbit, cores);
    c.pairBytes = config.value("pair_bytes", c.pairBytes);
    c.servers = config.value("servers", 0);  // bench --accuracy --servers (0: every node)
    c.cryptoLanes =
        config.value("io_threads", bench::kBenchIoThreads);  // the ranks' I/O threads (2 before it was recorded)
    c.sumLanes = config.value("sum_threads", 0);             // poseidon train's (on the loop before it was recorded)
    c.gemmFlops = kHostGemmFlops;
    c.gemmOnGpu = false;     // poseidon train reconstructs on the host's cores
    c.timedSchemes = false;  // poseidon train picks schemes by bytes
    double predicted = 0;
    if (system == "bsp" || system == "ddp") {
      predicted = planner::predict(w, c, system == "bsp" ? System::kPoseidon : System::kDdp).iterationSeconds;
    } else if (run.value("merged_fc", false)) {
      // Merged FC: the pad is the conv layers' compute on each worker (the FC layers run on rank 0's
      // FC server); the server's time per group round is the one the run measured, or else the FC
      // layers' FLOPs at one core's rate stretched by the nodes sharing the host's cores.
      const ModelDesc lenet = resolveModel("lenet");
      const double rows = static_cast<double>(nodes / groups) * static_cast<double>(w.batch);
      const double measuredMs = run.value("fc_server_ms_per_update", 0.0);
      double perSample = measuredMs / 1e3 / rows;
      if (!(measuredMs > 0)) {
        double macs = 0;
        for (const auto& l : lenet.layers)
          if (l.type == LayerType::kFC) macs += static_cast<double>(l.m * l.n);
        perSample = 6 * macs / kHostGemmFlops * std::max(1.0, static_cast<double>(nodes) / cores);
      }
      const auto [padded, fc] = planner::paddedMergedFc(lenet, w.batch, std::max(padSeconds, 1e-9), perSample);
      predicted = groupStep(planner::predictGroups(padded, c, groups, &fc));
    } else {
      predicted = groupStep(planner::predictGroups(w, c, groups));
    }
    const double error = t.add(measured, predicted);
    t.rows.push_back({{"system", system},
                      {"groups", groups},
                      {"nodes", nodes},
                      {"link_mbit", mbit},
                      {"measured_seconds", measured},
                      {"measured", meanRate > 0 ? "mean_rate" : "rank0"},  // which step (see above)
                      {"predicted_seconds", predicted},
                      {"error", error}});
    if (!json) {
      std::printf("%-*s %5d %8.0f %10.3f %10.3f %+6.1f%%%s%s\n", width, system.c_str(), nodes, mbit, measured,
                  predicted, error * 100, t.mark(error), meanRate > 0 ? "  (all workers)" : "");
    }
  }
  t.report(json, "");
  return 0;
}

// --limits: the link rates from which each of the runtime's own costs sets the pace of each
// Poseidon system (printed unless --json), as JSON rows.
nlohmann::json costLimits(const PredictRequest& r, const planner::Workload& w) {
  constexpr double kMargin = 0.05, kLowest = 0.1e9 / 8, kHighest = 3200e9 / 8;
  nlohmann::json rows = nlohmann::json::array();
  if (!r.json) {
    std::printf(
        "\nwhere the runtime's own costs bind: the lowest link rate (Gbit/s, %g to %g) from which the cost makes "
        "the iteration at least %.0f%% slower than without it\n%-8s %-17s",
        kLowest * 8 / 1e9, kHighest * 8 / 1e9, kMargin * 100, "workers", "system");
    for (planner::Cost cost : planner::allCosts()) std::printf(" %24s", planner::costName(cost));
    std::printf("\n");
  }
  for (int P : r.workers) {
    Cluster c = r.cluster;
    c.workers = P;
    for (System s : r.systems) {
      if (s == System::kDdp || s == System::kDdpFp16 || P == 1) continue;
      if (!r.json) std::printf("%-8d %-17s", P, planner::systemName(s));
      for (planner::Cost cost : planner::allCosts()) {
        const bool charged = planner::charges(c, cost);
        const double from = charged ? planner::costBindsFrom(w, c, s, cost, kMargin, kLowest, kHighest) : 0;
        nlohmann::json row{{"workers", P},
                           {"system", planner::systemName(s)},
                           {"cost", planner::costName(cost)},
                           {"charged", charged}};
        row["binds_from_gbit"] =
            charged && !std::isinf(from) ? nlohmann::json(from * 8 / 1e9) : nlohmann::json(nullptr);
        rows.push_back(row);
        if (r.json) continue;
        std::string text = "off";
        if (charged) text = std::isinf(from) ? "beyond" : (from <= 0 ? "at any" : "from " + gbit(from));
        std::printf(" %24s", text.c_str());
      }
      if (!r.json) std::printf("\n");
    }
  }
  if (!r.json)
    std::printf("(off: not charged here; at any: already at the lowest rate; beyond: not up to the highest)\n");
  return rows;
}

}  // namespace

int planPredict(const PredictRequest& r) {
  const planner::Workload w = workloadOf(r);
  if (!r.groups.empty()) return planGroups(r, w);
  const bool sweep = r.sweep;
  nlohmann::json out{{"model", w.model.name},
                     {"batch", w.batch},
                     {"compute", r.computeSeconds > 0 ? "--compute-seconds" : r.compute},
                     {"compute_seconds", w.computeSeconds()},
                     {"link_gbit", r.cluster.linkBytes * 8 / 1e9},
                     {"wire", wirePrecisionName(r.cluster.wire)},
                     {"crypto_gbytes_per_s", r.cluster.cryptoBytes / 1e9},
                     {"io_threads", r.cluster.cryptoLanes},
                     {"sum_threads", r.cluster.sumLanes},
                     {"local_ranks", r.cluster.localRanks},
                     {"urgent_layers", r.cluster.urgentLayers},
                     {"host_queue", r.cluster.lowDelayFirst ? "tos" : "fifo"},
                     {"gemm_tflops", r.cluster.gemmFlops / 1e12},
                     {"copy_gbytes_per_s", r.cluster.copyBytes / 1e9},
                     {"efficiency_target", r.efficiency}};
  nlohmann::json rows = nlohmann::json::array();
  char line[256];
  if (!r.json) {
    char cryptoText[64] = "off";
    if (r.cluster.cryptoBytes > 0)
      std::snprintf(cryptoText, sizeof cryptoText, "at %.3g GB/s per I/O thread (%d)", r.cluster.cryptoBytes / 1e9,
                    r.cluster.cryptoLanes);
    const std::string crypto = cryptoText;
    std::printf("model %s, K=%lld per worker, %.3f s of compute per iteration on one worker (%s)\n",
                w.model.name.c_str(), static_cast<long long>(w.batch), w.computeSeconds(),
                r.computeSeconds > 0 ? "--compute-seconds" : r.compute.c_str());
    char copyText[64] = "none";
    if (r.cluster.copyBytes > 0)
      std::snprintf(copyText, sizeof copyText, "%.3g GB/s each way", r.cluster.copyBytes / 1e9);
    std::printf("links %s Gbit/s each way per node; %s wire; CURVE %s; SFB GEMM at %.3g TFLOP/s; host copies %s\n",
                gbit(r.cluster.linkBytes).c_str(), wirePrecisionName(r.cluster.wire), crypto.c_str(),
                r.cluster.gemmFlops / 1e12, copyText);
    if (r.cluster.localRanks > 1) {
      std::printf(
          "%d GPUs (ranks) per node, meeting on its first before the network (--local-ranks); workers "
          "count nodes, speedup every GPU\n",
          r.cluster.localRanks);
    }
    if (sweep) {
      std::printf("\n%-8s", "workers");
      for (System s : r.systems) std::printf(" %26s", planner::systemName(s));
      std::printf("\n%-8s", "");
      for (size_t i = 0; i < r.systems.size(); ++i) std::printf(" %26s", "s/iter  speedup  eff");
      std::printf("\n");
    } else {
      const std::string minCol = "Gbit/s @" + std::to_string(std::lround(r.efficiency * 100)) + "%";
      std::printf("\n%-17s %8s %8s %6s %12s %10s %14s\n", "system", "s/iter", "speedup", "eff", "tx MB/iter",
                  "own bound", minCol.c_str());
    }
  }
  const int largest = *std::max_element(r.workers.begin(), r.workers.end());
  if (!r.json && largest >= 32) {
    std::fprintf(stderr,
                 "(%d workers: every row is a discrete-event run of each message%s; rows appear as they finish)\n",
                 largest, sweep ? "" : ", and its lowest rate a search of ~15 runs");
  }
  for (int P : r.workers) {
    Cluster c = r.cluster;
    c.workers = P;
    if (sweep && !r.json) std::printf("%-8d", P);
    for (System s : r.systems) {
      const Prediction p = planner::predict(w, c, s);
      const double minLink = sweep ? -1 : planner::minLinkBytesFor(w, c, s, r.efficiency);
      rows.push_back(toJson(p, c.linkBytes, minLink));
      if (r.json) continue;
      if (sweep) {
        std::snprintf(line, sizeof line, "%9.3f %7.2fx %4.0f%%", p.iterationSeconds, p.speedup, p.efficiency * 100);
        std::printf(" %26s", line);
      } else {
        std::printf("%-17s %8.3f %7.2fx %5.1f%% %12.1f %10.3f %14s\n", planner::systemName(s), p.iterationSeconds,
                    p.speedup, p.efficiency * 100, p.maxNodeTxBytes / 1e6, p.boundSeconds, gbit(minLink).c_str());
      }
      std::fflush(stdout);  // each row as it is done: a large P takes a while per row
    }
    if (sweep && !r.json) std::printf("\n");
  }
  out["predictions"] = rows;
  if (!r.json) {
    std::printf(
        "\nspeedup: %s x (one worker's compute) / iteration; own bound: max(compute, busiest node's bytes / "
        "link rate)\n",
        r.cluster.localRanks > 1 ? strCat("P x ", r.cluster.localRanks, " GPUs").c_str() : "P");
  }
  if (r.limits) out["limits"] = costLimits(r, w);
  if (r.json) std::cout << out.dump(2) << "\n";
  return 0;
}

namespace {

// A bench results file (--check), read and checked for its config and runs.
nlohmann::json readResults(const std::string& path) {
  if (std::filesystem::is_directory(path)) throw InvalidArgument("--check: '" + path + "' is a directory, not a results file");
  std::ifstream in(path);
  if (!in) throw InvalidArgument("--check: cannot open '" + path + "'");
  nlohmann::json results;
  try {
    results = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument("--check: '" + path + "' is not JSON: " + e.what());
  }
  if (!results.is_object() || !results.contains("config") || !results.contains("runs") || !results["runs"].is_array())
    throw InvalidArgument("--check: '" + path + "' is not a poseidon bench results file (no config and runs)");
  return results;
}

// The measured rates of the results file's device `name` (config's "devices"), or nullptr.
const nlohmann::json* deviceRates(const nlohmann::json& devices, const std::string& name) {
  for (const auto& d : devices)
    if (d.is_object() && d.value("name", "") == name) return &d;
  return nullptr;
}

// The cluster one throughput run ran on: `nodes` on one host of `cores` at `mbit` (what its links ran
// at), the model's width `scale`, the file's send window and I/O threads, and (Poseidon's runs) its
// device's measured rates.
Cluster runCluster(const Cluster& calibration, const nlohmann::json& config, int nodes, double mbit, double scale,
                   int cores, WirePrecision wire, const nlohmann::json* rates) {
  // The bench runs every node on one host: a message's loop time stretches as they share its cores.
  Cluster c = planner::emulatedCluster(calibration, nodes, mbit, cores);
  c.scale = scale;
  c.wire = wire;
  const double window = config.value("send_window", 0.0);
  if (window > 0) c.sendWindowBytes = window / (scale * scale);
  // bench --urgent-layers (-1: the runtime's rule); files made before the urgent connection ran none
  c.urgentLayers = config.value("urgent_layers", 0);
  c.lowDelayFirst = config.value("host_queue", std::string("fifo")) == "tos";  // bench --host-queue
  // bench --pair-bytes (full width, as the planner's); files without it ran the default
  c.pairBytes = config.value("pair_bytes", c.pairBytes);
  c.cryptoLanes = config.value("io_threads", 2);
  c.sumLanes = config.value("sum_threads", 0);  // the ranks' sum threads (on the loop before it was recorded)
  c.cryptoBytes = c.gemmFlops = c.sumBytes = 0;
  c.timedSchemes = false;
  c.gemmOnGpu = false;
  if (rates) {
    c.cryptoBytes = rates->value("crypto_bytes_per_s", 0.0);
    c.gemmFlops = rates->value("gemm_flops", 0.0);
    // Before --compute (files with "gpu", "cpu:C"), the reconstruction was charged beside the GPU.
    c.gemmOnGpu = bench::isComputeName(rates->value("name", ""));
    c.sumBytes = rates->value("sum_bytes_per_s", 0.0);
    c.timedSchemes = true;
  }
  return c;
}

}  // namespace

namespace {

// The busiest node's bytes sent per iteration of one run, or null where the file has none.
nlohmann::json maxNodeTxBytes(const nlohmann::json& run) {
  if (!run.contains("tx_bytes_per_iteration")) return nullptr;
  const auto& tx = run["tx_bytes_per_iteration"];
  if (!tx.is_array() || tx.empty()) return nullptr;
  return *std::max_element(tx.begin(), tx.end());
}

// planCheck's work on a file readResults accepted; a field of the wrong type throws nlohmann's
// type_error, which planCheck turns into the file's usage error.
int checkResults(const std::string& path, const nlohmann::json& results, const Cluster& given, int hostCores,
                 double tolerance, bool json, bool messageSet) {
  const auto& config = results["config"];
  Cluster calibration = given;
  if (!messageSet && !config.contains("timer_slack_ns"))
    calibration.messageSeconds = planner::kMessageSecondsDefaultSlack;
  if (config.value("queue_ms", 100.0) < 100) {
    throw InvalidArgument(strCat("--check: the planner models no drops, and the file's switch queue (queue_ms ",
                                 config.value("queue_ms", 100.0),
                                 ") drops packets under incast; it checks runs "
                                 "with the default 100 ms"));
  }
  if (config.contains("pad_ms")) return planCheckAccuracy(path, results, calibration, hostCores, tolerance, json);
  const double scale = config.value("scale", 0.1);
  if (config.value("latency_ms", 0.0) > 0)
    throw InvalidArgument("--check: the planner models no added link latency (the file's latency_ms > 0)");
  // Cores of the host that ran the emulated cluster: the file's (bench records it), else this machine's.
  const int cores =
      hostCores > 0 ? hostCores
                    : config.value("host_cores", static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  // Under time dilation F (bench --time-dilation) the host's own work per message, not dilated, took
  // 1/F of the emulated time it takes at F = 1: F times faster cores, as the runs read.
  const double messageSeconds = calibration.messageSeconds / config.value("time_dilation", 1.0);
  const nlohmann::json devices = config.value("devices", nlohmann::json::array());  // each device's measured rates
  CheckTally t{path, tolerance, cores, messageSeconds * 1e6};
  if (!json) {
    std::printf("%-12s %-17s %5s %8s %9s %10s %7s\n", "model", "system", "nodes", "Mbit/s", "measured", "predicted",
                "error");
  }
  for (const auto& run : results["runs"]) {
    const std::string system = run.value("system", ""), model = run.value("model", "");
    const int nodes = run.value("nodes", 0);
    const int localRanks = run.value("local_ranks", config.value("local_ranks", 1));
    const std::string nodesText = localRanks > 1 ? strCat(nodes, "x", localRanks) : std::to_string(nodes);
    const double mbit = run.value("link_mbit", 0.0), measured = run.value("iteration_seconds", 0.0);
    std::string why;
    System sys{};
    WirePrecision wire = WirePrecision::kFp32;
    bool noCurve = false;
    try {
      const bench::SystemChoice c = bench::parseBenchSystem(system.substr(0, system.find('@')));
      if (!c.spec->planned) throw InvalidArgument(system + " has no model in the planner");
      sys = *c.spec->planned;
      wire = c.wire;
      noCurve = c.noCurve;
    } catch (const InvalidArgument&) {
      why = "not modelled";
    }
    if (why.empty() && !run.value("ok", false)) why = "failed run";
    if (why.empty() && run.value("host_bound", false)) why = "HOST-BOUND";
    if (why.empty() && !(measured > 0)) why = "no iteration time";
    if (why.empty() && nodes < 1) why = "no node count";
    const std::string device = run.value("device", "gpu");
    const nlohmann::json* rates = deviceRates(devices, device);
    // Poseidon's runtime charged its own work on the run's device: the file must say how fast.
    const bool ddp = sys == System::kDdp || sys == System::kDdpFp16;
    if (why.empty() && !ddp && device != "none" && !rates) why = "device '" + device + "' not in the file";
    planner::Workload w;
    double modelScale = scale, linkMbit = mbit;
    if (why.empty()) {
      try {
        // Files with "model_scales" ran each model at the width recorded there (its batch whole), its
        // links at the run's emulated_mbit; older ones at the file's scale with the batch rounded.
        const nlohmann::json widths = config.value("model_scales", nlohmann::json::object());
        const bool whole = widths.contains(model);
        w = planner::zooWorkload(model, scale, config.value("compute", "titanx"), whole);
        if (whole) {
          modelScale = widths[model].get<double>();
          if (std::fabs(modelScale - bench::wholeBatchScale(model, scale)) > 1e-12) {
            throw InvalidArgument(strCat("the file's width for ", model, " (", modelScale,
                                         ") is not where its batch is whole at s = ", scale));
          }
          linkMbit = run.value("emulated_mbit", bench::emulatedMbit(modelScale, mbit, scale));
        }
      } catch (const std::exception& e) {
        why = e.what();
      }
    }
    if (!why.empty()) {
      ++t.skipped;
      if (!json)
        std::printf("%-12s %-17s %5s %8.0f %9s %10s  (%s)\n", model.c_str(), system.c_str(), nodesText.c_str(), mbit,
                    "-", "-", why.c_str());
      continue;
    }
    Cluster c = runCluster(calibration, config, nodes, linkMbit, modelScale, cores, wire, ddp ? nullptr : rates);
    if (noCurve) c.cryptoBytes = 0;  // its links ran without CURVE
    // bench --local-ranks: L processes a node, all sharing the host's cores.
    c.localRanks = localRanks;
    c.messageSeconds = messageSeconds * std::max(1.0, static_cast<double>(nodes * c.localRanks) / std::max(1, cores));
    const Prediction p = planner::predict(w, c, sys);
    const double error = t.add(measured, p.iterationSeconds);
    t.rows.push_back({{"model", model},
                      {"system", system},
                      {"nodes", nodes},
                      {"local_ranks", localRanks},
                      {"link_mbit", mbit},
                      {"measured_seconds", measured},
                      {"predicted_seconds", p.iterationSeconds},
                      {"error", error},
                      {"measured_max_node_tx_bytes", maxNodeTxBytes(run)},
                      {"predicted_max_node_tx_bytes", p.maxNodeTxBytes}});
    if (!json) {
      std::printf("%-12s %-17s %5s %8.0f %9.3f %10.3f %+6.1f%%%s\n", model.c_str(), system.c_str(), nodesText.c_str(),
                  mbit, measured, p.iterationSeconds, error * 100, t.mark(error));
    }
  }
  t.report(json, ": not modelled, failed, HOST-BOUND or incomplete");
  return 0;
}

}  // namespace

int planCheck(const std::string& path, const Cluster& given, int hostCores, double tolerance, bool json,
              bool messageSet) {
  const nlohmann::json results = readResults(path);
  try {
    return checkResults(path, results, given, hostCores, tolerance, json, messageSet);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(strCat("--check: '", path, "' is not a poseidon bench results file: ", e.what()));
  }
}

}  // namespace poseidon::cli
