// Measurements of the algorithm itself (poseidon experiment ...), as opposed to
// the benchmark's throughput.
//
// Implicit momentum (Omnivore section IV-C, Theorem 1; Mitliagkas et al.,
// "Asynchrony begets momentum"): with g asynchronous compute groups and no
// explicit momentum, the expected update behaves like momentum SGD,
//
//   E V(t+1) = (1 - 1/g) E V(t) - (eta / g) E grad(W(t)),
//
// when step times are exponentially distributed and independent (A2). The
// experiment trains softmax regression on Fashion-MNIST with mu = 0 in g
// groups (real nodes and shards on loopback, one thread per worker), records
// the model after every update on the shard (W(0), W(1), ...), and averages
// `runs` independent runs (same initial model, own batches and step times)
// into E W(t) and E grad(W(t)), the gradient taken over a fixed sample that
// the batches are drawn from. With V(t+1) = W(t+1) - W(t) (the paper's eq. 4)
// it fits E V(t+1) = a E V(t) - b E grad(W(t)) over every coordinate and
// update after the burn-in, by least squares and by instrumental variables
// (grad(W(t-1)) for V(t), which the runs' leftover noise does not bias
// towards a = 0). Each group's step is padded to an exponentially
// distributed time (mean stepMs), the theorem's assumption; the share of
// fresh updates (staleness 0; 1/g under the theorem's geometric law) says
// how far the real step times, pad plus compute, are from it.
//
// That wall-clock mode is the control. With exactRace the theorem's
// assumptions hold by construction instead (docs/omnivore.md): a race of
// groups with i.i.d. exponential step times is memoryless, so the next group
// to push is uniform over the groups and independent of the past; a turnstile
// draws that order and lets one group at a time push its update and pull its
// next model, with no clock involved. The problem is least squares (one-hot
// targets of Fashion-MNIST images, a linear gradient), so the expectation of
// the gradient is the gradient at the expected model, and the mean trajectory
// over the runs must be the deterministic heavy-ball trajectory with momentum
// 1 - 1/g and rate eta/g. The experiment compares the two directly, fits the
// one unknown a of E V(t+1) + eta grad(W(t)) = a (E V(t) + eta grad(W(t)))
// (b = eta (1 - a), the constraint the theorem implies), and bootstraps its
// 95% interval over the runs.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace poseidon::pt {

struct ImplicitMomentumOptions {
  int groups = 2;
  int workers = 8;         // groups must divide it
  int64_t steps = 40;      // per group
  int64_t batch = 1024;    // per worker
  double lr = 0.05;
  double stepMs = 40;      // mean of the padded step time
  bool exponential = true; // false: every step takes stepMs (round-robin staleness)
  uint64_t seed = 1;
  int runs = 16;           // independent runs averaged into E W(t), E grad(W(t))
  int64_t burnIn = 16;     // updates left out of the fit at the start
  int64_t fitSample = 1024;  // training images the full-batch gradient is taken over
  std::string dataDir;
  int timeoutMs = 60000;
  // The exact race on least squares (above); lr <= 0 there means lrCurvature / lambda_max of the
  // problem's Hessian.
  bool exactRace = false;
  double lrCurvature = 0.5;
  int bootstrap = 2000;  // resamples of the runs for a's interval
};

struct ImplicitMomentumResult {
  int groups = 0;
  int64_t updates = 0;
  double a = 0, b = 0;                  // the fit
  double predictedA = 0, predictedB = 0;  // 1 - 1/g, eta / g
  double r2 = 0;                        // share of the updates' variance the fit explains
  double aIv = 0, bIv = 0;              // the fit with grad(W(t-1)) as the instrument for V(t)
  double meanStaleness = 0;
  double freshShare = 0;                // P(staleness = 0); Theorem 1's law has 1/g
  std::map<int64_t, int64_t> staleness;  // updates by staleness
  double stalenessA = 0;                 // mean staleness m / (1 + m): 1 - 1/g under the geometric law

  // The exact race only.
  double lr = 0, lambdaMax = 0;  // the rate used and the Hessian's largest eigenvalue
  double aConstrained = 0;       // the fit with b = lr (1 - a) on the mean trajectory
  double aCi95[2] = {0, 0};      // its bootstrap interval over the runs
  // max_t |mean W(t) - W_model(t)| / max_t |W_model(t) - W(0)| for the heavy-ball trajectory
  // (1 - 1/g, lr/g) and for plain SGD at lr (no implicit momentum); noise is the mean trajectory's
  // standard error on the same scale.
  double heavyBallError = 0, sgdError = 0, noise = 0;
};

ImplicitMomentumResult measureImplicitMomentum(const ImplicitMomentumOptions& options);

}  // namespace poseidon::pt
