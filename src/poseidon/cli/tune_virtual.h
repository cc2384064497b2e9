// poseidon tune's backend on the virtual clock (torch/virtual_race.h), for the regret experiment
// (cli/tune_regret.cc): every probe and epoch a run of the virtual race from an in-memory state.
// Internal to the CLI; built with LibTorch only.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "poseidon/cli/tuner.h"
#include "poseidon/torch/virtual_race.h"

namespace poseidon::cli {

// States are kept in memory under handles "s1", "s2", ...
class VirtualBackend : public TuneBackend {
 public:
  // curveEverySeconds: an epoch's curve points (the path's); average: a probe scored by its tail
  // average's loss (--probe-score average) instead of its model's.
  VirtualBackend(const pt::VirtualRace& race, double curveEverySeconds, int64_t batch, uint64_t seed, bool average)
      : race_(race), curveEvery_(curveEverySeconds), batch_(batch), seed_(seed), average_(average) {}

  // A group's mean round on the clock, and its samples: the HE model of the same clock.
  TuneHe predict(int groups, double) override;
  std::string heSource() const override { return "virtual clock"; }
  TuneRunResult train(const TuneRunSpec& spec) override;

 private:
  const pt::VirtualRace& race_;
  double curveEvery_;
  int64_t batch_;
  uint64_t seed_;
  bool average_;
  int runs_ = 0;
  std::map<std::string, pt::VirtualRace::StatePtr> states_;
};

}  // namespace poseidon::cli
