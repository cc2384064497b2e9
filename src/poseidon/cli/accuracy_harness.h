// The time-to-accuracy harness (poseidon bench --accuracy, docs/time_to_accuracy.md), shared by
// the bench and by Omnivore's optimizer (poseidon tune, docs/omnivore.md): real training of LeNet on
// Fashion-MNIST on the emulated cluster, one `poseidon train` (or bench/ddp_train.py) process per
// node, every step's compute padded to a modeled device time; rank 0's curve is read back.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "poseidon/bench/cluster.h"
#include "poseidon/cli/bench_util.h"

namespace poseidon::cli {

// A system of the comparison: Poseidon BSP ("bsp"), compute groups ("gG"), compute groups with
// merged FC ("gGfc": the FC layers on one FC server, poseidon train --merged-fc), or PyTorch DDP
// ("ddp"), with its learning rate and explicit momentum.
struct AccuracySystem {
  std::string name;
  int groups = 0;  // 0: BSP (no groups); -1: DDP
  bool mergedFc = false;
  bool overlapForward = false;  // bsp-overlap: poseidon train --overlap-forward (BSP, bit-identical to bsp)
  int sendWindow = 0;           // bsp[-overlap]-wBYTES: --send-window BYTES (priority links; 0: FIFO)
  double lr = 0.05, momentum = 0.9;
};

// The defaults are Table III's best settings measured on this model and batch
// (bench/results/momentum_grid.md): explicit momentum falls as g grows; at g = 8 every momentum
// diverged at lr 0.05, and lr 0.005 with momentum 0.6 was best.
AccuracySystem defaultAccuracySystem(const std::string& name, int nodes);

struct AccuracyRun {
  AccuracySystem system;
  double mbit = 0;
  bool ok = false;
  std::string error;
  nlohmann::json summary;  // rank 0's
  double secondsPerStep = 0, finalAccuracy = 0, overruns = 0, maxComputeMs = 0;
  // Every worker's step at the rate through all of them: workers / sum of each one's steps per second
  // (compute groups step at their own paces; rank 0's clock alone misses the others). 0: not reported.
  double meanRateSecondsPerStep = 0;
  // Time (training clock) and steps at the first curve point that reached the target; -1: never.
  double accuracySeconds = -1, lossSeconds = -1;
  int64_t accuracySteps = -1, lossSteps = -1;
  int64_t divergedAt = -1;  // the step at which the training diverged and the run stopped; -1: it did not

  nlohmann::json toJson() const;
};

// What one run adds to the harness's defaults (poseidon tune's probes and epochs).
struct RunExtras {
  std::string tag;                     // part of the run's file names (default: the system's name)
  int maxSteps = 0;                    // stop after this many steps in total (0: the harness's steps)
  int startStep = 0;                   // the step a resumed run starts from (its checkpoint's)
  int curveEvery = 0;                  // 0: the harness's
  std::vector<std::string> trainArgs;  // more flags for poseidon train (e.g. --checkpoint DIR)
  bool quiet = false;                  // no line per run on the terminal
};

struct AccuracyHarness {
  std::string exe, ddpScript, work, dataDir;
  std::string ddpPython = kDefaultDdpPython;  // --ddp-python
  bench::EmulatedCluster* cluster = nullptr;
  int nodes = 8, steps = 200, curveEvery = 10, timeoutS = 1800;
  int servers = 0;  // --servers: Poseidon's shards on nodes 0..servers-1 only (0: every node)
  int rcvbuf = 0;   // --tcp-rcvbuf: Poseidon's TCP receive buffer per connection (0: the OS default)
  int pushWindow = 0;  // --group-push-window: compute groups' pairs pushed ahead of the replies (0: off)
  double queueMs = bench::LinkSpec::kDefaultQueueMs;  // --queue-ms: each emulated port's queue
  std::string tcpCongestion = bench::EmulatedCluster::kDefaultTcpCongestion;  // --tcp-cc: every node's TCP
  int64_t batch = 32, pairBytes = 64 * 1024;
  double padMs = 300, padJitterMs = 0, targetAccuracy = 0.8, targetLoss = 0.6;
  uint64_t seed = 1;
  int port = 29600;
  std::string secret;

  AccuracyHarness();
  // Epochs of the data that `steps` steps need (poseidon train's --epochs).
  int epochsFor(int steps) const;
  AccuracyRun run(const AccuracySystem& sys, const RunExtras& extra = {});
  // Before the first run (after requireEmulatedCluster): the dataset checked (InvalidArgument), this
  // executable, and the work directory its runs write into (a WorkDir's).
  void prepare(const std::string& workDir);
  // The results file's config as far as the harness knows it: the command line, the cluster, the
  // modeled compute, the targets and the link rates (each command adds its own).
  nlohmann::json config(const std::string& command, const std::vector<double>& rates) const;
  // Reads rank 0's summary into the run's numbers (throws Error when it has no curve); the run
  // started at `startStep`.
  void read(AccuracyRun& r, int startStep = 0) const;
  void print(const AccuracyRun& r) const;
};

}  // namespace poseidon::cli
