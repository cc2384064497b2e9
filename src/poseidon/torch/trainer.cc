// trainRank(): one rank's whole run, in the order its pieces run. The loop is train/rank_run.h; how a
// step synchronizes is the mode's (train/mode.h).
#include "poseidon/torch/trainer.h"

#include <algorithm>
#include <cmath>

#include "poseidon/common/file.h"
#include "poseidon/torch/checkpoint.h"
#include "poseidon/torch/device_staging.h"
#include "poseidon/torch/models.h"
#include "poseidon/torch/train/modes.h"
#include "poseidon/torch/train/rank_run.h"

namespace poseidon::pt {

double defaultLearningRate(int workers, int64_t batch) {
  const double global = static_cast<double>(workers) * static_cast<double>(batch);
  return kBaseLr * std::min(1.0, std::sqrt(global / static_cast<double>(kBaseBatch)));
}

TrainOptions resolveGroupBatch(TrainOptions o, int world) {
  if (o.groupBatch <= 0) return o;
  if (o.groups <= 0) {
    throw InvalidArgument("--group-batch splits each compute group's batch over its members: it needs --groups");
  }
  if (world % o.groups != 0) return o;  // validateModeOptions says so
  const int64_t members = world / o.groups;
  if (o.groupBatch % members != 0) {
    throw InvalidArgument(strCat("--group-batch ", o.groupBatch, " does not split evenly over the ", members,
                                 " workers of a group (", world, " workers in ", o.groups, " groups)"));
  }
  o.batch = o.groupBatch / members;
  // Each update is the mean gradient of groupBatch images: the default rate is the one for that batch.
  if (o.lr <= 0) o.lr = defaultLearningRate(1, o.groupBatch);
  return o;
}

double warmedUpLearningRate(double lr, int64_t warmupSteps, int64_t iteration) {
  if (warmupSteps <= 0 || iteration >= warmupSteps) return lr;
  return lr * static_cast<double>(iteration + 1) / static_cast<double>(warmupSteps);
}

void checkDevice(const std::string& device) { selectDevice(device, 0); }

void validateTrainOptions(const TrainOptions& options, const TrainHooks& hooks, int world) {
  const TrainOptions o = resolveGroupBatch(options, world);
  validateRankOptions(o, hooks, world);
  const AnyNet net = makeModel(o.model);
  if (o.mergedFc) checkMergedFcModel(net, o.model);
  if (!o.checkpointDir.empty()) {
    DirectoryLock::checkFree(o.checkpointDir, "checkpoint directory");  // rank 0 takes it
    checkCheckpointLayout(o.checkpointDir, checkpointLayout(o, world));
  }
}

int trainRank(const TrainOptions& options, const TrainHooks& hooks, const RankEnv& env) {
  const TrainOptions o = resolveGroupBatch(options, env.worldSize);
  RankRun run(o, hooks, env);
  run.resume();
  run.connect();
  run.printPlan();
  run.train();
  run.reportTraffic();
  run.printResult();
  if (run.exitCode() != 0) {
    // A diverged job: rank 0's outputs before the final barrier, so that a launcher that stops the
    // other ranks once one exits with an error (poseidon launch) finds them written.
    run.evaluateCurve();
    run.writeOutputs();
    run.finish();
    return run.exitCode();
  }
  run.finish();
  run.evaluateCurve();
  run.writeOutputs();
  return 0;
}

}  // namespace poseidon::pt
