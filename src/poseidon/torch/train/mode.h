// A training mode: how one rank's step synchronizes, and what that changes around the step. The core
// loop (rank_run.h) is the same for every mode: data, warm-up, divergence, evaluation, checkpoints,
// progress, results. What differs is a TrainMode, chosen once by chooseMode() from the options, the
// one place that reads the mode flags:
//
//   mode              file                  the step                        around it
//   plain             plain_mode.cc         the LibTorch loop, no Poseidon  --plain (1 worker)
//   BSP               mode.cc (defaults)    wait-free backprop + step()     the default
//   overlapped step   overlapped_mode.cc    step() returns at once; the     applyPending before the
//                                           next forward applies it         model is read
//   straggler dropping straggler_mode.cc    a rank the others finished      drop counts reported
//                                           without skips the step
//   compute groups    group_mode.cc         push during the backward,       the shards hold the model,
//                                           pull before the forward         its momentum, its clock
//   merged FC         merged_fc_mode.cc     conv layers in groups, FC       the FC server's model and
//                                           layers on rank 0's FC server    momentum in checkpoints
//
// Each hook has the BSP behaviour as its default (or nothing, where BSP needs nothing); a mode
// overrides what it changes. Hooks that are collectives are called by every rank at the same point.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "poseidon/torch/checkpoint.h"
#include "poseidon/torch/train/context.h"

namespace poseidon::pt {

// A step's real compute, the pad left out (ComputePad::record).
struct StepTimes {
  double forwardMs = 0, backwardMs = 0;
};

class TrainMode {
 public:
  explicit TrainMode(RankContext& c) : c_(c) {}
  virtual ~TrainMode() = default;
  TrainMode(const TrainMode&) = delete;
  TrainMode& operator=(const TrainMode&) = delete;

  // ---- Building the run ----
  // The parameters this rank's optimizer trains (merged FC: the conv layers only).
  virtual std::vector<torch::Tensor> trainedParameters() { return c_.net.module->parameters(); }
  // After c_.optimizer was built with these options.
  virtual void optimizerBuilt(const torch::optim::SGDOptions&) {}
  // The optimizer whose state a checkpoint holds (every parameter's).
  virtual torch::optim::SGD& stateOptimizer() { return *c_.optimizer; }
  // A checkpoint was resumed into the module and stateOptimizer(): what else the mode takes from it.
  virtual void resumed(const Resumed&) {}
  // Joins the job: c_.dist from c_.jobOptions() (the job's settings; the mode adds its own).
  virtual void connect();
  // The job line's words for the mode (", wait-free backprop").
  virtual std::string describe() const;
  // Rank 0, after the per-layer plan: what else the mode runs where.
  virtual void printPlanNotes() const {}

  // ---- One step ----
  // Before the step, with its (warmed-up) learning rate, already set on the optimizer.
  virtual void beginStep(double lr);
  // True: this rank skips the step (the others finished it without it).
  virtual bool skipStep() { return false; }
  // The step's forward, the modeled compute's pad, the backward; returns the loss.
  virtual torch::Tensor compute(const torch::Tensor& x, const torch::Tensor& y, StepTimes& times);
  // The synchronization and the optimizer's step for step `iteration` (0-based). Throws
  // DivergenceError where the mode finds the training diverged.
  virtual void update(int64_t iteration);
  // A DivergenceError from the step: true when the step is a dead round (compute groups: its pull
  // showed a model that is not finite; the round ran to keep the shards' rounds whole), false when
  // the step diverged (BSP: every rank finds it at the same step).
  virtual bool divergenceIsDeadRound() const { return false; }

  // ---- Reading the model ----
  // Before the model is read (evaluation, checkpoint, curve copy): an update still pending goes in.
  // Throws DivergenceError (every rank alike) when it is not finite.
  virtual void settle() {}
  // A collective before evaluation: the model as it stands (compute groups: every update so far).
  virtual void gatherModel() {}
  // A collective around a checkpoint (every rank; rank 0 saves between the two): the state the mode
  // keeps outside the module into stateOptimizer() and `meta`.
  virtual void beforeCheckpoint(CheckpointMeta&) {}
  virtual void afterCheckpoint() {}
  // Rank 0: a copy of the whole model (merged FC: the FC server's layers as of a finished update).
  virtual std::vector<torch::Tensor> modelCopy();
  // Whether a layer of the model is trained elsewhere (merged FC: on the FC server).
  virtual bool onFcServer(const std::string& /*layer*/) const { return false; }

  // ---- Divergence ----
  // True when every rank finds a divergence at the same step (BSP: they hold the same mean gradient).
  virtual bool everyRankFindsDivergence() const { return true; }
  // What the job does once this rank found it (rank 0's line with --allow-divergence).
  virtual const char* afterDivergence() const { return "the job stops here"; }
  // True when the model a due curve point copied at the divergence's step is the one before it, and
  // the diverged model replaces it (compute groups see it one round later).
  virtual bool divergedModelSeenLater() const { return false; }

  // ---- Results ----
  // A collective after the epoch loop: the mode's own counts, printed by rank 0.
  virtual void report() {}
  // The mode's results in the summary (over the defaults the core writes).
  virtual void addSummary(nlohmann::json&) const {}
  // Ends the job (every rank; after report()).
  virtual void finish();

 protected:
  // The step's forward: its output, the ms the compute took (modeled layers included) and the ms of
  // it that were modeled (the overlapped step's per-layer pad).
  struct Forward {
    torch::Tensor out;
    double ms = 0, modeledMs = 0;
  };
  virtual Forward forward(const torch::Tensor& x);
  // --overlap-forward's forward (DistributedModel::forwardGated): each layer waits for its part of the
  // last step (BSP: its update; compute groups: its pulled parameters) just before it runs, and
  // --pad-ms's modeled forward is spent layer by layer right after each gate. overlapped_mode.cc
  Forward gatedForward(const torch::Tensor& x);

  RankContext& c_;
};

// The mode checks: combinations of the options no rank can train with (InvalidArgument).
void validateModeOptions(const TrainOptions& o, int world);
// The mode for these options (the one place that reads the mode flags); needs c.net.
std::unique_ptr<TrainMode> chooseMode(RankContext& c);
// The mode flags as the summary echoes them.
nlohmann::json modeOptionsJson(const TrainOptions& o);

}  // namespace poseidon::pt
