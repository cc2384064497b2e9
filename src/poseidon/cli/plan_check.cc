// poseidon plan --check: the planner's predictions of a bench results file's runs, point by point
// against what they measured (docs/planner.md, "Against the measurements").
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "poseidon/bench/emulation.h"
#include "poseidon/bench/systems.h"
#include "poseidon/cli/limits.h"
#include "poseidon/cli/plan_predict.h"
#include "poseidon/common/error.h"
#include "poseidon/common/file.h"
#include "poseidon/model/zoo.h"

namespace poseidon::cli {
namespace {

using planner::Cluster;
using planner::Prediction;
using planner::System;

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
    // A check that checked nothing is not a pass (a script reading the exit status would take it for one).
    if (points == 0) {
      throw Error(strCat("--check: no run of '", path, "' could be predicted (",
                         skipped ? strCat(skipped, " skipped: the rows say why") : std::string("it lists no runs"), ")"));
    }
  }
};

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

// A bench results file (--check), read and checked for its config and runs.
nlohmann::json readResults(const std::string& path) {
  if (std::filesystem::is_directory(path))
    throw InvalidArgument("--check: '" + path + "' is a directory, not a results file");
  std::ifstream in(path);
  if (!in) throw InvalidArgument("--check: cannot open '" + path + "'");
  nlohmann::json results;
  try {
    results = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument("--check: '" + path + "' is not JSON: " + jsonErrorText(e));
  }
  if (!results.is_object() || !results.contains("config") || !results.contains("runs") || !results["runs"].is_array())
    throw InvalidArgument("--check: '" + path + "' is not a poseidon bench results file (no config and runs)");
  return results;
}

// The fields --check reads and their JSON types. A hand-edited file with one of the wrong type is
// refused naming the field and its run, not with the JSON library's "type must be number".
enum class Kind { kNumber, kString, kBool, kArray, kObject };
struct Field {
  const char* name;
  Kind kind;
};
const char* kindName(Kind k) {
  static const char* names[] = {"a number", "a string", "true or false", "an array", "an object"};
  return names[static_cast<int>(k)];
}
constexpr Field kConfigFields[] = {
    {"batch", Kind::kNumber},         {"compute", Kind::kString},       {"defer_reconstruction", Kind::kBool},
    {"devices", Kind::kArray},        {"fc_server_ms_per_update", Kind::kNumber},
    {"host_cores", Kind::kNumber},    {"host_queue", Kind::kString},    {"io_threads", Kind::kNumber},
    {"latency_ms", Kind::kNumber},    {"local_ranks", Kind::kNumber},   {"merged_fc", Kind::kBool},
    {"model_scales", Kind::kObject},  {"pad_jitter_ms", Kind::kNumber},
    {"pad_ms", Kind::kNumber},        {"pair_bytes", Kind::kNumber},    {"queue_ms", Kind::kNumber},
    {"scale", Kind::kNumber},         {"send_window", Kind::kNumber},   {"send_window_rule", Kind::kNumber},
    {"servers", Kind::kNumber},       {"sum_threads", Kind::kNumber},   {"switch_queue", Kind::kString},
    {"time_dilation", Kind::kNumber}, {"urgent_layers", Kind::kNumber}, {"urgent_rule", Kind::kNumber}};
constexpr Field kRunFields[] = {
    {"device", Kind::kString},           {"emulated_mbit", Kind::kNumber},     {"groups", Kind::kNumber},
    {"host_bound", Kind::kBool},         {"iteration_seconds", Kind::kNumber}, {"link_mbit", Kind::kNumber},
    {"local_ranks", Kind::kNumber},      {"mbit", Kind::kNumber},              {"model", Kind::kString},
    {"mean_rate_seconds_per_step", Kind::kNumber}, {"nodes", Kind::kNumber},   {"ok", Kind::kBool},
    {"seconds_per_step", Kind::kNumber}, {"system", Kind::kString},            {"tx_bytes_per_iteration", Kind::kArray}};

bool isKind(const nlohmann::json& v, Kind k) {
  switch (k) {
    case Kind::kNumber: return v.is_number();
    case Kind::kString: return v.is_string();
    case Kind::kBool: return v.is_boolean();
    case Kind::kArray: return v.is_array();
    case Kind::kObject: return v.is_object();
  }
  return false;
}

template <size_t N>
void checkFields(const std::string& path, const nlohmann::json& obj, const Field (&fields)[N], const std::string& where) {
  if (!obj.is_object()) throw InvalidArgument(strCat("--check: '", path, "': ", where, " is not a JSON object"));
  for (const Field& f : fields) {
    if (obj.contains(f.name) && !obj[f.name].is_null() && !isKind(obj[f.name], f.kind)) {
      throw InvalidArgument(strCat("--check: '", path, "': ", where, ": \"", f.name, "\" is ", obj[f.name].dump(),
                                   ", expected ", kindName(f.kind)));
    }
  }
}

// Every field --check reads, before the first row is printed: "run 3 (vgg19 ps-naive)" or "config".
void checkFieldTypes(const std::string& path, const nlohmann::json& results) {
  const nlohmann::json& config = results["config"];
  checkFields(path, config, kConfigFields, "config");
  // A bench file lists its node counts; an accuracy file (pad_ms) ran at one.
  if (config.contains("pad_ms")) checkFields(path, config, {Field{"nodes", Kind::kNumber}}, "config");
  size_t i = 0;
  for (const auto& run : results["runs"]) {
    std::string where = strCat("run ", i++);
    if (run.is_object()) {
      std::string what;
      for (const char* key : {"model", "system"})
        if (run.contains(key) && run[key].is_string()) what += (what.empty() ? "" : " ") + run[key].get<std::string>();
      if (!what.empty()) where += " (" + what + ")";
    }
    checkFields(path, run, kRunFields, where);
  }
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
  // Which default window 0 meant (Cluster::sendWindowRule); files without send_window_rule ran 1 MB
  c.sendWindowRule = config.value("send_window_rule", 1);
  // bench --urgent-layers (-1: the runtime's rule); files made before the urgent connection ran none
  c.urgentLayers = config.value("urgent_layers", 0);
  // Which rule -1 meant (Cluster::urgentRule); files without urgent_rule ran the first
  c.urgentRule = config.value("urgent_rule", 1);
  c.lowDelayFirst = config.value("host_queue", std::string("fifo")) != "fifo";         // bench --host-queue
  c.hostQueueTold = config.value("host_queue", std::string("fifo")) == "tos";          // the ranks were told
  c.switchLowDelayFirst = config.value("switch_queue", std::string("fifo")) == "tos";  // bench --switch-queue
  c.deferReconstruction = config.value("defer_reconstruction", false);         // bench --defer-reconstruction
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
    if (why.empty() && static_cast<int64_t>(nodes) * std::max(1, localRanks) > kMaxPlannedWorkers)
      why = strCat("more than ", kMaxPlannedWorkers, " ranks, past what the planner models");
    if (why.empty() && !(mbit > 0)) why = "no link rate";
    const std::string device = run.value("device", "gpu");
    const nlohmann::json* rates = deviceRates(devices, device);
    // Poseidon's runtime charged its own work on the run's device: the file must say how fast.
    const bool ddp = sys == System::kDdp || sys == System::kDdpFp16;
    if (why.empty() && !ddp && device != "none" && !rates)
      why = devices.empty() ? "no rates of the runtime's own work in the file: made before the bench recorded them"
                            : "device '" + device + "' not in the file";
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
  checkFieldTypes(path, results);
  try {
    return checkResults(path, results, given, hostCores, tolerance, json, messageSet);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(strCat("--check: '", path, "' is not a poseidon bench results file (a field of the wrong ",
                                 "type: ", jsonErrorText(e), ")"));
  }
}

}  // namespace poseidon::cli
