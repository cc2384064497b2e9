// poseidon bench: the emulated-cluster benchmark, Poseidon against PyTorch
// DDP side by side on the same emulated model and network (see
// bench/README.md for the method and DESIGN.md section 4 for its rationale).
// This file is the flags and the order of the runs; cli/bench_harness.h runs one point, and
// bench/report.h turns the runs into speedups, headline ratios, tables and plots.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
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
#include "poseidon/cli/bench_harness.h"
#include "poseidon/cli/bench_util.h"
#include "poseidon/cli/commands.h"
#include "poseidon/cli/flags.h"
#include "poseidon/client/node.h"
#include "poseidon/common/error.h"
#include "poseidon/common/file.h"
#include "poseidon/common/trace.h"
#include "poseidon/core/kv_layout.h"
#include "poseidon/launch/env.h"
#include "poseidon/launch/launcher.h"
#include "poseidon/launch/process.h"
#include "poseidon/transport/security.h"

namespace poseidon::cli {
namespace fs = std::filesystem;
using bench::EmulatedCluster;
using bench::EmulatedModel;
using bench::RunResult;

namespace {

// poseidon bench's settings, as its flags set them.
struct BenchArgs {
  std::string modelsFlag = "vgg19,vgg19-22k,googlenet,resnet-152,alexnet";
  std::string systemsFlag = "poseidon,ps-wfbp,ps-naive,adam,ddp,ddp-fp16,ddp-powersgd1,ddp-powersgd4";
  std::string nodesFlag = "1,2,4,8", ratesFlag = "1000,300,100,30", computeFlag = "titanx";
  std::string jsonPath, mdPath, plotDir, ddpScript, bisectSystems, reportFrom, traceDir;
  std::string ddpPython = kDefaultDdpPython;
  std::string machineRates;  // --machine-rates GEMM,SUM,CRYPTO (GFLOP/s, GB/s, GB/s); empty: measured
  double scale = 0.1, latencyMs = 0, queueMs = bench::LinkSpec::kDefaultQueueMs;
  double timeDilation = 1;  // --time-dilation (bench/emulation.h)
  bool tcpQuickAck = false;  // --tcp-quickack: no delayed ACK on the nodes' routes
  std::string tcpCongestion = bench::EmulatedCluster::kDefaultTcpCongestion;
  std::string hostQueue = "fifo";  // --host-queue: each emulated node's egress qdisc
  std::string switchQueue = "fifo";                                 // --switch-queue: each switch port's egress qdisc
  int urgentLayers = VanOptions::kAutoUrgentLayers;                 // --urgent-layers, for the poseidon-overlap systems
  bool deferReconstruction = true;                                  // --defer-reconstruction, for Poseidon's ranks
  int peersPerSendWindow = VanOptions::kDefaultPeersPerSendWindow;  // --peers-per-send-window
  int iterations = 8, warmup = 3, timeoutS = 150, retries = 1, repeat = 1, rcvbuf = 0, sendWindow = 0;
  int ioThreads = bench::kBenchIoThreads;
  int sumThreads = kDefaultSumThreads;  // the runtime's (NodeOptions::sumThreads)
  int localRanks = 1;
  int64_t pairBytes = kDefaultPairBytes;
  bool quick = false, keep = false, accuracyMode = false;
};

// What to run: models, systems, cluster sizes, links, iterations.
void addWhatToRunFlags(FlagSet& flags, BenchArgs& a) {
  flags.addBool("accuracy", &a.accuracyMode,  // taken by benchCommand before parsing; listed for --help
                "time-to-accuracy mode: real training (LeNet on Fashion-MNIST) on the emulated cluster, padded "
                "compute, Poseidon BSP, compute groups and DDP (see poseidon bench --accuracy --help)");
  flags.addBool("quick", &a.quick, "vgg19, 1 and 8 nodes, 100 and 30 Mbit/s, poseidon vs ddp, 5 iterations (< 10 min)");
  flags.addString("models", &a.modelsFlag, "comma-separated emulated models", "LIST");
  flags.addString("systems", &a.systemsFlag, "comma-separated systems", "LIST");
  flags.addString("nodes", &a.nodesFlag, "comma-separated cluster sizes in [1, 64] (1 is the speedup baseline)",
                  "LIST");
  flags.addString("rates", &a.ratesFlag, "comma-separated link rates in Mbit/s, > 0 (tc tbf)", "LIST");
  flags.addDouble("latency-ms", &a.latencyMs, "added one-way latency per link (netem)", "MS", RealRange::atLeast(0));
  addQueueFlag(flags, &a.queueMs);
  addTcpCongestionFlag(flags, &a.tcpCongestion);
  addTcpQuickAckFlag(flags, &a.tcpQuickAck);
  flags.addDouble("scale", &a.scale,
                  "width scale s (link rates represent rate / s^2 at full width; a model whose batch x s is not "
                  "whole runs at the nearest width s' where it is, at least one row, its links at rate x (s'/s)^2)",
                  "S", RealRange::leftOpen(0, 1));
  flags.addDouble("time-dilation", &a.timeDilation,
                  "run the emulation F times slower: links at rate / F with F times the queueing time, every "
                  "system's compute and Poseidon's charged work F times longer, times reported divided by F, TCP's "
                  "minimum RTO F x 200 ms; each emulated node gets F times this host's CPU per emulated second, "
                  "for more nodes or faster links than the host holds at F = 1 (docs/bench.md)",
                  "F", RealRange::closed(1, bench::kMaxTimeDilation));
  flags.addInt("iterations", &a.iterations, "measured iterations per run", "N", IntRange::atLeast(1));
  flags.addInt("warmup", &a.warmup, "warm-up iterations per run (not measured)", "N", IntRange::atLeast(0));
  // The ranks get it in milliseconds (bench-worker --timeout), an int.
  flags.addInt("run-timeout", &a.timeoutS, "seconds before a run is declared failed", "S",
               IntRange::closed(1, std::numeric_limits<int>::max() / 1000));
  flags.addInt("retries", &a.retries, "times a failed run is tried again (recorded in the results)", "N",
               IntRange::atLeast(0));
  flags.addString("bisect", &a.bisectSystems,
                  "comma-separated systems: bisect the minimum link rate for 90% efficiency at the largest size "
                  "(first model)",
                  "LIST");
}

// Runs per point, where Poseidon's own work is charged, and the runtime's knobs.
void addRuntimeFlags(FlagSet& flags, BenchArgs& a) {
  flags.addInt("repeat", &a.repeat,
               "runs per point: the tables give the median (the upper middle run for an even N), min and max, and "
               "the slowest rank",
               "N", IntRange::closed(1, 100));
  flags.addString("compute", &a.computeFlag,
                  "the modelled node, a comma-separated list: titanx (the paper's GPU: published iteration times, "
                  "5 TFLOP/s reconstruction GEMM), h200 or h200-bf16 (per-layer times measured on an H200 in fp32 "
                  "or bf16 autocast, its measured fp32 GEMM), cpu:C (the list's GPU computes, the GEMM on C cores "
                  "of this machine), none (nothing charged: our own work costs its real time at width s). Every "
                  "system computes on the list's one GPU (titanx if it names none); Poseidon's own work "
                  "(reconstruction, server sums, CURVE encryption at this machine's one-core rates) is charged at "
                  "full width on each node in turn, as SYSTEM@NODE after the first",
                  "LIST");
  flags.addInt("tcp-rcvbuf", &a.rcvbuf,
               "TCP receive buffer per connection into each Poseidon rank, bytes at width s (0: the runtime's "
               "default - the send window and a third on the poseidon-overlap systems' priority links, seven "
               "eighths of it past 8 peers, the OS's on FIFO links; -1: the OS's); bounds "
               "each sender's window against incast (docs/bench.md)",
               "BYTES", IntRange::closed(-1, 1 << 30));
  flags.addInt(
      "send-window", &a.sendWindow,
      "the poseidon-overlap systems' kernel send window per connection, bytes as the ranks use it (0: "
      "the runtime's default, Van::defaultSendWindow: 1 MB, or 256 KB past 8 peers with --host-queue tos, x s'^2 "
      "at the model's width s', at least 4096; docs/scheduling.md)",
      "BYTES", IntRange::closed(4096, 1 << 30).orOff(0));
  flags.addInt("peers-per-send-window", &a.peersPerSendWindow,
               "the poseidon-overlap systems: each connection's kernel send buffer is a window for every N peers, at "
               "least one (VanOptions::peersPerSendWindow; 0: one window each; docs/scheduling.md)",
               "N", IntRange::closed(0, 1 << 20));
  flags.addInt("urgent-layers", &a.urgentLayers,
               "the poseidon-overlap systems send the round data of their first K layers on a second connection "
               "per peer marked IP TOS low-delay (train --urgent-layers; 0: one connection; -1, the default: the "
               "runtime's: past 16 peers the layers below the FC stack with --host-queue tos (the ranks are told "
               "their queue) where the FC layers hold most bytes, else 3 past 8 peers; docs/scheduling.md)",
               "K", IntRange::closed(-1, 1 << 20));
  flags.addBool("defer-reconstruction", &a.deferReconstruction,
                "on a GPU node, Poseidon's SFB reconstructions wait until the iteration's backward is handed over, "
                "as a CUDA model's do (NodeOptions::deferReconstruction; default true; =false: each as its factors "
                "land, inside the backward, as before 2026-12-02)");
  flags.addString("host-queue", &a.hostQueue,
                  "each emulated node's egress queue: fifo (one FIFO), tos (two bands, packets marked low-delay "
                  "first, as Linux's pfifo_fast serves them; the ranks are told) or pfifo_fast (Linux's default "
                  "qdisc itself under the shaper, which the ranks read for themselves; as a child qdisc it runs "
                  "slower than its bands do: bench/results/pfifo-fast/leaf/); the switch ports stay FIFO unless "
                  "--switch-queue tos",
                  "fifo|tos|pfifo_fast");
  flags.addString("switch-queue", &a.switchQueue,
                  "each switch port's queue toward its node: fifo (one FIFO) or tos (the same two bands as "
                  "--host-queue tos: a switch set to trust the mark; not a stock switch's setting)",
                  "fifo|tos");
  flags.addInt64("pair-bytes", &a.pairBytes,
                 "Poseidon's KV pair size at full width, bytes (train --pair-bytes); each rank gets it x s'^2 "
                 "(the model's width), at least 4096; the most: on many shards pairs shrink (docs/kvstore.md)",
                 "BYTES", IntRange::closed(4, 1 << 30));
  flags.addInt("io-threads", &a.ioThreads,
               "ZeroMQ I/O threads per emulated Poseidon node (2; the runtime's default is half the host's cores over "
               "its ranks); "
               "CURVE's encryption is charged on them, each connection on one",
               "N", IntRange::closed(1, 64));
  flags.addInt("sum-threads", &a.sumThreads,
               "threads per emulated Poseidon node that sum its shard's pushes beside the receive loop (train "
               "--sum-threads; default 2, as the runtime's; 0: on the loop); each sum is charged on its thread",
               "N", IntRange::closed(0, 64));
  flags.addInt("local-ranks", &a.localRanks,
               "ranks (GPUs) per emulated node, each its own process with its own emulated GPU: Poseidon's "
               "aggregate on the node's first rank before they leave it (train --local-ranks; not adam), DDP's "
               "reach each other over the node's own address, off the shaped link; --nodes counts nodes, "
               "images/s every rank, bytes are each node's (docs/gpu.md)",
               "L", IntRange::closed(1, 16));
}

// The results it writes.
void addOutputFlags(FlagSet& flags, BenchArgs& a) {
  flags.addString("json", &a.jsonPath, "write all results as JSON to FILE", "FILE");
  flags.addString("markdown", &a.mdPath, "write the result tables as Markdown to FILE", "FILE");
  flags.addString("plots", &a.plotDir, "write speedup and traffic plots (PNG, gnuplot) into DIR", "DIR");
}

// Reports from an earlier run, traces, the DDP script, the logs.
void addReportFlags(FlagSet& flags, BenchArgs& a) {
  flags.addString(
      "report-from", &a.reportFrom,
      "run nothing: write --markdown and --plots from the results JSON of an earlier run (bench --accuracy's too)",
      "FILE");
  flags.addString("trace", &a.traceDir,
                  "write one Chrome trace per Poseidon run into DIR (every rank: emulated compute, each layer's "
                  "send and receive, the wait for the sync; chrome://tracing or Perfetto)",
                  "DIR");
  flags.addString("ddp-script", &a.ddpScript, "path to bench/ddp_worker.py", "FILE");
  flags.addString("machine-rates", &a.machineRates,
                  "this machine's one-core rates the charged work is scaled from, as GEMM GFLOP/s, server sums GB/s, "
                  "CURVE encryption GB/s (e.g. 78,9.7,1.4; the results' machine_one_core); default: measured at "
                  "the start, which moves between invocations on a busy host: give the same rates to compare them",
                  "G,S,C");
  flags.addString("ddp-python", &a.ddpPython,
                  "the interpreter the DDP baselines run in: one whose torch has torch.distributed, e.g. a pip "
                  "install's python3 where Debian's python3-torch is missing",
                  "FILE");
  flags.addBool("keep", &a.keep, "keep the per-rank logs and results (printed path)");
}

// The run's lists, checked, and each node's model.
struct BenchPlan {
  std::vector<std::string> models, systems, devices, labels;  // labels: systems, once per node for Poseidon's
  std::string gpu;                                            // the GPU every system computes on
  std::vector<int> nodes;
  std::vector<double> rates;
  bench::MachineRates machine;
  bool charging = false;
  std::map<std::string, DeviceModel> deviceModels;
};

BenchPlan planBench(const BenchArgs& a) {
  checkTcpCongestionName(a.tcpCongestion);
  parseHostQueue(a.hostQueue);
  parseHostQueue(a.switchQueue, "--switch-queue");
  BenchPlan p;
  p.models = splitList(a.modelsFlag);
  p.systems = splitList(a.systemsFlag);
  for (const auto& n : splitList(a.nodesFlag)) {
    p.nodes.push_back(static_cast<int>(parseIntIn("each --nodes entry", n, IntRange::closed(1, 64))));
  }
  std::sort(p.nodes.begin(), p.nodes.end());
  p.rates = parseRates(a.ratesFlag);
  for (const auto& s : p.systems) {
    const bench::SystemChoice c = bench::parseBenchSystem(s);  // throws for unknown names
    // Its iterations carry the previous one's tail: the first measured one needs one before it.
    if (c.spec->overlapForward && a.warmup < 1) {
      throw InvalidArgument(c.base() + " needs --warmup 1 or more (each iteration carries the one before's tail)");
    }
    if (a.localRanks > 1 && !c.spec->ddp && c.spec->policy == SchemePolicy::kAdam) {
      throw InvalidArgument("--local-ranks " + std::to_string(a.localRanks) +
                            ": the adam baseline has no local aggregation (its one server per layer takes every "
                            "rank's factors); run it without --local-ranks");
    }
  }
  if (a.urgentLayers > 0 && std::none_of(p.systems.begin(), p.systems.end(), [](const std::string& s) {
        return bench::parseBenchSystem(s).spec->overlapForward;
      })) {
    throw InvalidArgument(
        "--urgent-layers is for the poseidon-overlap systems (their priority links), and --systems "
        "has none");
  }
  const bench::ComputeChoice compute = bench::parseComputeList(a.computeFlag);  // throws on bad names
  p.gpu = compute.gpu;
  p.devices = compute.nodes;
  if (p.models.empty() || p.systems.empty() || p.nodes.empty() || p.rates.empty())
    throw InvalidArgument("empty list flag");
  p.charging = std::any_of(p.devices.begin(), p.devices.end(), [](const std::string& d) { return d != "none"; });
  for (const auto& d : p.devices) p.deviceModels[d] = bench::deviceFor(d, a.scale, p.machine);  // validates the names
  if (p.charging) {
    p.machine = a.machineRates.empty() ? bench::measureMachineRates() : parseMachineRates(a.machineRates);
    for (const auto& d : p.devices) p.deviceModels[d] = bench::deviceFor(d, a.scale, p.machine);
  }
  // Poseidon's systems once per node: the first node's under the plain name.
  for (const auto& s : p.systems) {
    p.labels.push_back(s);
    if (!isDdp(s))
      for (size_t i = 1; i < p.devices.size(); ++i) p.labels.push_back(s + "@" + p.devices[i]);
  }
  for (const auto& m : p.models) bench::emulatedModel(m, a.scale, p.gpu);  // validate names early
  // --bisect compares each system with its own 1-node run at the largest size: both must be run.
  if (!a.bisectSystems.empty()) {
    for (const auto& s : splitList(a.bisectSystems)) {
      if (std::find(p.labels.begin(), p.labels.end(), s) == p.labels.end()) {
        throw InvalidArgument(strCat("--bisect: '", s, "' is not one of the systems run (--systems ", a.systemsFlag,
                                     "); it needs that system's runs"));
      }
    }
    if (p.nodes.front() != 1 || p.nodes.back() == 1) {
      throw InvalidArgument(strCat("--bisect needs --nodes to hold 1 (each system's baseline) and a larger size, got ",
                                   a.nodesFlag));
    }
  }
  return p;
}

nlohmann::json benchConfig(const BenchArgs& a, const BenchPlan& p, const std::vector<std::string>& args) {
  nlohmann::json config = {{"command", commandLine("poseidon bench", args)},
                           {"scale", a.scale},
                           {"iterations", a.iterations},
                           {"warmup", a.warmup},
                           {"latency_ms", a.latencyMs},
                           {"queue_ms", a.queueMs},
                           {"time_dilation", a.timeDilation},
                           {"tcp_congestion_control", a.tcpCongestion},
                           {"tcp_quickack", a.tcpQuickAck},
                           {"timer_slack_ns", bench::kRankTimerSlackNs},
                           {"models", p.models},
                           {"compute", p.gpu},
                           {"systems", p.labels},
                           {"nodes", p.nodes},
                           {"rates_mbit", p.rates},
                           {"repeat", a.repeat},
                           {"tcp_rcvbuf", a.rcvbuf},
                           {"receive_buffer_auto", a.rcvbuf == 0},
                           // 4 (2026-12-04): seven eighths of the send window past 8 peers on any
                           // queue; 3 (2026-12-03): not where the ranks are told --host-queue tos; 2, a
                           // trial of 2026-12-03: as 4; before, and absent, the send window and a third
                           // at every size.
                           {"receive_buffer_rule", 4},
                           {"io_threads", a.ioThreads},
                           {"sum_threads", a.sumThreads},
                           {"local_ranks", a.localRanks},
                           {"ddp_python", a.ddpPython},
                           {"send_window", a.sendWindow},
                           // which of the runtime's default windows 0 meant (Van::defaultSendWindow)
                           {"send_window_rule", Van::kSendWindowRule},
                           {"peers_per_send_window", a.peersPerSendWindow},
                           {"urgent_layers", a.urgentLayers},
                           // which of the runtime's rules -1 meant (plan --check)
                           {"urgent_rule", VanOptions::kAutoUrgentRule},
                           {"defer_reconstruction", a.deferReconstruction},
                           {"host_queue", a.hostQueue},
                           {"switch_queue", a.switchQueue},
                           {"pair_bytes", a.pairBytes},  // full width
                           // every emulated node ran here: what the planner's --check needs to know
                           {"host_cores", std::max(1u, std::thread::hardware_concurrency())}};
  nlohmann::json devicesJson = nlohmann::json::array();
  for (const auto& d : p.devices) {
    const DeviceModel& dm = p.deviceModels.at(d);
    devicesJson.push_back({{"name", d}, {"gemm_flops", dm.gemmFlops}, {"sum_bytes_per_s", dm.sumBytes},
                           {"crypto_bytes_per_s", dm.cryptoBytes}});
  }
  config["devices"] = devicesJson;
  // Each model's batch per worker at its width and at full width, and the width it ran at (whole
  // batches: bench::wholeBatchScale; its links at rate x (width / s)^2).
  nlohmann::json batches = nlohmann::json::object(), scales = nlohmann::json::object();
  for (const auto& m : p.models) {
    const bench::EmulatedModel em = bench::emulatedModel(m, a.scale, p.gpu);
    batches[m] = {{"scaled", em.batch}, {"full", em.fullBatch}};
    scales[m] = em.scale;
  }
  config["batches"] = batches;
  config["model_scales"] = scales;
  config["machine_rates_given"] = !a.machineRates.empty();
  config["machine_one_core"] = {{"gemm_flops", p.machine.gemmFlops},
                                {"sum_bytes_per_s", p.machine.sumBytes},
                                {"crypto_bytes_per_s", p.machine.cryptoBytes}};
  return config;
}

// --bisect: the minimum link rate for 90% efficiency at the largest size, for the first model.
nlohmann::json bisectRates(Harness& h, const BenchArgs& a, const BenchPlan& p, const std::vector<RunResult>& runs) {
  const std::string& m = p.models.front();
  const int n = p.nodes.back();
  nlohmann::json mins;
  for (const auto& s : splitList(a.bisectSystems)) {
    double base = 0;
    for (const auto& b : runs)
      if (b.ok && b.nodes == 1 && b.model == m && b.system == s) base = b.iterSeconds;
    if (base == 0) {
      std::printf("not bisecting %s: its 1-node run on %s failed\n", s.c_str(), m.c_str());
      continue;
    }
    double lo = 5, hi = 2000;
    std::printf("bisecting %s on %s at %d nodes\n", s.c_str(), m.c_str(), n);
    for (int step = 0; step < 7; ++step) {
      double mid = std::sqrt(lo * hi);
      h.setRate(m, mid, a.latencyMs, a.queueMs);
      RunResult r = h.run(m, s, n);
      bool good = r.ok && n * base / r.iterSeconds >= 0.9 * n;
      (good ? hi : lo) = mid;
    }
    mins[s] = hi;
  }
  return {{"model", m}, {"nodes", n}, {"efficiency", 0.9}, {"min_mbit", mins}};
}

// Every point on one emulated cluster (removed when this returns or throws); the bisection, if asked.
std::vector<RunResult> runAll(Harness& h, const BenchArgs& a, const BenchPlan& p, nlohmann::json& result) {
  std::vector<RunResult> runs;
  EmulatedCluster cluster(p.nodes.back(), bench::LinkSpec{p.rates.front(), a.latencyMs, a.queueMs}, a.tcpCongestion,
                          parseHostQueue(a.hostQueue), parseHostQueue(a.switchQueue, "--switch-queue"));
  h.cluster = &cluster;
  if (a.timeDilation != 1 || a.tcpQuickAck)
    cluster.setRouteTimers(EmulatedCluster::kKernelMinRtoMs * a.timeDilation, a.tcpQuickAck);
  if (a.tcpQuickAck) std::printf("every node's route: quickack 1 (no delayed ACK, --tcp-quickack)\n");
  if (a.timeDilation != 1) {
    std::printf("time dilation %g: links at rate / %g, compute and charges x %g, times reported / %g\n", a.timeDilation,
                a.timeDilation, a.timeDilation, a.timeDilation);
  }
  std::printf("poseidon bench: %d-node emulated cluster, models %s, systems %s, s = %g, %d run%s per point\n",
              p.nodes.back(), a.modelsFlag.c_str(), a.systemsFlag.c_str(), a.scale, a.repeat, a.repeat > 1 ? "s" : "");
  if (p.charging) {
    std::printf("this machine, one core%s: GEMM %.1f GFLOP/s, server sums %.2f GB/s, CURVE encryption %.2f GB/s\n",
                a.machineRates.empty() ? "" : " (--machine-rates)", p.machine.gemmFlops / 1e9, p.machine.sumBytes / 1e9,
                p.machine.cryptoBytes / 1e9);
    for (const auto& d : p.devices) {
      const DeviceModel& dm = p.deviceModels.at(d);
      std::printf("node %s: the runtime's own work charged at full width (GEMM %.1f GFLOP/s%s)\n", d.c_str(),
                  dm.gemmFlops / 1e9, dm.charges() ? "" : "; nothing charged");
    }
  }
  // --host-queue tos: what the nodes' queues sent ahead (their counters restart with each setLink).
  uint64_t lowDelayBytes = 0, switchLowDelayBytes = 0;  // and --switch-queue tos: the ports'
  auto setRate = [&](const std::string& m, double rate) {
    lowDelayBytes += cluster.lowDelayBytesSent();
    switchLowDelayBytes += cluster.lowDelayBytesReceived();
    h.setRate(m, rate, a.latencyMs, a.queueMs);
  };
  for (const auto& m : p.models) {
    const EmulatedModel& em = h.model(m);
    std::printf("%s: %lld params at s = %g, K = %lld per worker, %.3f s compute per iteration (%s)\n", m.c_str(),
                static_cast<long long>(em.desc.numel()), em.scale, static_cast<long long>(em.batch),
                em.computeSeconds(), em.timeSource.c_str());
    if (em.scale != a.scale) {
      const double r = em.scale / a.scale;
      std::printf(
          "  (width %g, not %g: %lld x %g = %g rows a worker is not whole; its links run at %.4g x each "
          "rate, the same full-width rate)\n",
          em.scale, a.scale, static_cast<long long>(em.fullBatch), a.scale, static_cast<double>(em.fullBatch) * a.scale,
          r * r);
    }
    if (a.sendWindow == 0) printSendWindowFloor(p.labels, p.nodes, a.hostQueue == "tos", em.scale);
    std::fflush(stdout);
    setRate(m, p.rates.front());
    if (p.nodes.front() == 1)
      for (const auto& s : p.labels) runs.push_back(h.run(m, s, 1));
    for (double rate : p.rates) {
      setRate(m, rate);
      for (const auto& s : p.labels)
        for (int n : p.nodes)
          if (n > 1) runs.push_back(h.run(m, s, n));
    }
  }
  lowDelayBytes += cluster.lowDelayBytesSent();
  switchLowDelayBytes += cluster.lowDelayBytesReceived();
  if (cluster.hostQueue() == bench::HostQueue::kTos) {
    result["low_delay_bytes"] = lowDelayBytes;
    std::printf("host queues: %.3f MB sent in the low-delay band (IP TOS 0x10, --urgent-layers)\n",
                static_cast<double>(lowDelayBytes) / 1e6);
  }
  if (cluster.switchQueue() == bench::HostQueue::kTos) {
    result["switch_low_delay_bytes"] = switchLowDelayBytes;
    std::printf("switch ports: %.3f MB sent in the low-delay band (IP TOS 0x10, --urgent-layers)\n",
                static_cast<double>(switchLowDelayBytes) / 1e6);
  }
  bench::computeSpeedups(runs);
  if (!a.bisectSystems.empty() && p.nodes.front() == 1 && p.nodes.back() > 1) {
    result["bisection"] = bisectRates(h, a, p, runs);
  }
  h.cluster = nullptr;
  return runs;
}

// The results: the headline lines, --json, --markdown, --plots; the work directory kept or removed.
void writeBenchResults(const BenchArgs& a, const BenchPlan& p, const Harness& h, const std::vector<RunResult>& runs,
                       nlohmann::json& result) {
  nlohmann::json runsJson = nlohmann::json::array();
  for (const auto& r : runs) runsJson.push_back(r.toJson());
  result["runs"] = runsJson;
  // Headline ratios at the largest size; per-node traffic there at the lowest rate, for the first model.
  nlohmann::json headline = bench::headlineRatios(runs, p.models, p.rates, p.nodes.back());
  result["headline"] = headline;
  nlohmann::json histogram = bench::trafficHistogram(runs, p.models.front(), p.nodes.back(), p.rates.back());
  if (!histogram.is_null()) result["histogram"] = histogram;
  std::printf("\n");
  for (const auto& l : headline) std::printf("%s\n", l.get<std::string>().c_str());
  writeResultsJson(a.jsonPath, result);
  if (!a.mdPath.empty()) {
    bench::writeMarkdown(a.mdPath, result);
    std::printf("table: %s\n", a.mdPath.c_str());
  }
  if (!a.plotDir.empty()) {
    bench::writePlots(a.plotDir, result);
    std::printf("plots: %s\n", a.plotDir.c_str());
  }
}

}  // namespace

int benchCommand(const std::vector<std::string>& given) {
  // The time-to-accuracy mode has flags of its own (bench_accuracy.cc).
  std::vector<std::string> args = given;
  if (takeModeFlag(args, "accuracy")) return benchAccuracyCommand(args);
  for (const auto& arg : args) {
    if (arg == "--device" || arg.rfind("--device=", 0) == 0) {
      throw InvalidArgument(
          "--device is now --compute (titanx replaces gpu; cpu:C and none as before); --device names where a "
          "model's tensors live, in train");
    }
  }
  BenchArgs a;
  FlagSet flags("bench",
                "poseidon bench [--quick] [--models LIST] [--systems LIST] [--nodes LIST] [--rates LIST] [flags]",
                "Emulated-cluster benchmark (needs root): one network namespace per node, links shaped with tc tbf,\n"
                "trace-driven compute (each layer's forward/backward is a wait of its time on the modelled GPU,\n"
                "--compute), real parameter shapes at width scale s. Runs Poseidon's systems and\n"
                "PyTorch DDP (Debian's python3-torch) on the identical model and network, in the same run, and\n"
                "reports iteration time, speedup over one node, bytes per node, and measured / ideal time.\n"
                "Systems: poseidon (WFBP + hybrid), poseidon-overlap (+ priority-scheduled links, next forward\n"
                "overlapping the sync), ps-wfbp, ps-naive, adam, sfb (SFB forced on FC layers), ddp, ddp-tuned\n"
                "(best bucket cap), ddp-fp16, ddp-powersgd1, ddp-powersgd4. A -bf16 or -fp16 suffix on a Poseidon\n"
                "system (not adam) sends its gradients in 16 bits (like train's --wire; lossy, like ddp-fp16),\n"
                "e.g. poseidon-overlap-bf16. A -nocurve suffix, last, runs a Poseidon system without CURVE (train's\n"
                "--transport-security none: unencrypted, as DDP's Gloo), e.g. poseidon-nocurve.\n"
                "Poseidon's own work is charged at full width on --compute's node. A link of R Mbit/s stands for\n"
                "R / s^2 at full width (s = 0.1: 100, 250, 1000 are 10, 25, 100 GbE).\n"
                "Everything it creates is removed on exit, Ctrl-C, a closed output pipe and failure.");
  addWhatToRunFlags(flags, a);
  addOutputFlags(flags, a);
  addRuntimeFlags(flags, a);
  addReportFlags(flags, a);
  flags.parse(args);
  if (flags.helpRequested()) {
    std::cout << flags.helpText();
    return 0;
  }
  checkResultOutputs(a.jsonPath, a.mdPath, a.plotDir);  // every path the run writes, before it runs
  if (!a.traceDir.empty()) checkOutputDirectory("--trace", a.traceDir);
  if (!a.reportFrom.empty()) return reportFromFile(a.reportFrom, a.mdPath, a.plotDir);
  if (a.quick) {
    if (!flags.wasSet("models")) a.modelsFlag = "vgg19";
    if (!flags.wasSet("systems")) a.systemsFlag = "poseidon,ddp";
    if (!flags.wasSet("nodes")) a.nodesFlag = "1,8";
    if (!flags.wasSet("rates")) a.ratesFlag = "100,30";
    if (!flags.wasSet("iterations")) a.iterations = 5;
    if (!flags.wasSet("warmup")) a.warmup = 2;
  }
  const BenchPlan p = planBench(a);
  // A script the user named is checked with the other flags, before the root check.
  if (!a.ddpScript.empty() && std::any_of(p.systems.begin(), p.systems.end(), isDdp))
    findBenchScript(a.ddpScript, "ddp_worker.py");
  requireEmulatedCluster();

  Harness h;
  h.exe = selfExecutable();
  h.scale = a.scale;
  h.iterations = a.iterations;
  h.warmup = a.warmup;
  h.timeoutS = a.timeoutS;
  h.timeDilation = a.timeDilation;
  h.retries = a.retries;
  h.repeat = a.repeat;
  h.rcvbuf = a.rcvbuf;
  h.sendWindow = a.sendWindow;
  h.peersPerSendWindow = a.peersPerSendWindow;
  h.urgentLayers = a.urgentLayers;
  h.deferReconstruction = a.deferReconstruction;
  h.ioThreads = a.ioThreads;
  h.sumThreads = a.sumThreads;
  h.localRanks = a.localRanks;
  h.pairBytes = a.pairBytes;
  if (!a.traceDir.empty()) h.traceDir = fs::absolute(a.traceDir).string();
  h.compute = p.gpu;
  h.devices = p.devices;
  h.deviceModels = p.deviceModels;
  if (std::any_of(p.systems.begin(), p.systems.end(), isDdp)) {
    h.ddpScript = findDdpScript(a.ddpScript, "ddp_worker.py", a.ddpPython);
    h.ddpPython = a.ddpPython;
  }
  const WorkDir work("poseidon-bench", a.keep, "logs");
  h.work = work.path();

  nlohmann::json result;
  result["config"] = benchConfig(a, p, args);
  auto t0 = std::chrono::steady_clock::now();
  const std::vector<RunResult> runs = runAll(h, a, p, result);
  result["wall_seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  writeBenchResults(a, p, h, runs, result);
  finishOutput();  // a reader gone during the last lines: 141, as for one gone earlier
  bool allOk = std::all_of(runs.begin(), runs.end(), [](const RunResult& r) { return r.ok; });
  return allOk ? 0 : 1;
}

}  // namespace poseidon::cli
