// The accuracy curve of a time-to-accuracy run (poseidon train --curve-every; bench --accuracy and
// tune pass it): rank 0 keeps a copy of its model every N steps, with the training clock and the
// mean loss since the last copy, and after the run (off the clock) tests each copy on the whole test
// set and, with --curve-loss-samples, scores it by its mean loss on fixed training images (poseidon
// tune's probe signal). A hook of the core loop; the training modes never read it.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "poseidon/data/fashion_mnist.h"
#include "poseidon/torch/models.h"
#include "poseidon/torch/trainer.h"

namespace poseidon::pt {

class AccuracyCurve {
 public:
  AccuracyCurve(const TrainHooks& hooks, bool lead)
      : every_(hooks.curveEvery), lossSamples_(hooks.curveLossSamples), lead_(lead) {}
  // InvalidArgument for curve settings no run can use.
  static void validate(const TrainHooks& hooks);

  bool on() const { return every_ > 0; }
  // Whether a copy is due after `step` steps.
  bool due(int64_t step) const { return every_ > 0 && step % every_ == 0; }
  // A step's loss, into the mean of the next point (rank 0).
  void addLoss(double loss);
  // Rank 0: the point of `step` (if it is not the last one already), from the model's copy.
  bool has(int64_t step) const { return !points_.empty() && points_.back().iteration == step; }
  void add(int64_t step, double clockSeconds, std::vector<torch::Tensor> model);
  // The last point's model, replaced (compute groups: the diverged model, seen one round later).
  void replaceLast(std::vector<torch::Tensor> model) { points_.back().params = std::move(model); }
  bool empty() const { return points_.empty(); }

  // Tests every copy with `net` (whose parameters it restores after), on the whole test set and (with
  // curveLossSamples) the fixed training images; prints a line unless quiet.
  void evaluate(AnyNet& net, const data::Dataset& train, const data::Dataset& test, bool quiet);
  nlohmann::json json() const;

 private:
  struct Point {
    int64_t iteration;
    double seconds, trainLoss, testAccuracy = -1, sampleLoss = -1;
    std::vector<torch::Tensor> params;
  };
  const int64_t every_, lossSamples_;
  const bool lead_;
  std::vector<Point> points_;
  double lossSum_ = 0;
  int64_t lossCount_ = 0;
};

}  // namespace poseidon::pt
