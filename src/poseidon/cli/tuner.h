// Omnivore's automatic optimizer (Algorithm 1): tuner.cc says how it decides. It trains through a
// TuneBackend: `poseidon tune` runs it on the time-to-accuracy harness (real processes on the
// emulated cluster), `poseidon tune --regret` on a virtual clock (cli/tune_regret.cc). Internal to
// the CLI.
#pragma once

#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "poseidon/cli/accuracy_harness.h"

namespace poseidon::cli {

struct TuneConfig {
  int steps = 1800;         // the trained model's steps (cold start included), the budget
  int epochSteps = 600;     // an optimizer epoch (the paper: an hour)
  int probeSteps = 10;      // a probe (the paper: a minute, 1/60 of an epoch)
  int coldSteps = 60;       // the synchronous cold start (its probes included)
  std::vector<int> groups;  // CG, ascending
  std::vector<double> lrs{1e-5, 1e-4, 1e-3, 1e-2, 1e-1};
  std::vector<double> momenta{0, 0.3, 0.6, 0.9};
  bool mergedFc = false;        // every run with merged FC (the FC layers on one FC server)
  int64_t probeSamples = 4096;  // a run's loss: its end model's on this many fixed training images (0: see Stage)
  // The summary's time to target: the first path point whose `lossKey` is at most targetLoss (and
  // whose test_accuracy, where the curve has one, reaches targetAccuracy).
  double targetAccuracy = 0.8, targetLoss = 0.6;
  std::string lossKey = "train_loss";
  bool verbose = true;  // a line per run and decision on stdout
};

// A run the tuner asks for: (g, lr, mu) from a saved state ("" : the initial model) at fromStep to
// toStep (steps of every worker, as poseidon train counts them).
struct TuneRunSpec {
  std::string kind;  // "cold-start probe", "probe", "momentum check", "extension", "epoch"
  std::string from;
  int fromStep = 0, toStep = 0;
  int groups = 1;
  double lr = 0, momentum = 0;
};

struct TuneRunResult {
  std::string state;    // a handle of its end state (a later run's `from`)
  double clock = 0;     // training-clock seconds it took
  int divergedAt = -1;  // the step its model was found not finite, where it stopped (-1: it did not)
  // The run's loss at points of its second half, (step, loss), ascending, the last one its end model:
  // the tuner scores the run from them (tuner.cc). Non-finite: diverged.
  std::vector<std::pair<double, double>> points;
  nlohmann::json curve = nlohmann::json::array();  // points with "step", "seconds" from the run's start, losses
  double fcBusySeconds = 0, fcSamples = 0;         // merged FC: the server's busy seconds, samples served
};

// The HE model's prediction at g groups.
struct TuneHe {
  double stepSeconds = 0;       // a group's round
  double secondsPerSample = 0;  // through the whole cluster
  double fcServerBusy = 0;      // merged FC: the FC server's load (1: saturated)
};

class TuneBackend {
 public:
  virtual ~TuneBackend() = default;
  virtual TuneRunResult train(const TuneRunSpec& run) = 0;
  // fcSecondsPerSample: merged FC's server time per sample, as the cold start measured it (0 without).
  virtual TuneHe predict(int groups, double fcSecondsPerSample) = 0;
  virtual std::string heSource() const = 0;  // what predicts it, for the terminal ("planner")
};

// One tuning run: the decisions, the stages, the trained model's curve and the times.
nlohmann::json tune(TuneBackend* backend, const TuneConfig& cfg);

// The harness's backend: every run a real `poseidon train` per node on the emulated cluster at `mbit`
// (the summary JSON's "runs" entry gets "mbit").
nlohmann::json tune(AccuracyHarness* harness, const TuneConfig& cfg, double mbit);

// A curve point's number; NaN where a diverged run wrote null.
double curveNumber(const nlohmann::json& point, const char* key);

// A run's score from its points (TuneRunResult::points): their mean loss and, with three or more steps,
// its standard error from the points' scatter about their least-squares line (NaN with fewer: the
// tie band is then the paper's 5%). Infinity when a loss is not finite.
std::pair<double, double> scoreRun(const std::vector<std::pair<double, double>>& points);

// The least-squares line through (x, y) points: the means, the slope, and from the points' scatter
// about it the standard errors of the slope and of the mean (NaN with fewer than three distinct x).
struct LineFit {
  double mx = 0, my = 0;
  double slope = std::nan(""), slopeSe = std::nan(""), meanSe = std::nan("");
};
LineFit fitLine(const std::vector<std::pair<double, double>>& points);

}  // namespace poseidon::cli
