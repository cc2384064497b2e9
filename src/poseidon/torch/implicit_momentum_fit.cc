#include "poseidon/torch/implicit_momentum_fit.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "poseidon/common/error.h"

namespace poseidon::pt::fit {
namespace {

// sum_ij M_ij over column chunks of a [runs, D] float32 pair, in float64: the Gram matrix a^T b.
torch::Tensor gram(const torch::Tensor& a, const torch::Tensor& b) {
  torch::Tensor out = torch::zeros({a.size(0), b.size(0)}, torch::kFloat64);
  const int64_t chunk = int64_t{1} << 16;
  for (int64_t at = 0; at < a.size(1); at += chunk) {
    const int64_t len = std::min(chunk, a.size(1) - at);
    out.add_(torch::mm(a.narrow(1, at, len), b.narrow(1, at, len).t()).to(torch::kFloat64));
  }
  return out;
}

// The fit of the one unknown, a = sum_t <E X, E Y> / sum_t |E X|^2, and its 95% interval from
// resampling the runs. The inner products of the expectations are estimated from pairs of
// different runs, sum_{r != s} <X_r, Y_s> / (R (R - 1)), which is unbiased: the mean's own
// <X_mean, X_mean> would add the runs' variance / R to the denominator and pull a towards 0 (the
// noise in a regressor). With resampled counts w the same sums are w^T M w - sum_r w_r^2 M_rr
// (a run drawn twice is still one run).
double pairRatio(const torch::Tensor& mxy, const torch::Tensor& mxx, const torch::Tensor& w) {
  auto offDiagonal = [&](const torch::Tensor& m) {
    return torch::dot(w, torch::mv(m, w)).item<double>() - torch::dot(w.pow(2), m.diagonal()).item<double>();
  };
  const double xx = offDiagonal(mxx);
  return xx > 0 ? offDiagonal(mxy) / xx : std::nan("");
}

}  // namespace

void fitConstrained(const RaceSums& sums, const ImplicitMomentumOptions& o, ImplicitMomentumResult& result) {
  const torch::Tensor mxx = gram(sums.x, sums.x), mxy = gram(sums.x, sums.y);
  result.aConstrained = pairRatio(mxy, mxx, torch::ones({sums.runs}, torch::kFloat64));
  if (!std::isfinite(result.aConstrained)) {
    throw Error("the implicit-momentum fit is degenerate (the mean trajectory did not move)");
  }
  std::mt19937_64 rng(o.seed * 2654435761ull + static_cast<uint64_t>(o.groups));
  std::uniform_int_distribution<int> pick(0, sums.runs - 1);
  std::vector<double> as;
  for (int b = 0; b < o.bootstrap; ++b) {
    torch::Tensor w = torch::zeros({sums.runs}, torch::kFloat64);
    for (int i = 0; i < sums.runs; ++i) w.data_ptr<double>()[pick(rng)] += 1;
    const double a = pairRatio(mxy, mxx, w);
    if (std::isfinite(a)) as.push_back(a);
  }
  if (as.empty()) return;
  std::sort(as.begin(), as.end());
  auto quantile = [&](double q) { return as[static_cast<size_t>(q * static_cast<double>(as.size() - 1) + 0.5)]; };
  result.aCi95[0] = quantile(0.025);
  result.aCi95[1] = quantile(0.975);
}

// The mean trajectory against the deterministic models: heavy ball with momentum 1 - 1/g and rate
// lr/g, started with V(0) = -lr grad(W(0)) (the first update is always fresh, so V(1) = -lr
// grad(W(0)) as in the race), and plain SGD at lr. With a linear gradient the race's mean must be
// the heavy ball's trajectory up to the runs' noise.
void compareTrajectories(const RaceSums& sums, const LeastSquares& ls, double lr, int g,
                         ImplicitMomentumResult& result) {
  const int64_t steps = sums.sumW.size(0);
  const double runs = static_cast<double>(sums.runs), q = 1.0 - 1.0 / g;
  torch::Tensor mean = sums.sumW.div(runs);
  torch::Tensor hb = sums.w0.clone(), sgd = sums.w0.clone();
  torch::Tensor velocity = ls.grad(sums.w0).mul(-lr);
  double scale = 0, hbError = 0, sgdError = 0, noise = 0;
  for (int64_t t = 0; t < steps; ++t) {
    if (t > 0) {
      velocity = velocity.mul(q) - ls.grad(hb).mul(lr * (1 - q));
      hb = hb + velocity;
      sgd = sgd - ls.grad(sgd).mul(lr);
    }
    scale = std::max(scale, (hb - sums.w0).norm().item<double>());
    hbError = std::max(hbError, (mean[t] - hb).norm().item<double>());
    sgdError = std::max(sgdError, (mean[t] - sgd).norm().item<double>());
    if (sums.runs > 1) {
      const double spread = sums.sumSquares[t].item<double>() - runs * mean[t].pow(2).sum().item<double>();
      noise = std::max(noise, std::sqrt(std::max(0.0, spread) / (runs * (runs - 1))));
    }
  }
  if (!(scale > 0)) return;
  result.heavyBallError = hbError / scale;
  result.sgdError = sgdError / scale;
  result.noise = noise / scale;
}

}  // namespace poseidon::pt::fit
