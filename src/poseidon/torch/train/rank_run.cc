#include "poseidon/torch/train/rank_run.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "poseidon/common/error.h"
#include "poseidon/common/log.h"
#include "poseidon/coordinator/book.h"
#include "poseidon/launch/env.h"
#include "poseidon/torch/device_staging.h"
#include "poseidon/torch/finite.h"
#include "poseidon/torch/train/outputs.h"

namespace poseidon::pt {

torch::Tensor batchImages(const data::Dataset& d, const std::vector<int64_t>& idx, size_t begin, size_t end) {
  const int64_t n = static_cast<int64_t>(end - begin), px = static_cast<int64_t>(d.rows) * d.cols;
  torch::Tensor x = torch::empty({n, 1, d.rows, d.cols});
  float* out = x.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) data::normalizeInto(d, idx[begin + i], out + i * px);
  return x;
}

torch::Tensor batchLabels(const data::Dataset& d, const std::vector<int64_t>& idx, size_t begin, size_t end) {
  torch::Tensor y = torch::empty({static_cast<int64_t>(end - begin)}, torch::kLong);
  auto* out = y.data_ptr<int64_t>();
  for (size_t i = begin; i < end; ++i) out[i - begin] = d.labels[idx[i]];
  return y;
}

DistributedOptions RankContext::jobOptions() const {
  DistributedOptions d = DistributedOptions::fromEnvironment(env, o.secret);
  if (!o.transportSecurity.empty()) d.node.security = parseTransportSecurity(o.transportSecurity);
  if (!o.bindHost.empty()) d.node.van.bindHost = o.bindHost;
  d.node.timeout = std::chrono::milliseconds(o.timeoutMs);
  d.node.threads = o.syncThreads;
  d.node.van.receiveBufferBytes = o.tcpRcvbuf;
  d.node.groupPushWindow = o.groupPushWindow;
  d.node.ioThreads = o.ioThreads;
  d.node.sumThreads = o.sumThreads;
  d.node.van.sendWindowBytes = o.sendWindowBytes;
  d.node.van.urgentLayers = o.urgentLayers;
  d.node.van.egressQueue = o.hostQueue;
  d.node.settings.batch = o.batch;
  d.node.settings.pairBytes = o.pairBytes;
  if (o.servers > 0) d.node.role = env.rank < o.servers ? Role::kBoth : Role::kWorker;
  d.node.settings.policy = o.scheme;
  d.node.settings.wire = o.wire;
  d.node.settings.localRanks = o.localRanks;
  d.node.settings.startIteration = startIteration;
  d.node.tracer = tracer.get();
  d.node.logFailure = false;  // the rank's error line (cli/main.cc) says it, once
  d.node.settings.momentum = static_cast<float>(o.momentum);
  d.node.settings.weightDecay = static_cast<float>(o.weightDecay);
  d.learningRate = static_cast<float>(warmedUpLearningRate(lr, o.warmupSteps, startIteration));
  d.overlap = o.overlap;
  return d;
}

void RankContext::slowDown() const {
  if (rank == hooks.slowRank && hooks.slowMs > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(hooks.slowMs));
  }
}

// Option values no rank can train with (the CLI checks the launcher-level ones).
CheckpointMeta checkpointLayout(const TrainOptions& o, int world) {
  CheckpointMeta m;
  m.model = o.model;
  m.workers = world;
  m.batch = o.batch;
  m.seed = o.seed;
  m.trainLimit = o.trainLimit;
  m.namedAsFlags = true;  // poseidon train's user changes its flags
  if (o.groups > 0) {  // compute groups (and merged FC, which runs in them)
    m.groups = o.groups;
    m.regroup = o.regroup;
  }
  return m;
}

void validateRankOptions(const TrainOptions& o, const TrainHooks& hooks, int world) {
  if (o.batch < 1) throw InvalidArgument(strCat("--batch must be at least 1, got ", o.batch));
  if (o.epochs < 1) throw InvalidArgument(strCat("--epochs must be at least 1, got ", o.epochs));
  if (!(o.lr >= 0)) throw InvalidArgument(strCat("--lr must be positive (or 0: the default), got ", o.lr));
  if (o.warmupSteps < 0) throw InvalidArgument(strCat("--warmup-steps must be at least 0, got ", o.warmupSteps));
  if (o.momentum < 0 || o.momentum >= 1)
    throw InvalidArgument(strCat("--momentum must be in [0, 1), got ", o.momentum));
  // The test hooks name a rank: one outside the job would make a fault or a slow rank that never
  // happens, and the test that set it pass for nothing.
  const struct {
    const char* variable;
    int rank;
  } named[] = {{"POSEIDON_FAULT", hooks.faultRank}, {"POSEIDON_SLOW", hooks.slowRank}};
  for (const auto& n : named) {
    if (n.rank >= world) {
      throw InvalidArgument(strCat(n.variable, " names rank ", n.rank, ", but the job's ranks are 0..", world - 1));
    }
  }
  if (hooks.faultRank >= 0 && o.maxSteps > 0 && hooks.faultStep >= o.maxSteps) {
    throw InvalidArgument(strCat("POSEIDON_FAULT fires at iteration ", hooks.faultStep, ", but --max-steps ", o.maxSteps,
                                 " ends the job before it (iterations 0..", o.maxSteps - 1, ")"));
  }
  // Settings that exclude each other (the adam baseline with --groups, --drop-stragglers, a 16-bit
  // --wire or --local-ranks, ...): the coordinator refuses them too, but only once every rank has
  // started, loaded the data and met; here train --workers says it before any worker starts.
  JobSettings settings;
  settings.policy = o.scheme;
  settings.wire = o.wire;
  settings.localRanks = o.localRanks;
  settings.groups = o.groups;
  settings.dropStragglers = o.dropStragglers;
  if (const std::string why = settings.conflictError(); !why.empty()) throw InvalidArgument(why);
  ComputePad::validate(hooks);
  AccuracyCurve::validate(hooks);
  validateModeOptions(o, world);
}

namespace {

// LibTorch's intra-op threads: this machine's cores shared by its local workers, unless --threads. The
// workers on this host are LOCAL_WORLD_SIZE where a launcher says it (poseidon launch, train --workers,
// torchrun): 2 hosts x 8 ranks on 16 cores each give every rank 2 threads, not 16 / 16. Elsewhere
// (mpirun, Slurm) the whole job is taken to share this host, as the smaller share never oversubscribes.
int setTorchThreads(const TrainOptions& o, int world) {
  const char* local = std::getenv("LOCAL_WORLD_SIZE");
  const int onThisHost = local && *local ? std::min(world, localWorldSizeFromEnvironment()) : world;
  const int localWorkers = std::max(1, std::min(onThisHost, static_cast<int>(std::thread::hardware_concurrency())));
  int threads =
      o.threads > 0 ? o.threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / localWorkers);
  torch::set_num_threads(threads);
  return threads;
}

}  // namespace

// Loss and throughput of one epoch, as the progress lines and the summary report them.
struct RankRun::EpochStats {
  Clock::time_point start;
  double lossSum = 0;
  int64_t lossCount = 0;
  int64_t images = 0;  // over all ranks
  double meanLoss() const { return lossSum / std::max<int64_t>(lossCount, 1); }
};

RankRun::RankRun(const TrainOptions& o, const TrainHooks& hooks, const RankEnv& env)
    : o_(o), hooks_(hooks), c_(o, hooks, env), warmupSteps_(o.warmupSteps), curve_(hooks, env.rank == 0) {
  setLogPrefix("rank " + std::to_string(c_.rank));
  validateRankOptions(o_, hooks_, c_.world);
  checkOutputPaths(o_, c_.rank);
  // --checkpoint's lock, before the data loads: a directory another job uses is refused within a second.
  if (c_.lead && !o_.checkpointDir.empty()) {
    checkpointLock_ = std::make_unique<DirectoryLock>(o_.checkpointDir, "checkpoint directory",
                                                      strCat("poseidon train (rank 0 of ", c_.world, ")"));
  }
  torchThreads_ = setTorchThreads(o_, c_.world);
  torch::manual_seed(static_cast<int64_t>(o_.seed));

  const std::string dataDir = o_.dataDir.empty() ? data::kDefaultFashionMnistDir : o_.dataDir;
  train_ = data::loadFashionMnist(dataDir, true);
  test_ = data::loadFashionMnist(dataDir, false);
  if (o_.trainLimit > 0 && o_.trainLimit < train_.count) train_.count = o_.trainLimit;

  c_.lr = o.lr > 0 ? o.lr : defaultLearningRate(c_.world, o.batch);
  c_.net = makeModel(o_.model);
  c_.device = selectDevice(o_.device, env.localRank);
  if (!c_.device.is_cpu()) c_.net.module->to(c_.device);
  mode_ = chooseMode(c_);
  const auto sgd = torch::optim::SGDOptions(c_.lr).momentum(o_.momentum).weight_decay(o_.weightDecay);
  c_.optimizer = std::make_unique<torch::optim::SGD>(mode_->trainedParameters(), sgd);
  mode_->optimizerBuilt(sgd);

  const int64_t perRank = (train_.count + c_.world - 1) / c_.world;
  stepsPerEpoch_ = (perRank + o_.batch - 1) / o_.batch;
}

void RankRun::resume() {
  // Every rank reads the checkpoint (the directory must be visible to all
  // ranks); the rendezvous then checks that all ranks resume at the same iteration.
  meta_ = checkpointLayout(o_, c_.world);
  // A damaged checkpoint (a file that fails its checksum) is skipped for the
  // newest intact one; every rank decides alike from the same files.
  Resumed r = resumeFromNewest(o_.checkpointDir, meta_, *c_.net.module, mode_->stateOptimizer());
  if (c_.lead) {
    for (const auto& w : r.warnings) POSEIDON_LOG(kWarning) << w;
  }
  if (r.path.empty()) {
    // A new directory, or a typo of the one meant: say which, so that a restart from 0 is never silent.
    if (c_.lead && !o_.checkpointDir.empty() && r.warnings.empty()) {
      std::printf("no checkpoint in %s yet: starting from iteration 0\n", o_.checkpointDir.c_str());
      std::fflush(stdout);
    }
    return;
  }
  c_.startIteration = r.meta.iteration;
  resumedFrom_ = r.path;
  checkpointIteration_ = c_.startIteration;
  checkpointedAt_ = c_.startIteration;
  mode_->resumed(r);
  if (c_.lead) {
    const auto start = c_.startIteration;
    std::printf("resuming from %s (iteration %lld: epoch %lld, step %lld)\n", r.path.c_str(),
                static_cast<long long>(start), static_cast<long long>(start / stepsPerEpoch_ + 1),
                static_cast<long long>(start % stepsPerEpoch_));
    std::fflush(stdout);
  }
}

void RankRun::connect() {
  if (!o_.tracePath.empty()) c_.tracer = std::make_unique<Tracer>(c_.rank);
  mode_->connect();
}

void RankRun::printPlan() const {
  if (!c_.lead) return;
  ModelDesc desc = describeModule(*c_.net.module, c_.net.name);
  std::printf(
      "poseidon train: %s (%lld params) on Fashion-MNIST, %d worker%s x batch %lld, %d epochs, lr %g%s, "
      "momentum %g, scheme %s%s%s\n",
      c_.net.name.c_str(), static_cast<long long>(desc.numel()), c_.world, c_.world > 1 ? "s" : "",
      static_cast<long long>(o_.batch), o_.epochs, c_.lr,
      strCat(o_.lr > 0 ? "" : " (for the global batch)",
             warmupSteps_ > 0 ? strCat(", warmed up over ", warmupSteps_, " steps") : std::string())
          .c_str(),
      o_.momentum, schemePolicyName(o_.scheme), mode_->describe().c_str(),
      o_.wire == WirePrecision::kFp32 ? "" : strCat(", ", wirePrecisionName(o_.wire), " wire (lossy)").c_str());
  if (c_.dist) {
    std::printf("\n%-8s %-5s %-12s %-6s %16s\n", "layer", "type", "shape", "scheme", "floats/iter/node");
    for (const auto& p : c_.dist->plan(o_.batch)) {
      std::printf("%-8s %-5s %-12s %-6s %16.0f\n", p.name.c_str(), layerTypeName(p.type), p.shape.c_str(),
                  c_.world == 1 ? "local" : schemeName(p.scheme), c_.world == 1 ? 0.0 : p.floatsPerIteration);
    }
    mode_->printPlanNotes();
    std::printf("\n");
  }
  std::fflush(stdout);
}

void RankRun::settle() {
  try {
    mode_->settle();
  } catch (const DivergenceError& err) {  // every rank finds it here alike (the same mean gradient)
    noteDivergence(err.step(), err.subject());
  }
}

double RankRun::evaluate() {
  settle();
  mode_->gatherModel();
  torch::NoGradGuard guard;
  AnyNet& net = c_.net;
  net.module->eval();
  int64_t correct = 0, seen = 0;
  std::vector<int64_t> idx = data::shardIndices(test_.count, c_.world, c_.rank, 0, 0, /*shuffle=*/false);
  // Padding repeats a few samples on the last ranks; count each sample once.
  size_t limit = std::min<size_t>(idx.size(), static_cast<size_t>((test_.count - c_.rank + c_.world - 1) / c_.world));
  for (size_t b = 0; b < limit; b += kEvalBatch) {
    size_t e = std::min(limit, b + kEvalBatch);
    auto pred = net.forward(c_.onDevice(batchImages(test_, idx, b, e))).argmax(1);
    correct += pred.eq(c_.onDevice(batchLabels(test_, idx, b, e))).sum().item<int64_t>();
    seen += static_cast<int64_t>(e - b);
  }
  net.module->train();
  // Whether the training diverged, decided together: each rank's step of it (its own finding, or a
  // model that is not finite now), 0 for none. Checked before the sum: until rank 0 has sent its part
  // no rank has left, so (merged FC) no FC update is in flight.
  const auto params = net.module->parameters();
  if (divergedAt_ < 0 &&
      !std::all_of(params.begin(), params.end(), [](const torch::Tensor& p) { return allFinite(p); })) {
    noteDivergence(iteration_);
  }
  std::vector<double> mine(2 + static_cast<size_t>(c_.world), 0.0);
  mine[0] = static_cast<double>(correct);
  mine[1] = static_cast<double>(seen);
  mine[2 + static_cast<size_t>(c_.rank)] = divergedAt_ >= 0 ? static_cast<double>(divergedAt_ + 1) : 0.0;
  const std::vector<double> total = c_.allSum(mine);
  modelDiverged_ = false;
  for (int r = 0; r < c_.world; ++r) {
    const auto step = static_cast<int64_t>(total[2 + static_cast<size_t>(r)]) - 1;
    if (step < 0 || (modelDiverged_ && step >= jobDivergedAt_)) continue;
    modelDiverged_ = true;
    jobDivergedAt_ = step;
    jobDivergedRank_ = r;
  }
  return total[0] / total[1];
}

void RankRun::checkpoint(int64_t iteration) {
  if (o_.checkpointDir.empty()) return;
  settle();  // a checkpoint holds the last step's update (and the optimizer's state after it)
  mode_->beforeCheckpoint(meta_);
  const auto params = c_.net.module->parameters();
  if (c_.lead && !std::all_of(params.begin(), params.end(), [](const torch::Tensor& p) { return allFinite(p); })) {
    // A diverged model is not saved: the newest checkpoint stays the last finite one.
    std::printf("checkpoint at step %lld not saved: the model is not finite\n", static_cast<long long>(iteration));
    std::fflush(stdout);
  } else if (c_.lead) {
    // Reported first, so that a restart after a failed save (a full disk) counts this iteration as lost.
    writeProgress(hooks_.progressPath, iteration, checkpointIteration_);
    meta_.iteration = iteration;
    saveCheckpoint(o_.checkpointDir, meta_, *c_.net.module, mode_->stateOptimizer());
    checkpointIteration_ = iteration;
  }
  mode_->afterCheckpoint();
  checkpointedAt_ = iteration;
}

void RankRun::checkpointIfDue() {
  if (o_.checkpointEvery > 0 && iteration_ % o_.checkpointEvery == 0) checkpoint(iteration_);
}

void RankRun::train() {
  iteration_ = c_.startIteration;
  stop_ = maxStepsReached();
  if (stop_ || startEpoch() >= o_.epochs) {
    // Resumed where the job already ended (the same command again): nothing to train, and the report
    // says the checkpoint's own accuracy, not the 0 of a model never evaluated. Every rank resumed at
    // the same iteration (the rendezvous checked), so every rank takes this path and evaluates.
    if (c_.lead) {
      const std::string limit = stop_ ? strCat("--max-steps ", o_.maxSteps)
                                      : strCat("the end of --epochs ", o_.epochs, " (raise --epochs to train on)");
      std::printf("nothing left to train: the checkpoint is at iteration %lld, %s; evaluating it\n",
                  static_cast<long long>(c_.startIteration), limit.c_str());
      std::fflush(stdout);
    }
    trainedNothing_ = true;
    accuracy_ = evaluate();
    return;
  }
  c_.net.module->train();
  for (int epoch = startEpoch(); epoch < o_.epochs && !stop_; ++epoch) {
    EpochStats stats;
    stop_ = trainEpoch(epoch, stats);
    double epochSeconds = secondsSince(stats.start);
    trainSeconds_ += epochSeconds;
    images_ += stats.images;
    accuracy_ = evaluate();
    // evaluate() summed every rank's finding, so every rank stops here, or none. (BSP ranks found it at
    // the same step and left the epoch there; a compute group that found it skipped the rest.)
    if (modelDiverged_) {
      if (divergedAt_ < 0) noteDivergence(iteration_);
      stop_ = true;
    }
    // An epoch that --max-steps or a divergence cut short says so, not "done".
    const int64_t epochStart = int64_t{epoch} * stepsPerEpoch_;
    const bool whole = iteration_ - epochStart >= stepsPerEpoch_;
    const int64_t steps = iteration_ - std::max(epochStart, c_.startIteration);  // this attempt's, as the summary's
    if (c_.lead) {
      const std::string ended =
          whole ? std::string("done")
                : strCat("stopped after ", iteration_ - epochStart, " of ", stepsPerEpoch_, " steps (",
                         modelDiverged_ ? std::string("diverged") : strCat("--max-steps ", o_.maxSteps), ")");
      std::printf("epoch %d/%d %s in %.1f s: train loss %.4f, test accuracy %.2f%%\n", epoch + 1, o_.epochs,
                  ended.c_str(), epochSeconds, stats.meanLoss(), 100 * accuracy_);
      std::fflush(stdout);
    }
    epochsJson_.push_back({{"epoch", epoch + 1},
                           {"steps", steps},
                           {"complete", whole},
                           {"train_loss", stats.meanLoss()},
                           {"test_accuracy", accuracy_},
                           {"seconds", epochSeconds}});
    // Per-epoch checkpoints, unless --checkpoint-every already took this one.
    if (!stop_ && o_.checkpointEvery <= 0) checkpoint(iteration_);
  }
  // Ended off the checkpoints' beat (--max-steps mid-epoch, or the last epoch between two
  // --checkpoint-every): saved where it ended, so that the same command says "nothing left to train"
  // and one with more steps or epochs goes on from here, rather than redoing the steps since the last
  // checkpoint (an epoch shorter than --checkpoint-every left none at all). Every rank ends at the same
  // iteration and evaluate() decided together whether the model diverged; a diverged one is not saved.
  if (!modelDiverged_ && iteration_ != checkpointedAt_) checkpoint(iteration_);
}

bool RankRun::trainEpoch(int epoch, EpochStats& stats) {
  std::vector<int64_t> idx = data::shardIndices(train_.count, c_.world, c_.rank, o_.seed, epoch);
  stats.start = Clock::now();
  int nextReport = 1;
  const int64_t firstStep = epoch == startEpoch() ? c_.startIteration % stepsPerEpoch_ : 0;
  for (int64_t s = firstStep; s < stepsPerEpoch_; ++s) {
    if (divergedAt_ >= 0) {
      // Compute groups: this rank's model is no longer finite, so the rest of the epoch is skipped, not
      // run. The iterations still pass the collectives other ranks make (a compute group's checkpoint is
      // one), so that a group that has not seen it yet can finish the epoch; train() stops the job.
      ++iteration_;
      checkpointIfDue();
      if (maxStepsReached()) return true;
      continue;
    }
    injectFault();
    size_t b = static_cast<size_t>(s * o_.batch), e = std::min(idx.size(), b + static_cast<size_t>(o_.batch));
    auto stepBegin = Clock::now();
    const StepOutcome outcome = trainStep(idx, b, e, stats);
    if (outcome == StepOutcome::kDiverged) {
      // Every rank of a BSP job holds the same mean gradient, so every rank found it at this step
      // (the overlapped step: at the last step's, when this forward applied it): all leave the epoch
      // here, with the model of the step before. It ran, so it counts.
      trainClock_ += secondsSince(stepBegin);
      steps_ += found_.step - iteration_;
      iteration_ = found_.step;
      noteDivergence(found_.step, found_.what);
      return true;
    }
    if (outcome == StepOutcome::kDeadRound) {
      noteDivergence(iteration_, found_.what);
      // Compute groups: this round's pull was the first model to show the last step's update, and it
      // is not finite. The divergence is that step's, as BSP finds it; this round ran only to keep
      // the shards' rounds whole, and is skipped like the rest of the epoch (not on the clock).
      ++iteration_;
      checkpointIfDue();
      if (maxStepsReached()) return true;
      continue;
    }
    trainClock_ += secondsSince(stepBegin);
    ++steps_;
    ++iteration_;
    if (curve_.due(iteration_)) recordCurvePoint(iteration_);
    checkpointIfDue();
    if (c_.lead) writeProgress(hooks_.progressPath, iteration_, checkpointIteration_);
    if (maxStepsReached()) return true;
    printProgress(epoch, s, stats, nextReport);
  }
  return false;
}

void RankRun::noteDivergence(int64_t step, const std::string& what) {
  if (divergedAt_ >= 0) return;
  divergedAt_ = step;
  divergedWhat_ = what;
  if (c_.lead && o_.allowDivergence) {
    std::printf("step %lld: the training diverged (a NaN or an infinity): %s (--allow-divergence)\n",
                static_cast<long long>(step), mode_->afterDivergence());
    std::fflush(stdout);
  }
  // The curve ends with the model at the divergence (tested like the others), even between
  // --curve-every steps: BSP's is the model before the step whose mean gradient was not finite (that
  // update is not applied). In group mode the point of this step, if it was due, holds the model the
  // step started from (the round's pull): the diverged model, seen only in the next round's pull,
  // replaces it.
  if (curve_.on() && !curve_.due(step)) {
    recordCurvePoint(step);
  } else if (curve_.on() && mode_->divergedModelSeenLater() && curve_.has(step)) {
    curve_.replaceLast(mode_->modelCopy());
  }
}

void RankRun::injectFault() const {
  if (c_.rank != hooks_.faultRank || iteration_ != hooks_.faultStep || hooks_.restartCount != 0) return;
  std::fprintf(stderr, "rank %d: fault injection (POSEIDON_FAULT): signal %d at iteration %lld\n", c_.rank,
               hooks_.faultSignal, static_cast<long long>(iteration_));
  std::fflush(stderr);
  std::raise(hooks_.faultSignal);
}

RankRun::StepOutcome RankRun::trainStep(const std::vector<int64_t>& idx, size_t b, size_t e, EpochStats& stats) {
  // The warm-up: this step's learning rate (every rank alike, from the job's iteration).
  const double lr = warmedUpLearningRate(c_.lr, warmupSteps_, iteration_);
  static_cast<torch::optim::SGDOptions&>(c_.optimizer->param_groups().at(0).options()).lr(lr);
  mode_->beginStep(lr);
  torch::Tensor loss;
  try {
    if (mode_->skipStep()) {
      stats.images += static_cast<int64_t>(e - b) * c_.world;
      return StepOutcome::kTrained;
    }
    torch::Tensor x = c_.onDevice(batchImages(train_, idx, b, e)), y = c_.onDevice(batchLabels(train_, idx, b, e));
    StepTimes times;
    loss = mode_->compute(x, y, times);
    c_.pad.record(times.forwardMs, times.backwardMs);
    mode_->update(iteration_);
  } catch (const DivergenceError& err) {
    found_ = {err.step(), err.subject()};
    // Compute groups: the round's pull (the model after the last step's update, the first look at it;
    // the same for every member of the group) is not finite. A dead round: its push went out anyway,
    // as every member pushes every round it pulled.
    if (mode_->divergenceIsDeadRound()) return StepOutcome::kDeadRound;
    // BSP: the step ran; its loss (likely not finite) is the last the epoch's and the curve's means see.
    // The overlapped step found the last step's gradient at this forward: this step did not run.
    if (loss.defined() && err.step() == iteration_ + 1) addLoss(loss.item<double>(), stats);
    return StepOutcome::kDiverged;
  }
  addLoss(loss.item<double>(), stats);
  stats.images += static_cast<int64_t>(e - b) * c_.world;
  return StepOutcome::kTrained;
}

void RankRun::addLoss(double loss, EpochStats& stats) {
  stats.lossSum += loss;
  ++stats.lossCount;
  curve_.addLoss(loss);
}

// A progress line at every tenth of the epoch (rank 0, unless --quiet).
void RankRun::printProgress(int epoch, int64_t s, const EpochStats& stats, int& nextReport) const {
  if (!c_.lead || o_.quiet || (s + 1) * 10 < nextReport * stepsPerEpoch_) return;
  int pct = static_cast<int>(100 * (s + 1) / stepsPerEpoch_);
  std::string bar(static_cast<size_t>(pct / 5), '#');
  bar.resize(20, '.');
  std::printf("epoch %d/%d [%s] %3d%%  loss %.4f  %.0f img/s\n", epoch + 1, o_.epochs, bar.c_str(), pct,
              stats.lossSum / stats.lossCount, stats.images / secondsSince(stats.start));
  std::fflush(stdout);
  while (nextReport * stepsPerEpoch_ <= (s + 1) * 10) ++nextReport;
}

void RankRun::recordCurvePoint(int64_t step) {
  settle();  // every rank alike: the copy is the model after this step
  if (c_.lead && !curve_.has(step))
    curve_.add(step, trainClock_, mode_->modelCopy());  // (settle may have noted a divergence)
}

}  // namespace poseidon::pt
