// Omnivore's automatic optimizer (Algorithm 1), as `poseidon tune` runs it on the time-to-accuracy
// harness: tuner.cc says how it decides. Internal to the CLI.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "poseidon/cli/accuracy_harness.h"

namespace poseidon::cli {

struct TuneConfig {
  int steps = 300;          // the trained model's steps (cold start included), the budget
  int epochSteps = 100;     // an optimizer epoch
  int probeSteps = 10;      // a probe
  std::vector<int> groups;  // CG, ascending
  std::vector<double> lrs{1e-5, 1e-4, 1e-3, 1e-2, 1e-1};
  std::vector<double> momenta{0, 0.3, 0.6, 0.9};
  bool mergedFc = false;        // every run with merged FC (the FC layers on one FC server)
  int64_t probeSamples = 4096;  // a run's loss: its end model's on this many fixed training images (0: see Stage)
};

// One tuning run at one link rate: the decisions, the stages, the trained model's curve and the
// times (the summary JSON's "runs" entry). The harness's emulated cluster runs at `mbit`.
nlohmann::json tune(AccuracyHarness* harness, const TuneConfig& cfg, double mbit);

// A curve point's number; NaN where a diverged run wrote null.
double curveNumber(const nlohmann::json& point, const char* key);

}  // namespace poseidon::cli
