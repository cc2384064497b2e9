#include "poseidon/cli/plan_predict.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <tuple>

#include "poseidon/bench/emulation.h"
#include "poseidon/common/error.h"
#include "poseidon/model/zoo.h"

namespace poseidon::cli {
namespace {

using planner::Cluster;
using planner::Prediction;
using planner::System;

// KV pairs x workers from which a prediction says first that its rows take a while (vgg19's 274
// pairs of 2 MB at 32 workers, where the note used to start).
constexpr double kSlowPredictionMessages = 8000;
// ... and from which it is refused: about 1.3 us a simulated message and ~15 runs for a row's lowest
// rate make 5e7 half an hour a row (--pair-bytes 4 on vgg19 at 64 workers: 9e9, days).
constexpr double kMaxPredictionMessages = 5e7;

double pairsPerIteration(const planner::Workload& w, const Cluster& c) {
  return std::ceil(4.0 * static_cast<double>(w.model.numel()) / static_cast<double>(c.pairBytes));
}

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
  {  // before the first line of output
    const int largest = *std::max_element(r.workers.begin(), r.workers.end());
    const double pairs = pairsPerIteration(w, r.cluster);
    if (pairs * largest > kMaxPredictionMessages) {
      const double least = 4.0 * static_cast<double>(w.model.numel()) * largest / kMaxPredictionMessages;
      throw InvalidArgument(strCat("--pair-bytes ", r.cluster.pairBytes, " cuts ", w.model.name, " into ",
                                   static_cast<int64_t>(pairs), " KV pairs: at ", largest,
                                   " workers a prediction would simulate hours of messages; give --pair-bytes ",
                                   static_cast<int64_t>(std::ceil(least)), " or more (or fewer workers)"));
    }
  }
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
                     {"switch_queue", r.cluster.switchLowDelayFirst ? "tos" : "fifo"},
                     {"links", planner::linksName(r.cluster.links)},
                     {"credit_window_bytes", r.cluster.creditWindowBytes},
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
    if (r.cluster.links != Cluster::Links::kAsBuilt || r.cluster.switchLowDelayFirst) {
      // A design study, not the runtime: say so above the numbers.
      std::string study;
      if (r.cluster.links == Cluster::Links::kCredits)
        study = strCat("receiver-driven credits (", std::lround(r.cluster.creditWindowBytes / 1024),
                       " KB granted in flight per receiver)");
      else if (r.cluster.links == Cluster::Links::kIdeal)
        study = "ideal links (both ends serve the most urgent fragment first)";
      if (r.cluster.switchLowDelayFirst)
        study += strCat(study.empty() ? "" : "; ", "switch ports serving the urgent connections first");
      std::printf("design study, not how the runtime runs: poseidon-overlap on %s\n", study.c_str());
    }
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
  // A row's cost grows with the messages it simulates, about KV pairs x workers: vgg19's 274 default
  // pairs at 32 workers take seconds a row, its 140,000 pairs of 4 KB minutes (--pair-bytes 4096).
  const int largest = *std::max_element(r.workers.begin(), r.workers.end());
  const double pairs = pairsPerIteration(w, r.cluster);
  if (!r.json && pairs * largest >= kSlowPredictionMessages) {
    std::fprintf(stderr,
                 "(%d workers, %.0f KV pairs an iteration: every row is a discrete-event run of each message%s; "
                 "rows appear as they finish)\n",
                 largest, pairs, sweep ? "" : ", and its lowest rate a search of ~15 runs");
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

}  // namespace poseidon::cli
