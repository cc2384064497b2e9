#include "poseidon/torch/trainer.h"

#include <fcntl.h>
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "poseidon/common/error.h"
#include "poseidon/common/file.h"
#include "poseidon/common/log.h"
#include "poseidon/common/trace.h"
#include "poseidon/data/fashion_mnist.h"
#include "poseidon/torch/checkpoint.h"
#include "poseidon/torch/distributed.h"
#include "poseidon/torch/finite.h"
#include "poseidon/torch/merged_fc.h"
#include "poseidon/torch/models.h"
#include "poseidon/transport/van.h"

namespace poseidon::pt {

namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

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

// Evaluation's batch (forward only; the kernels may sum in another order for another size, so an
// image's logits can differ in the last bits, not more). Measured on this
// machine's LibTorch (no MKL; oneDNN): LeNet over the 10,000 test images takes about 2.9 s of two
// cores in batches of 250 and 5.1 s in batches of 1000 (a batch's activations leave the cache).
constexpr size_t kEvalBatch = 250;

std::string human(double bytes) {
  char b[64];
  if (bytes >= 1e9) std::snprintf(b, sizeof b, "%.2f GB", bytes / 1e9);
  else if (bytes >= 1e6) std::snprintf(b, sizeof b, "%.2f MB", bytes / 1e6);
  else std::snprintf(b, sizeof b, "%.1f kB", bytes / 1e3);
  return b;
}

// Progress for a supervising launcher (POSEIDON_PROGRESS_FILE): where the
// job is and where its newest checkpoint is, so a restart can say what was lost.
void writeProgress(const std::string& path, int64_t iteration, int64_t checkpointIteration) {
  if (path.empty()) return;
  try {
    writeFileAtomically(
        path, nlohmann::json{{"iteration", iteration}, {"checkpoint_iteration", checkpointIteration}}.dump() + "\n",
        "progress file");
  } catch (const IoError&) {
    // Best effort: without it a restart only says less about what was lost.
  }
}

// Option values no rank can train with (the CLI checks the launcher-level ones).
void validateOptions(const TrainOptions& o, int world) {
  if (o.batch < 1) throw InvalidArgument(strCat("--batch must be at least 1, got ", o.batch));
  if (o.epochs < 1) throw InvalidArgument(strCat("--epochs must be at least 1, got ", o.epochs));
  if (!(o.lr >= 0)) throw InvalidArgument(strCat("--lr must be positive (or 0: the default), got ", o.lr));
  if (o.warmupSteps < 0) throw InvalidArgument(strCat("--warmup-steps must be at least 0, got ", o.warmupSteps));
  if (o.momentum < 0 || o.momentum >= 1) throw InvalidArgument(strCat("--momentum must be in [0, 1), got ", o.momentum));
  if (o.padMs < 0) throw InvalidArgument(strCat("--pad-ms must be at least 0, got ", o.padMs));
  if (o.padJitterMs < 0) throw InvalidArgument(strCat("--pad-jitter-ms must be at least 0, got ", o.padJitterMs));
  if (o.padJitterMs > 0 && o.padMs <= 0) throw InvalidArgument("--pad-jitter-ms needs --pad-ms");
  if (o.curveEvery < 0) throw InvalidArgument(strCat("--curve-every must be at least 0, got ", o.curveEvery));
  if (o.curveLossSamples < 0) {
    throw InvalidArgument(strCat("--curve-loss-samples must be at least 0, got ", o.curveLossSamples));
  }
  if (o.curveLossSamples > 0 && o.curveEvery == 0) {
    throw InvalidArgument("--curve-loss-samples scores the curve's model copies: it needs --curve-every");
  }
  if (o.plain && world != 1) throw InvalidArgument("--plain runs the plain LibTorch loop and needs --workers 1");
  if (o.groups > 0) {
    if (o.plain) throw InvalidArgument("--groups needs Poseidon; --plain is the loop without it");
    if (world % o.groups != 0) {
      throw InvalidArgument(strCat("--groups ", o.groups, " must divide the ", world, " workers"));
    }
    if (o.dropStragglers > 0) throw InvalidArgument("--groups and --drop-stragglers cannot be combined");
    if (o.regroup && o.checkpointDir.empty()) {
      throw InvalidArgument("--regroup resumes a checkpoint with another number of groups: it needs --checkpoint");
    }
  } else if (o.mergedFc) {
    throw InvalidArgument(
        "--merged-fc runs the conv layers in compute groups and the FC layers on one FC server: "
        "it needs --groups");
  } else if (o.staleness >= 0) {
    throw InvalidArgument("--staleness bounds the lead of compute groups: it needs --groups");
  } else if (o.regroup) {
    throw InvalidArgument("--regroup resumes a compute-group checkpoint with another number of groups: it needs --groups");
  }
  if (o.overlapForward) {
    // The overlapped step is BSP's (DistributedModel::submitStep): every rank applies the same mean.
    const char* other = o.groups > 0           ? "--groups (each round's forward pulls the shards' model)"
                        : o.dropStragglers > 0 ? "--drop-stragglers (a skipped step has no forward to apply it)"
                        : o.plain              ? "--plain (nothing is synchronized)"
                                               : nullptr;
    if (other) throw InvalidArgument(strCat("--overlap-forward cannot be combined with ", other));
  }
  if (o.sendWindowBytes > 0 && o.sendWindowBytes < Van::kMinSendWindow) {
    throw InvalidArgument(strCat("--send-window must be 0 (FIFO links) or at least ", Van::kMinSendWindow,
                                 " bytes (smaller ones cut messages into too many fragments), got ",
                                 o.sendWindowBytes));
  }
  if (o.sendWindowBytes > 0) {
    // The priority links order a BSP iteration's syncs; group rounds pull and push whole models.
    const char* other = o.groups > 0 ? "--groups (compute groups pull and push whole rounds, not layer by layer)"
                        : o.plain    ? "--plain (nothing is synchronized)"
                                     : nullptr;
    if (other) throw InvalidArgument(strCat("--send-window cannot be combined with ", other));
  }
}

// Output paths are checked before the first step, by the rank that will write
// there: a typo in --summary should cost seconds, not the whole run. Creating
// (and removing) a file where the output goes is the one check that sees
// everything: a missing directory, permissions, a read-only or full file system.
void probeDirectory(const std::string& flag, const std::string& path, const std::filesystem::path& dir, int rank) {
  std::filesystem::path probe = dir / strCat(".poseidon-probe-", rank, "-", ::getpid());
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    throw InvalidArgument(
        strCat(flag, " ", path, ": cannot create files in ", dir.string(), ": ", std::strerror(errno)));
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

void checkOutputFile(const std::string& flag, const std::string& path, int rank) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw InvalidArgument(strCat(flag, " ", path, ": is a directory, expected a file name"));
  }
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  probeDirectory(flag, path, dir.empty() ? std::filesystem::path(".") : dir, rank);
}

void checkOutputPaths(const TrainOptions& o, int rank) {
  if (rank == 0 && !o.checkpointDir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.checkpointDir, ec);  // saveCheckpoint would create it anyway
    if (ec) throw InvalidArgument(strCat("--checkpoint ", o.checkpointDir, ": cannot create it: ", ec.message()));
    probeDirectory("--checkpoint", o.checkpointDir, o.checkpointDir, rank);
  }
  if (rank == 0 && !o.summaryPath.empty()) checkOutputFile("--summary", o.summaryPath, rank);
  if (rank == 0 && !o.saveParamsPath.empty()) checkOutputFile("--save-params", o.saveParamsPath, rank);
  // Every rank writes <trace>.rank<R> next to --trace (merged into it at the end).
  if (!o.tracePath.empty()) checkOutputFile("--trace", o.tracePath, rank);
}

// LibTorch's intra-op threads: this machine's cores shared by its local workers, unless --threads.
void setTorchThreads(const TrainOptions& o, int world) {
  const int localWorkers = std::max(1, std::min(world, static_cast<int>(std::thread::hardware_concurrency())));
  int threads = o.threads > 0 ? o.threads
                              : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / localWorkers);
  torch::set_num_threads(threads);
}

DistributedOptions distributedOptions(const TrainOptions& o, const RankEnv& env, int64_t startIteration,
                                      double lr, Tracer* tracer) {
  DistributedOptions d = DistributedOptions::fromEnvironment(env, o.secret);
  if (!o.bindHost.empty()) d.node.bindHost = o.bindHost;
  d.node.timeout = std::chrono::milliseconds(o.timeoutMs);
  d.node.threads = o.syncThreads;
  d.node.receiveBufferBytes = o.tcpRcvbuf;
  d.node.ioThreads = o.ioThreads;
  d.node.sendWindowBytes = o.sendWindowBytes;
  d.node.settings.batch = o.batch;
  d.node.settings.pairBytes = o.pairBytes;
  d.node.settings.policy = o.scheme;
  d.node.settings.wire = o.wire;
  d.node.settings.startIteration = startIteration;
  d.node.tracer = tracer;
  d.node.settings.dropStragglers = o.dropStragglers;
  d.node.settings.stragglerTimeoutMs = o.stragglerTimeoutMs;
  d.node.settings.groups = o.groups;
  d.node.settings.staleness = o.staleness;
  d.node.settings.momentum = static_cast<float>(o.momentum);
  d.node.settings.weightDecay = static_cast<float>(o.weightDecay);
  d.learningRate = static_cast<float>(lr);
  d.overlap = o.overlap;
  return d;
}

// Loss and throughput of one epoch, as the progress lines and the summary report them.
struct EpochStats {
  Clock::time_point start;
  double lossSum = 0;
  int64_t lossCount = 0;
  int64_t images = 0;  // over all ranks
  double meanLoss() const { return lossSum / std::max<int64_t>(lossCount, 1); }
};

// One rank's run. trainRank() calls the pieces in order; each does one thing.
// SGD's momentum buffers, which LibTorch keys by the parameter's TensorImpl (compute-group mode keeps
// the shards' buffers there, so a checkpoint saves them in optimizer.pt and a resume reads them back).
std::string sgdStateKey(const torch::Tensor& p) { return c10::guts::to_string(p.unsafeGetTensorImpl()); }

void setMomentumBuffers(torch::optim::SGD& optimizer, const std::vector<torch::Tensor>& buffers) {
  const auto& params = optimizer.param_groups().at(0).params();
  POSEIDON_ENFORCE_EQ(params.size(), buffers.size(), "momentum buffers for the optimizer's parameters");
  for (size_t i = 0; i < params.size(); ++i) {
    auto state = std::make_unique<torch::optim::SGDParamState>();
    state->momentum_buffer(buffers[i].view(params[i].sizes()));
    optimizer.state()[sgdStateKey(params[i])] = std::move(state);
  }
}

std::vector<torch::Tensor> momentumBuffers(torch::optim::SGD& optimizer) {
  std::vector<torch::Tensor> out;
  for (const auto& p : optimizer.param_groups().at(0).params()) {
    auto it = optimizer.state().find(sgdStateKey(p));
    out.push_back(it == optimizer.state().end()
                      ? torch::zeros_like(p)
                      : static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer().contiguous());
  }
  return out;
}

class RankRun {
 public:
  // Checks the options and output paths, seeds LibTorch, loads the data and builds the model and optimizer.
  RankRun(const TrainOptions& o, const RankEnv& env);
  // Resumes from the newest intact checkpoint in --checkpoint, if any (warning about damaged newer ones).
  void resume();
  // Joins the job (unless --plain): the DistributedModel with this rank's options.
  void connect();
  // Rank 0: the job line and the per-layer plan.
  void printPlan() const;
  // The epoch loop: trains, evaluates after every epoch, checkpoints.
  void train();
  // Straggler drops and bytes on the wire over all ranks (collectives: every rank calls it).
  void reportTraffic();
  // Rank 0: final accuracy, throughput and wall time.
  void printResult() const;
  // --curve-every: evaluates rank 0's model copies on the whole test set (after finish(), so
  // that no other rank waits on it).
  void evaluateCurve();
  // --save-params, the trace of this rank, --summary.
  void writeOutputs() const;
  // kExitDiverged on every rank when the job diverged (and --allow-divergence was not given), else 0.
  int exitCode() const { return modelDiverged_ && !o_.allowDivergence ? kExitDiverged : 0; }
  void finish() {
    // Every worker's last round was served before the collectives of reportTraffic().
    if (mergedFc_) mergedFc_->stop();
    if (dist_) dist_->finish();
  }

 private:
  // Returns true when --max-steps was reached inside the epoch.
  bool trainEpoch(int epoch, EpochStats& stats);
  // One SGD step on batch [b, e) of idx; adds its loss and images to stats.
  // One step. kDiverged: its mean gradient was not finite (every rank of a BSP job finds it at this
  // step); kDeadRound: compute groups, the round's pull showed a model that is not finite (the round
  // ran, its push went out, it is not counted).
  enum class StepOutcome { kTrained, kDiverged, kDeadRound };
  StepOutcome trainStep(const std::vector<int64_t>& idx, size_t b, size_t e, EpochStats& stats);
  // The step's forward, pad (padBeforeBackward) and backward, timed (ms, the pad left out); returns the loss.
  torch::Tensor localStep(const torch::Tensor& x, const torch::Tensor& y, double& forwardMs, double& backwardMs);
  // --pad-ms: sleeps what is left of the modeled compute after `forwardMs` and the last backward;
  // returns the ms slept.
  double padBeforeBackward(double forwardMs);
  // Merged FC: the features' forward; the FC server's loss and gradient; the features' backward.
  torch::Tensor mergedStep(const torch::Tensor& x, const torch::Tensor& y, double& forwardMs, double& backwardMs);
  // Merged FC: the model without its FC layers (what the shards hold) and the FC layers' parameters.
  ModelParts featureParts() const;
  bool isClassifierParam(const torch::Tensor& p) const;
  // The optimizer whose state a checkpoint holds (every parameter's).
  torch::optim::SGD& stateOptimizer() { return checkpointOptimizer_ ? *checkpointOptimizer_ : *optimizer_; }
  int startEpoch() const { return static_cast<int>(startIteration_ / stepsPerEpoch_); }
  void injectFault() const;
  void printProgress(int epoch, int64_t s, const EpochStats& stats, int& nextReport) const;
  // Test accuracy over all ranks' shards of the test set.
  double evaluate();
  // --overlap-forward: applies a pending step now (before the model is read: evaluation, checkpoint,
  // curve copy); the next forward then has nothing to apply. A divergence found there is noted.
  void applyPending();
  static bool finite(const std::vector<torch::Tensor>& params);
  static std::vector<torch::Tensor> gradients(const std::vector<torch::Tensor>& params);
  // A step's loss into the epoch's mean and (rank 0, --curve-every) the curve's.
  void addLoss(double loss, EpochStats& stats);
  // This rank found the training diverged at `step` (what: the DivergenceError's message, if any):
  // records it, and a curve point there; with --allow-divergence rank 0 says so at once.
  void noteDivergence(int64_t step, const std::string& what = "");
  // Rank 0: the line that says where the job diverged and what to try.
  std::string divergenceLine() const;
  std::vector<torch::Tensor> modelCopy();  // rank 0's whole model (merged FC: the FC server's layers too)
  void checkpoint(int64_t iteration);
  void reportStragglers();
  void reportGroups();
  // --pad-ms: every rank's overruns and largest real compute (a collective).
  void reportPadding();
  // --curve-every: rank 0 copies its model and the loss since the last copy.
  void recordCurvePoint(int64_t step);
  double imagesPerSecond() const { return trainSeconds_ > 0 ? images_ / trainSeconds_ : 0; }
  void saveParams() const;
  nlohmann::json summaryJson() const;
  nlohmann::json curveJson() const;

  const TrainOptions& o_;
  const RankEnv& env_;
  const Clock::time_point wallStart_ = Clock::now();
  const int rank_, world_;
  const bool lead_;
  const double lr_;            // --lr, or the default for this global batch
  const int64_t warmupSteps_;  // --warmup-steps, or the default
  data::Dataset train_, test_;
  AnyNet net_;
  std::unique_ptr<torch::optim::SGD> optimizer_;
  int64_t stepsPerEpoch_ = 0;
  CheckpointMeta meta_;
  int64_t startIteration_ = 0, checkpointIteration_ = -1;
  std::unique_ptr<Tracer> tracer_;
  std::unique_ptr<DistributedModel> dist_;
  // Merged FC: the FC layers' parameters (run by rank 0's server; destroyed before dist_'s node).
  std::vector<torch::Tensor> classifierParams_;
  // Merged FC: SGD over every parameter, for the checkpoint's optimizer.pt only (laid out as without
  // merged FC): the shards' momentum for the conv layers, the FC server's for the FC layers.
  std::unique_ptr<torch::optim::SGD> checkpointOptimizer_;
  std::vector<torch::Tensor> fcMomentum_;  // a resumed checkpoint's, for the FC server
  // Merged FC: every rank's side of the FC server, and rank 0's server (destroyed before dist_).
  std::unique_ptr<MergedFc> mergedFc_;
  int64_t fcUpdates_ = 0;
  double fcBusySeconds_ = 0;
  // Results of the epoch loop.
  nlohmann::json epochsJson_ = nlohmann::json::array();
  double accuracy_ = 0, trainSeconds_ = 0;
  int64_t steps_ = 0, images_ = 0, iteration_ = 0;
  bool stop_ = false;
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
  std::vector<double> dropped_, skipped_;
  // Compute-group mode: the shards' momentum and version clock from the checkpoint resumed.
  std::vector<torch::Tensor> groupMomentum_;
  int64_t groupVersion_ = 0;
  // Results of reportGroups().
  nlohmann::json stalenessHistogram_ = nlohmann::json::object();
  int64_t maxGroupLead_ = 0;
  // Time-to-accuracy: the training clock (seconds in training steps), compute padding, the curve.
  double trainClock_ = 0;
  int64_t padOverruns_ = 0;
  double maxComputeMs_ = 0, computeMsSum_ = 0, lastBackwardMs_ = 0;
  // --overlap-forward with --pad-ms: each gated layer's share of the real forward time, measured on the
  // last step (empty before the first): where the modeled forward's time goes (padForwardShare).
  std::vector<double> forwardShare_;
  std::mt19937_64 padRandom_;  // --pad-jitter-ms, seeded per rank
  std::vector<double> overrunsPerRank_, maxComputeMsPerRank_;
  double meanComputeMs_ = 0;
  struct CurvePoint {
    int64_t iteration;
    double seconds, trainLoss, testAccuracy = -1, sampleLoss = -1;
    std::vector<torch::Tensor> params;
  };
  std::vector<CurvePoint> curve_;
  double curveLossSum_ = 0;
  int64_t curveLossCount_ = 0;
};

RankRun::RankRun(const TrainOptions& o, const RankEnv& env)
    : o_(o),
      env_(env),
      rank_(env.rank),
      world_(env.worldSize),
      lead_(env.rank == 0),
      lr_(o.lr > 0 ? o.lr : defaultLearningRate(env.worldSize, o.batch)),
      warmupSteps_(o.warmupSteps) {
  setLogPrefix("rank " + std::to_string(rank_));
  validateOptions(o_, world_);
  checkOutputPaths(o_, rank_);
  setTorchThreads(o_, world_);
  torch::manual_seed(static_cast<int64_t>(o_.seed));

  const std::string dataDir = o_.dataDir.empty() ? data::kDefaultFashionMnistDir : o_.dataDir;
  train_ = data::loadFashionMnist(dataDir, true);
  test_ = data::loadFashionMnist(dataDir, false);
  if (o_.trainLimit > 0 && o_.trainLimit < train_.count) train_.count = o_.trainLimit;

  net_ = makeModel(o_.model);
  std::vector<torch::Tensor> trained = net_.module->parameters();
  if (o_.mergedFc) {
    if (!net_.classifier) {
      throw InvalidArgument(
          "--merged-fc needs a model with conv features and an FC classifier (lenet, "
          "cifar10-quick); " +
          o_.model + " is all FC");
    }
    trained.clear();
    for (const auto& l : featureParts().layers) trained.insert(trained.end(), l.params.begin(), l.params.end());
    for (const auto& l : partsOf(*net_.module, net_.name).layers) {
      if (std::count(net_.classifierLayers.begin(), net_.classifierLayers.end(), l.name)) {
        classifierParams_.insert(classifierParams_.end(), l.params.begin(), l.params.end());
      }
    }
  }
  const auto sgd = torch::optim::SGDOptions(lr_).momentum(o_.momentum).weight_decay(o_.weightDecay);
  optimizer_ = std::make_unique<torch::optim::SGD>(trained, sgd);
  if (o_.mergedFc) checkpointOptimizer_ = std::make_unique<torch::optim::SGD>(net_.module->parameters(), sgd);

  const int64_t perRank = (train_.count + world_ - 1) / world_;
  stepsPerEpoch_ = (perRank + o_.batch - 1) / o_.batch;
  dropped_.assign(world_, 0.0);
  skipped_.assign(world_, 0.0);
  padRandom_.seed(o_.seed * 1000003 + static_cast<uint64_t>(rank_));
}

void RankRun::resume() {
  // Every rank reads the checkpoint (the directory must be visible to all
  // ranks); the rendezvous then checks that all ranks resume at the same iteration.
  meta_.model = o_.model;
  meta_.workers = world_;
  meta_.batch = o_.batch;
  meta_.seed = o_.seed;
  meta_.trainLimit = o_.trainLimit;
  meta_.groups = o_.groups;
  meta_.regroup = o_.regroup;
  // A damaged checkpoint (a file that fails its checksum) is skipped for the
  // newest intact one; every rank decides alike from the same files.
  Resumed r = resumeFromNewest(o_.checkpointDir, meta_, *net_.module, stateOptimizer());
  if (lead_) {
    for (const auto& w : r.warnings) POSEIDON_LOG(kWarning) << w;
  }
  if (!r.path.empty()) {
    startIteration_ = r.meta.iteration;
    checkpointIteration_ = startIteration_;
    if (o_.groups > 0) {  // the shards start from this state: model.pt's parameters, optimizer.pt's momentum
      std::vector<torch::Tensor> buffers = momentumBuffers(stateOptimizer());
      if (o_.mergedFc) {  // the FC layers' momentum goes to the FC server, the rest to the shards
        const auto& params = stateOptimizer().param_groups().at(0).params();
        for (size_t i = 0; i < params.size(); ++i) {
          (isClassifierParam(params[i]) ? fcMomentum_ : groupMomentum_).push_back(buffers[i]);
        }
      } else {
        groupMomentum_ = std::move(buffers);
      }
      groupVersion_ = r.meta.groupVersion;
    }
    if (lead_) {
      std::printf("resuming from %s (iteration %lld: epoch %lld, step %lld)\n", r.path.c_str(),
                  static_cast<long long>(startIteration_), static_cast<long long>(startIteration_ / stepsPerEpoch_ + 1),
                  static_cast<long long>(startIteration_ % stepsPerEpoch_));
      std::fflush(stdout);
    }
  }
}

void RankRun::connect() {
  if (!o_.tracePath.empty()) tracer_ = std::make_unique<Tracer>(rank_);
  if (o_.plain) return;
  DistributedOptions d = distributedOptions(o_, env_, startIteration_,
                                            warmedUpLearningRate(lr_, warmupSteps_, startIteration_), tracer_.get());
  d.groupMomentum = groupMomentum_;
  d.groupVersion = groupVersion_;
  if (!o_.mergedFc) {
    dist_ = std::make_unique<DistributedModel>(net_.module, net_.name, std::move(d), net_.forward);
    return;
  }
  dist_ = std::make_unique<DistributedModel>(featureParts(), std::move(d));
  mergedFc_ =
      std::make_unique<MergedFc>(*dist_, net_.classifier, classifierParams_, o_.momentum, o_.weightDecay, fcMomentum_);
}

ModelParts RankRun::featureParts() const {
  ModelParts parts = partsOf(*net_.module, net_.name);
  parts.layers.erase(std::remove_if(parts.layers.begin(), parts.layers.end(),
                                    [&](const LayerTensors& l) {
                                      return std::count(net_.classifierLayers.begin(), net_.classifierLayers.end(),
                                                        l.name) > 0;
                                    }),
                     parts.layers.end());
  return parts;
}

bool RankRun::isClassifierParam(const torch::Tensor& p) const {
  return std::any_of(classifierParams_.begin(), classifierParams_.end(),
                     [&](const torch::Tensor& c) { return c.unsafeGetTensorImpl() == p.unsafeGetTensorImpl(); });
}

void RankRun::printPlan() const {
  if (!lead_) return;
  ModelDesc desc = describeModule(*net_.module, net_.name);
  std::printf(
      "poseidon train: %s (%lld params) on Fashion-MNIST, %d worker%s x batch %lld, %d epochs, lr %g%s, "
      "momentum %g, scheme %s%s%s\n",
      net_.name.c_str(), static_cast<long long>(desc.numel()), world_, world_ > 1 ? "s" : "",
      static_cast<long long>(o_.batch), o_.epochs, lr_,
      strCat(o_.lr > 0 ? "" : " (for the global batch)",
             warmupSteps_ > 0 ? strCat(", warmed up over ", warmupSteps_, " steps") : std::string())
          .c_str(),
      o_.momentum, schemePolicyName(o_.scheme),
      o_.plain
          ? ", plain LibTorch (no Poseidon)"
          : strCat(o_.overlap ? ", wait-free backprop" : ", no overlap", o_.overlapForward ? ", overlapped step" : "")
                .c_str(),
      o_.wire == WirePrecision::kFp32 ? "" : strCat(", ", wirePrecisionName(o_.wire), " wire (lossy)").c_str());
  if (dist_) {
    std::printf("\n%-8s %-5s %-12s %-6s %16s\n", "layer", "type", "shape", "scheme", "floats/iter/node");
    for (const auto& p : dist_->plan(o_.batch)) {
      std::printf("%-8s %-5s %-12s %-6s %16.0f\n", p.name.c_str(), layerTypeName(p.type), p.shape.c_str(),
                  world_ == 1 ? "local" : schemeName(p.scheme), world_ == 1 ? 0.0 : p.floatsPerIteration);
    }
    if (o_.mergedFc) {
      int64_t n = 0;
      for (const auto& p : classifierParams_) n += p.numel();
      std::string names;
      for (const auto& l : net_.classifierLayers) names += (names.empty() ? "" : ", ") + l;
      std::printf(
          "merged FC: %s (%lld params) on the FC server (rank %d), model-parallel; each step a worker sends "
          "it its features and gets their gradient back\n",
          names.c_str(), static_cast<long long>(n), kFcServerRank);
    }
    std::printf("\n");
  }
  std::fflush(stdout);
}

void RankRun::applyPending() {
  if (!dist_ || !o_.overlapForward) return;
  try {
    dist_->applyPending();  // the model with its last update
  } catch (const DivergenceError& err) {  // every rank finds it here alike (the same mean gradient)
    noteDivergence(err.step(), err.subject());
  }
}

double RankRun::evaluate() {
  applyPending();
  if (dist_ && o_.groups > 0) {
    // The model as it stands once every group's updates so far are in (pullLatest's barrier leaves
    // every push sent before it applied).
    dist_->pullLatest();
    if (mergedFc_) mergedFc_->broadcastClassifier();
  }
  torch::NoGradGuard guard;
  net_.module->eval();
  int64_t correct = 0, seen = 0;
  std::vector<int64_t> idx = data::shardIndices(test_.count, world_, rank_, 0, 0, /*shuffle=*/false);
  // Padding repeats a few samples on the last ranks; count each sample once.
  size_t limit = std::min<size_t>(idx.size(), static_cast<size_t>((test_.count - rank_ + world_ - 1) / world_));
  for (size_t b = 0; b < limit; b += kEvalBatch) {
    size_t e = std::min(limit, b + kEvalBatch);
    auto pred = net_.forward(batchImages(test_, idx, b, e)).argmax(1);
    correct += pred.eq(batchLabels(test_, idx, b, e)).sum().item<int64_t>();
    seen += static_cast<int64_t>(e - b);
  }
  net_.module->train();
  // Whether the training diverged, decided together: each rank's step of it (its own finding, or a
  // model that is not finite now), 0 for none. Checked before the sum: until rank 0 has sent its part
  // no rank has left, so (merged FC) no FC update is in flight.
  if (divergedAt_ < 0 && !finite(net_.module->parameters())) noteDivergence(iteration_);
  std::vector<double> mine(2 + static_cast<size_t>(world_), 0.0);
  mine[0] = static_cast<double>(correct);
  mine[1] = static_cast<double>(seen);
  mine[2 + static_cast<size_t>(rank_)] = divergedAt_ >= 0 ? static_cast<double>(divergedAt_ + 1) : 0.0;
  const std::vector<double> total = dist_ ? dist_->node().allSum(mine) : mine;
  modelDiverged_ = false;
  for (int r = 0; r < world_; ++r) {
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
  applyPending();  // a checkpoint holds the last step's update (and the optimizer's state after it)
  const bool groups = dist_ && o_.groups > 0;
  if (groups) {
    // The shards hold the model and its momentum: every rank stops at this round (a barrier),
    // then the first worker takes their state into the model and the optimizer's buffers. No
    // rank goes on before it has (the second barrier, below): a group that did would update the
    // shards (and the FC server) while their state is read.
    auto [buffers, version] = dist_->groupState();
    if (lead_) {
      if (FcServer* server = mergedFc_ ? mergedFc_->server() : nullptr) {
        // The conv layers' momentum from the shards, the FC layers' from the FC server (idle: every
        // rank is between the two barriers), in the order of every parameter.
        std::vector<torch::Tensor> fc = server->momentumBuffers(), all;
        size_t conv = 0, fcIndex = 0;
        for (const auto& p : stateOptimizer().param_groups().at(0).params()) {
          all.push_back(isClassifierParam(p) ? fc.at(fcIndex++) : buffers.at(conv++));
        }
        buffers = std::move(all);
      }
      setMomentumBuffers(stateOptimizer(), buffers);
      meta_.groupVersion = version;
    }
  }
  if (lead_ && !finite(net_.module->parameters())) {
    // A diverged model is not saved: the newest checkpoint stays the last finite one.
    std::printf("checkpoint at step %lld not saved: the model is not finite\n", static_cast<long long>(iteration));
    std::fflush(stdout);
  } else if (lead_) {
    // Reported first, so that a restart after a failed save (a full disk) counts this iteration as lost.
    writeProgress(o_.progressPath, iteration, checkpointIteration_);
    meta_.iteration = iteration;
    saveCheckpoint(o_.checkpointDir, meta_, *net_.module, stateOptimizer());
    checkpointIteration_ = iteration;
  }
  if (groups) dist_->node().barrier();
}

void RankRun::train() {
  iteration_ = startIteration_;
  stop_ = o_.maxSteps > 0 && iteration_ >= o_.maxSteps;
  net_.module->train();
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
    if (lead_) {
      std::printf("epoch %d/%d done in %.1f s: train loss %.4f, test accuracy %.2f%%\n", epoch + 1, o_.epochs,
                  epochSeconds, stats.meanLoss(), 100 * accuracy_);
      std::fflush(stdout);
    }
    epochsJson_.push_back({{"epoch", epoch + 1}, {"train_loss", stats.meanLoss()},
                           {"test_accuracy", accuracy_}, {"seconds", epochSeconds}});
    // Per-epoch checkpoints, unless --checkpoint-every already took this one.
    if (!stop_ && o_.checkpointEvery <= 0) checkpoint(iteration_);
  }
}

bool RankRun::trainEpoch(int epoch, EpochStats& stats) {
  std::vector<int64_t> idx = data::shardIndices(train_.count, world_, rank_, o_.seed, epoch);
  stats.start = Clock::now();
  int nextReport = 1;
  const int64_t firstStep = epoch == startEpoch() ? startIteration_ % stepsPerEpoch_ : 0;
  for (int64_t s = firstStep; s < stepsPerEpoch_; ++s) {
    if (divergedAt_ >= 0) {
      // Compute groups: this rank's model is no longer finite, so the rest of the epoch is skipped, not
      // run. The iterations still pass the collectives other ranks make (a compute group's checkpoint is
      // one), so that a group that has not seen it yet can finish the epoch; train() stops the job.
      ++iteration_;
      if (o_.checkpointEvery > 0 && iteration_ % o_.checkpointEvery == 0) checkpoint(iteration_);
      if (o_.maxSteps > 0 && iteration_ >= o_.maxSteps) return true;
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
      if (o_.checkpointEvery > 0 && iteration_ % o_.checkpointEvery == 0) checkpoint(iteration_);
      if (o_.maxSteps > 0 && iteration_ >= o_.maxSteps) return true;
      continue;
    }
    trainClock_ += secondsSince(stepBegin);
    ++steps_;
    ++iteration_;
    if (o_.curveEvery > 0 && iteration_ % o_.curveEvery == 0) recordCurvePoint(iteration_);
    if (o_.checkpointEvery > 0 && iteration_ % o_.checkpointEvery == 0) checkpoint(iteration_);
    if (lead_) writeProgress(o_.progressPath, iteration_, checkpointIteration_);
    if (o_.maxSteps > 0 && iteration_ >= o_.maxSteps) return true;
    printProgress(epoch, s, stats, nextReport);
  }
  return false;
}

bool RankRun::finite(const std::vector<torch::Tensor>& params) {
  return std::all_of(params.begin(), params.end(), [](const torch::Tensor& p) { return allFinite(p); });
}

std::vector<torch::Tensor> RankRun::gradients(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) out.push_back(p.grad());
  return out;
}

void RankRun::noteDivergence(int64_t step, const std::string& what) {
  if (divergedAt_ >= 0) return;
  divergedAt_ = step;
  divergedWhat_ = what;
  if (lead_ && o_.allowDivergence) {
    std::printf("step %lld: the training diverged (a NaN or an infinity): %s (--allow-divergence)\n",
                static_cast<long long>(step),
                o_.groups > 1 ? "this group skips the rest of the epoch, the job stops at its end"
                              : "the job stops here");
    std::fflush(stdout);
  }
  // The curve ends with the model at the divergence (tested like the others), even between
  // --curve-every steps: BSP's is the model before the step whose mean gradient was not finite (that
  // update is not applied). In group mode the point of this step, if it was due, holds the model the
  // step started from (the round's pull): the diverged model, seen only in the next round's pull,
  // replaces it.
  if (o_.curveEvery > 0 && step % o_.curveEvery != 0) {
    recordCurvePoint(step);
  } else if (o_.curveEvery > 0 && o_.groups > 0 && !curve_.empty() && curve_.back().iteration == step) {
    curve_.back().params = modelCopy();
  }
}

void RankRun::injectFault() const {
  if (rank_ != o_.faultRank || iteration_ != o_.faultStep || o_.restartCount != 0) return;
  std::fprintf(stderr, "rank %d: fault injection (POSEIDON_FAULT): signal %d at iteration %lld\n", rank_,
               o_.faultSignal, static_cast<long long>(iteration_));
  std::fflush(stderr);
  raise(o_.faultSignal);
}

RankRun::StepOutcome RankRun::trainStep(const std::vector<int64_t>& idx, size_t b, size_t e, EpochStats& stats) {
  // The warm-up: this step's learning rate (every rank alike, from the job's iteration). Compute groups
  // push during the backward, so the shards are told it before the round (step() would tell them
  // for the next round's pushes).
  const double lr = warmedUpLearningRate(lr_, warmupSteps_, iteration_);
  static_cast<torch::optim::SGDOptions&>(optimizer_->param_groups().at(0).options()).lr(lr);
  if (dist_ && o_.groups > 0) dist_->setGroupLearningRate(static_cast<float>(lr));
  // --overlap-forward: a pending step still uses its gradients; each layer's are cleared once its
  // update is applied (DistributedModel::forwardGated), which zero_grad() would do.
  if (!(dist_ && dist_->stepPending())) optimizer_->zero_grad();
  torch::Tensor loss;
  try {
    if (dist_ && dist_->skipIfBehind(*optimizer_)) {
      // A straggler: the others finished this iteration without us.
      stats.images += static_cast<int64_t>(e - b) * world_;
      return StepOutcome::kTrained;
    }
    torch::Tensor x = batchImages(train_, idx, b, e), y = batchLabels(train_, idx, b, e);
    double forwardMs = 0, backwardMs = 0;
    loss = o_.mergedFc ? mergedStep(x, y, forwardMs, backwardMs) : localStep(x, y, forwardMs, backwardMs);
    if (o_.padMs > 0) {
      lastBackwardMs_ = backwardMs;
      double computeMs = forwardMs + backwardMs;
      maxComputeMs_ = std::max(maxComputeMs_, computeMs);
      computeMsSum_ += computeMs;
      if (computeMs > o_.padMs) ++padOverruns_;
    }
    if (dist_ && o_.overlapForward) {
      dist_->stepOverlapped(*optimizer_);  // the next forward applies it, layer by layer
    } else if (dist_) {
      dist_->step(*optimizer_);
    } else {
      // --plain: the check DistributedModel makes, on the one worker's gradient.
      if (!finite(gradients(optimizer_->param_groups().at(0).params()))) {
        throw DivergenceError("a gradient is not finite (a NaN or an infinity): the training diverged",
                              iteration_ + 1, "a gradient");
      }
      optimizer_->step();
    }
  } catch (const DivergenceError& err) {
    found_ = {err.step(), err.subject()};
    // Compute groups: the round's pull (the model after the last step's update, the first look at it;
    // the same for every member of the group) is not finite. A dead round: its push went out anyway,
    // as every member pushes every round it pulled.
    if (o_.groups > 0) return StepOutcome::kDeadRound;
    // BSP: the step ran; its loss (likely not finite) is the last the epoch's and the curve's means see.
    // The overlapped step found the last step's gradient at this forward: this step did not run.
    if (loss.defined() && err.step() == iteration_ + 1) addLoss(loss.item<double>(), stats);
    return StepOutcome::kDiverged;
  }
  addLoss(loss.item<double>(), stats);
  stats.images += static_cast<int64_t>(e - b) * world_;
  return StepOutcome::kTrained;
}

void RankRun::addLoss(double loss, EpochStats& stats) {
  stats.lossSum += loss;
  ++stats.lossCount;
  if (lead_ && o_.curveEvery > 0) {
    curveLossSum_ += loss;
    ++curveLossCount_;
  }
}

double RankRun::padBeforeBackward(double forwardMs) {
  if (o_.padMs <= 0) return 0;
  // The modeled device: forward + backward take padMs. The pad goes between forward and
  // backward (backward's length estimated by the previous step's), so that every sync, ours and
  // DDP's alike (bench/ddp_train.py pads the same way), starts after the modeled compute: no
  // system gets overlap from the pad itself, only from the real backward.
  double jitter = o_.padJitterMs > 0 ? std::exponential_distribution<double>(1.0 / o_.padJitterMs)(padRandom_) : 0;
  double rest = o_.padMs + jitter - forwardMs - lastBackwardMs_;
  if (rest <= 0) return 0;
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(rest));
  return rest;
}

torch::Tensor RankRun::localStep(const torch::Tensor& x, const torch::Tensor& y, double& forwardMs,
                                 double& backwardMs) {
  torch::Tensor out;
  Clock::time_point stepStart;
  double gateMs = 0;  // --overlap-forward: waits for the last step's layers, network time (not compute)
  double modeledMs = 0;  // --overlap-forward: the modeled forward spent layer by layer (padForwardShare)
  if (dist_ && o_.overlapForward) {
    stepStart = Clock::now();
    const double forwardBudget = o_.padMs * o_.padForwardShare;
    std::vector<double> realMs;  // each gated layer's real forward time, this step
    int current = -1;
    Clock::time_point layerStart;
    out = dist_->forwardGated([&](const LayerGate& gate) {
      return net_.gated(x, [&](int layer) {
        auto t = Clock::now();
        if (current >= 0)
          realMs[static_cast<size_t>(current)] += 1000 * std::chrono::duration<double>(t - layerStart).count();
        gate(layer);
        gateMs += 1000 * secondsSince(t);
        if (static_cast<size_t>(layer) >= realMs.size()) realMs.resize(static_cast<size_t>(layer) + 1, 0.0);
        if (forwardBudget > 0 && static_cast<size_t>(layer) < forwardShare_.size()) {
          const double ms = forwardBudget * forwardShare_[static_cast<size_t>(layer)];
          std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
          modeledMs += ms;
        }
        current = layer;
        layerStart = Clock::now();
      });
    });
    if (current >= 0) {
      realMs[static_cast<size_t>(current)] += 1000 * secondsSince(layerStart);
      double total = 0;
      for (double v : realMs) total += v;
      if (total > 0) {
        forwardShare_.assign(realMs.size(), 0.0);
        for (size_t l = 0; l < realMs.size(); ++l) forwardShare_[l] = realMs[l] / total;
      }
    }
  } else if (dist_ && o_.padMs > 0) {
    // The compute clock starts once the step's model is here (in group mode beginForward waits
    // for the pull): a wait for the network is not device time and must not hide in the pad.
    dist_->beginForward();
    stepStart = Clock::now();
    out = net_.forward(x);
    dist_->endForward(out);
  } else {
    stepStart = Clock::now();
    out = dist_ ? dist_->forward(x) : net_.forward(x);
  }
  torch::Tensor loss = torch::nll_loss(torch::log_softmax(out, 1), y);
  forwardMs = 1000 * secondsSince(stepStart) - gateMs;  // the modeled layers' time included: the pad's rest
  padBeforeBackward(forwardMs);
  forwardMs -= modeledMs;  // the real compute, for the overrun count
  auto backwardStart = Clock::now();
  loss.backward();
  if (rank_ == o_.slowRank && o_.slowMs > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(o_.slowMs));
  }
  backwardMs = 1000 * secondsSince(backwardStart);
  return loss;
}

torch::Tensor RankRun::mergedStep(const torch::Tensor& x, const torch::Tensor& y, double& forwardMs,
                                  double& backwardMs) {
  dist_->beginForward();  // the step's conv model from the shards
  auto stepStart = Clock::now();
  torch::Tensor h = net_.features(x);
  dist_->endForward(h);
  forwardMs = 1000 * secondsSince(stepStart);
  // The modeled device time (here the conv layers' forward and backward; the FC layers run on the
  // FC server) before anything is sent.
  padBeforeBackward(forwardMs);
  // The optimizer's learning rate, as the shards take it for the conv layers (takeGroupOptimizer).
  const double lr = static_cast<torch::optim::SGDOptions&>(optimizer_->param_groups().at(0).options()).lr();
  MergedFc::Reply reply = mergedFc_->exchange(h, y, static_cast<float>(lr));
  auto backwardStart = Clock::now();
  h.backward(reply.gradient);
  backwardMs = 1000 * secondsSince(backwardStart);
  if (rank_ == o_.slowRank && o_.slowMs > 0) {  // as localStep's: this rank's compute takes longer
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(o_.slowMs));
  }
  return torch::tensor(reply.loss, torch::kFloat64);
}

// A progress line at every tenth of the epoch (rank 0, unless --quiet).
void RankRun::printProgress(int epoch, int64_t s, const EpochStats& stats, int& nextReport) const {
  if (!lead_ || o_.quiet || (s + 1) * 10 < nextReport * stepsPerEpoch_) return;
  int pct = static_cast<int>(100 * (s + 1) / stepsPerEpoch_);
  std::string bar(static_cast<size_t>(pct / 5), '#');
  bar.resize(20, '.');
  std::printf("epoch %d/%d [%s] %3d%%  loss %.4f  %.0f img/s\n", epoch + 1, o_.epochs, bar.c_str(), pct,
              stats.lossSum / stats.lossCount, stats.images / secondsSince(stats.start));
  std::fflush(stdout);
  while (nextReport * stepsPerEpoch_ <= (s + 1) * 10) ++nextReport;
}

void RankRun::reportStragglers() {
  if (!dist_ || o_.dropStragglers <= 0) return;
  std::vector<double> mine(2 * world_, 0.0);
  mine[rank_] = static_cast<double>(dist_->node().droppedContributions());
  mine[world_ + rank_] = static_cast<double>(dist_->node().skippedIterations());
  auto all = dist_->node().allSum(mine);
  for (int r = 0; r < world_; ++r) {
    dropped_[r] = all[r];
    skipped_[r] = all[world_ + r];
  }
  if (lead_) {
    std::printf("straggler dropping: dropped layer contributions per rank [");
    for (int r = 0; r < world_; ++r) std::printf("%s%.0f", r ? ", " : "", dropped_[r]);
    std::printf("], skipped iterations per rank [");
    for (int r = 0; r < world_; ++r) std::printf("%s%.0f", r ? ", " : "", skipped_[r]);
    std::printf("]\n");
  }
}

void RankRun::reportGroups() {
  if (!dist_ || o_.groups == 0) return;
  // Every shard's count of updates by staleness, in buckets 0..kMaxStaleness-1 and the rest; the
  // largest lead of a group over the slowest (per rank, then the maximum).
  constexpr int kBuckets = 64;
  Node& node = dist_->node();
  std::vector<double> mine(kBuckets + 1 + world_, 0.0);
  for (const auto& [s, n] : node.stalenessHistogram()) mine[std::min<int64_t>(s, kBuckets)] += static_cast<double>(n);
  mine[kBuckets + 1 + rank_] = static_cast<double>(node.maxGroupLead());
  auto all = node.allSum(mine);
  stalenessHistogram_ = nlohmann::json::object();
  double updates = 0, weighted = 0;
  for (int s = 0; s <= kBuckets; ++s) {
    if (all[s] == 0) continue;
    stalenessHistogram_[s < kBuckets ? std::to_string(s) : ">=" + std::to_string(kBuckets)] = all[s];
    updates += all[s];
    weighted += s * all[s];
  }
  maxGroupLead_ = 0;
  for (int r = 0; r < world_; ++r) maxGroupLead_ = std::max<int64_t>(maxGroupLead_, static_cast<int64_t>(all[kBuckets + 1 + r]));
  if (lead_) {
    std::printf("compute groups: %d groups of %d workers; staleness of %.0f pair updates (mean %.2f):", o_.groups,
                world_ / o_.groups, updates, updates > 0 ? weighted / updates : 0.0);
    for (auto it = stalenessHistogram_.begin(); it != stalenessHistogram_.end(); ++it) {
      std::printf(" %s: %.0f", it.key().c_str(), it.value().get<double>());
    }
    std::printf("; largest lead of a group over the slowest: %lld\n", static_cast<long long>(maxGroupLead_));
  }
  if (FcServer* server = mergedFc_ ? mergedFc_->server() : nullptr) {
    fcUpdates_ = server->updates();
    fcBusySeconds_ = server->busySeconds();
    std::printf("merged FC: the FC server applied %lld updates (staleness 0), busy %.1f s (%.1f ms per update)\n",
                static_cast<long long>(fcUpdates_), fcBusySeconds_,
                fcUpdates_ ? 1000 * fcBusySeconds_ / fcUpdates_ : 0.0);
  }
}

std::vector<torch::Tensor> RankRun::modelCopy() {
  std::vector<torch::Tensor> params;
  torch::NoGradGuard guard;
  auto copy = [&] {
    for (const auto& t : net_.module->parameters()) params.push_back(t.detach().clone());
  };
  if (FcServer* server = mergedFc_ ? mergedFc_->server() : nullptr)
    server->withModel(copy);  // the FC layers as of a finished update
  else
    copy();
  return params;
}

void RankRun::recordCurvePoint(int64_t step) {
  applyPending();  // every rank alike: the copy is the model after this step
  if (lead_ && (curve_.empty() || curve_.back().iteration != step)) {  // (applyPending may have found a divergence)
    curve_.push_back(
        {step, trainClock_, curveLossSum_ / std::max<int64_t>(curveLossCount_, 1), -1, -1, modelCopy()});
    curveLossSum_ = 0;
    curveLossCount_ = 0;
  }
}

void RankRun::evaluateCurve() {
  if (!lead_ || curve_.empty()) return;
  // Off the clock, after finish(): the other ranks on this host are done, so the copies are tested
  // with every core (a copy of LeNet over the test set is seconds of one core, and poseidon tune's
  // wall time is mostly this).
  torch::set_num_threads(std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
  torch::NoGradGuard guard;
  auto params = net_.module->parameters();
  std::vector<torch::Tensor> final;
  for (const auto& t : params) final.push_back(t.detach().clone());
  net_.module->eval();
  std::vector<int64_t> idx(static_cast<size_t>(test_.count));
  for (int64_t i = 0; i < test_.count; ++i) idx[static_cast<size_t>(i)] = i;
  // --curve-loss-samples: fixed training images, evenly spaced (all of them when there are fewer).
  const int64_t n = std::min(o_.curveLossSamples, train_.count);
  std::vector<int64_t> sample(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) sample[static_cast<size_t>(i)] = i * train_.count / n;
  // Sums fn(outputs, labels) over the images `which` of `d`, in batches of kEvalBatch.
  auto sumOver = [&](const data::Dataset& d, const std::vector<int64_t>& which, auto fn) {
    double sum = 0;
    for (size_t b = 0; b < which.size(); b += kEvalBatch) {
      size_t e = std::min(which.size(), b + kEvalBatch);
      sum += fn(net_.forward(batchImages(d, which, b, e)), batchLabels(d, which, b, e));
    }
    return sum;
  };
  for (auto& p : curve_) {
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(p.params[i]);
    const double correct = sumOver(test_, idx, [](const torch::Tensor& out, const torch::Tensor& y) {
      return static_cast<double>(out.argmax(1).eq(y).sum().item<int64_t>());
    });
    p.testAccuracy = correct / static_cast<double>(test_.count);
    if (n > 0) {  // the training step's loss (mean negative log-likelihood); batch sums added in double
      p.sampleLoss =
          sumOver(train_, sample,
                  [](const torch::Tensor& out, const torch::Tensor& y) {
                    return torch::nll_loss(torch::log_softmax(out, 1), y, {}, at::Reduction::Sum).item<double>();
                  }) /
          static_cast<double>(n);
    }
    p.params.clear();
  }
  for (size_t i = 0; i < params.size(); ++i) params[i].copy_(final[i]);
  net_.module->train();
  if (!o_.quiet) {
    std::printf("accuracy curve (%zu points, every %lld steps): ", curve_.size(), static_cast<long long>(o_.curveEvery));
    for (size_t i = 0; i < curve_.size(); i += std::max<size_t>(1, curve_.size() / 8)) {
      std::printf("%s%lld: %.1f s %.2f%%", i ? ", " : "", static_cast<long long>(curve_[i].iteration), curve_[i].seconds,
                  100 * curve_[i].testAccuracy);
    }
    std::printf("\n");
    std::fflush(stdout);
  }
}

void RankRun::reportPadding() {
  if (o_.padMs <= 0) return;
  std::vector<double> mine(3 * world_ + 1, 0.0);
  mine[rank_] = static_cast<double>(padOverruns_);
  mine[world_ + rank_] = maxComputeMs_;
  mine[2 * world_ + rank_] = computeMsSum_;
  mine[3 * world_] = static_cast<double>(steps_);
  std::vector<double> all = dist_ ? dist_->node().allSum(mine) : mine;
  overrunsPerRank_.assign(all.begin(), all.begin() + world_);
  maxComputeMsPerRank_.assign(all.begin() + world_, all.begin() + 2 * world_);
  double sum = 0, overruns = 0, maxMs = 0;
  for (int r = 0; r < world_; ++r) {
    sum += all[2 * world_ + r];
    overruns += overrunsPerRank_[r];
    maxMs = std::max(maxMs, maxComputeMsPerRank_[r]);
  }
  meanComputeMs_ = all[3 * world_] > 0 ? sum / all[3 * world_] : 0;
  if (lead_) {
    std::printf("compute padded to %.1f ms per step%s: real compute mean %.1f ms, max %.1f ms; %.0f overruns over all ranks\n",
                o_.padMs, o_.padJitterMs > 0 ? strCat(" + exponential jitter of mean ", o_.padJitterMs, " ms").c_str() : "",
                meanComputeMs_, maxMs, overruns);
  }
}

void RankRun::reportTraffic() {
  reportStragglers();
  reportGroups();
  reportPadding();
  if (!dist_) return;
  // Traffic over all ranks, against Table 1's prediction.
  Node& node = dist_->node();
  TrafficTotals ps = node.counters().total(TrafficKind::kPS), sfb = node.counters().total(TrafficKind::kSFB);
  auto pred = dist_->predictedFloats();
  const double eb = static_cast<double>(wireElementBytes(o_.wire));  // Table 1's floats, as the wire sends them
  auto total = node.allSum({double(ps.bytesSent), double(sfb.bytesSent), double(ps.bytesSent + ps.bytesReceived),
                             double(sfb.bytesSent + sfb.bytesReceived), pred.first * eb, pred.second * eb});
  psBytes_ = total[0];
  sfbBytes_ = total[1];
  predictedPs_ = total[4];
  predictedSfb_ = total[5];
  double moved = total[2] + total[3], predicted = total[4] + total[5];
  if (lead_ && world_ > 1) {
    std::printf("\nbytes on the wire (all ranks, sent): ps %s, sfb %s\n", human(psBytes_).c_str(),
                human(sfbBytes_).c_str());
    std::printf("bytes moved (sent + received) vs Table 1 prediction: %s vs %s (%.3fx)\n", human(moved).c_str(),
                human(predicted).c_str(), predicted > 0 ? moved / predicted : 0.0);
  }
}

void RankRun::printResult() const {
  if (!lead_) return;
  std::printf("final test accuracy %.2f%%, %.0f images/s, %.1f s\n", 100 * accuracy_, imagesPerSecond(),
              secondsSince(wallStart_));
  if (modelDiverged_ && o_.allowDivergence) {
    std::printf("stopped: the model diverged at step %lld (%lld steps trained; --allow-divergence)\n",
                static_cast<long long>(jobDivergedAt_), static_cast<long long>(steps_));
  }
  std::fflush(stdout);
  if (modelDiverged_ && !o_.allowDivergence) {
    std::fprintf(stderr, "%s\n", divergenceLine().c_str());
    std::fflush(stderr);
  }
}

std::string RankRun::divergenceLine() const {
  const int64_t step = jobDivergedAt_;
  const std::string who = o_.groups > 0 || o_.plain || world_ == 1
                              ? strCat("found by rank ", jobDivergedRank_)
                              : std::string("found by every rank");
  // BSP: what rank 0 found, which every rank found (a layer's mean gradient).
  const std::string what = divergedAt_ == step && !divergedWhat_.empty() ? strCat(": ", divergedWhat_, " is not finite")
                                                                        : std::string(": the model is not finite");
  const double lr = warmedUpLearningRate(lr_, warmupSteps_, std::max<int64_t>(step - 1, 0));
  const std::string warmup =
      warmupSteps_ > 0 ? strCat(" (warm-up ", warmupSteps_, " steps, to ", lr_, ")") : std::string(" (no warm-up)");
  return strCat("poseidon train: error: the training diverged at step ", step, " (epoch ",
                std::max<int64_t>(step - 1, 0) / stepsPerEpoch_ + 1, "; ", who, what, ") at learning rate ", lr,
                warmup, "; try a lower --lr (e.g. ", lr_ / 4, ") or a longer --warmup-steps, or --allow-divergence to "
                "record the run as a result");
}

void RankRun::saveParams() const {
  std::ofstream f(o_.saveParamsPath, std::ios::binary);
  for (const auto& p : net_.module->parameters()) {
    torch::Tensor c = p.detach().contiguous();
    f.write(reinterpret_cast<const char*>(c.data_ptr<float>()), static_cast<std::streamsize>(c.numel() * 4));
  }
  if (!f) throw IoError("cannot write " + o_.saveParamsPath);
}

nlohmann::json RankRun::summaryJson() const {
  nlohmann::json layers = nlohmann::json::array();
  ModelDesc desc = describeModule(*net_.module, net_.name);
  for (size_t l = 0, synced = 0; l < desc.layers.size(); ++l) {
    const auto& s = desc.layers[l];
    const bool onFcServer =
        o_.mergedFc && std::count(net_.classifierLayers.begin(), net_.classifierLayers.end(), s.name) > 0;
    std::string scheme = onFcServer ? "fc-server" : world_ == 1 ? "local" : schemeName(dist_->lastSchemes()[synced]);
    if (!onFcServer) ++synced;
    layers.push_back({{"name", s.name},
                      {"type", layerTypeName(s.type)},
                      {"shape", s.params[0].shape},
                      {"params", s.numel()},
                      {"scheme", scheme}});
  }
  return {{"model", o_.model},
          {"test_accuracy", accuracy_},
          {"epochs", o_.epochs},
          {"epochs_run", epochsJson_},
          {"workers", world_},
          {"batch", o_.batch},
          {"lr", lr_},
          {"warmup_steps", warmupSteps_},
          {"momentum", o_.momentum},
          {"steps", steps_},
          {"allow_divergence", o_.allowDivergence},
          {"diverged", modelDiverged_},
          {"diverged_at_step", modelDiverged_ ? nlohmann::json(jobDivergedAt_) : nlohmann::json(nullptr)},
          {"diverged_rank", modelDiverged_ && (o_.groups > 0 || world_ == 1) ? nlohmann::json(jobDivergedRank_)
                                                                            : nlohmann::json(nullptr)},
          {"images_per_sec", imagesPerSecond()},
          {"train_seconds", trainSeconds_},
          {"wall_seconds", secondsSince(wallStart_)},
          {"scheme_policy", schemePolicyName(o_.scheme)},
          {"wire", wirePrecisionName(o_.wire)},
          {"overlap", o_.overlap},
          {"overlap_forward", o_.overlapForward},
          {"send_window", o_.sendWindowBytes},
          {"updates_in_forward", dist_ ? dist_->updatesInForward() : 0},
          {"plain", o_.plain},
          {"bytes_sent_by_scheme", {{"ps", psBytes_}, {"sfb", sfbBytes_}}},
          {"drop_stragglers", o_.dropStragglers},
          {"dropped_contributions_per_rank", dropped_},
          {"skipped_iterations_per_rank", skipped_},
          {"predicted_bytes_by_scheme", {{"ps", predictedPs_}, {"sfb", predictedSfb_}}},
          {"groups", o_.groups},
          {"staleness_bound", o_.staleness},
          {"staleness_histogram", stalenessHistogram_},
          {"max_group_lead", maxGroupLead_},
          {"merged_fc", o_.mergedFc},
          {"fc_server_updates", fcUpdates_},
          {"fc_server_busy_seconds", fcBusySeconds_},
          {"pad_ms", o_.padMs},
          {"pad_jitter_ms", o_.padJitterMs},
          {"pad_overruns_per_rank", overrunsPerRank_},
          {"max_compute_ms_per_rank", maxComputeMsPerRank_},
          {"mean_compute_ms", meanComputeMs_},
          {"train_clock_seconds", trainClock_},
          {"curve", curveJson()},
          {"layers", layers}};
}

nlohmann::json RankRun::curveJson() const {
  nlohmann::json c = nlohmann::json::array();
  for (const auto& p : curve_) {
    c.push_back({{"step", p.iteration}, {"seconds", p.seconds}, {"train_loss", p.trainLoss}, {"test_accuracy", p.testAccuracy}});
    if (o_.curveLossSamples > 0) c.back()["sample_loss"] = p.sampleLoss;  // NaN (diverged) is written as null
  }
  return c;
}

void RankRun::writeOutputs() const {
  if (!o_.saveParamsPath.empty() && lead_) saveParams();
  if (tracer_) tracer_->writeFile(o_.tracePath + ".rank" + std::to_string(rank_));
  if (lead_ && !o_.summaryPath.empty()) writeFileAtomically(o_.summaryPath, summaryJson().dump(2) + "\n", "summary");
}

}  // namespace

double defaultLearningRate(int workers, int64_t batch) {
  const double global = static_cast<double>(workers) * static_cast<double>(batch);
  return kBaseLr * std::min(1.0, std::sqrt(global / static_cast<double>(kBaseBatch)));
}

double warmedUpLearningRate(double lr, int64_t warmupSteps, int64_t iteration) {
  if (warmupSteps <= 0 || iteration >= warmupSteps) return lr;
  return lr * static_cast<double>(iteration + 1) / static_cast<double>(warmupSteps);
}

int trainRank(const TrainOptions& o, const RankEnv& env) {
  RankRun run(o, env);
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
