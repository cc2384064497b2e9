// The implicit-momentum experiment's fits (poseidon experiment implicit-momentum; docs/omnivore.md):
// the least-squares model of softmax regression's gradient, what the exact race keeps of its runs,
// the constrained fit of a with its bootstrap interval, and the mean trajectory against heavy ball
// and SGD. Internal to torch/experiments.cc; split out to keep that file on the runs themselves.
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "poseidon/common/error.h"
#include "poseidon/torch/experiments.h"

namespace poseidon::pt::fit {

// Least squares in the [classes, inputs + 1] layout (a class's weights and its bias in one row):
// grad(W) = W H - C with H = [x 1]^T [x 1] / N and C = Y^T [x 1] / N over the fit's sample.
struct LeastSquares {
  torch::Tensor h, c;  // float64
  int64_t classes = 0, inputs = 0;

  LeastSquares(const torch::Tensor& sample, const torch::Tensor& targets) {
    classes = targets.size(1);
    inputs = sample.size(1);
    const double rows = static_cast<double>(sample.size(0));
    torch::Tensor x = torch::cat({sample, torch::ones({sample.size(0), 1})}, 1).to(torch::kFloat64);
    h = torch::mm(x.t(), x).div(rows);
    c = torch::mm(targets.to(torch::kFloat64).t(), x).div(rows);
  }

  // The recorded flat models (weight row-major, then bias) as [T, classes, inputs + 1].
  torch::Tensor layout(std::vector<std::vector<float>>& w) const {
    const int64_t n = classes * (inputs + 1);
    torch::Tensor out = torch::empty({static_cast<int64_t>(w.size()), classes, inputs + 1}, torch::kFloat64);
    for (size_t t = 0; t < w.size(); ++t) {
      torch::Tensor flat = torch::from_blob(w[t].data(), {n}, torch::kFloat32).to(torch::kFloat64);
      out[static_cast<int64_t>(t)]
          .narrow(1, 0, inputs)
          .copy_(flat.narrow(0, 0, classes * inputs).view({classes, inputs}));
      out[static_cast<int64_t>(t)].select(1, inputs).copy_(flat.narrow(0, classes * inputs, classes));
    }
    return out;
  }

  torch::Tensor grad(const torch::Tensor& w) const { return torch::matmul(w, h) - c; }

  // The largest eigenvalue of H (power iteration; H is symmetric positive semi-definite).
  double lambdaMax() const {
    torch::Tensor v = torch::ones({h.size(0)}, torch::kFloat64);
    double lambda = 0;
    for (int i = 0; i < 1000; ++i) {
      torch::Tensor next = torch::mv(h, v);
      const double norm = next.norm().item<double>();
      if (!(norm > 0)) break;
      const bool settled = std::abs(norm - lambda) <= 1e-12 * norm;
      lambda = norm;
      v = next.div(norm);
      if (settled) break;
    }
    return lambda;
  }
};

// What the exact race keeps of its runs: per run the rows X_r(t) = V(t) + lr grad(W(t)) and
// Y_r(t) = V(t+1) + lr grad(W(t)), t = 1 .. T-1 (the fit's regressor and response; theorem:
// E Y = (1 - 1/g) E X), and the sums for the mean trajectory and its spread.
struct RaceSums {
  torch::Tensor x, y;        // [runs, (T - 1) * D] float32
  torch::Tensor sumW;        // [T + 1, classes, inputs + 1] float64
  torch::Tensor sumSquares;  // [T + 1] float64: sum over runs of |W_r(t)|^2
  torch::Tensor w0;          // W(0), the same in every run
  int runs = 0;
  size_t total = 0;  // runs to come (the rows of x and y)

  void add(const LeastSquares& ls, double lr, int run, std::vector<std::vector<float>>& recorded) {
    torch::Tensor w = ls.layout(recorded);
    const int64_t t = w.size(0) - 1;                           // updates
    torch::Tensor v = w.narrow(0, 1, t) - w.narrow(0, 0, t);   // V(1) .. V(T)
    torch::Tensor g = ls.grad(w.narrow(0, 1, t - 1)).mul(lr);  // lr grad(W(1)) .. lr grad(W(T-1))
    torch::Tensor xr = (v.narrow(0, 0, t - 1) + g).flatten();
    torch::Tensor yr = (v.narrow(0, 1, t - 1) + g).flatten();
    if (!x.defined()) {
      x = torch::empty({static_cast<int64_t>(total), xr.numel()}, torch::kFloat32);
      y = torch::empty_like(x);
      sumW = torch::zeros_like(w);
      sumSquares = torch::zeros({t + 1}, torch::kFloat64);
      w0 = w[0].clone();
    }
    if (xr.numel() != x.size(1)) throw Error("the runs recorded different numbers of updates");
    x[run].copy_(xr);
    y[run].copy_(yr);
    sumW.add_(w);
    sumSquares.add_(w.pow(2).sum({1, 2}));
    ++runs;
  }
};

// a = sum_t <E X, E Y> / sum_t |E X|^2 from pairs of different runs, and its 95% bootstrap interval.
void fitConstrained(const RaceSums& sums, const ImplicitMomentumOptions& o, ImplicitMomentumResult& result);
// The race's mean trajectory against heavy ball (momentum 1 - 1/g, rate lr/g) and SGD at lr.
void compareTrajectories(const RaceSums& sums, const LeastSquares& ls, double lr, int g,
                         ImplicitMomentumResult& result);

}  // namespace poseidon::pt::fit
