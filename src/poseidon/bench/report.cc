#include "poseidon/bench/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include "poseidon/bench/cluster.h"
#include "poseidon/common/error.h"
#include "poseidon/common/file.h"
#include "poseidon/core/cost_model.h"

namespace poseidon::bench {
namespace fs = std::filesystem;

namespace {

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

}  // namespace

nlohmann::json RunResult::toJson() const {
  return {{"model", model},
          {"system", system},
          {"nodes", nodes},
          {"local_ranks", localRanks},
          {"link_mbit", mbit},
          {"emulated_mbit", linkMbit()},
          {"latency_ms", latencyMs},
          {"ok", ok},
          {"error", error},
          {"iteration_seconds", iterSeconds},
          {"images_per_sec", imagesPerSec},
          {"speedup", speedup},
          {"ideal_seconds", idealSeconds},
          {"measured_over_ideal", idealSeconds > 0 ? iterSeconds / idealSeconds : 0.0},
          {"tx_bytes_per_iteration", txPerIter},
          {"rx_bytes_per_iteration", rxPerIter},
          {"attempts", attempts},
          {"earlier_errors", earlierErrors},
          {"repeat_seconds", repeatSeconds},
          {"min_seconds", minSeconds},
          {"max_seconds", maxSeconds},
          {"slowest_rank_seconds", slowestRankSeconds},
          {"own_bound_seconds", ownBoundSeconds},
          {"measured_over_own_bound", ownBoundSeconds > 0 ? iterSeconds / ownBoundSeconds : 0.0},
          {"device", device},
          {"charged_seconds_per_iteration", charged},
          {"bucket_mb", bucketMb},
          {"first_bucket_mb", firstBucketMb},
          {"tuning", tuning},
          {"fc_schemes", fcSchemes},
          {"cpu_seconds_per_iteration", cpuPerIter},
          {"host_cpu_share", hostCpuShare},
          {"trace", tracePath},
          {"tcp_retransmits", tcpRetransmits},
          {"tcp_timeouts", tcpTimeouts},
          {"queue_drops", {{"uplink", uplinkDrops}, {"downlink", downlinkDrops}}},
          {"timer_slack_ns", timerSlackNs},
          {"host_bound", hostBound()}};
}

double ownBoundSeconds(const RunResult& r, double computeSeconds) {
  double busiest = 0;
  for (size_t i = 0; i < r.txPerIter.size(); ++i)
    busiest = std::max({busiest, r.txPerIter[i], i < r.rxPerIter.size() ? r.rxPerIter[i] : 0.0});
  return std::max(computeSeconds, busiest * 8 / (r.linkMbit() * 1e6));
}

double idealSeconds(const EmulatedModel& m, int nodes, double mbit, int localRanks) {
  double floats = 0;
  if (nodes > 1) {
    for (const auto& l : m.desc.layers) {
      // A node's ranks leave it as one worker of their batches together (client/local_group.h).
      CostInputs c = costInputs(l, m.batch * localRanks, nodes, nodes);
      double ps = psCostBoth(c);
      floats += l.type == LayerType::kFC ? std::min(ps, sfbCost(c)) : ps;
    }
  }
  double comm = floats / 2 * 4 * 8 / (mbit * 1e6);
  return std::max(m.computeSeconds(), comm);
}

void computeSpeedups(std::vector<RunResult>& runs) {
  for (auto& r : runs) {
    if (!r.ok || r.nodes == 1) {
      if (r.ok) r.speedup = 1;
      continue;
    }
    for (const auto& b : runs) {
      if (b.ok && b.nodes == 1 && b.model == r.model && b.system == r.system) {
        r.speedup = r.nodes * b.iterSeconds / r.iterSeconds;
      }
    }
  }
}

nlohmann::json headlineRatios(const std::vector<RunResult>& runs, const std::vector<std::string>& models,
                              const std::vector<double>& rates, int nodes) {
  nlohmann::json headline = nlohmann::json::array();
  const int big = nodes;
  for (const auto& m : models)
    for (double rate : rates) {
      const RunResult* pos = nullptr;
      for (const auto& r : runs)
        if (r.ok && r.model == m && r.mbit == rate && r.nodes == big && r.system == "poseidon") pos = &r;
      if (!pos) continue;
      // Without a one-node run there is no speedup to state (computeSpeedups leaves it 0).
      std::string line = strCat(m, ", ", big, " nodes, ", rate, " Mbit/s: poseidon ",
                                pos->speedup > 0 ? strCat(fmt("%.2fx", pos->speedup), " speedup (",
                                                          fmt("%.0f%%", 100 * pos->speedup / big), " efficiency), ")
                                                 : std::string(),
                                "measured/ideal ", fmt("%.2f", pos->iterSeconds / pos->idealSeconds));
      for (const auto& r : runs)
        if (r.ok && r.model == m && r.mbit == rate && r.nodes == big && r.system != "poseidon")
          line += strCat("; vs ", r.system, " ", fmt("%.2fx", pos->imagesPerSec / r.imagesPerSec), " throughput");
      headline.push_back(line);
    }
  return headline;
}

nlohmann::json trafficHistogram(const std::vector<RunResult>& runs, const std::string& model, int nodes,
                                double mbit) {
  nlohmann::json perNode;
  for (const auto& r : runs) {
    if (!r.ok || r.model != model || r.nodes != nodes || r.mbit != mbit) continue;
    if (r.system != "poseidon" && r.system != "adam" && r.system != "ps-wfbp" && r.system != "ddp") continue;
    std::vector<double> both;
    for (size_t i = 0; i < r.txPerIter.size(); ++i) both.push_back(r.txPerIter[i] + r.rxPerIter[i]);
    perNode[r.system] = both;
  }
  if (perNode.empty() || nodes <= 1) return nullptr;
  return {{"model", model}, {"nodes", nodes}, {"link_mbit", mbit}, {"bytes_per_node", perNode}};
}

std::string tcpCongestionSentence(const nlohmann::json& config) {
  const std::string quickAck = config.value("tcp_quickack", false)
                                   ? " Every node acknowledged each segment at once (`--tcp-quickack`: no delayed ACK)."
                                   : "";
  if (config.contains("tcp_congestion_control") && config["tcp_congestion_control"].is_string())
    return "Every node's TCP ran " + config["tcp_congestion_control"].get<std::string>() + " (`--tcp-cc`)." + quickAck;
  return "Every node's TCP ran the host's default congestion control (not recorded; bbr on the machine where the "
         "committed tables were made).";
}

std::string timerSlackSentence(const nlohmann::json& config) {
  if (config.contains("timer_slack_ns") && config["timer_slack_ns"].is_number_integer())
    return strCat("Every rank ran with a timer slack of ", config["timer_slack_ns"].get<int64_t>(),
                  " ns, so that the sleeps that emulate its GPU and charge its own work wake on time.");
  return "Every rank ran with the kernel's default timer slack (not recorded; 50 us), so that each sleep charging the "
         "runtime's own work woke 70-75 us late (files before 2026-11-30).";
}

namespace {

// The results file's introduction: the command, the method, the columns, the device models.
void writeIntro(std::ostringstream& md, const nlohmann::json& cfg) {
  md << "# poseidon bench results\n\n";
  md << "Command: `" << cfg["command"].get<std::string>() << "`\n\n";
  md << "Emulated cluster: one network namespace per node, tc tbf links both ways, each queueing "
     << cfg.value("queue_ms", 100.0) << " ms (--queue-ms); width scale s = " << cfg["scale"].get<double>()
     << " (link rates represent rate / s^2 at full width); " << cfg["iterations"].get<int>()
     << " measured iterations after " << cfg["warmup"].get<int>() << " warm-up ones; iteration time is rank 0's median";
  const int repeat = cfg.value("repeat", 1);
  if (repeat > 1)
    md << ", and the median of " << repeat << " runs per point (min and max beside it)";
  else
    md << "; one run per point";
  md << ". " << tcpCongestionSentence(cfg) << " " << timerSlackSentence(cfg);
  if (cfg.value("time_dilation", 1.0) != 1.0) {
    const double f = cfg["time_dilation"].get<double>();
    md << " **Time dilation " << f << "** (--time-dilation): the links ran at each rate / " << f << " with " << f
       << " times the queueing time (the same bytes queue), each layer's compute and the charged work took " << f
       << " times as long, TCP's minimum retransmission timeout was " << f
       << " x 200 ms, and every time below is divided by " << f
       << ". The host's own work per message and byte was not dilated: each node had " << f
       << " times this host's CPU per emulated second (the host CPU column is real), and delayed ACKs came up to " << f
       << " times sooner in emulated time.";
  }
  {
    bool ddp = false, priority = false;
    for (const auto& s : cfg.value("systems", nlohmann::json::array())) {
      if (!s.is_string()) continue;
      ddp = ddp || s.get<std::string>().rfind("ddp", 0) == 0;
      priority = priority || s.get<std::string>().rfind("poseidon-overlap", 0) == 0;
    }
    const int rcvbuf = cfg.value("tcp_rcvbuf", 0);
    if (rcvbuf > 0) {
      md << " Poseidon's ranks ran with a " << rcvbuf << "-byte TCP receive buffer per connection (--tcp-rcvbuf)"
         << (ddp ? "; DDP's with the OS default." : ".");
    } else if (rcvbuf < 0) {
      md << " Poseidon's ranks ran with the OS's TCP receive buffers (--tcp-rcvbuf -1).";
    } else if (priority) {
      // Only files made since the runtime chose it say so; older ones ran the OS's buffers. Rules 2 (a
      // trial) and 4 took seven eighths past 8 peers on any queue, rule 3 not on queues told two-band.
      const int rule = cfg.value("receive_buffer_rule", 1);
      const bool sevenEighths =
          rule == 2 || rule >= 4 || (rule == 3 && cfg.value("host_queue", std::string("fifo")) != "tos");
      if (cfg.value("receive_buffer_auto", false))
        md << " The poseidon-overlap systems' ranks ran with the runtime's TCP receive buffer per connection, the "
              "send window and a third"
           << (sevenEighths ? " up to 8 peers and seven eighths of it past them" : "")
           << " (VanOptions::receiveBufferBytes)" << (ddp ? "; DDP's with the OS default." : ".");
    }
    // Files since the default window's rule 2 say which it was; older ones ran 1 MB x s'^2 everywhere.
    if (priority && cfg.value("send_window", 0) == 0 && cfg.value("send_window_rule", 1) >= 2)
      md << " The poseidon-overlap systems' send window was the runtime's default (Van::defaultSendWindow): 1 MB at "
            "full width, 256 KB past 8 peers on nodes told their queue is two-band (--host-queue tos), x s'^2, at "
            "least 4,096 bytes.";
  }
  if (cfg.value("local_ranks", 1) > 1) {
    const int l = cfg["local_ranks"].get<int>();
    md << " Each node ran " << l << " ranks (" << l
       << " GPUs, --local-ranks), each its own process and emulated GPU: Poseidon's aggregate on the node's first "
          "rank before anything leaves the node (train --local-ranks), DDP's reach each other over the node's own "
          "address, off the shaped link. Images/s counts every rank; bytes, the own bound and poseidon's ideal "
          "are each node's.";
  }
  // A model whose batch x s is not whole ran at the width that makes it whole, its links slowed to
  // match (files with "model_scales"); before, it ran at s and SFB's factors carried the rounded batch.
  const double scale = cfg["scale"].get<double>();
  const nlohmann::json batches = cfg.value("batches", nlohmann::json::object());
  const nlohmann::json scales = cfg.value("model_scales", nlohmann::json::object());
  for (const auto& [model, b] : batches.items()) {
    if (!b.is_object()) continue;
    const double exact = b.value("full", 0) * scale, used = b.value("scaled", 0);
    if (scales.contains(model) && scales[model].is_number()) {
      const double width = scales[model].get<double>();
      if (std::fabs(width / scale - 1) > 1e-9) {
        char line[320];
        std::snprintf(line, sizeof line,
                      " %s ran at width %g, where its batch is whole (%d x %g = %.0f rows a worker; %d x %g is "
                      "%.3g), its links at %.4g x each rate: the same full-width rate, every message s'^2 of "
                      "full width's.",
                      model.c_str(), width, b.value("full", 0), width, used, b.value("full", 0), scale, exact,
                      (width / scale) * (width / scale));
        md << line;
      }
      continue;
    }
    if (exact > 0 && std::fabs(used / exact - 1) > 0.005) {
      char line[256];
      std::snprintf(line, sizeof line,
                    " %s's SFB factors carry K = %.0f rows a worker where %d x s is %.3g: %.2fx the bytes of full "
                    "width's.",
                    model.c_str(), used, b.value("full", 0), exact, used / exact);
      md << line;
    }
  }
  md << "\n\n";
  md << "Columns: *slowest rank* is the slowest rank's median iteration; *own bound* is each system's own floor, "
        "max(compute, its busiest node's bytes on the wire per iteration, headers included, / link rate), so "
        "*/ own bound* says how close a system runs to what its own traffic allows; *poseidon's ideal* is the "
        "same floor with the fewest bytes any scheme needs (Table 1's hybrid), the one yardstick for every "
        "system; *charged* is the runtime's own work (SFB reconstruction, server sums, CURVE encryption) at "
        "full width on the device model, per iteration: the sum over kinds of each kind's busiest rank. A run whose "
        "ranks together used more "
        "than 80% of this machine's CPU over the measured iterations, or whose host was that busy (/proc/stat, kernel "
        "time included), is marked HOST-BOUND: the host, not the "
        "emulated network or compute, may have set its pace, and it does not count.\n\n";
  if (cfg.contains("devices")) {
    md << "Modelled nodes (--compute; every system computes on " << cfg.value("compute", std::string("titanx"))
       << "'s tables):";
    for (const auto& d : cfg["devices"]) {
      md << " " << d["name"].get<std::string>() << " (GEMM "
         << fmt("%.0f GFLOP/s", d["gemm_flops"].get<double>() / 1e9) << ", sums "
         << fmt("%.2f GB/s", d["sum_bytes_per_s"].get<double>() / 1e9) << ", encryption "
         << fmt("%.2f GB/s", d["crypto_bytes_per_s"].get<double>() / 1e9) << ");";
    }
    md << " a rate of 0 charges nothing. Poseidon's systems charged on a node other than the first are named "
          "SYSTEM@NODE. DDP's own work (Gloo's sums) is not charged.\n\n";
  }
}

// One system's row of a model-and-rate table: its speedup at each size, then the largest size's
// iteration, slowest rank, bounds and charges.
void writeSystemRow(std::ostringstream& md, const std::string& s, const std::vector<int>& nodes,
                    const std::vector<nlohmann::json>& runs,
                    const std::map<std::pair<std::string, std::string>, nlohmann::json>& one, const std::string& model,
                    int repeat, double width) {
  md << "| " << s << " |";
  nlohmann::json last;
  for (int n : nodes) {
    nlohmann::json hit;
    if (n == 1) {
      auto it = one.find({model, s});
      if (it != one.end()) hit = it->second;
    } else {
      for (const auto& r : runs)
        if (r["system"] == s && r["nodes"] == n) hit = r;
    }
    if (hit.is_null())
      md << " - |";
    else if (!hit["ok"].get<bool>())
      md << " failed |";
    else if (n > 1 && hit["speedup"].get<double>() <= 0)
      md << " - |";  // no one-node run to compare with
    else
      md << " " << fmt("%.2fx", n == 1 ? 1.0 : hit["speedup"].get<double>()) << " |";
    if (n == nodes.back()) last = hit;
  }
  if (!last.is_null() && last["ok"].get<bool>()) {
    md << " " << fmt("%.3f", last["iteration_seconds"].get<double>());
    if (repeat > 1) {
      md << " (" << fmt("%.3f", last.value("min_seconds", 0.0)) << "-" << fmt("%.3f", last.value("max_seconds", 0.0))
         << ")";
    }
    if (last.value("host_bound", false)) {
      md << " HOST-BOUND (" << fmt("%.0f%%", 100 * last.value("host_cpu_share", 0.0)) << " of the host's CPU)";
    }
    if (last.contains("tuning") && last["tuning"].is_object()) {
      md << ", " << fmt("%g MB", last.value("bucket_mb", 0.0) / width / width) << " buckets";
    }
    double charged = 0;
    if (last.contains("charged_seconds_per_iteration") && last["charged_seconds_per_iteration"].is_object())
      for (const auto& [k, v] : last["charged_seconds_per_iteration"].items()) charged += v.get<double>();
    md << " | " << fmt("%.3f", last.value("slowest_rank_seconds", 0.0)) << " | "
       << fmt("%.3f", last.value("own_bound_seconds", 0.0)) << " | "
       << fmt("%.2f", last.value("measured_over_own_bound", 0.0)) << " | "
       << fmt("%.2f", last["measured_over_ideal"].get<double>()) << " | "
       << (last["charged_seconds_per_iteration"].is_object() ? fmt("%.3f", charged) : std::string("-")) << " |\n";
  } else {
    md << " - | - | - | - | - | - |\n";
  }
}

}  // namespace

void writeMarkdown(const std::string& path, const nlohmann::json& result) {
  std::ostringstream md;
  const auto& cfg = result["config"];
  writeIntro(md, cfg);
  const int repeat = cfg.value("repeat", 1);
  std::map<std::pair<std::string, double>, std::vector<nlohmann::json>> groups;
  for (const auto& r : result["runs"])
    if (r["nodes"].get<int>() > 1) groups[{r["model"].get<std::string>(), r["link_mbit"].get<double>()}].push_back(r);
  std::map<std::pair<std::string, std::string>, nlohmann::json> one;
  for (const auto& r : result["runs"])
    if (r["nodes"].get<int>() == 1) one[{r["model"].get<std::string>(), r["system"].get<std::string>()}] = r;
  for (const auto& [key, runs] : groups) {
    double scale = cfg["scale"].get<double>();
    md << "## " << key.first << " at " << key.second << " Mbit/s (" << fmt("%g", key.second / scale / scale / 1000)
       << " Gbit/s at full width)\n\n";
    // The width this model ran at (whole batches, "model_scales"), which its DDP caps were scaled by.
    const nlohmann::json widths = cfg.value("model_scales", nlohmann::json::object());
    const double width =
        widths.contains(key.first) && widths[key.first].is_number() ? widths[key.first].get<double>() : scale;
    std::vector<int> nodes{1};
    std::vector<std::string> systems;
    for (const auto& r : runs) {
      if (std::find(nodes.begin(), nodes.end(), r["nodes"].get<int>()) == nodes.end()) nodes.push_back(r["nodes"]);
      if (std::find(systems.begin(), systems.end(), r["system"].get<std::string>()) == systems.end())
        systems.push_back(r["system"]);
    }
    std::sort(nodes.begin(), nodes.end());
    md << "| system |";
    for (int n : nodes) md << " " << n << " node" << (n > 1 ? "s" : "") << " |";
    md << " s/iter at " << nodes.back() << (repeat > 1 ? " (min-max)" : "")
       << " | slowest rank | own bound | / own bound | / poseidon's ideal | charged s/iter |\n|---|";
    for (size_t i = 0; i < nodes.size() + 6; ++i) md << "---|";
    md << "\n";
    for (const auto& s : systems) {
      writeSystemRow(md, s, nodes, runs, one, key.first, repeat, width);
    }
    md << "\n";
  }
  if (result.contains("headline") && !result["headline"].empty()) {
    md << "## Headline ratios (measured side by side in this run)\n\n";
    for (const auto& h : result["headline"]) md << "- " << h.get<std::string>() << "\n";
    md << "\n";
  }
  if (result.contains("bisection")) {
    md << "## Minimum link rate for 90% efficiency at " << result["bisection"]["nodes"].get<int>() << " nodes ("
       << result["bisection"]["model"].get<std::string>()
       << ")\n\n| system | Mbit/s (emulated) | at full width |\n|---|---|---|\n";
    double scale = cfg["scale"].get<double>();
    for (const auto& [sys, v] : result["bisection"]["min_mbit"].items()) {
      md << "| " << sys << " | " << fmt("%.1f", v.get<double>()) << " | "
         << fmt("%.1f Gbit/s", v.get<double>() / scale / scale / 1000) << " |\n";
    }
    md << "\n";
  }
  writeFileAtomically(path, md.str(), "--markdown");
}

void writePlots(const std::string& dir, const nlohmann::json& result) {
  fs::create_directories(dir);
  std::map<std::pair<std::string, double>, std::map<std::string, std::vector<std::pair<int, double>>>> series;
  for (const auto& r : result["runs"]) {
    if (!r["ok"].get<bool>()) continue;
    if (r["nodes"].get<int>() == 1) continue;
    series[{r["model"], r["link_mbit"]}][r["system"]].push_back({r["nodes"].get<int>(), r["speedup"].get<double>()});
  }
  for (auto& [key, systems] : series) {
    std::string base = strCat(dir, "/speedup-", key.first, "-", fmt("%g", key.second), "mbit");
    std::ofstream gp(base + ".gp");
    gp << "set terminal pngcairo size 800,560\nset output '" << base << ".png'\n"
       << "set title 'speedup over one node: " << key.first << ", " << key.second << " Mbit/s links (emulated)'\n"
       << "set xlabel 'nodes'\nset ylabel 'speedup'\nset key left top\nset grid\nset xtics (1,2,4,8,16,32)\n"
       << "plot x title 'linear' dashtype 2 lc rgb 'gray'";
    for (auto& [sys, pts] : systems) {
      std::sort(pts.begin(), pts.end());
      std::ofstream dat(base + "-" + sys + ".dat");
      dat << "1 1\n";
      for (auto& [n, s] : pts) dat << n << " " << s << "\n";
      gp << ", '" << base << "-" << sys << ".dat' with linespoints lw 2 title '" << sys << "' noenhanced";
    }
    gp << "\n";
    gp.close();
    try {
      bench::run({"gnuplot", base + ".gp"});
    } catch (const Error& e) {
      std::cerr << "poseidon bench: plotting failed (install gnuplot-nox): " << e.what() << "\n";
    }
  }
  if (result.contains("histogram")) {
    const auto& h = result["histogram"];
    std::string base = strCat(dir, "/traffic-", h["model"].get<std::string>(), "-", h["nodes"].get<int>(), "nodes");
    std::ofstream dat(base + ".dat");
    dat << "node";
    for (const auto& [sys, v] : h["bytes_per_node"].items()) dat << " " << sys;
    dat << "\n";
    int n = h["nodes"].get<int>();
    for (int i = 0; i < n; ++i) {
      dat << i;
      for (const auto& [sys, v] : h["bytes_per_node"].items()) dat << " " << v[i].get<double>() / 1e6;
      dat << "\n";
    }
    dat.close();
    std::ofstream gp(base + ".gp");
    gp << "set terminal pngcairo size 800,480\nset output '" << base << ".png'\n"
       << "set title 'bytes per node per iteration (sent + received), " << h["model"].get<std::string>() << ", " << n
       << " nodes'\nset ylabel 'MB per iteration'\nset xlabel 'node'\nset style data histograms\n"
       << "set style histogram clustered gap 1\nset style fill solid 0.8 border -1\nset grid ytics\nset key left top\n"
       << "plot for [c=2:" << 1 + h["bytes_per_node"].size() << "] '" << base
       << ".dat' using c:xtic(1) title columnheader\n";
    gp.close();
    try {
      bench::run({"gnuplot", base + ".gp"});
    } catch (const Error& e) {
      std::cerr << "poseidon bench: plotting failed (install gnuplot-nox): " << e.what() << "\n";
    }
  }
}

}  // namespace poseidon::bench
