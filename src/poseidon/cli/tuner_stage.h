// The tuner's record of one run (cli/tuner.cc): a probe, its extensions or the rest of an epoch.
// Internal to the CLI.
#pragma once

#include <cmath>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "poseidon/common/error.h"

namespace poseidon::cli::tuner {

// One run of the tuner: a probe or the rest of an epoch, from a saved state to a saved state.
struct Stage {
  std::string kind;  // "cold-start probe", "probe", "momentum check", "extension", "epoch"
  int groups = 0;
  double lr = 0, momentum = 0;
  int fromStep = 0, toStep = 0;
  double loss = std::numeric_limits<double>::infinity();  // scoreRun's (inf: diverged)
  double lossSe = std::nan("");                           // its standard error (NaN: no spread)
  double clock = 0;                                       // training-clock seconds it took
  int divergedAt = -1;  // the step its model was found not finite, where the run stopped (-1: it did not)
  // Merged FC: the FC server's busy seconds and the samples it served in this run (0: none).
  double fcBusySeconds = 0, fcSamples = 0;
  std::string state;  // the backend's handle of its end state
  nlohmann::json curve;
  std::vector<size_t> runs;  // the tuner's runs this stage is made of (a probe and its extensions)
  bool won = false;          // part of the trained model's path
  nlohmann::json toJson() const {
    return {{"kind", kind},
            {"groups", groups},
            {"lr", lr},
            {"momentum", momentum},
            {"from_step", fromStep},
            {"to_step", toStep},
            {"loss", std::isinf(loss) ? nlohmann::json("diverged") : nlohmann::json(loss)},
            {"loss_se", std::isfinite(lossSe) ? nlohmann::json(lossSe) : nlohmann::json(nullptr)},
            {"diverged_at_step", divergedAt >= 0 ? nlohmann::json(divergedAt) : nlohmann::json(nullptr)},
            {"clock_seconds", clock},
            {"fc_server_busy_seconds", fcBusySeconds},
            {"fc_server_samples", fcSamples},
            {"won", won}};
  }
};

// A run's outcome for the terminal: "loss 0.5210 +- 0.0031", "diverged at step 23 (stopped)" or
// "loss diverged".
inline std::string outcome(const Stage& s) {
  if (s.divergedAt >= 0) return strCat("diverged at step ", s.divergedAt, " (stopped)");
  if (std::isinf(s.loss)) return "loss diverged";
  char b[64];
  if (std::isfinite(s.lossSe))
    std::snprintf(b, sizeof b, "loss %.4f +- %.4f", s.loss, s.lossSe);
  else
    std::snprintf(b, sizeof b, "loss %.4f", s.loss);
  return b;
}

inline std::string name(const Stage& s) { return strCat("g=", s.groups, " lr=", s.lr, " momentum=", s.momentum); }

}  // namespace poseidon::cli::tuner
