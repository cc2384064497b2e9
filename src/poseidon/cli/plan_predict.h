// poseidon plan --predict / --sweep / --check: the planner (planner/planner.h) behind the CLI.
#pragma once

#include <string>
#include <vector>

#include "poseidon/planner/planner.h"

namespace poseidon::cli {

struct PredictRequest {
  std::string model;          // zoo name or JSON layer table
  double computeSeconds = 0;  // a JSON table's single-worker iteration (0: zoo timing)
  std::string compute = "titanx";  // the zoo timing's GPU (bench/emulation.h)
  int64_t batch = -1;         // -1: the model's
  std::vector<int> workers;   // one entry (--predict) or the sweep
  bool sweep = false;         // a table over `workers`, without the lowest link rates
  std::vector<planner::System> systems;
  std::vector<int> groups;   // --groups: compute-group counts (then `systems` is empty)
  bool mergedFc = false;     // --groups --merged-fc: the top FC layers on one FC server
  planner::Cluster cluster;  // link rate at full width, scale 1
  double efficiency = 0.9;   // for the minimum link rate
  bool limits = false;       // for each Poseidon system, the link rate from which each of its own costs binds
  bool json = false;
};
int planPredict(const PredictRequest& request);

// Predicts every run of a bench results JSON (poseidon bench --json) the planner models and
// prints predicted against measured. `calibration` gives the overheads (link, per message, DDP's
// step); each run's rates, scale and device come from the file; the emulated cluster's nodes
// shared `hostCores` cores (0: the file's host_cores, or this machine's for a file without one).
// Unless `messageSet` (plan --message-us), a file without timer_slack_ns (made while the ranks' charged
// sleeps woke 70-75 us late) is checked with planner::kMessageSecondsDefaultSlack per message.
int planCheck(const std::string& resultsPath, const planner::Cluster& calibration, int hostCores, double tolerance,
              bool json, bool messageSet = false);

}  // namespace poseidon::cli
