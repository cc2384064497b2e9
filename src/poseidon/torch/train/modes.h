// The training modes (mode.h has the table): each overrides the TrainMode hooks its step changes.
// Declared together so that merged FC can build on compute groups; each is defined in its own file.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "poseidon/torch/merged_fc.h"
#include "poseidon/torch/train/mode.h"

namespace poseidon::pt {

// BSP: TrainMode's defaults (wait-free backprop, every rank applies the same mean gradient).
class BspMode final : public TrainMode {
 public:
  using TrainMode::TrainMode;
};

// --plain: the plain LibTorch loop, no Poseidon (the overhead baseline, one worker). plain_mode.cc
class PlainMode final : public TrainMode {
 public:
  using TrainMode::TrainMode;
  void connect() override {}
  std::string describe() const override;
  void update(int64_t iteration) override;  // the check DistributedModel makes, on the one gradient
  bool everyRankFindsDivergence() const override { return false; }
  void finish() override {}

 protected:
  Forward forward(const torch::Tensor& x) override;
};

// --overlap-forward: step() returns at once and the next forward applies each layer's update just
// before that layer runs (DistributedModel::forwardGated); bit-identical to BSP. overlapped_mode.cc
class OverlappedMode final : public TrainMode {
 public:
  using TrainMode::TrainMode;
  std::string describe() const override;
  void beginStep(double lr) override;
  void update(int64_t iteration) override;
  void settle() override;

 protected:
  Forward forward(const torch::Tensor& x) override;
};

// --drop-stragglers: each KV pair or SFB round proceeds without up to D late workers; a rank the
// others finished an iteration without skips it. straggler_mode.cc
class StragglerMode final : public TrainMode {
 public:
  using TrainMode::TrainMode;
  void connect() override;
  bool skipStep() override;
  void report() override;
  void addSummary(nlohmann::json& summary) const override;

 private:
  std::vector<double> dropped_, skipped_;  // per rank, from report()
};

// --groups: Omnivore's compute groups. The shards hold the model and run SGD; each group pushes its
// gradients during the backward and pulls the model before its forward, at most --staleness rounds
// ahead of the slowest. group_mode.cc
class GroupMode : public TrainMode {
 public:
  using TrainMode::TrainMode;
  void resumed(const Resumed& r) override;
  void connect() override;
  void beginStep(double lr) override;
  bool divergenceIsDeadRound() const override { return true; }
  void gatherModel() override;
  void beforeCheckpoint(CheckpointMeta& meta) override;
  void afterCheckpoint() override;
  bool everyRankFindsDivergence() const override { return false; }
  const char* afterDivergence() const override;
  bool divergedModelSeenLater() const override { return true; }
  void update(int64_t iteration) override;
  void report() override;
  void addSummary(nlohmann::json& summary) const override;

 protected:
  // --overlap-forward: each layer of the next round's model is awaited just before it runs.
  Forward forward(const torch::Tensor& x) override;
  // The job's options with the groups' settings and the shards' resumed state.
  DistributedOptions groupOptions() const;
  // The shards' momentum (in the shards' parameter order) as the checkpoint's optimizer holds it (in
  // its own), and back: the resumed optimizer's momentum, the shards' part of it.
  virtual std::vector<torch::Tensor> checkpointMomentum(std::vector<torch::Tensor> shards) { return shards; }
  virtual std::vector<torch::Tensor> resumedMomentum(std::vector<torch::Tensor> all) { return all; }

  std::vector<torch::Tensor> momentum_;  // a resumed checkpoint's, for the shards
  int64_t version_ = 0;                  // the shards' version clock, from the checkpoint resumed
  nlohmann::json stalenessHistogram_ = nlohmann::json::object();  // from report()
  int64_t maxGroupLead_ = 0;
  int64_t earlyPulls_ = 0;
  int64_t pacedPushes_ = 0;
};

// InvalidArgument unless `net` (the model `model`) has conv features and an FC classifier, as
// --merged-fc needs.
void checkMergedFcModel(const AnyNet& net, const std::string& model);

// --merged-fc: Omnivore's merged FC (V-A). The conv layers train in compute groups; the FC layers
// run on rank 0's FC server, model-parallel: each step a worker sends it its features and gets their
// gradient back. merged_fc_mode.cc
class MergedFcMode final : public GroupMode {
 public:
  explicit MergedFcMode(RankContext& c);  // InvalidArgument for a model without an FC classifier
  std::vector<torch::Tensor> trainedParameters() override;
  void optimizerBuilt(const torch::optim::SGDOptions& sgd) override;
  torch::optim::SGD& stateOptimizer() override { return *checkpointOptimizer_; }
  void connect() override;
  void printPlanNotes() const override;
  torch::Tensor compute(const torch::Tensor& x, const torch::Tensor& y, StepTimes& times) override;
  void gatherModel() override;
  std::vector<torch::Tensor> modelCopy() override;
  bool onFcServer(const std::string& layer) const override;
  void report() override;
  void addSummary(nlohmann::json& summary) const override;
  void finish() override;

 protected:
  std::vector<torch::Tensor> checkpointMomentum(std::vector<torch::Tensor> shards) override;
  std::vector<torch::Tensor> resumedMomentum(std::vector<torch::Tensor> all) override;

 private:
  ModelParts featureParts() const;  // the model without its FC layers: what the shards hold
  bool isClassifierParam(const torch::Tensor& p) const;

  std::vector<torch::Tensor> classifierParams_;  // the FC layers' (trained by rank 0's FC server)
  // SGD over every parameter, for the checkpoint's optimizer.pt only (laid out as without merged FC):
  // the shards' momentum for the conv layers, the FC server's for the FC layers.
  std::unique_ptr<torch::optim::SGD> checkpointOptimizer_;
  std::vector<torch::Tensor> fcMomentum_;  // a resumed checkpoint's, for the FC server
  std::unique_ptr<MergedFc> mergedFc_;     // every rank's side of the FC server, and rank 0's server
  int64_t fcUpdates_ = 0;
  double fcBusySeconds_ = 0;
};

}  // namespace poseidon::pt
