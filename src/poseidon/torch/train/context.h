// What one rank's training shares between its core loop (rank_run.h) and its mode (mode.h): the
// options, the model and its optimizer, the job (DistributedModel), the modeled compute. The core
// loop owns it; the mode reads and fills it.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <vector>

#include "poseidon/common/trace.h"
#include "poseidon/data/fashion_mnist.h"
#include "poseidon/launch/env.h"
#include "poseidon/torch/distributed.h"
#include "poseidon/torch/models.h"
#include "poseidon/torch/train/compute_pad.h"
#include "poseidon/torch/trainer.h"

namespace poseidon::pt {

using Clock = std::chrono::steady_clock;
inline double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
inline double msSince(Clock::time_point t) { return 1000 * secondsSince(t); }

// Evaluation's batch (forward only; the kernels may sum in another order for another size, so an
// image's logits can differ in the last bits, not more). Measured on this
// machine's LibTorch (no MKL; oneDNN): LeNet over the 10,000 test images takes about 2.9 s of two
// cores in batches of 250 and 5.1 s in batches of 1000 (a batch's activations leave the cache).
constexpr size_t kEvalBatch = 250;

// Images idx[begin, end) of d, normalized, as an N x 1 x rows x cols batch; and their labels.
torch::Tensor batchImages(const data::Dataset& d, const std::vector<int64_t>& idx, size_t begin, size_t end);
torch::Tensor batchLabels(const data::Dataset& d, const std::vector<int64_t>& idx, size_t begin, size_t end);

struct RankContext {
  RankContext(const TrainOptions& options, const TrainHooks& hooks, const RankEnv& env)
      : o(options),
        hooks(hooks),
        env(env),
        rank(env.rank),
        world(env.worldSize),
        lead(env.rank == 0),
        pad(hooks, options.seed, env.rank) {}

  const TrainOptions& o;
  const TrainHooks& hooks;
  const RankEnv& env;
  const int rank, world;
  const bool lead;  // rank 0: prints, writes the summary and checkpoints
  AnyNet net;
  c10::Device device = c10::Device(c10::kCPU);  // --device: the model's and the batches'
  // A batch onto the model's device (a no-op on the CPU).
  torch::Tensor onDevice(const torch::Tensor& t) const { return device.is_cpu() ? t : t.to(device, true); }
  std::unique_ptr<torch::optim::SGD> optimizer;  // over the mode's trainedParameters()
  std::unique_ptr<Tracer> tracer;                // --trace
  std::unique_ptr<DistributedModel> dist;        // the job (nullptr: --plain)
  ComputePad pad;                                // --pad-ms (the benchmarks' modeled device)
  double lr = 0;                                 // --lr, or the default for this global batch
  int64_t startIteration = 0;                    // where the run starts (a resumed checkpoint's)

  // The job's DistributedOptions for this rank (the modes add their own settings).
  DistributedOptions jobOptions() const;

  // A sum over all ranks (every rank calls it; --plain: this rank's own).
  std::vector<double> allSum(const std::vector<double>& mine) { return dist ? dist->node().allSum(mine) : mine; }
  // POSEIDON_SLOW: this rank's step takes slowMs longer.
  void slowDown() const;
};

}  // namespace poseidon::pt
