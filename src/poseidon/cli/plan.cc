// poseidon plan: per-layer costs (paper Table 1) and BestScheme choices for a
// model on a cluster shape, without running anything.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "poseidon/bench/emulation.h"
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

// poseidon plan's settings, as its flags set them.
struct PlanArgs {
  std::string model = "vgg19";
  int workers = 8, servers = -1;
  int64_t batch = -1, pairBytes = kDefaultPairBytes;
  double scale = 1.0;
  bool json = false, predict = false, mergedFc = false;
  bool batchSet = false, serversSet = false;
  std::string scheme = "auto", wire = "fp32", sweep, groups, systems = "poseidon,poseidon-overlap,ps-wfbp,ps-naive,ddp",
              check;
  std::string compute = "titanx";
  double rateGbit = 10, cryptoGBps = 1.75, gemmTflops = 5, efficiency = 0.9, computeSeconds = 0, tolerance = 0.15,
         copyGBps = 0;
  bool limits = false;
  // --io-threads: the runtime's default on a 16-core GPU node (half its cores); --check reads each file's.
  planner::Cluster calibration = [] {
    planner::Cluster c;
    c.cryptoLanes = 8;
    return c;
  }();
  std::string hostQueue = "fifo";  // --host-queue
  std::string links = "as-built";  // --links
  std::string switchQueue = "fifo";  // --switch-queue
  double ddpStepMs = calibration.ddpStepSeconds * 1e3, messageUs = calibration.messageSeconds * 1e6;
  int hostCores = 0;  // --check: the results file's (or this machine's), a placeholder outside the range
};

// The cost table's: the model and the cluster's shape.
void addCostTableFlags(FlagSet& flags, PlanArgs& a) {
  flags.addString("model", &a.model, "zoo model name or path to a JSON layer table", "NAME|FILE");
  flags.addInt("workers", &a.workers, "P1, the number of workers", "P1", IntRange::closed(1, kMaxRanks));
  flags.addInt("servers", &a.servers,
               "P2, the number of server shards (default: P1, every node is both); with --groups, the shards on nodes "
               "0..P2-1 only (poseidon train --servers; 1: Omnivore's one model server)",
               "P2", IntRange::closed(1, kMaxRanks));
  flags.addInt64("batch", &a.batch,
                 "K, the per-worker batch (default: the zoo model's batch in the paper x --width-scale; 32 for a "
                 "model FILE)",
                 "K", IntRange::closed(1, kMaxBatch));
  flags.addInt64("pair-bytes", &a.pairBytes, "KV pair size in bytes", "BYTES",
                 IntRange::closed(kMinPairBytes, kMaxPairBytes));
  flags.addDouble("width-scale", &a.scale, "build the zoo model with widths x S (the bench's scaling rule)", "S",
                  RealRange::leftOpen(0, 1));
  flags.addString("scheme", &a.scheme,
                  "auto (BestScheme), or force ps / sfb / adam (Project Adam's server, the paper's baseline) for FC "
                  "layers",
                  "auto|ps|sfb|adam");
  flags.addString("wire", &a.wire, "what gradients travel as, for the byte totals (bf16 / fp16: 2 bytes a float)",
                  "fp32|bf16|fp16");
}

// The planner's (--predict, --sweep, --groups).
void addPredictFlags(FlagSet& flags, PlanArgs& a) {
  flags.addBool("json", &a.json, "print JSON instead of a table");
  flags.addBool("predict", &a.predict, "predict iteration time, speedup and efficiency at --workers (the planner)");
  flags.addString("sweep", &a.sweep, "predict at each of these worker counts (implies --predict)", "P1,P2,...");
  flags.addDouble("rate", &a.rateGbit, "--predict: each node's link, Gbit/s each way", "GBIT", RealRange::above(0));
  flags.addString("groups", &a.groups,
                  "--predict: compute-group counts to model instead of --systems (each must divide --workers)",
                  "G1,G2,...");
  flags.addBool("merged-fc", &a.mergedFc,
                "--groups: the model's top FC layers on one FC server (poseidon train --merged-fc; Omnivore's t_fc)");
  flags.addString("systems", &a.systems,
                  "--predict: systems to model (poseidon, poseidon-overlap, ps-wfbp, ps-naive, ddp, ddp-fp16)", "LIST");
  flags.addDouble("efficiency", &a.efficiency, "--predict: the efficiency whose lowest link rate is reported", "E",
                  RealRange::leftOpen(0, 1));
  flags.addString("compute", &a.compute,
                  "--predict: the GPU whose compute tables a zoo model runs on: titanx (the paper's), h200 or "
                  "h200-bf16 (measured per layer; the reconstruction GEMM then at the H200's measured rate unless "
                  "--gemm-tflops says otherwise)",
                  "GPU");
  flags.addDouble("compute-seconds", &a.computeSeconds,
                  "--predict: one worker's seconds per iteration (needed for a model without a zoo timing)", "T",
                  RealRange::above(0));
  flags.addDouble("crypto", &a.cryptoGBps,
                  "--predict: CURVE encryption, GB/s per I/O thread (0: links without it; jobs use it by default)",
                  "GBPS", RealRange::atLeast(0));
  flags.addInt("io-threads", &a.calibration.cryptoLanes,
               "--predict: ZeroMQ I/O threads per process, which encrypt, each connection on one (default 8: "
               "poseidon train's default, half the cores, on a 16-core GPU node; --check reads the results file's)",
               "N", IntRange::closed(1, 64));
  flags.addInt("sum-threads", &a.calibration.sumLanes,
               "--predict: threads per node that sum its shard's pushes beside the receive loop (default 2, "
               "poseidon train's; 0: on the loop; --check reads the results file's)",
               "N", IntRange::closed(0, 64));
  flags.addDouble("host-copy", &a.copyGBps,
                  "--predict: host <-> GPU copies, GB/s each way (default: 55 with --compute h200 or h200-bf16, the "
                  "H200's pinned rate, which the runtime stages through; 6.8 is pageable memory; 0 with titanx: the "
                  "paper's tables leave them out)",
                  "GBPS", RealRange::atLeast(0));
  flags.addBool("limits", &a.limits,
                "--predict: for each Poseidon system, the lowest link rate from which each of the runtime's own costs "
                "(CURVE, host copies, the receive loop, shard sums, the SFB reconstruction) makes its iteration at "
                "least 5% slower");
  flags.addDouble("gemm-tflops", &a.gemmTflops, "--predict: the SFB reconstruction GEMM's rate (a Titan X: 5)",
                  "TFLOPS", RealRange::above(0));
  flags.addDouble("link-overhead", &a.calibration.linkOverhead,
                  "bytes on the link per payload byte (TCP/IP headers and ACKs; calibrated on the bench)", "X",
                  RealRange::atLeast(1));
  flags.addDouble("ddp-step-ms", &a.ddpStepMs, "milliseconds each DDP ring step costs besides its bytes (calibrated)",
                  "MS", RealRange::atLeast(0));
  flags.addDouble("send-window", &a.calibration.sendWindowBytes,
                  "--predict: poseidon-overlap's fragment (the kernel send window per connection), bytes at full "
                  "width (default: the runtime's, Van::defaultSendWindow: 1 MB, 256 KB past 8 peers with "
                  "--host-queue tos; --check: the results file's)",
                  "BYTES", RealRange::atLeast(4096));
  flags.addInt("urgent-layers", &a.calibration.urgentLayers,
               "--predict: poseidon-overlap's first K layers on a second connection per peer (train --urgent-layers; "
               "-1: the runtime's rule: past 16 peers the layers below the FC stack with --host-queue tos where the "
               "FC layers hold most bytes, else 3 past 8 peers; 0: one connection; --check: the results file's)",
               "K", IntRange::closed(-1, 1 << 20));
  flags.addString("host-queue", &a.hostQueue,
                  "--predict: each node's egress queue: fifo (its connections take turns) or tos (the urgent "
                  "connections' packets first, as Linux's pfifo_fast serves TOS low-delay; pfifo_fast: tos's "
                  "queueing, with the automatic urgent layers and send window of fifo; "
                  "bench --host-queue; --check: the results file's)",
                  "fifo|tos|pfifo_fast");
  flags.addString("switch-queue", &a.switchQueue,
                  "--predict: the switch ports toward each node: fifo or tos (the urgent connections' packets first, "
                  "switches set to trust the mark; bench --switch-queue; --check: the results file's)",
                  "fifo|tos");
  flags.addString("links", &a.links,
                  "--predict: how poseidon-overlap's round data share the links, a design study: as-built (each "
                  "node's connections take turns on its link, as the runtime runs), credits (receiver-driven: each "
                  "node grants its senders one fragment at a time, most urgent first, at most --credit-window in "
                  "flight; not built in the runtime) or ideal (each node's egress and ingress serve the most urgent "
                  "fragment of any connection first: the floor any link scheduling can reach with this protocol)",
                  "as-built|credits|ideal");
  flags.addDouble("credit-window", &a.calibration.creditWindowBytes,
                  "--predict --links credits: the bytes a receiver has granted and not yet received, at full width",
                  "BYTES", RealRange::atLeast(4096));
  flags.addInt("local-ranks", &a.calibration.localRanks,
               "--predict: GPUs (ranks) per node, meeting on the node's first before the network (train "
               "--local-ranks; --workers counts nodes, speedup every rank); --check: each run's",
               "L", IntRange::closed(1, 64));
  flags.addDouble("message-us", &a.messageUs,
                  "microseconds a node's receive loop spends per message, decryption aside (default 30; --check "
                  "uses 60 for bench files made before the ranks' 1 ns timer slack, which record no timer_slack_ns)",
                  "US", RealRange::atLeast(0));
}

// --check's.
void addCheckFlags(FlagSet& flags, PlanArgs& a) {
  flags.addString("check", &a.check, "predict every run of a poseidon bench results file and compare", "RESULTS.json");
  flags.addInt("host-cores", &a.hostCores,
               "--check: cores of the host that ran the emulated cluster (default: the results file's, or "
               "this machine's for a file that does not say)",
               "N", IntRange::closed(1, 4096));
  flags.addDouble("tolerance", &a.tolerance, "--check: the error beyond which a point is flagged", "F",
                  RealRange::above(0));
}

// Each mode takes its own flags; one that another mode would silently ignore is refused.
void refuseOtherModesFlags(const FlagSet& flags, const PlanArgs& a) {
  const bool sweeping = flags.wasSet("sweep"), predicting = a.predict || sweeping, checking = !a.check.empty();
  auto refuse = [&](std::initializer_list<const char*> names, const std::string& why) {
    for (const char* name : names)
      if (flags.wasSet(name)) throw InvalidArgument(strCat("--", name, " ", why));
  };
  if (checking) {
    refuse({"predict",       "sweep",       "groups",      "merged-fc",   "model",           "workers",
            "servers",       "batch",       "pair-bytes",  "width-scale", "scheme",          "wire",
            "rate",          "systems",     "efficiency",  "compute",     "compute-seconds", "crypto",
            "gemm-tflops",   "send-window", "host-copy",   "limits",      "io-threads",      "sum-threads",
            "urgent-layers", "host-queue",  "local-ranks", "links",       "credit-window",   "switch-queue"},
           "does not apply to --check: each run's model, cluster and rates come from the results file");
  } else if (predicting) {
    refuse({"scheme", "width-scale"}, "is for the cost table; the planner models BestScheme's choice at full width");
    if (!flags.wasSet("groups"))
      refuse({"servers"},
             "is for the cost table and --groups; the planner's other systems have every node a worker and a "
             "server shard");
    refuse({"host-cores", "tolerance"}, "is for --check");
    if (sweeping) refuse({"workers", "efficiency"}, "does not apply to --sweep (it gives the worker counts)");
    if (flags.wasSet("groups")) {
      refuse({"sweep", "systems", "efficiency", "send-window", "wire", "host-copy", "limits", "urgent-layers",
              "host-queue", "links", "credit-window", "switch-queue"},
             "does not apply to --groups (group mode sends dense fp32 gradients and pulls through the shards)");
    }
    if (flags.wasSet("credit-window") && a.links != "credits")
      throw InvalidArgument("--credit-window is for --links credits");
    if (a.mergedFc && !flags.wasSet("groups"))
      throw InvalidArgument("--merged-fc is a compute-group mode: it needs --groups");
    if (!sweeping && a.workers > kMaxPlannedWorkers) {
      throw InvalidArgument(strCat("--predict models at most ", kMaxPlannedWorkers, " workers, got ", a.workers));
    }
  } else {
    refuse({"rate",        "groups",          "merged-fc",  "systems",       "efficiency",
            "compute",     "compute-seconds", "crypto",     "gemm-tflops",   "link-overhead",
            "ddp-step-ms", "send-window",     "message-us", "host-cores",    "tolerance",
            "host-copy",   "limits",          "io-threads", "sum-threads",   "urgent-layers",
            "host-queue",  "local-ranks",     "links",      "credit-window", "switch-queue"},
           "is for the planner (--predict, --sweep or --check)");
    if (flags.wasSet("servers") && a.servers > a.workers)
      throw InvalidArgument(strCat("--servers ", a.servers, " exceeds --workers ", a.workers, " (shards are nodes)"));
  }
}

// --predict / --sweep / --groups: the planner's request.
PredictRequest predictRequest(const FlagSet& flags, const PlanArgs& a) {
  PredictRequest r;
  r.model = a.model;
  r.computeSeconds = a.computeSeconds;
  if (!bench::isComputeName(a.compute))
    throw InvalidArgument("unknown --compute '" + a.compute + "' (titanx, h200, h200-bf16)");
  if (flags.wasSet("compute") && flags.wasSet("compute-seconds"))
    throw InvalidArgument("--compute and --compute-seconds both give the compute: choose one");
  r.compute = a.compute;
  r.batch = a.batchSet ? a.batch : -1;
  r.efficiency = a.efficiency;
  r.json = a.json;
  r.sweep = flags.wasSet("sweep");
  r.mergedFc = a.mergedFc;
  if (r.sweep) {
    for (const auto& item : splitList(a.sweep)) {
      r.workers.push_back(
          static_cast<int>(parseIntIn("each --sweep entry", item, IntRange::closed(1, kMaxPlannedWorkers))));
    }
    if (r.workers.empty()) throw InvalidArgument("--sweep needs at least one worker count");
  } else {
    r.workers.push_back(a.workers);
  }
  if (flags.wasSet("groups")) {
    for (const auto& item : splitList(a.groups)) {
      const int g = static_cast<int>(parseIntIn("each --groups entry", item, IntRange::closed(1, a.workers)));
      if (a.workers % g != 0) throw InvalidArgument(strCat("--groups ", g, " does not divide --workers ", a.workers));
      r.groups.push_back(g);
    }
    if (r.groups.empty()) throw InvalidArgument("--groups needs at least one group count");
    if (a.calibration.localRanks > 1) {
      throw InvalidArgument("--local-ranks and --groups cannot be combined (compute groups have no local aggregation)");
    }
  } else {
    for (const auto& item : splitList(a.systems)) r.systems.push_back(planner::parseSystem(item));
    if (r.systems.empty()) throw InvalidArgument("--systems needs at least one system");
  }
  r.cluster = a.calibration;
  r.cluster.linkBytes = a.rateGbit * 1e9 / 8;
  r.cluster.cryptoBytes = a.cryptoGBps * 1e9;
  r.cluster.gemmFlops =
      a.compute != "titanx" && !flags.wasSet("gemm-tflops") ? bench::h200SfbGemmFlops() : a.gemmTflops * 1e12;
  r.cluster.copyBytes =
      flags.wasSet("host-copy") ? a.copyGBps * 1e9 : (a.compute != "titanx" ? planner::kH200PinnedCopyBytes : 0.0);
  r.limits = a.limits;
  r.cluster.pairBytes = a.pairBytes;
  if (a.serversSet) {
    if (a.servers > a.workers)
      throw InvalidArgument(strCat("--servers ", a.servers, " exceeds --workers ", a.workers, " (shards are nodes)"));
    r.cluster.servers = a.servers;
  }
  r.cluster.wire = parseWirePrecision(a.wire);
  r.cluster.lowDelayFirst = parseHostQueue(a.hostQueue) != bench::HostQueue::kFifo;  // tos, pfifo_fast
  r.cluster.hostQueueTold = parseHostQueue(a.hostQueue) == bench::HostQueue::kTos;   // as the bench tells its ranks
  r.cluster.links = planner::parseLinks(a.links);
  r.cluster.switchLowDelayFirst = parseHostQueue(a.switchQueue, "--switch-queue") == bench::HostQueue::kTos;
  return r;
}

// The cost table as text: `rows` (one line per layer), then the totals from `out` (costTable's JSON).
void printCostTable(const nlohmann::json& out, const std::string& rows, int64_t pairBytes) {
  const nlohmann::json& t = out["totals"];
  const double totParams = t["params"].get<double>(), totPs = t["ps_cost"].get<double>(),
               totPsWorker = t["ps_worker_cost"].get<double>(), totHybrid = t["hybrid_cost"].get<double>(),
               totAdam = t["adam_cost"].get<double>();
  const int sfbLayers = t["sfb_layers"].get<int>(), adamLayers = t["adam_layers"].get<int>(),
            servers = out["servers"].get<int>();
  const int64_t maxB = t["max_shard_bytes"].get<int64_t>(), minB = t["min_shard_bytes"].get<int64_t>();
  const std::string wire = out["wire"].get<std::string>();
  const double elementBytes = static_cast<double>(wireElementBytes(parseWirePrecision(wire)));
  char line[512];
  std::cout << "model " << out["model"].get<std::string>() << " (" << grouped(totParams)
            << " params), P1=" << out["workers"].get<int>() << " workers, P2=" << servers
            << " servers, K=" << out["batch"].get<int64_t>() << ", scheme " << out["scheme_policy"].get<std::string>()
            << "\ncosts: floats moved per iteration by one node (sent + received)\n\n"
            << rows;
  std::snprintf(line, sizeof line, "%-22s %-5s %-14s %13s %15s %15s %15s %15s\n", "total", "", "",
                grouped(totParams).c_str(), grouped(totPs).c_str(), grouped(totPsWorker).c_str(), "",
                grouped(totAdam).c_str());
  std::cout << line;
  // --scheme ps|sfb|adam forces the FC layers' scheme: those totals are not BestScheme's hybrid.
  const bool hybrid = out.value("scheme_policy", "auto") == "auto";
  const char* label = hybrid ? "hybrid" : "these schemes";
  std::cout << "\n" << (hybrid ? "hybrid (chosen schemes)" : "these schemes (--scheme)") << ": " << grouped(totHybrid)
            << " floats per node per iteration; all-PS: " << grouped(totPs);
  if (totHybrid > 0) {
    if (totHybrid <= totPs)
      std::snprintf(line, sizeof line, " (%.2fx less with %s)", totPs / totHybrid, label);
    else  // a forced scheme that moves more than PS (--scheme adam)
      std::snprintf(line, sizeof line, " (%.2fx more with these schemes)", totHybrid / totPs);
    std::cout << line;
  }
  std::snprintf(line, sizeof line, "\non a %s wire: %.2f MB per node per iteration (%s), %.2f MB all-PS",
                wire.c_str(), totHybrid * elementBytes / 1e6, label, totPs * elementBytes / 1e6);
  std::cout << line;
  std::cout << "\n" << sfbLayers << " layer(s) by SFB, ";
  if (adamLayers > 0) std::cout << adamLayers << " by Adam's server, ";
  std::cout << out["layers"].size() - sfbLayers - adamLayers << " by PS\n";
  std::snprintf(line, sizeof line, "KV store: %lld pairs of at most %lld bytes over %d shards; shard load %.2f-%.2f MB",
                static_cast<long long>(t["kv_pairs"].get<int64_t>()), static_cast<long long>(pairBytes), servers,
                minB / 1e6, maxB / 1e6);
  std::cout << line;
  // An empty shard has no max/min: say how many, and what spreads the pairs.
  const int64_t empty = t["empty_shards"].get<int64_t>();
  if (empty > 0)
    std::cout << " (" << empty << " of " << servers << " shards hold no pair: a smaller --pair-bytes makes more)\n";
  else {
    std::snprintf(line, sizeof line, " (max/min %.3f)\n", double(maxB) / double(minB));
    std::cout << line;
  }
}

// The cost table's totals over the layers.
struct CostTotals {
  double ps = 0, psWorker = 0, hybrid = 0, adam = 0;
  int64_t params = 0;
  int sfbLayers = 0, adamLayers = 0;
};

// One layer's row: Table 1's floats per scheme and BestScheme's choice, as JSON and as a line of
// `table`; added to the totals.
nlohmann::json costRow(const LayerSpec& l, int64_t batch, int workers, int servers, SchemePolicy policy,
                       CostTotals& tot, std::ostringstream& table) {
  CostInputs c = costInputs(l, batch, workers, servers);
  // PS moves every parameter (bias included); Table 1 counts the M x N
  // matrix, so FC layers report the formula and the others their numel.
  double ps = psCostBoth(c), psw = psCostWorker(c);
  Scheme s = bestScheme(l, batch, workers, servers, policy);
  bool fc = l.type == LayerType::kFC;
  double sfb = fc ? sfbCost(c) : 0, adam = fc ? adamCostBoth(c) : ps;
  tot.ps += ps;
  tot.psWorker += psw;
  tot.hybrid += s == Scheme::kSFB ? sfb : s == Scheme::kAdam ? adam : ps;
  tot.adam += adam;
  tot.params += l.numel();
  tot.sfbLayers += s == Scheme::kSFB;
  tot.adamLayers += s == Scheme::kAdam;
  char line[512];
  std::snprintf(line, sizeof line, "%-22s %-5s %-14s %13s %15s %15s %15s %15s  %s\n", l.name.c_str(),
                layerTypeName(l.type), l.shapeString().c_str(), grouped(double(l.numel())).c_str(), grouped(ps).c_str(),
                grouped(psw).c_str(), fc ? grouped(sfb).c_str() : "-", fc ? grouped(adam).c_str() : "-", schemeName(s));
  table << line;
  return {{"name", l.name},
          {"type", layerTypeName(l.type)},
          {"m", fc ? nlohmann::json(l.m) : nlohmann::json(nullptr)},
          {"n", fc ? nlohmann::json(l.n) : nlohmann::json(nullptr)},
          {"shape", l.params.empty() ? nlohmann::json::array() : nlohmann::json(l.params[0].shape)},
          {"params", l.numel()},
          {"ps_cost", ps},
          {"ps_worker_cost", psw},
          {"sfb_cost", fc ? nlohmann::json(sfb) : nlohmann::json(nullptr)},
          {"adam_cost", fc ? nlohmann::json(adam) : nlohmann::json(nullptr)},
          {"scheme", schemeName(s)}};
}

// The cost table: per layer, Table 1's floats under each scheme and BestScheme's choice, with totals.
int costTable(const PlanArgs& a) {
  const int workers = a.workers, servers = a.serversSet ? a.servers : a.workers;
  const std::string& model = a.model;
  const double scale = a.scale;
  const int64_t pairBytes = a.pairBytes;
  const bool json = a.json;
  int64_t batch = a.batch;
  SchemePolicy policy = parseSchemePolicy(a.scheme);
  const WirePrecision precision = parseWirePrecision(a.wire);
  const double elementBytes = static_cast<double>(wireElementBytes(precision));
  ModelDesc desc = resolveModel(model, scale);
  if (!a.batchSet) {
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
  CostTotals tot;
  nlohmann::json layers = nlohmann::json::array();
  std::ostringstream table;
  char line[512];
  std::snprintf(line, sizeof line, "%-22s %-5s %-14s %13s %15s %15s %15s %15s  %s\n", "layer", "type", "shape",
                "params", "ps(both)", "ps(worker)", "sfb", "adam(both)", "scheme");
  table << line;
  for (size_t l = 0; l < desc.layers.size(); ++l) {
    layers.push_back(costRow(desc.layers[l], batch, workers, servers, policy, tot, table));
    layers.back()["kv_pairs"] = layout.pairsOf(static_cast<int>(l)).size();
  }
  const auto& sb = layout.shardBytes();
  int64_t maxB = *std::max_element(sb.begin(), sb.end()), minB = *std::min_element(sb.begin(), sb.end());
  out["layers"] = layers;
  out["totals"] = {{"params", tot.params},
                   {"ps_cost", tot.ps},
                   {"ps_worker_cost", tot.psWorker},
                   {"hybrid_cost", tot.hybrid},
                   {"adam_cost", tot.adam},
                   {"sfb_layers", tot.sfbLayers},
                   {"adam_layers", tot.adamLayers},
                   {"kv_pairs", layout.totalPairs()},
                   {"max_shard_bytes", maxB},
                   {"min_shard_bytes", minB},
                   {"empty_shards", std::count(sb.begin(), sb.end(), 0)},
                   {"hybrid_bytes", tot.hybrid * elementBytes},
                   {"ps_bytes", tot.ps * elementBytes}};
  out["wire"] = wirePrecisionName(precision);
  if (json) {
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  printCostTable(out, table.str(), a.pairBytes);
  return 0;
}

}  // namespace

int planCommand(const std::vector<std::string>& args) {
  PlanArgs a;
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
  addCostTableFlags(flags, a);
  addPredictFlags(flags, a);
  addCheckFlags(flags, a);
  flags.parse(args);
  if (flags.helpRequested()) {
    std::cout << flags.helpText();
    return 0;
  }
  a.calibration.ddpStepSeconds = a.ddpStepMs / 1e3;
  a.calibration.messageSeconds = a.messageUs * 1e-6;
  a.batchSet = flags.wasSet("batch");
  a.serversSet = flags.wasSet("servers");
  refuseOtherModesFlags(flags, a);
  if (!a.check.empty()) {
    return planCheck(a.check, a.calibration, a.hostCores, a.tolerance, a.json, flags.wasSet("message-us"));
  }
  if (a.predict || flags.wasSet("sweep")) return planPredict(predictRequest(flags, a));
  return costTable(a);
}

}  // namespace poseidon::cli
