// The main job: data-parallel training of a CNN on Fashion-MNIST, one
// process per worker. trainRank() is one rank's whole run; `poseidon train`
// launches it once per worker (or runs it directly when started by a
// launcher that set RANK/WORLD_SIZE).
#pragma once

#include <cstdint>
#include <string>

#include "poseidon/core/best_scheme.h"
#include "poseidon/core/kv_layout.h"
#include "poseidon/launch/env.h"
#include "poseidon/transport/egress_queue.h"
#include "poseidon/wire/precision.h"

namespace poseidon::pt {

// The main job's defaults, chosen by the grid in docs/hyperparameters.md: the learning rate follows
// the global batch B = workers x batch as kBaseLr x min(1, sqrt(B / kBaseBatch)) (square-root scaling
// below kBaseBatch; above it LeNet's edge of stability, about 0.05 at any batch, caps it), and every
// run warms it up over kWarmupSteps steps.
constexpr double kBaseLr = 0.025;
constexpr int64_t kBaseBatch = 256;
constexpr int64_t kWarmupSteps = 50;
double defaultLearningRate(int workers, int64_t batch);
// The learning rate of step `iteration` (0-based, over the whole job): lr, warmed up over warmupSteps.
double warmedUpLearningRate(double lr, int64_t warmupSteps, int64_t iteration);
// Throws InvalidArgument (one line) when no rank could train on `device` here (--device cuda without
// a CUDA device LibTorch can use, or another name): checked before any worker starts.
void checkDevice(const std::string& device);

// What the user sets: poseidon train's flags (TrainHooks holds the rest).
struct TrainOptions {
  std::string model = "lenet";
  int workers = 4;
  int epochs = 5;
  int64_t batch = 64;  // per worker
  // SGD's learning rate for the global batch (workers x batch). 0: the default, defaultLearningRate().
  double lr = 0;
  // The learning rate rises linearly from lr / warmupSteps to lr over the first warmupSteps steps
  // (Goyal et al.'s gradual warm-up); 0: none.
  int64_t warmupSteps = kWarmupSteps;
  double momentum = 0.9;
  double weightDecay = 0;
  // Omnivore's compute groups (0: off): the shards hold the model and run SGD; staleness -1: unbounded.
  int groups = 0;
  // > 0 (with groups): each group's batch, split evenly over its workers / groups members, the
  // paper's setting (batch becomes groupBatch / members; the default lr is the one for this batch).
  // 0: batch is per worker, so a group's batch is members x batch.
  int64_t groupBatch = 0;
  int64_t staleness = -1;
  bool regroup = false;  // resume a group-mode checkpoint written with another number of groups
  // Merged FC (Omnivore V-A, --merged-fc; needs groups): the model's FC layers run on rank 0's FC
  // server (torch/fc_server.h), model-parallel; only the conv layers train in the groups.
  bool mergedFc = false;
  uint64_t seed = 1;
  SchemePolicy scheme = SchemePolicy::kAuto;
  WirePrecision wire = WirePrecision::kFp32;  // what gradients travel as (--wire; 16 bits are lossy)
  bool overlap = true;   // false: sync after the whole backward (naive baseline)
  // The overlapped step (--overlap-forward, docs/scheduling.md): step() returns at once and the next
  // forward applies each layer's update just before that layer runs (the models declare their layer
  // order: LayerGate). Bit-identical to the barrier path. BSP only.
  bool overlapForward = false;
  // > 0: priority-scheduled links with this kernel send window per connection (--send-window,
  // NodeOptions::sendWindowBytes): a lower layer's result passes the upper ones queued before it,
  // which is what the overlapped step's next forward needs first. 0: FIFO links. BSP only.
  int sendWindowBytes = 0;
  // > 0 (with sendWindowBytes): the first K layers' round data travel on a second connection per
  // peer, marked IP TOS low-delay (--urgent-layers, VanOptions::urgentLayers). 0: none. -1
  // (VanOptions::kAutoUrgentLayers): the runtime's rule (past 16 peers the layers below the FC stack
  // with hostQueue kTos, else 3 past 8 peers).
  int urgentLayers = -1;
  // For the automatic urgentLayers: what the host's egress queue does with the mark (--host-queue,
  // VanOptions::egressQueue); kAuto reads it from the kernel for the log.
  EgressQueue hostQueue = EgressQueue::kAuto;
  bool plain = false;    // no Poseidon at all: the plain LibTorch loop (overhead baseline, 1 worker)
  // Where each rank's model and batches live (--device): cpu, cuda (cuda:LOCAL_RANK, one process per
  // GPU; ranks beyond the GPUs share them), or auto (cuda when there is one). docs/gpu.md.
  std::string device = "cpu";
  std::string dataDir;   // default: the Debian package's directory
  std::string summaryPath, tracePath, checkpointDir;
  std::string saveParamsPath;  // raw float32 dump of the final parameters (tests)
  int64_t maxSteps = -1;       // stop after this many steps in total (tests, smoke runs)
  // Divergence (a mean gradient, or with compute groups a pulled model, that is not finite) stops
  // the job at that step on every rank (compute groups: a group that finds it skips the rest of the
  // epoch, and the ranks decide together at its end). Without allowDivergence it is an error: rank 0
  // says where and what to try, and every rank exits with kExitDiverged. With it, a diverged run is a
  // result (poseidon tune's probes, bench --accuracy): exit 0, the summary says where.
  bool allowDivergence = false;
  int64_t trainLimit = -1;     // use only the first N training images (tests, smoke runs)
  int64_t checkpointEvery = 0;  // checkpoint every N iterations (0: at the end of every epoch)
  // Straggler dropping (--drop-stragglers D --straggler-timeout MS).
  int dropStragglers = 0;
  int64_t stragglerTimeoutMs = 0;
  int threads = 0;             // LibTorch intra-op threads per worker (0: cores / local workers)
  int syncThreads = 2;         // Poseidon thread pool per worker
  int timeoutMs = 30000;
  int tcpRcvbuf = 0;           // TCP receive buffer per connection into a rank (0: OS default)
  int groupPushWindow = 0;     // compute groups: pairs pushed ahead of the replies (NodeOptions::groupPushWindow)
  int ioThreads = 0;           // ZeroMQ I/O threads per rank (NodeOptions::ioThreads; 0: defaultIoThreads())
  int sumThreads =
      kDefaultSumThreads;  // the shard's sum threads per rank (NodeOptions::sumThreads; 0: on the receive loop)
  int64_t pairBytes = 2 * 1024 * 1024;
  // Several ranks per machine (--local-ranks; JobSettings::localRanks): ranks r..r+L-1 meet on rank r,
  // which alone synchronizes with the other machines. 1: every rank its own node.
  int localRanks = 1;
  // > 0: only the first N ranks hold KV shards (the rest are workers only): --servers 1 puts the whole
  // model on rank 0, Omnivore's one conv model server and its k-fold congestion. 0: every rank a shard.
  int servers = 0;
  std::string bindHost;        // data endpoint interface (default: the route to MASTER_ADDR)
  std::string secret;          // job secret (POSEIDON_SECRET / POSEIDON_SECRET_FILE)
  std::string transportSecurity;  // curve | none; empty: POSEIDON_TRANSPORT_SECURITY, else curve
  bool quiet = false;          // no progress lines
};

// What a run takes besides the user's settings: the supervising launcher's state, the reliability
// tests' fault injection, and the benchmarks' modeled compute and accuracy curve (poseidon bench
// --accuracy and poseidon tune pass these through `poseidon train`'s flags). The training modes never
// read them; the trainer's core loop and its ComputePad and AccuracyCurve do.
struct TrainHooks {
  std::string progressPath;  // POSEIDON_PROGRESS_FILE: rank 0 reports its iteration here
  int restartCount = 0;      // POSEIDON_RESTART_COUNT: how many times the launcher restarted the job
  // Fault injection for the reliability tests (POSEIDON_FAULT=RANK:ITERATION:kill|stop):
  // that rank sends itself the signal at that iteration, in the first run only.
  int faultRank = -1;
  int64_t faultStep = -1;
  int faultSignal = 9;
  // Test hook (POSEIDON_SLOW=RANK:MS): each of that rank's steps takes MS milliseconds longer. A time,
  // not a factor of the step's own: a test derives it from the timeout it tests against, so that
  // the rank is as slow on a fast machine as on a loaded one.
  int slowRank = -1;
  double slowMs = 0;
  // Time-to-accuracy runs (poseidon bench --accuracy; docs/time_to_accuracy.md).
  // padMs: each step's compute (forward + backward, not the waits for the
  // network) is padded to this modeled device time; steps whose real compute
  // took longer are counted as overruns. curveEvery: rank 0 keeps a copy of
  // its model every N steps and, after the run, evaluates each on the whole
  // test set: the accuracy curve against the training clock (the time in
  // training steps; the per-epoch evaluations are not on it).
  // padJitterMs: each step's pad gets an extra wait drawn from an exponential distribution of this
  // mean (per rank, seeded): step times that vary, as Omnivore's Theorem 1 assumes and stragglers do.
  double padMs = 0, padJitterMs = 0;
  // padForwardShare: the modeled forward's share of padMs. With --overlap-forward it is spent layer by
  // layer, each layer's part right after its gate (in proportion to the real forward's time per layer,
  // measured on the step before), so that a device computes the early layers while later layers'
  // updates still come; the rest of the pad goes between forward and backward as without it. Without
  // --overlap-forward the forward starts after every update, and where its share is spent changes
  // nothing: it stays in the one wait.
  double padForwardShare = 1.0 / 3;
  int64_t curveEvery = 0;
  // curveLossSamples (with curveEvery): each copy is also scored by its mean loss on this many fixed
  // training images (evenly spaced over the training set, the same for every run of the job), after
  // the run, off the training clock: a signal without the minibatches' noise, for poseidon tune's
  // probes (the curve's "sample_loss"). 0: off.
  int64_t curveLossSamples = 0;
};

// The exit code of a rank (and of poseidon train) whose training diverged (TrainOptions::allowDivergence).
constexpr int kExitDiverged = 3;

// The options a rank of a world of `world` runs with: --group-batch resolved into the per-worker
// batch (and the default learning rate for the group's batch). InvalidArgument when it cannot be
// split evenly or there are no groups.
TrainOptions resolveGroupBatch(TrainOptions o, int world);

// Every check of the options that needs no peer (their values, the mode's combinations, the model's
// name, the newest checkpoint's job layout), as each rank makes them when it starts: poseidon train makes them once before it starts its
// workers, so that a bad option is one line, not one per worker. Throws InvalidArgument.
void validateTrainOptions(const TrainOptions& options, const TrainHooks& hooks, int world);

// Runs one rank. Returns the process exit code. Rank 0 prints the plan,
// progress, accuracy and traffic, and writes the summary; every rank writes
// its own trace file (<trace>.rank<R>) when tracing.
int trainRank(const TrainOptions& options, const TrainHooks& hooks, const RankEnv& env);

}  // namespace poseidon::pt
