// The throughput bench's harness (poseidon bench, cli/bench_cmd.cc): one point of the comparison, a
// system on a model at a cluster size, run `repeat` times on the emulated cluster (each tried again
// on failure), every rank a bench-worker (Poseidon's systems) or bench/ddp_worker.py (DDP's) process
// in its node's network namespace; its result read back and printed. Internal to the CLI.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "poseidon/bench/cluster.h"
#include "poseidon/bench/device.h"
#include "poseidon/bench/emulation.h"
#include "poseidon/bench/ranks.h"
#include "poseidon/bench/report.h"
#include "poseidon/bench/systems.h"
#include "poseidon/cli/bench_util.h"
#include "poseidon/cli/commands.h"
#include "poseidon/cli/flags.h"
#include "poseidon/client/node.h"
#include "poseidon/common/error.h"
#include "poseidon/common/trace.h"
#include "poseidon/core/kv_layout.h"
#include "poseidon/launch/env.h"
#include "poseidon/launch/launcher.h"
#include "poseidon/launch/process.h"

namespace poseidon::cli {
namespace fs = std::filesystem;
using bench::EmulatedCluster;
using bench::EmulatedModel;
using bench::RunResult;

// ddp-tuned's sweep of the bucket cap, MB at full width (scaled by the model's width^2 like the default 25 MB).
const std::vector<double> kTunedBucketsMb{1, 5, 25};
// Whether a system (a valid name: bench/systems.h) is one of PyTorch DDP's.
inline bool isDdp(const std::string& s) { return bench::parseBenchSystem(s).spec->ddp; }

struct Harness {
  std::string exe, ddpScript, work;
  std::string ddpPython = kDefaultDdpPython;  // --ddp-python
  double scale = 0.1;
  std::string compute = "titanx";  // the GPU whose compute tables every system runs on (--compute)
  int iterations = 8, warmup = 3, timeoutS = 300, retries = 1;
  EmulatedCluster* cluster = nullptr;
  std::map<std::string, EmulatedModel> models;
  std::map<std::string, std::string> modelJson;  // model -> path
  int port = 29600;
  bool verbose = true;
  std::string secret = randomSecret();  // Poseidon's ranks authenticate (DDP's Gloo cannot)

  const EmulatedModel& model(const std::string& name) {
    auto it = models.find(name);
    if (it != models.end()) return it->second;
    EmulatedModel m = bench::emulatedModel(name, scale, compute);
    std::string path = work + "/" + name + ".json";
    std::ofstream(path) << bench::emulatedModelJson(m);
    modelJson[name] = path;
    return models.emplace(name, std::move(m)).first->second;
  }

  // Repeats (--repeat), nodes (--compute) and DDP's bucket caps.
  std::string traceDir;                     // --trace: one merged Chrome trace per Poseidon run
  int rcvbuf = 0;                           // --tcp-rcvbuf, for Poseidon's ranks
  int sendWindow = 0;                       // --send-window, for the poseidon-overlap systems (0: their default)
  int peersPerSendWindow = VanOptions::kDefaultPeersPerSendWindow;  // --peers-per-send-window, for the same
  int urgentLayers = VanOptions::kAutoUrgentLayers;                 // --urgent-layers, for the poseidon-overlap systems
  bool deferReconstruction = true;                                  // --defer-reconstruction, for Poseidon's ranks
  int ioThreads = bench::kBenchIoThreads;   // --io-threads, for Poseidon's ranks
  int sumThreads = kDefaultSumThreads;      // --sum-threads, for Poseidon's ranks
  int64_t pairBytes = kDefaultPairBytes;    // --pair-bytes at full width, for Poseidon's ranks (x s^2)
  // --local-ranks: ranks (GPUs) per node, each its own process in the node's namespace. Poseidon's
  // aggregate on the node's first (train --local-ranks); DDP's reach each other over the node's own
  // address, off the shaped link, as NCCL's would inside a node.
  int localRanks = 1;
  int repeat = 1;
  // --time-dilation F (bench/emulation.h): the links at rate / F with F times the queueing time, the
  // ranks' compute and charges F times longer, their times divided by F, every timeout F times longer.
  double timeDilation = 1;
  unsigned hostCores = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::string> devices{"none"};  // the first is the plain system name's
  std::map<std::string, DeviceModel> deviceModels;

  // A system label: a system name, or for Poseidon's systems charged on a node
  // other than the first, name@node (e.g. poseidon@cpu:16).
  static std::pair<std::string, std::string> splitLabel(const std::string& label) {
    auto at = label.find('@');
    if (at == std::string::npos) return {label, ""};
    return {label.substr(0, at), label.substr(at + 1)};
  }

  // DDP's default caps (25 MB, first bucket 1 MB) scaled by s^2 like Poseidon's pairs (s the model's
  // width: bench::wholeBatchScale).
  static double scaledMb(double fullWidthMb, const EmulatedModel& m) { return fullWidthMb * m.scale * m.scale; }

  // The column's rate (--rates, or a bisection's): the links run at it for `modelName`, times
  // (s'/s)^2 where the model runs at width s' (bench::emulatedMbit), the same full-width rate.
  double rateMbit = 0;
  void setRate(const std::string& modelName, double mbit, double latencyMs, double queueMs) {
    rateMbit = mbit;
    const double emulated = bench::emulatedMbit(model(modelName).scale, mbit, scale);
    cluster->setLink({emulated / timeDilation, latencyMs * timeDilation, queueMs * timeDilation, emulated});
  }

  // One point: `repeat` runs (each tried again on failure, up to `retries`
  // times); ddp-tuned first sweeps its bucket cap and repeats the best.
  RunResult run(const std::string& modelName, const std::string& label, int nodes) {
    auto [system, device] = splitLabel(label);
    if (!isDdp(system) && device.empty()) device = devices.front();
    double bucket = 25, first = 1;  // MB at full width
    nlohmann::json tuning;
    std::vector<RunResult> reps;
    if (system == "ddp-tuned" && nodes > 1) {
      // The sweep only chooses the cap; the repeats below are fresh runs with it (keeping the
      // sweep's winner would report a best-of-three against everyone else's median).
      double bestS = 0;
      for (double cap : kTunedBucketsMb) {
        RunResult r = runRetried(modelName, label, "ddp", device, nodes, cap, first);
        tuning[strCat(cap)] = r.ok ? nlohmann::json(r.iterSeconds) : nlohmann::json(nullptr);  // null: failed
        if (r.ok && (bestS == 0 || r.iterSeconds < bestS)) {
          bestS = r.iterSeconds;
          bucket = cap;
        }
      }
    }
    const std::string runSystem = system == "ddp-tuned" ? "ddp" : system;
    while (static_cast<int>(reps.size()) < repeat) {
      RunResult r = runRetried(modelName, label, runSystem, device, nodes, bucket, first);
      if (!r.ok) return r;
      reps.push_back(std::move(r));
    }
    std::vector<double> secs, slow;
    for (const auto& r : reps) secs.push_back(r.iterSeconds), slow.push_back(r.slowestRankSeconds);
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    // The repeat whose time is the median (the upper middle one for an even count) stands for the
    // point (its bytes, charges and attempts).
    double med = median(secs);
    RunResult out = *std::find_if(reps.begin(), reps.end(), [&](const RunResult& r) { return r.iterSeconds == med; });
    out.repeatSeconds = secs;
    out.minSeconds = *std::min_element(secs.begin(), secs.end());
    out.maxSeconds = *std::max_element(secs.begin(), secs.end());
    out.slowestRankSeconds = median(slow);
    for (const auto& r : reps) out.hostCpuShare = std::max(out.hostCpuShare, r.hostCpuShare);  // the worst repeat
    out.tuning = tuning;
    if (repeat > 1 || !tuning.is_null()) printPoint(out);
    return out;
  }

  RunResult runRetried(const std::string& modelName, const std::string& label, const std::string& system,
                       const std::string& device, int nodes, double bucketMb, double firstBucketMb) {
    std::vector<std::string> errors;
    for (int attempt = 1;; ++attempt) {
      RunResult r = runOnce(modelName, label, system, device, nodes, bucketMb, firstBucketMb);
      r.attempts = attempt;
      r.earlierErrors = errors;
      if (r.ok || attempt > retries) return r;
      errors.push_back(r.error);
      if (verbose) {
        std::printf("  retrying %s on %d nodes (attempt %d failed: %s)\n", label.c_str(), nodes, attempt,
                    r.error.c_str());
      }
    }
  }

  RunResult runOnce(const std::string& modelName, const std::string& label, const std::string& system,
                    const std::string& device, int nodes, double bucketMb, double firstBucketMb) {
    const EmulatedModel& m = model(modelName);
    RunResult r;
    r.model = modelName;
    r.system = label;
    r.nodes = nodes;
    r.localRanks = localRanks;
    // The undilated link (the ranks report undilated times): what the bounds and the tables use.
    r.emulatedMbit = cluster->link().mbit * timeDilation;
    r.mbit = rateMbit > 0 ? rateMbit : r.emulatedMbit;
    r.latencyMs = cluster->link().latencyMs / timeDilation;
    r.idealSeconds = bench::idealSeconds(m, nodes, r.emulatedMbit, localRanks);
    r.device = device;
    int p = port++;
    if (port > 29999) port = 29600;
    std::vector<SpawnOptions> ranks;
    auto outBase = [&](int i) { return strCat(work, "/", modelName, "-", p, "-", nodes, "-", i); };
    const int world = nodes * localRanks;
    for (int i = 0; i < world; ++i) {
      std::string out = outBase(i);
      SpawnOptions so = bench::rankSpawn(*cluster, i, world, p, secret, out + ".log", localRanks);
      if (isDdp(system)) {
        r.bucketMb = scaledMb(bucketMb, m);
        r.firstBucketMb = scaledMb(firstBucketMb, m);
        so.argv = {ddpPython,
                   ddpScript,
                   "--model-json",
                   modelJson[modelName],
                   "--variant",
                   system,
                   "--iterations",
                   std::to_string(iterations),
                   "--warmup",
                   std::to_string(warmup),
                   "--out",
                   out + ".json",
                   "--iface",
                   EmulatedCluster::nodeInterface(),
                   "--timeout",
                   strCat(timeoutS * timeDilation),
                   "--bucket-mb",
                   strCat(r.bucketMb),
                   "--first-bucket-mb",
                   strCat(r.firstBucketMb)};
      } else {
        const DeviceModel& dm = deviceModels.at(device);
        so.argv = {exe, "bench-worker", "--model", modelName, "--scale", strCat(scale), "--system", system,
                   "--iterations", std::to_string(iterations), "--warmup", std::to_string(warmup), "--out",
                   out + ".json", "--iface", EmulatedCluster::nodeInterface(), "--bind",
                   cluster->nodeAddress(i / localRanks), "--local-ranks", std::to_string(localRanks), "--timeout",
                   std::to_string(std::min<long long>(std::llround(timeoutS * 1000 * timeDilation),
                                                      std::numeric_limits<int>::max())),
                   "--compute", compute, "--charged-on", device, "--gemm-flops", strCat(dm.gemmFlops), "--sum-bytes",
                   strCat(dm.sumBytes), "--crypto-bytes",
                   // -nocurve: nothing is encrypted, and BestScheme must not weigh encryption either
                   strCat(bench::parseBenchSystem(system).noCurve ? 0.0 : dm.cryptoBytes), "--link-mbit",
                   strCat(dm.charges() ? r.emulatedMbit : 0.0)};
        if (!traceDir.empty()) so.argv.insert(so.argv.end(), {"--trace", out + ".trace.json"});
        if (rcvbuf != 0) so.argv.insert(so.argv.end(), {"--tcp-rcvbuf", std::to_string(rcvbuf)});
        const bool priorityLinks = system.rfind("poseidon-overlap", 0) == 0;  // the systems with a send window
        if (sendWindow > 0 && priorityLinks) {
          so.argv.insert(so.argv.end(), {"--send-window", std::to_string(sendWindow)});
        }
        if (peersPerSendWindow != VanOptions::kDefaultPeersPerSendWindow && priorityLinks) {
          so.argv.insert(so.argv.end(), {"--peers-per-send-window", std::to_string(peersPerSendWindow)});
        }
        if (urgentLayers != VanOptions::kAutoUrgentLayers && priorityLinks) {
          so.argv.insert(so.argv.end(), {"--urgent-layers", std::to_string(urgentLayers)});
        }
        // The node's two-band queue is HTB with a filter on the mark, which the runtime's probe of the
        // egress qdisc (probeEgressQueue) does not read; the node's FIFO (tbf) and its pfifo_fast under
        // the tbf (--host-queue pfifo_fast) it reads itself.
        if (cluster->hostQueue() == bench::HostQueue::kTos && priorityLinks) {
          so.argv.insert(so.argv.end(), {"--host-queue", "tos"});
        }
        if (!deferReconstruction) so.argv.push_back("--defer-reconstruction=false");
        so.argv.insert(so.argv.end(), {"--io-threads", std::to_string(ioThreads)});
        so.argv.insert(so.argv.end(), {"--sum-threads", std::to_string(sumThreads)});
        so.argv.insert(so.argv.end(), {"--pair-bytes", std::to_string(scaledPairBytes(pairBytes, m.scale))});
      }
      if (timeDilation != 1) so.argv.insert(so.argv.end(), {"--time-dilation", strCat(timeDilation)});
      ranks.push_back(std::move(so));
    }
    const EmulatedCluster::QueueDrops dropsBefore = cluster->queueDrops();
    std::string failure =
        bench::runRanks(std::move(ranks), static_cast<int>(std::ceil(timeoutS * timeDilation)), gStop);
    throwIfStopped();
    if (!failure.empty()) {
      r.error = failure;
      printRun(r);
      return r;
    }
    const EmulatedCluster::QueueDrops dropsAfter = cluster->queueDrops();
    r.uplinkDrops = static_cast<double>(dropsAfter.uplink - dropsBefore.uplink);
    r.downlinkDrops = static_cast<double>(dropsAfter.downlink - dropsBefore.downlink);
    try {
      nlohmann::json charged = {{"gemm", 0.0}, {"sum", 0.0}, {"crypto", 0.0}};
      double wall = 0, cpuTotal = 0, hostBusyShare = 0;
      for (int i = 0; i < world; ++i) {
        // A node's ranks share its interface and its TCP counters: its first rank reads them for it.
        const bool nodeFirst = i % localRanks == 0;
        std::ifstream f(outBase(i) + ".json");
        nlohmann::json j = nlohmann::json::parse(f);
        std::vector<double> t = j["iteration_seconds"].get<std::vector<double>>();
        t.erase(t.begin(), t.begin() + std::min<size_t>(t.size(), static_cast<size_t>(j["warmup"].get<int>())));
        if (i == 0)
          for (double x : t) wall += x;
        std::sort(t.begin(), t.end());
        double med = t.empty() ? 0 : t[t.size() / 2];
        double cpu = j.value("cpu_seconds", 0.0);
        if (i == 0 && j.value("host_total_jiffies", 0.0) > 0)
          hostBusyShare = j.value("host_busy_jiffies", 0.0) / j["host_total_jiffies"].get<double>();
        cpuTotal += cpu;
        r.cpuPerIter.push_back(cpu / std::max(1, iterations));
        if (nodeFirst) r.tcpRetransmits += j.value("tcp_retransmits", 0.0);
        if (nodeFirst) r.tcpTimeouts += j.value("tcp_timeouts", 0.0);
        r.timerSlackNs = std::max<int64_t>(r.timerSlackNs, j.value("timer_slack_ns", int64_t{-1}));
        if (i == 0) r.iterSeconds = med;
        if (i == 0 && j.contains("fc_schemes")) r.fcSchemes = j["fc_schemes"];
        r.slowestRankSeconds = std::max(r.slowestRankSeconds, med);
        if (nodeFirst) {
          r.txPerIter.push_back(j["tx_bytes"].get<double>() / std::max(1, iterations));
          r.rxPerIter.push_back(j["rx_bytes"].get<double>() / std::max(1, iterations));
        }
        if (j.contains("charged_seconds"))
          for (auto& [kind, v] : charged.items())
            v = std::max(v.get<double>(), j["charged_seconds"][kind].get<double>() / std::max(1, iterations));
      }
      if (!isDdp(system)) r.charged = charged;
      if (!isDdp(system) && !traceDir.empty()) {
        std::vector<std::string> parts;
        for (int i = 0; i < world; ++i) parts.push_back(outBase(i) + ".trace.json");
        std::string merged =
            strCat(traceDir, "/", modelName, "-", label, "-", nodes, "n-", r.mbit, "mbit-", p, ".json");
        Tracer::merge(parts, merged);
        r.tracePath = merged;
      }
      // The ranks' own CPU, or the whole host's over rank 0's measured iterations where that is more
      // (kernel time: the shaped links' softirqs and copies are in no process's rusage).
      // (`wall` is undilated, as the ranks report their times: the real one is F times longer.)
      r.hostCpuShare = std::max(wall > 0 ? cpuTotal / (wall * timeDilation * hostCores) : 0.0, hostBusyShare);
      r.imagesPerSec = r.iterSeconds > 0 ? world * m.batch / r.iterSeconds : 0;
      r.ownBoundSeconds = bench::ownBoundSeconds(r, m.computeSeconds());
      r.repeatSeconds = {r.iterSeconds};
      r.minSeconds = r.maxSeconds = r.iterSeconds;
      r.ok = r.iterSeconds > 0;
    } catch (const std::exception& e) {
      r.error = strCat("unreadable result: ", e.what());
    }
    printRun(r);
    return r;
  }

  // "8 nodes", or "4 nodes x 2 ranks" with --local-ranks.
  static std::string nodesLabel(const RunResult& r) {
    char b[64];
    if (r.localRanks > 1)
      std::snprintf(b, sizeof b, "%2d nodes x %d ranks", r.nodes, r.localRanks);
    else
      std::snprintf(b, sizeof b, "%2d nodes", r.nodes);
    return b;
  }

  void printPoint(const RunResult& r) {
    if (!verbose || !r.ok) return;
    std::printf("  %-14s %s @ %6g Mbit/s: median %.3f s/iter of %zu (min %.3f, max %.3f), slowest rank %.3f",
                r.system.c_str(), nodesLabel(r).c_str(), r.mbit, r.iterSeconds, r.repeatSeconds.size(), r.minSeconds,
                r.maxSeconds, r.slowestRankSeconds);
    if (!r.tuning.is_null()) {
      const double s = model(r.model).scale;
      std::printf(", bucket cap %g MB at full width (sweep, MB -> s/iter: %s)", r.bucketMb / (s * s),
                  r.tuning.dump().c_str());
    }
    std::printf("\n");
    std::fflush(stdout);
  }

  // One progress line per run.
  void printRun(const RunResult& r) {
    if (!verbose) return;
    if (!r.ok) {
      std::printf("  %-14s %s @ %6g Mbit/s: FAILED: %s\n", r.system.c_str(), nodesLabel(r).c_str(), r.mbit,
                  r.error.c_str());
    } else {
      double tx = 0;
      for (double x : r.txPerIter) tx = std::max(tx, x);
      double charged = 0;
      if (r.charged.is_object())
        for (const auto& [kind, v] : r.charged.items()) charged += v.get<double>();
      std::printf(
          "  %-14s %s @ %6g Mbit/s: %.3f s/iter (own bound %.3f, x%.2f; poseidon's %.3f), "
          "%.1f images/s, max node tx %.2f MB/iter, charged %.3f s/iter, host CPU %.0f%%, "
          "%.0f TCP retransmits (%.0f timeouts), queue drops %.0f up / %.0f down%s\n",
          r.system.c_str(), nodesLabel(r).c_str(), r.mbit, r.iterSeconds, r.ownBoundSeconds,
          r.iterSeconds / r.ownBoundSeconds, r.idealSeconds, r.imagesPerSec, tx / 1e6, charged, 100 * r.hostCpuShare,
          r.tcpRetransmits, r.tcpTimeouts, r.uplinkDrops, r.downlinkDrops,
          r.hostBound() ? " HOST-BOUND: does not count" : "");
    }
    std::fflush(stdout);
  }
};

}  // namespace poseidon::cli
