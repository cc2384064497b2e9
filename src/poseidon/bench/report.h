// What `poseidon bench` reports, computed from its runs: the ideal iteration
// time, speedups over one node, the headline ratios, the per-node traffic
// histogram, and the Markdown tables and gnuplot plots written from the
// results JSON. The harness (cli/bench_cmd.cc) measures; this judges.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "poseidon/bench/emulation.h"

namespace poseidon::bench {

// One run: a system on a model, cluster size and link rate.
struct RunResult {
  std::string model, system;
  int nodes = 0;
  int localRanks = 1;  // ranks (GPUs) per node (--local-ranks); images/s counts them all, bytes are per node
  double mbit = 0, latencyMs = 0;  // the column's rate (--rates): rate / s^2 at full width
  // What the links ran at for this model: mbit x (s'/s)^2 where the model runs at width s'
  // (bench::emulatedMbit); 0: mbit (results files from before).
  double emulatedMbit = 0;
  double linkMbit() const { return emulatedMbit > 0 ? emulatedMbit : mbit; }
  bool ok = false;
  std::string error;
  double iterSeconds = 0;      // median of the steady iterations (rank 0)
  double imagesPerSec = 0;     // emulated images: nodes x K / iteration
  double speedup = 0;          // over the same system on one node
  double idealSeconds = 0;     // Poseidon's bound (idealSeconds below), the same for every system
  std::vector<double> txPerIter, rxPerIter;  // bytes per node per iteration (interface counters)
  // Repeated runs (--repeat): iterSeconds is the median of the repeats' rank-0 medians.
  std::vector<double> repeatSeconds;
  double minSeconds = 0, maxSeconds = 0;
  double slowestRankSeconds = 0;  // median over the repeats of the slowest rank's median
  // The system's own bound: max(compute, its busiest node's bytes on the wire, headers included, / link rate).
  double ownBoundSeconds = 0;
  std::string device;             // Poseidon's systems: the device model their own work is charged on
  nlohmann::json charged;         // full-width seconds per iteration of that work, per kind (busiest rank)
  double bucketMb = 0, firstBucketMb = 0;  // DDP's bucket caps (MB at width s)
  nlohmann::json tuning;          // ddp-tuned: the sweep, bucket cap (MB at full width) -> s/iter
  nlohmann::json fcSchemes;       // Poseidon's systems: BestScheme's choice per FC layer (rank 0)
  // The host: every rank's CPU seconds per iteration, and the larger of their sum over the measured
  // stretch as a share of this machine's cores and the whole host's busy share then (/proc/stat,
  // kernel time included). Above kHostBoundShare the host, not the emulated network or compute, may
  // have set the pace: such a run is flagged and does not count.
  std::string tracePath;  // --trace: the merged trace of this run
  double tcpRetransmits = 0;  // segments all Poseidon ranks retransmitted in the measured iterations (drops)
  double tcpTimeouts = 0;     // of which retransmission timeouts fired (each a stall of TCP's minimum RTO)
  // Packets the shaped queues dropped over the whole run (warm-up and start-up included): at the nodes'
  // egress and at the switch ports toward them (incast). Every system's, DDP's too.
  double uplinkDrops = 0, downlinkDrops = 0;
  // The largest timer slack any rank reported (bench/ranks.h sets it), nanoseconds; -1: none reported.
  int64_t timerSlackNs = -1;
  std::vector<double> cpuPerIter;
  double hostCpuShare = 0;
  bool hostBound() const { return hostCpuShare > kHostBoundShare; }
  static constexpr double kHostBoundShare = 0.8;
  int attempts = 1;
  std::vector<std::string> earlierErrors;     // failed attempts before this result
  nlohmann::json toJson() const;
};

// The own bound of a run from its byte counters (see RunResult::ownBoundSeconds).
double ownBoundSeconds(const RunResult& r, double computeSeconds);

// Ideal iteration time: max(compute, min-scheme bytes per node / link rate),
// full duplex (half of Table 1's send + receive floats each way). With localRanks ranks a node, a
// node's traffic is one worker's of their batches together.
double idealSeconds(const EmulatedModel& m, int nodes, double mbit, int localRanks = 1);

// The results file's sentence on the nodes' TCP congestion control (config "tcp_congestion_control";
// files from before it was set say it was the host's).
std::string tcpCongestionSentence(const nlohmann::json& config);
// The results file's sentence on the ranks' timer slack (config "timer_slack_ns", bench/ranks.h;
// files from before it was set ran with the kernel's default).
std::string timerSlackSentence(const nlohmann::json& config);

// Sets every successful run's speedup over the same model and system on one
// node (1 for the one-node runs themselves).
void computeSpeedups(std::vector<RunResult>& runs);

// Per model and rate, one line: poseidon's speedup, efficiency and measured /
// ideal at `nodes` nodes, and its throughput against every other system there.
nlohmann::json headlineRatios(const std::vector<RunResult>& runs, const std::vector<std::string>& models,
                              const std::vector<double>& rates, int nodes);

// Bytes per node per iteration (sent + received) of poseidon, adam, ps-wfbp
// and ddp on `model` at `nodes` nodes and `mbit`; null when there is none.
nlohmann::json trafficHistogram(const std::vector<RunResult>& runs, const std::string& model, int nodes,
                                double mbit);

// From the results JSON that `poseidon bench --json` writes: tables per model
// and rate, the headline ratios and the bisection as Markdown; speedup and
// traffic plots as PNG through gnuplot (a missing gnuplot is reported, not fatal).
void writeMarkdown(const std::string& path, const nlohmann::json& result);
void writePlots(const std::string& dir, const nlohmann::json& result);

}  // namespace poseidon::bench
