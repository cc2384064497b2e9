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
};

ImplicitMomentumResult measureImplicitMomentum(const ImplicitMomentumOptions& options);

}  // namespace poseidon::pt
