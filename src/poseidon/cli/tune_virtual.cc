#include "poseidon/cli/tune_virtual.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "poseidon/common/error.h"

namespace poseidon::cli {

TuneHe VirtualBackend::predict(int groups, double) {
  const auto& o = race_.options();
  const double step = o.computeSeconds + o.computeExpSeconds + race_.commSeconds(groups);
  return {step, step / (groups * static_cast<double>(batch_)), 0};
}

TuneRunResult VirtualBackend::train(const TuneRunSpec& spec) {
  pt::VirtualRace::Run r;
  if (!spec.from.empty()) r.from = states_.at(spec.from);
  r.groups = spec.groups;
  r.lr = spec.lr;
  r.momentum = spec.momentum;
  r.steps = spec.toStep - spec.fromStep;
  r.seed = seed_ * 1000003 + ++runs_;
  // The batches from step k on are the same in every run from step k, as poseidon train's data
  // order is a function of the seed and the step: probes from one checkpoint see the same data.
  r.batchSeed = seed_ * 1000003 + 7919 * static_cast<uint64_t>(spec.fromStep + 1);
  const int64_t updates = r.steps * spec.groups;
  const bool epoch = spec.kind == "epoch";
  if (epoch) {
    r.evalEverySeconds = curveEvery_;  // the path's curve
  } else {
    // The score: four points of the second half, fewer where it is too short for four distinct ones.
    for (int j = 1; j <= 4; ++j) {
      const int64_t u = updates / 2 + (j * (updates - updates / 2) + 3) / 4;
      if (r.evalAtUpdates.empty() || r.evalAtUpdates.back() != u) r.evalAtUpdates.push_back(u);
    }
    if (average_) r.averageAfter = updates / 2;
  }
  const pt::VirtualRace::Result res = race_.run(r);
  TuneRunResult out;
  out.state = strCat("s", runs_);
  states_[out.state] = res.end;
  out.clock = res.seconds;
  if (res.divergedAtUpdate >= 0) out.divergedAt = spec.fromStep + static_cast<int>(res.divergedAtUpdate / spec.groups);
  for (const auto& p : res.points) {
    const int step = spec.fromStep + static_cast<int>(p.updates / spec.groups);
    out.curve.push_back({{"step", step},
                         {"seconds", p.seconds},
                         {"sample_loss", std::isfinite(p.loss) ? nlohmann::json(p.loss) : nlohmann::json(nullptr)}});
    const bool scored = epoch ? &p == &res.points.back() : p.updates > updates / 2;
    // A probe's score: its tail average's loss (--probe-score average) or its model's.
    const double score = !epoch && average_ ? p.averageLoss : p.loss;
    if (scored) out.points.emplace_back(spec.fromStep + static_cast<double>(p.updates) / spec.groups, score);
  }
  return out;
}

}  // namespace poseidon::cli
