#include "poseidon/torch/train/curve.h"

#include <algorithm>
#include <cstdio>
#include <thread>

#include "poseidon/common/error.h"
#include "poseidon/torch/train/context.h"

namespace poseidon::pt {

void AccuracyCurve::validate(const TrainHooks& h) {
  if (h.curveEvery < 0) throw InvalidArgument(strCat("--curve-every must be at least 0, got ", h.curveEvery));
  if (h.curveLossSamples < 0) {
    throw InvalidArgument(strCat("--curve-loss-samples must be at least 0, got ", h.curveLossSamples));
  }
  if (h.curveLossSamples > 0 && h.curveEvery == 0) {
    throw InvalidArgument("--curve-loss-samples scores the curve's model copies: it needs --curve-every");
  }
}

void AccuracyCurve::addLoss(double loss) {
  if (!lead_ || every_ <= 0) return;
  lossSum_ += loss;
  ++lossCount_;
}

void AccuracyCurve::add(int64_t step, double clockSeconds, std::vector<torch::Tensor> model) {
  points_.push_back({step, clockSeconds, lossSum_ / std::max<int64_t>(lossCount_, 1), -1, -1, std::move(model)});
  lossSum_ = 0;
  lossCount_ = 0;
}

void AccuracyCurve::evaluate(AnyNet& net, const data::Dataset& train, const data::Dataset& test, bool quiet) {
  if (!lead_ || points_.empty()) return;
  // Off the clock, after finish(): the other ranks on this host are done, so the copies are tested
  // with every core (a copy of LeNet over the test set is seconds of one core, and poseidon tune's
  // wall time is mostly this).
  torch::set_num_threads(std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
  torch::NoGradGuard guard;
  auto params = net.module->parameters();
  std::vector<torch::Tensor> final;
  for (const auto& t : params) final.push_back(t.detach().clone());
  const c10::Device device = params.empty() ? c10::Device(c10::kCPU) : params[0].device();  // --device
  net.module->eval();
  std::vector<int64_t> idx(static_cast<size_t>(test.count));
  for (int64_t i = 0; i < test.count; ++i) idx[static_cast<size_t>(i)] = i;
  // --curve-loss-samples: fixed training images, evenly spaced (all of them when there are fewer).
  const int64_t n = std::min(lossSamples_, train.count);
  std::vector<int64_t> sample(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) sample[static_cast<size_t>(i)] = i * train.count / n;
  // Sums fn(outputs, labels) over the images `which` of `d`, in batches of kEvalBatch.
  auto sumOver = [&](const data::Dataset& d, const std::vector<int64_t>& which, auto fn) {
    double sum = 0;
    for (size_t b = 0; b < which.size(); b += kEvalBatch) {
      size_t e = std::min(which.size(), b + kEvalBatch);
      sum += fn(net.forward(batchImages(d, which, b, e).to(device)), batchLabels(d, which, b, e).to(device));
    }
    return sum;
  };
  for (auto& p : points_) {
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(p.params[i]);
    const double correct = sumOver(test, idx, [](const torch::Tensor& out, const torch::Tensor& y) {
      return static_cast<double>(out.argmax(1).eq(y).sum().item<int64_t>());
    });
    p.testAccuracy = correct / static_cast<double>(test.count);
    if (n > 0) {  // the training step's loss (mean negative log-likelihood); batch sums added in double
      p.sampleLoss =
          sumOver(train, sample,
                  [](const torch::Tensor& out, const torch::Tensor& y) {
                    return torch::nll_loss(torch::log_softmax(out, 1), y, {}, at::Reduction::Sum).item<double>();
                  }) /
          static_cast<double>(n);
    }
    p.params.clear();
  }
  for (size_t i = 0; i < params.size(); ++i) params[i].copy_(final[i]);
  net.module->train();
  if (!quiet) {
    std::printf("accuracy curve (%zu points, every %lld steps): ", points_.size(), static_cast<long long>(every_));
    for (size_t i = 0; i < points_.size(); i += std::max<size_t>(1, points_.size() / 8)) {
      std::printf("%s%lld: %.1f s %.2f%%", i ? ", " : "", static_cast<long long>(points_[i].iteration),
                  points_[i].seconds, 100 * points_[i].testAccuracy);
    }
    std::printf("\n");
    std::fflush(stdout);
  }
}

nlohmann::json AccuracyCurve::json() const {
  nlohmann::json c = nlohmann::json::array();
  for (const auto& p : points_) {
    c.push_back({{"step", p.iteration},
                 {"seconds", p.seconds},
                 {"train_loss", p.trainLoss},
                 {"test_accuracy", p.testAccuracy}});
    if (lossSamples_ > 0) c.back()["sample_loss"] = p.sampleLoss;  // NaN (diverged) is written as null
  }
  return c;
}

}  // namespace poseidon::pt
