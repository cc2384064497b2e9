// The benchmarks' modeled device (poseidon train --pad-ms; bench --accuracy and tune pass it): each
// step's compute (forward + backward, not the waits for the network) is padded to a modeled device
// time, so that time-to-accuracy runs on this CPU see the compute-to-communication ratio of the GPU
// they model. Steps whose real compute took longer are counted as overruns and reported. A hook of
// the core loop: no training mode reads it (the overlapped step asks it how long each layer's
// modeled forward takes).
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "poseidon/torch/trainer.h"

namespace poseidon::pt {

class ComputePad {
 public:
  ComputePad(const TrainHooks& hooks, uint64_t seed, int rank);
  // InvalidArgument for pad settings no run can use.
  static void validate(const TrainHooks& hooks);

  bool on() const { return padMs_ > 0; }
  double padMs() const { return padMs_; }
  double jitterMs() const { return jitterMs_; }
  // The modeled device: forward + backward take padMs (+ jitter). Sleeps what is left of it after a
  // forward of `forwardMs` and a backward as long as the last step's; returns the ms slept. The pad
  // goes between forward and backward, so that every sync, ours and DDP's alike (bench/ddp_train.py
  // pads the same way), starts after the modeled compute: no system gets overlap from the pad
  // itself, only from the real backward.
  double beforeBackward(double forwardMs);
  // The overlapped step (--pad-forward-share): the modeled forward's ms spent right after gated layer
  // `layer`, in proportion to the real forward's time per layer on the step before (0 before the first).
  double layerForwardMs(int layer) const;
  // The real forward's ms per gated layer on this step (for layerForwardMs on the next).
  void measuredForward(const std::vector<double>& realMs);
  // A step's real compute (the pad left out): its overrun, if any, and the statistics.
  void record(double forwardMs, double backwardMs);

  // Every rank's overruns and largest real compute, over `steps` steps of this rank (a collective
  // through allSum); rank 0 (lead) prints the line.
  void report(const std::function<std::vector<double>(const std::vector<double>&)>& allSum, int64_t steps, int rank,
              int world, bool lead);
  const std::vector<double>& overrunsPerRank() const { return overrunsPerRank_; }
  const std::vector<double>& maxComputeMsPerRank() const { return maxComputeMsPerRank_; }
  double meanComputeMs() const { return meanComputeMs_; }

 private:
  const double padMs_, jitterMs_, forwardShare_;
  std::mt19937_64 random_;  // the jitter, seeded per rank
  double lastBackwardMs_ = 0;
  int64_t overruns_ = 0;
  double maxComputeMs_ = 0, computeMsSum_ = 0;
  std::vector<double> layerShare_;  // each gated layer's share of the real forward, last step
  std::vector<double> overrunsPerRank_, maxComputeMsPerRank_;
  double meanComputeMs_ = 0;
};

}  // namespace poseidon::pt
