#include "poseidon/torch/train/compute_pad.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "poseidon/common/error.h"

namespace poseidon::pt {

ComputePad::ComputePad(const TrainHooks& hooks, uint64_t seed, int rank)
    : padMs_(hooks.padMs), jitterMs_(hooks.padJitterMs), forwardShare_(hooks.padForwardShare) {
  random_.seed(seed * 1000003 + static_cast<uint64_t>(rank));
}

void ComputePad::validate(const TrainHooks& h) {
  if (h.padMs < 0) throw InvalidArgument(strCat("--pad-ms must be at least 0, got ", h.padMs));
  if (h.padJitterMs < 0) throw InvalidArgument(strCat("--pad-jitter-ms must be at least 0, got ", h.padJitterMs));
  if (h.padJitterMs > 0 && h.padMs <= 0) throw InvalidArgument("--pad-jitter-ms needs --pad-ms");
}

double ComputePad::beforeBackward(double forwardMs) {
  if (padMs_ <= 0) return 0;
  // The backward's length is estimated by the previous step's.
  double jitter = jitterMs_ > 0 ? std::exponential_distribution<double>(1.0 / jitterMs_)(random_) : 0;
  double rest = padMs_ + jitter - forwardMs - lastBackwardMs_;
  if (rest <= 0) return 0;
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(rest));
  return rest;
}

double ComputePad::layerForwardMs(int layer) const {
  const double budget = padMs_ * forwardShare_;
  if (budget <= 0 || layer < 0 || static_cast<size_t>(layer) >= layerShare_.size()) return 0;
  return budget * layerShare_[static_cast<size_t>(layer)];
}

void ComputePad::measuredForward(const std::vector<double>& realMs) {
  double total = 0;
  for (double v : realMs) total += v;
  if (total <= 0) return;
  layerShare_.assign(realMs.size(), 0.0);
  for (size_t l = 0; l < realMs.size(); ++l) layerShare_[l] = realMs[l] / total;
}

void ComputePad::record(double forwardMs, double backwardMs) {
  if (padMs_ <= 0) return;
  lastBackwardMs_ = backwardMs;
  const double computeMs = forwardMs + backwardMs;
  maxComputeMs_ = std::max(maxComputeMs_, computeMs);
  computeMsSum_ += computeMs;
  if (computeMs > padMs_) ++overruns_;
}

void ComputePad::report(const std::function<std::vector<double>(const std::vector<double>&)>& allSum, int64_t steps,
                        int rank, int world, bool lead) {
  if (padMs_ <= 0) return;
  std::vector<double> mine(3 * world + 1, 0.0);
  mine[rank] = static_cast<double>(overruns_);
  mine[world + rank] = maxComputeMs_;
  mine[2 * world + rank] = computeMsSum_;
  mine[3 * world] = static_cast<double>(steps);
  std::vector<double> all = allSum(mine);
  overrunsPerRank_.assign(all.begin(), all.begin() + world);
  maxComputeMsPerRank_.assign(all.begin() + world, all.begin() + 2 * world);
  double sum = 0, overruns = 0, maxMs = 0;
  for (int r = 0; r < world; ++r) {
    sum += all[2 * world + r];
    overruns += overrunsPerRank_[r];
    maxMs = std::max(maxMs, maxComputeMsPerRank_[r]);
  }
  meanComputeMs_ = all[3 * world] > 0 ? sum / all[3 * world] : 0;
  if (lead && all[3 * world] > 0) {  // no step: resumed where the job had ended
    std::printf(
        "compute padded to %.1f ms per step%s: real compute mean %.1f ms, max %.1f ms; %.0f overruns over all ranks\n",
        padMs_, jitterMs_ > 0 ? strCat(" + exponential jitter of mean ", jitterMs_, " ms").c_str() : "", meanComputeMs_,
        maxMs, overruns);
  }
}

}  // namespace poseidon::pt
