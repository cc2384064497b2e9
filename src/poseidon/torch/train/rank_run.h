// One rank's run of the main job (trainRank): the core loop, the same for every mode. It loads the
// data, builds the model and its optimizer, resumes, runs the epochs (warm-up, steps, divergence,
// evaluation, checkpoints, progress) and reports; how a step synchronizes is its TrainMode's
// (mode.h), chosen once. The benchmarks' hooks (TrainHooks) stay here: the modeled compute
// (ComputePad), the accuracy curve (AccuracyCurve), fault injection and the slow rank.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "poseidon/common/file.h"
#include "poseidon/torch/checkpoint.h"
#include "poseidon/torch/train/context.h"
#include "poseidon/torch/train/curve.h"
#include "poseidon/torch/train/mode.h"

namespace poseidon::pt {

// The job layout a checkpoint of these options is written with and resumed against (model, workers,
// batch, seed, train limit; compute groups: their number): RankRun::resume and, before any worker
// starts, validateTrainOptions.
CheckpointMeta checkpointLayout(const TrainOptions& o, int world);

// Option values no rank can train with (values, the mode's combinations; validateTrainOptions adds
// the model's name). InvalidArgument.
void validateRankOptions(const TrainOptions& o, const TrainHooks& hooks, int world);

class RankRun {
 public:
  // Checks the options and output paths, seeds LibTorch, loads the data and builds the model, its
  // mode and its optimizer.
  RankRun(const TrainOptions& o, const TrainHooks& hooks, const RankEnv& env);
  // Resumes from the newest intact checkpoint in --checkpoint, if any (warning about damaged newer ones).
  void resume();
  // Joins the job (the mode's DistributedModel; --plain: none).
  void connect();
  // Rank 0: the job line and the per-layer plan.
  void printPlan() const;
  // The epoch loop: trains, evaluates after every epoch, checkpoints.
  void train();
  // The mode's counts, the modeled compute and bytes on the wire over all ranks (collectives: every
  // rank calls it).
  void reportTraffic();
  // Rank 0: final accuracy, throughput and wall time.
  void printResult() const;
  // --curve-every: evaluates rank 0's model copies on the whole test set (after finish(), so
  // that no other rank waits on it).
  void evaluateCurve() { curve_.evaluate(c_.net, train_, test_, o_.quiet); }
  // --save-params, the trace of this rank, --summary.
  void writeOutputs() const;
  // kExitDiverged on every rank when the job diverged (and --allow-divergence was not given), else 0.
  int exitCode() const { return modelDiverged_ && !o_.allowDivergence ? kExitDiverged : 0; }
  void finish() { mode_->finish(); }

 private:
  // One step. kDiverged: its mean gradient was not finite (every rank of a BSP job finds it at this
  // step); kDeadRound: compute groups, the round's pull showed a model that is not finite (the round
  // ran, its push went out, it is not counted).
  enum class StepOutcome { kTrained, kDiverged, kDeadRound };
  struct EpochStats;
  // Returns true when the job stops inside the epoch (--max-steps, or a divergence).
  bool trainEpoch(int epoch, EpochStats& stats);
  // One SGD step on batch [b, e) of idx; adds its loss and images to stats.
  StepOutcome trainStep(const std::vector<int64_t>& idx, size_t b, size_t e, EpochStats& stats);
  // --checkpoint-every: a checkpoint after step iteration_, when one is due.
  void checkpointIfDue();
  bool maxStepsReached() const { return o_.maxSteps > 0 && iteration_ >= o_.maxSteps; }
  int startEpoch() const { return static_cast<int>(c_.startIteration / stepsPerEpoch_); }
  void injectFault() const;
  void printProgress(int epoch, int64_t s, const EpochStats& stats, int& nextReport) const;
  // Test accuracy over all ranks' shards of the test set; decides together whether the job diverged.
  double evaluate();
  // The mode's pending update into the model before it is read; a divergence found there is noted.
  void settle();
  // A step's loss into the epoch's mean and (rank 0, --curve-every) the curve's.
  void addLoss(double loss, EpochStats& stats);
  // This rank found the training diverged at `step` (what: the DivergenceError's message, if any):
  // records it, and a curve point there; with --allow-divergence rank 0 says so at once.
  void noteDivergence(int64_t step, const std::string& what = "");
  // Rank 0: the line that says where the job diverged and what to try.
  std::string divergenceLine() const;
  // Whether one rank (not every rank at once) finds a divergence: then the summary names it.
  bool divergenceFoundByOneRank() const { return !mode_->everyRankFindsDivergence() || c_.world == 1; }
  void checkpoint(int64_t iteration);
  // --curve-every: rank 0 copies its model and the loss since the last copy.
  void recordCurvePoint(int64_t step);
  double imagesPerSecond() const { return trainSeconds_ > 0 ? images_ / trainSeconds_ : 0; }
  void saveParams() const;
  nlohmann::json summaryJson() const;

  const TrainOptions& o_;
  const TrainHooks& hooks_;
  const Clock::time_point wallStart_ = Clock::now();
  RankContext c_;              // the model, its optimizer and the job: what the mode works on
  const int64_t warmupSteps_;  // --warmup-steps
  data::Dataset train_, test_;
  std::unique_ptr<TrainMode> mode_;  // after c_: its MergedFc goes before c_'s DistributedModel
  int64_t stepsPerEpoch_ = 0;
  int torchThreads_ = 1;  // LibTorch's intra-op threads while training (--threads, or this host's share)
  CheckpointMeta meta_;
  int64_t checkpointIteration_ = -1;
  // The iteration of the state checkpoint() last took (or resume() loaded), on every rank alike (the
  // lead's checkpointIteration_ may lag: an unsaved diverged model): train()'s closing save skips it.
  int64_t checkpointedAt_ = 0;
  // Rank 0, the writer: --checkpoint's lock for the run, so that a second job given the same
  // directory is refused instead of resuming from and pruning this one's checkpoints.
  std::unique_ptr<DirectoryLock> checkpointLock_;
  std::string resumedFrom_;  // the checkpoint resume() loaded ("" for none), for the summary
  AccuracyCurve curve_;
  // Results of the epoch loop.
  nlohmann::json epochsJson_ = nlohmann::json::array();
  double accuracy_ = 0, trainSeconds_ = 0;
  bool trainedNothing_ = false;  // resumed where the job had ended: no step, no traffic to report
  int64_t steps_ = 0, images_ = 0, iteration_ = 0;
  bool stop_ = false;
  double trainClock_ = 0;       // the training clock: seconds in training steps (time-to-accuracy)
  // Every rank's training clock, steps and PS bytes (reportTraffic): compute groups step at their own
  // paces, so the rate through all workers (Omnivore's hardware efficiency) needs each rank's.
  std::vector<double> trainClockPerRank_, stepsPerRank_, psSentPerRank_, psReceivedPerRank_;
  int64_t divergedAt_ = -1;     // the step at which this rank found the training diverged (-1: it did not)
  std::string divergedWhat_;    // what it found there (DivergenceError::subject; empty: the model itself)
  bool modelDiverged_ = false;  // some rank found it by the last evaluate() (decided together there)
  struct Found {
    int64_t step = -1;
    std::string what;
  } found_;                     // trainStep(): the DivergenceError it caught
  int64_t jobDivergedAt_ = -1;  // evaluate(): the first step at which a rank found it, and that rank
  int jobDivergedRank_ = -1;
  // Results of reportTraffic().
  double psBytes_ = 0, sfbBytes_ = 0, predictedPs_ = 0, predictedSfb_ = 0;
  double localBytes_ = 0;  // between the ranks of a machine (--local-ranks), all ranks
  double urgentBytes_ = 0;  // on the urgent connections (--urgent-layers), all ranks
};

}  // namespace poseidon::pt
