// poseidon plan: per-layer costs (paper Table 1) and BestScheme choices for a
// model on a cluster shape, without running anything.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "poseidon/cli/bench_util.h"
#include "poseidon/cli/commands.h"
#include "poseidon/cli/flags.h"
#include "poseidon/cli/limits.h"
#include "poseidon/cli/plan_predict.h"
#include "poseidon/common/error.h"
#include "poseidon/core/best_scheme.h"
#include "poseidon/core/cost_model.h"
#include "poseidon/core/kv_layout.h"
#include "poseidon/model/zoo.h"
#include "poseidon/wire/precision.h"

namespace poseidon::cli {
namespace {

constexpr int kMaxPlannedWorkers = 4096;

std::string grouped(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.0f", v);
  std::string s = buf, out;
  int n = 0;
  for (auto it = s.rbegin(); it != s.rend(); ++it) {
    if (n && n % 3 == 0 && *it != '-') out.push_back(',');
    out.push_back(*it);
    ++n;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::string knownModels() {
  std::string s;
  for (const auto& e : zooEntries()) s += (s.empty() ? "" : ", ") + e.name;
  return s;
}

}  // namespace

int planCommand(const std::vector<std::string>& args) {
  std::string model = "vgg19";
  int workers = 8, servers = -1;
  int64_t batch = -1, pairBytes = kDefaultPairBytes;
  double scale = 1.0;
  bool json = false, predict = false;
  std::string scheme = "auto", wire = "fp32", sweep, groups, systems = "poseidon,poseidon-overlap,ps-wfbp,ps-naive,ddp",
              check;
  double rateGbit = 10, cryptoGBps = 1.75, gemmTflops = 5, efficiency = 0.9, computeSeconds = 0, tolerance = 0.15;
  planner::Cluster calibration;
  double ddpStepMs = calibration.ddpStepSeconds * 1e3, messageUs = calibration.messageSeconds * 1e6;
  int hostCores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  FlagSet flags("plan",
                "poseidon plan [--model NAME|FILE.json] [--workers P1] [--servers P2] [--batch K] [--json]\n"
                "       poseidon plan --predict [--model NAME] [--workers P | --sweep P1,P2,...] [--rate GBIT]\n"
                "       poseidon plan --predict --groups G1,... [--merged-fc] [--model NAME] [--workers P] [--rate R]\n"
                "       poseidon plan --check RESULTS.json",
                "Prints, per layer, the floats one node moves per iteration under each scheme (paper Table 1)\n"
                "and the scheme BestScheme (Algorithm 1) picks, with totals. Runs nothing.\n"
                "With --predict or --sweep: the planner's discrete-event model of an iteration (docs/planner.md)\n"
                "predicts iteration time, speedup, efficiency and the busiest node's bytes for Poseidon's systems\n"
                "and DDP at any scale, and the lowest link rate for --efficiency. With --groups: Omnivore's compute\n"
                "groups (`poseidon train --groups`), the time per step and per update and HE(g) / HE(1) for each g.\n"
                "With --check: the planner's prediction of every run in a `poseidon bench --json` (or\n"
                "`poseidon bench --accuracy --json`) file, against what was measured.\n"
                "Zoo models: " +
                    knownModels() + ".");
  flags.addString("model", &model, "zoo model name or path to a JSON layer table", "NAME|FILE");
  flags.addInt("workers", &workers, "P1, the number of workers", "P1", IntRange::closed(1, kMaxRanks));
  flags.addInt("servers", &servers, "P2, the number of server shards (default: P1, every node is both)", "P2",
               IntRange::closed(1, kMaxRanks));
  flags.addInt64("batch", &batch, "K, the per-worker batch (default: the model's batch in the paper)", "K",
                 IntRange::closed(1, kMaxBatch));
  flags.addInt64("pair-bytes", &pairBytes, "KV pair size in bytes", "BYTES",
                 IntRange::closed(kMinPairBytes, kMaxPairBytes));
  flags.addDouble("width-scale", &scale, "build the zoo model with widths x S (the bench's scaling rule)", "S",
                  RealRange::leftOpen(0, 1));
  flags.addString("scheme", &scheme, "auto (BestScheme), or force ps / sfb for FC layers", "auto|ps|sfb");
  flags.addString("wire", &wire, "what gradients travel as, for the byte totals (bf16 / fp16: 2 bytes a float)",
                  "fp32|bf16|fp16");
  flags.addBool("json", &json, "print JSON instead of a table");
  flags.addBool("predict", &predict, "predict iteration time, speedup and efficiency at --workers (the planner)");
  flags.addString("sweep", &sweep, "predict at each of these worker counts (implies --predict)", "P1,P2,...");
  flags.addDouble("rate", &rateGbit, "--predict: each node's link, Gbit/s each way", "GBIT", RealRange::above(0));
  flags.addString("groups", &groups,
                  "--predict: compute-group counts to model instead of --systems (each must divide --workers)",
                  "G1,G2,...");
  bool mergedFc = false;
  flags.addBool("merged-fc", &mergedFc,
                "--groups: the model's top FC layers on one FC server (poseidon train --merged-fc; Omnivore's t_fc)");
  flags.addString("systems", &systems,
                  "--predict: systems to model (poseidon, poseidon-overlap, ps-wfbp, ps-naive, ddp)", "LIST");
  flags.addDouble("efficiency", &efficiency, "--predict: the efficiency whose lowest link rate is reported", "E",
                  RealRange::leftOpen(0, 1));
  flags.addDouble("compute-seconds", &computeSeconds,
                  "--predict: one worker's seconds per iteration (needed for a model without a zoo timing)", "T",
                  RealRange::atLeast(0));
  flags.addDouble("crypto", &cryptoGBps,
                  "--predict: CURVE encryption, GB/s per I/O thread (0: links without it; jobs use it by default)",
                  "GBPS", RealRange::atLeast(0));
  flags.addDouble("gemm-tflops", &gemmTflops, "--predict: the SFB reconstruction GEMM's rate (a Titan X: 5)", "TFLOPS",
                  RealRange::above(0));
  flags.addDouble("link-overhead", &calibration.linkOverhead,
                  "bytes on the link per payload byte (TCP/IP headers and ACKs; calibrated on the bench)", "X",
                  RealRange::atLeast(1));
  flags.addDouble("ddp-step-ms", &ddpStepMs, "milliseconds each DDP ring step costs besides its bytes (calibrated)",
                  "MS", RealRange::atLeast(0));
  flags.addDouble("send-window", &calibration.sendWindowBytes,
                  "--predict: poseidon-overlap's fragment (the kernel send window per connection), bytes (--check: "
                  "the results file's)",
                  "BYTES", RealRange::atLeast(4096));
  flags.addDouble("message-us", &messageUs, "microseconds a node's receive loop spends per message, decryption aside",
                  "US", RealRange::atLeast(0));
  flags.addString("check", &check, "predict every run of a poseidon bench results file and compare", "RESULTS.json");
  flags.addInt("host-cores", &hostCores,
               "--check: cores of the host that ran the emulated cluster (default: the results file's, or "
               "this machine's for a file that does not say)",
               "N", IntRange::closed(1, 4096));
  flags.addDouble("tolerance", &tolerance, "--check: the error beyond which a point is flagged", "F",
                  RealRange::above(0));
  flags.parse(args);
  if (flags.helpRequested()) {
    std::cout << flags.helpText();
    return 0;
  }
  calibration.ddpStepSeconds = ddpStepMs / 1e3;
  calibration.messageSeconds = messageUs * 1e-6;
  // Each mode takes its own flags; one that another mode would silently ignore is refused.
  const bool sweeping = flags.wasSet("sweep"), predicting = predict || sweeping, checking = !check.empty();
  auto refuse = [&](std::initializer_list<const char*> names, const std::string& why) {
    for (const char* name : names)
      if (flags.wasSet(name)) throw InvalidArgument(strCat("--", name, " ", why));
  };
  if (checking) {
    refuse(
        {"predict", "sweep", "groups", "merged-fc", "model", "workers", "servers", "batch", "pair-bytes", "width-scale",
         "scheme", "wire", "rate", "systems", "efficiency", "compute-seconds", "crypto", "gemm-tflops", "send-window"},
        "does not apply to --check: each run's model, cluster and rates come from the results file");
  } else if (predicting) {
    refuse({"servers", "scheme", "width-scale"},
           "is for the cost table; the planner models every node as a worker and a server shard, BestScheme's "
           "choice, at full width");
    refuse({"host-cores", "tolerance"}, "is for --check");
    if (sweeping) refuse({"workers", "efficiency"}, "does not apply to --sweep (it gives the worker counts)");
    if (flags.wasSet("groups")) {
      refuse({"sweep", "systems", "efficiency", "send-window", "wire"},
             "does not apply to --groups (group mode sends dense fp32 gradients and pulls through the shards)");
    }
    if (mergedFc && !flags.wasSet("groups"))
      throw InvalidArgument("--merged-fc is a compute-group mode: it needs --groups");
    if (!sweeping && workers > kMaxPlannedWorkers) {
      throw InvalidArgument(strCat("--predict models at most ", kMaxPlannedWorkers, " workers, got ", workers));
    }
  } else {
    refuse({"rate", "groups", "merged-fc", "systems", "efficiency", "compute-seconds", "crypto", "gemm-tflops",
            "link-overhead", "ddp-step-ms", "send-window", "message-us", "host-cores", "tolerance"},
           "is for the planner (--predict, --sweep or --check)");
  }
  if (checking) return planCheck(check, calibration, flags.wasSet("host-cores") ? hostCores : 0, tolerance, json);
  if (predicting) {
    PredictRequest r;
    r.model = model;
    r.computeSeconds = computeSeconds;
    r.batch = flags.wasSet("batch") ? batch : -1;
    r.efficiency = efficiency;
    r.json = json;
    r.sweep = sweeping;
    r.mergedFc = mergedFc;
    if (sweeping) {
      for (const auto& item : splitList(sweep)) {
        r.workers.push_back(
            static_cast<int>(parseIntIn("each --sweep entry", item, IntRange::closed(1, kMaxPlannedWorkers))));
      }
      if (r.workers.empty()) throw InvalidArgument("--sweep needs at least one worker count");
    } else {
      r.workers.push_back(workers);
    }
    if (flags.wasSet("groups")) {
      for (const auto& item : splitList(groups)) {
        const int g = static_cast<int>(parseIntIn("each --groups entry", item, IntRange::closed(1, workers)));
        if (workers % g != 0) throw InvalidArgument(strCat("--groups ", g, " does not divide --workers ", workers));
        r.groups.push_back(g);
      }
      if (r.groups.empty()) throw InvalidArgument("--groups needs at least one group count");
    } else {
      for (const auto& item : splitList(systems)) r.systems.push_back(planner::parseSystem(item));
      if (r.systems.empty()) throw InvalidArgument("--systems needs at least one system");
    }
    r.cluster = calibration;
    r.cluster.linkBytes = rateGbit * 1e9 / 8;
    r.cluster.cryptoBytes = cryptoGBps * 1e9;
    r.cluster.gemmFlops = gemmTflops * 1e12;
    r.cluster.pairBytes = pairBytes;
    r.cluster.wire = parseWirePrecision(wire);
    return planPredict(r);
  }
  if (!flags.wasSet("servers")) servers = workers;
  SchemePolicy policy = parseSchemePolicy(scheme);
  const WirePrecision precision = parseWirePrecision(wire);
  const double elementBytes = static_cast<double>(wireElementBytes(precision));
  ModelDesc desc = resolveModel(model, scale);
  if (!flags.wasSet("batch")) {
    batch = 32;
    for (const auto& e : zooEntries())
      if (e.name == model) batch = std::max<int64_t>(1, static_cast<int64_t>(e.defaultBatch * scale + 0.5));
  }
  KvLayout layout(desc, servers, pairBytes);

  nlohmann::json out;
  out["model"] = desc.name;
  out["workers"] = workers;
  out["servers"] = servers;
  out["batch"] = batch;
  out["scheme_policy"] = schemePolicyName(policy);
  double totPs = 0, totPsWorker = 0, totHybrid = 0, totAdam = 0;
  int64_t totParams = 0;
  int sfbLayers = 0;
  nlohmann::json layers = nlohmann::json::array();
  std::ostringstream table;
  char line[512];
  std::snprintf(line, sizeof line, "%-22s %-5s %-14s %13s %15s %15s %15s %15s  %s\n", "layer", "type", "shape",
                "params", "ps(both)", "ps(worker)", "sfb", "adam(both)", "scheme");
  table << line;
  for (const auto& l : desc.layers) {
    CostInputs c = costInputs(l, batch, workers, servers);
    // PS moves every parameter (bias included); Table 1 counts the M x N
    // matrix, so FC layers report the formula and the others their numel.
    double ps = psCostBoth(c), psw = psCostWorker(c);
    Scheme s = bestScheme(l, batch, workers, servers, policy);
    bool fc = l.type == LayerType::kFC;
    double sfb = fc ? sfbCost(c) : 0, adam = fc ? adamCostBoth(c) : ps;
    double chosen = s == Scheme::kSFB ? sfb : ps;
    totPs += ps;
    totPsWorker += psw;
    totHybrid += chosen;
    totAdam += adam;
    totParams += l.numel();
    sfbLayers += s == Scheme::kSFB;
    nlohmann::json j;
    j["name"] = l.name;
    j["type"] = layerTypeName(l.type);
    j["m"] = fc ? nlohmann::json(l.m) : nlohmann::json(nullptr);
    j["n"] = fc ? nlohmann::json(l.n) : nlohmann::json(nullptr);
    j["shape"] = l.params.empty() ? nlohmann::json::array() : nlohmann::json(l.params[0].shape);
    j["params"] = l.numel();
    j["ps_cost"] = ps;
    j["ps_worker_cost"] = psw;
    j["sfb_cost"] = fc ? nlohmann::json(sfb) : nlohmann::json(nullptr);
    j["adam_cost"] = fc ? nlohmann::json(adam) : nlohmann::json(nullptr);
    j["scheme"] = schemeName(s);
    j["kv_pairs"] = layout.pairsOf(static_cast<int>(&l - desc.layers.data())).size();
    layers.push_back(j);
    std::snprintf(line, sizeof line, "%-22s %-5s %-14s %13s %15s %15s %15s %15s  %s\n", l.name.c_str(),
                  layerTypeName(l.type), l.shapeString().c_str(), grouped(double(l.numel())).c_str(),
                  grouped(ps).c_str(), grouped(psw).c_str(), fc ? grouped(sfb).c_str() : "-",
                  fc ? grouped(adam).c_str() : "-", schemeName(s));
    table << line;
  }
  const auto& sb = layout.shardBytes();
  int64_t maxB = *std::max_element(sb.begin(), sb.end()), minB = *std::min_element(sb.begin(), sb.end());
  out["layers"] = layers;
  out["totals"] = {{"params", totParams},
                   {"ps_cost", totPs},
                   {"ps_worker_cost", totPsWorker},
                   {"hybrid_cost", totHybrid},
                   {"adam_cost", totAdam},
                   {"sfb_layers", sfbLayers},
                   {"kv_pairs", layout.totalPairs()},
                   {"max_shard_bytes", maxB},
                   {"min_shard_bytes", minB},
                   {"hybrid_bytes", totHybrid * elementBytes},
                   {"ps_bytes", totPs * elementBytes}};
  out["wire"] = wirePrecisionName(precision);
  if (json) {
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::cout << "model " << desc.name << " (" << grouped(double(totParams)) << " params), P1=" << workers
            << " workers, P2=" << servers << " servers, K=" << batch << ", scheme " << schemePolicyName(policy)
            << "\ncosts: floats moved per iteration by one node (sent + received)\n\n"
            << table.str();
  std::snprintf(line, sizeof line, "%-22s %-5s %-14s %13s %15s %15s %15s %15s\n", "total", "", "",
                grouped(double(totParams)).c_str(), grouped(totPs).c_str(), grouped(totPsWorker).c_str(), "",
                grouped(totAdam).c_str());
  std::cout << line;
  std::cout << "\nhybrid (chosen schemes): " << grouped(totHybrid)
            << " floats per node per iteration; all-PS: " << grouped(totPs);
  if (totHybrid > 0) {
    std::snprintf(line, sizeof line, " (%.2fx less with hybrid)", totPs / totHybrid);
    std::cout << line;
  }
  std::snprintf(line, sizeof line, "\non a %s wire: %.2f MB per node per iteration (hybrid), %.2f MB all-PS",
                wirePrecisionName(precision), totHybrid * elementBytes / 1e6, totPs * elementBytes / 1e6);
  std::cout << line;
  std::cout << "\n" << sfbLayers << " layer(s) by SFB, " << desc.layers.size() - sfbLayers << " by PS\n";
  std::snprintf(line, sizeof line,
                "KV store: %lld pairs of at most %lld bytes over %d shards; shard load %.2f-%.2f MB (max/min %.3f)\n",
                static_cast<long long>(layout.totalPairs()), static_cast<long long>(pairBytes), servers, minB / 1e6,
                maxB / 1e6, minB ? double(maxB) / double(minB) : 0.0);
  std::cout << line;
  return 0;
}

}  // namespace poseidon::cli
