// Compute groups on a virtual clock: the substrate of `poseidon tune --regret` (cli/tune_regret.cc,
// docs/omnivore.md), where the optimizer and a grid of fixed configurations must train to convergence
// many times over in minutes on two cores.
//
// g groups train one model asynchronously as compute-group mode does (docs/omnivore.md): each group
// pulls the shared model, computes one gradient on its group batch, pushes it; the model is updated
// with each push as ModelShard updates it (PyTorch's SGD with momentum: buf <- mu buf + grad,
// W <- W - eta buf), and the group pulls again. What is simulated is only time: a group's round
// takes computeSeconds + Exp(computeExpSeconds) + commSeconds(g) on a virtual clock, and the pushes
// are applied in the order of their virtual finish times (a discrete-event simulation, one thread per
// run, no sleeps). The CPU pays only for the real work: one forward and backward of the group batch
// per update, the model's copies, the loss evaluations. The model is a 784-H-10 ReLU MLP on
// Fashion-MNIST; the loss is the mean cross-entropy on a fixed sample of training images, taken off
// the clock (the tuner's "lowest final loss").
//
// Runs are independent and `run` is const: several may run on different threads at once.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace poseidon::pt {

struct VirtualRaceOptions {
  std::string dataDir;                // Fashion-MNIST (default: Debian's)
  int64_t batch = 64;                 // a group's batch (the paper's: split over the group's members)
  int hidden = 64;                    // the MLP's hidden width
  int64_t evalSamples = 1024;         // the loss's fixed training images, evenly spaced
  uint64_t modelSeed = 1;             // the initial model
  double computeSeconds = 0.3;        // a round's deterministic compute
  double computeExpSeconds = 0.3;     // plus an exponential one of this mean
  std::map<int, double> commSeconds;  // per number of groups: a round's communication (the planner's)
};

class VirtualRace {
 public:
  struct State;  // the model's parameters and the momentum buffers
  using StatePtr = std::shared_ptr<const State>;

  struct Run {
    StatePtr from;  // null: the initial model, zero momentum
    int groups = 1;
    double lr = 0.01, momentum = 0;
    int64_t steps = 0;                   // every group makes this many rounds (the run ends with the last) ...
    double untilSeconds = 0;             // ... or (steps = 0) the race runs until this virtual time
    uint64_t seed = 1;                   // the batches and the step times
    uint64_t batchSeed = 0;              // the batches' own seed (0: from `seed`)
    double evalEverySeconds = 0;         // the loss every this many virtual seconds (0: never)
    std::vector<int64_t> evalAtUpdates;  // and after these numbers of updates
    // >= 0: from this many updates on, also keep the running mean of the models after each update (the
    // tail average); each evaluation then scores it too (Point::averageLoss).
    int64_t averageAfter = -1;
  };
  struct Point {
    double seconds = 0;      // virtual, from the run's start
    int64_t updates = 0;     // applied so far in this run
    double loss = 0;         // on the fixed sample (NaN once diverged)
    double averageLoss = 0;  // the tail average's (NaN before it has a model, or without averageAfter)
  };
  struct Result {
    StatePtr end;
    double seconds = 0;  // the run's virtual duration
    int64_t updates = 0;
    int64_t divergedAtUpdate = -1;         // the update after which the model was not finite; the run stopped there
    std::vector<Point> points;             // in time order; the last one is the end model's
    std::map<int64_t, int64_t> staleness;  // updates by the number of others applied since their pull
  };

  explicit VirtualRace(const VirtualRaceOptions& options);
  ~VirtualRace();
  VirtualRace(const VirtualRace&) = delete;
  VirtualRace& operator=(const VirtualRace&) = delete;

  // Throws InvalidArgument for a run it cannot make (no comm time for its g, no length, bad rates).
  Result run(const Run& run) const;
  double commSeconds(int groups) const;
  const VirtualRaceOptions& options() const;
  // LibTorch's intra-op threads (process-wide): 1 when runs go in parallel on their own threads.
  static void setIntraOpThreads(int threads);

 private:
  struct Data;
  std::unique_ptr<Data> d_;
};

}  // namespace poseidon::pt
