#include "poseidon/torch/experiments.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include "poseidon/common/error.h"
#include "poseidon/data/fashion_mnist.h"
#include "poseidon/launch/env.h"
#include "poseidon/torch/distributed.h"
#include "poseidon/torch/implicit_momentum_fit.h"

namespace poseidon::pt {

namespace {

// Everyone waits here until all workers joined and the recording is set up.
class Latch {
 public:
  explicit Latch(int count) : left_(count) {}
  void arriveAndWait() {
    std::unique_lock<std::mutex> lock(mutex_);
    if (--left_ == 0) cv_.notify_all();
    cv_.wait(lock, [&] { return left_ <= 0; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int left_;
};

// The exponential race, imposed. Groups whose step times are i.i.d. exponential finish in a
// memoryless order: the next group to push is uniform over the groups, independent of the past.
// The turnstile draws that order and lets one group at a time take its turn (push its update,
// pull the model its next one is computed on); the others wait. Every wait is bounded by the
// run's timeout, and a worker that fails wakes the others with its error.
class RaceTurnstile {
 public:
  RaceTurnstile(int groups, int members, int64_t turns, uint64_t seed, std::chrono::milliseconds timeout)
      : groups_(groups),
        members_(members),
        turnsLeft_(turns),
        waitingToStart_(groups * members),
        rng_(seed),
        timeout_(timeout) {}

  // Every worker pulled W(0): the race starts once all have (they all start on W(0) together).
  void started() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (--waitingToStart_ == 0) drawLocked();
  }

  // Blocks until `group` has a turn that this member has not taken yet (`taken`: the number of the
  // member's last turn, updated); false once every turn is taken.
  bool await(int group, int64_t& taken) {
    std::unique_lock<std::mutex> lock(mutex_);
    const bool ready = cv_.wait_for(lock, timeout_, [&] {
      return !error_.empty() || turnsLeft_ < 0 || (waitingToStart_ == 0 && turn_ == group && number_ > taken);
    });
    if (!error_.empty()) throw Error(error_);
    if (!ready) throw Error(strCat("exact race: group ", group, " waited for its turn longer than the timeout"));
    taken = number_;
    return turnsLeft_ >= 0;
  }

  // A member's turn is done; the last of the group's members draws the next group.
  void done() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (++finished_ == members_) drawLocked();
  }

  void fail(const std::string& what) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (error_.empty()) error_ = what;
    cv_.notify_all();
  }

 private:
  void drawLocked() {
    finished_ = 0;
    --turnsLeft_;  // -1: the race is over
    ++number_;
    turn_ = std::uniform_int_distribution<int>(0, groups_ - 1)(rng_);
    cv_.notify_all();
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  const int groups_, members_;
  int64_t turnsLeft_;
  int waitingToStart_, finished_ = 0, turn_ = -1;
  int64_t number_ = 0;  // of the current turn
  std::mt19937_64 rng_;
  std::chrono::milliseconds timeout_;
  std::string error_;
};

torch::Tensor imagesOf(const data::Dataset& d, const std::vector<int64_t>& idx) {
  const int64_t px = static_cast<int64_t>(d.rows) * d.cols;
  torch::Tensor x = torch::empty({static_cast<int64_t>(idx.size()), px});
  for (size_t i = 0; i < idx.size(); ++i) data::normalizeInto(d, idx[i], x.data_ptr<float>() + i * px);
  return x;
}

torch::Tensor labelsOf(const data::Dataset& d, const std::vector<int64_t>& idx) {
  torch::Tensor y = torch::empty({static_cast<int64_t>(idx.size())}, torch::kLong);
  for (size_t i = 0; i < idx.size(); ++i) y.data_ptr<int64_t>()[i] = d.labels[idx[i]];
  return y;
}

struct WorkerResult {
  std::vector<std::vector<float>> recorded;  // from the worker whose shard holds the model's pair
  std::map<int64_t, int64_t> staleness;
};

// What every run shares: the options, the data and the initial linear model (softmax regression in
// the wall-clock mode, least squares in the exact race: the same 784 x 10 layer).
struct Setup {
  Setup(const ImplicitMomentumOptions& options, const data::Dataset& data) : o(options), train(data) {}
  const ImplicitMomentumOptions& o;
  const data::Dataset& train;
  int64_t classes = 10, inputs = 0;
  torch::nn::Linear init{nullptr};
  // The exact race: the fit's sample, its one-hot targets and the rate.
  torch::Tensor sample, targets;
  double lr = 0;
};

// A worker's node: compute-group mode, explicit momentum 0, the shards' rate `lr`.
DistributedOptions workerOptions(const ImplicitMomentumOptions& o, int rank, int port, double lr) {
  DistributedOptions d;
  d.node.rank = rank;
  d.node.worldSize = o.workers;
  d.node.masterPort = port;
  d.node.timeout = std::chrono::milliseconds(o.timeoutMs);
  d.node.threads = 1;
  d.node.settings.batch = o.batch;
  d.node.settings.groups = o.groups;
  d.node.settings.momentum = 0;
  d.learningRate = static_cast<float>(lr);
  return d;
}

// The random streams of run `run` (batches, step times, the race's order) all start from this.
uint64_t runStream(const ImplicitMomentumOptions& o, int run) { return o.seed + 1000003ull * static_cast<uint64_t>(run); }

// One worker's parts in either mode: the shared initial model, its node (the recorder keeps the
// model after every update when its shard holds the pair), and the SGD that tells the shards the rate.
struct Worker {
  torch::nn::Linear net;
  DistributedModel dist;
  const bool recorder;
  torch::optim::SGD opt;

  Worker(const Setup& setup, int rank, int port, double lr, const char* name, Latch& ready)
      : net(copyOf(setup)),
        dist(net, name, workerOptions(setup.o, rank, port, lr)),
        recorder(dist.node().recordModelUpdates(0, 0)),
        opt(net->parameters(), torch::optim::SGDOptions(lr)) {
    ready.arriveAndWait();  // every worker's node is up and the recording is set before any push
  }

  WorkerResult finish() {
    dist.finish();
    WorkerResult out;
    if (recorder) out.recorded = dist.node().recordedModel();
    out.staleness = dist.node().stalenessHistogram();
    return out;
  }

 private:
  static torch::nn::Linear copyOf(const Setup& setup) {
    torch::nn::Linear net(setup.inputs, setup.classes);
    torch::NoGradGuard guard;
    net->weight.copy_(setup.init->weight);
    net->bias.copy_(setup.init->bias);
    return net;
  }
};

// One worker of run `run` in the wall-clock mode: a real node in compute-group mode, training the
// shared initial model on the fit's sample with padded step times.
WorkerResult runWorker(const Setup& setup, int rank, int run, int port, Latch& ready) {
  const ImplicitMomentumOptions& o = setup.o;
  Worker w(setup, rank, port, o.lr, "softmax", ready);
  // A group's members draw the same step times (one stream per group): the group's step time is
  // then the drawn one, exponential under A2. Batches: uniform with replacement (A0), per worker.
  const int group = rank / (o.workers / o.groups);
  const uint64_t stream = runStream(o, run);
  std::mt19937_64 timeRng(stream * 7919 + static_cast<uint64_t>(group));
  std::mt19937_64 dataRng(stream * 104729 + static_cast<uint64_t>(rank));
  std::exponential_distribution<double> expo(1.0 / o.stepMs);
  // The batches come from the fit's sample: its gradient is then the exact expectation of theirs.
  std::uniform_int_distribution<int64_t> pick(0, std::min<int64_t>(o.fitSample, setup.train.count) - 1);
  for (int64_t s = 0; s < o.steps; ++s) {
    std::vector<int64_t> idx(static_cast<size_t>(o.batch));
    for (auto& i : idx) i = pick(dataRng);
    const double padMs = o.exponential ? expo(timeRng) : o.stepMs;
    w.opt.zero_grad();
    auto loss =
        torch::nn::functional::cross_entropy(w.dist.forward(imagesOf(setup.train, idx)), labelsOf(setup.train, idx));
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(padMs));  // the padded compute
    loss.backward();
    w.dist.step(w.opt);
  }
  return w.finish();
}

// One worker of run `run` in the exact race: least squares on one-hot targets (a linear gradient),
// batches uniform with replacement from the fit's sample, one turn at a time. A turn is the
// group's push of the gradient it computed on the model of its last pull, then the pull of the
// next model (which the shard answers only once this push is applied, and which no other group's
// push can precede: they wait for the turn).
WorkerResult runRaceWorker(const Setup& setup, int rank, int run, int port, Latch& ready, RaceTurnstile& race) {
  const ImplicitMomentumOptions& o = setup.o;
  try {
    Worker w(setup, rank, port, setup.lr, "least-squares", ready);
    const int group = rank / (o.workers / o.groups);
    std::mt19937_64 dataRng(runStream(o, run) * 104729 + static_cast<uint64_t>(rank));
    std::uniform_int_distribution<int64_t> pick(0, setup.sample.size(0) - 1);
    auto nextLoss = [&] {  // pulls the round's model (forward), then the batch's loss on it
      torch::Tensor idx = torch::empty({o.batch}, torch::kLong);
      for (int64_t i = 0; i < o.batch; ++i) idx.data_ptr<int64_t>()[i] = pick(dataRng);
      torch::Tensor err = w.dist.forward(setup.sample.index_select(0, idx)) - setup.targets.index_select(0, idx);
      return err.pow(2).sum(1).mean().mul(0.5);
    };
    torch::Tensor loss = nextLoss();  // on W(0), as every group starts
    race.started();
    int64_t taken = 0;
    while (race.await(group, taken)) {
      w.opt.zero_grad();
      loss.backward();
      w.dist.step(w.opt);
      loss = nextLoss();
      race.done();
    }
    return w.finish();
  } catch (const std::exception& e) {
    race.fail(e.what());
    throw;
  }
}

// One run: every worker a thread with a real node; returns the recorded W(0), W(1), ... of the
// whole model (one layer: one pair holds it) and adds the staleness.
std::vector<std::vector<float>> runOnce(const Setup& setup, int run, std::map<int64_t, int64_t>& staleness) {
  const ImplicitMomentumOptions& o = setup.o;
  const int port = freePort("127.0.0.1");
  Latch ready(o.workers);
  const uint64_t raceSeed = runStream(o, run) * 15485863ull;
  RaceTurnstile race(o.groups, o.workers / o.groups, o.steps * o.groups, raceSeed,
                     std::chrono::milliseconds(o.timeoutMs));
  std::vector<std::future<WorkerResult>> futures;
  for (int r = 0; r < o.workers; ++r) {
    if (o.exactRace) {
      futures.push_back(std::async(std::launch::async, runRaceWorker, std::cref(setup), r, run, port, std::ref(ready),
                                   std::ref(race)));
    } else {
      futures.push_back(std::async(std::launch::async, runWorker, std::cref(setup), r, run, port, std::ref(ready)));
    }
  }
  std::vector<std::vector<float>> w;
  for (auto& f : futures) {
    WorkerResult r = f.get();
    if (!r.recorded.empty()) w = std::move(r.recorded);
    for (const auto& [st, n] : r.staleness) staleness[st] += n;
  }
  if (w.size() < 3) throw Error("the shard recorded fewer than three versions of the model");
  return w;
}

// The staleness histogram's mean and its share of fresh updates.
void summarizeStaleness(ImplicitMomentumResult& result) {
  double updates = 0, weighted = 0;
  for (const auto& [st, n] : result.staleness) {
    updates += static_cast<double>(n);
    weighted += static_cast<double>(st) * static_cast<double>(n);
  }
  result.meanStaleness = updates > 0 ? weighted / updates : 0;
  result.stalenessA = result.meanStaleness / (1 + result.meanStaleness);
  // Theorem 1 rests on a geometric staleness law, P(tau = j) = (1/g)(1 - 1/g)^j (exponential step
  // times: an update is fresh with probability 1/g). The mean, g - 1, holds for any steady
  // round-robin; P(tau = 0) tells whether the law itself holds.
  const auto fresh = result.staleness.find(0);
  result.freshShare = updates > 0 && fresh != result.staleness.end() ? static_cast<double>(fresh->second) / updates : 0;
}

// The sums of the least-squares fit V(t+1) = a V(t) + b (-grad W(t)), and of its instrumental-variable
// variant (z = -grad W(t-1)).
struct FitSums {
  double sxx = 0, sxg = 0, sgg = 0, sxy = 0, sgy = 0, syy = 0;
  double szx = 0, szg = 0, szy = 0;
};

// V(t+1) = W(t+1) - W(t) as in the paper's eq. (4): the update that the gradient at W(t) made.
// The full-batch gradient at every recorded W(t) on a fixed sample (softmax regression in closed
// form: dL/dz = softmax(z) - onehot(y), averaged), summed over every coordinate.
FitSums fitSums(const Setup& setup, std::vector<std::vector<std::vector<float>>>& runs, size_t burnIn) {
  const ImplicitMomentumOptions& o = setup.o;
  const int64_t classes = setup.classes, inputs = setup.inputs;
  std::vector<int64_t> sample(static_cast<size_t>(std::min<int64_t>(o.fitSample, setup.train.count)));
  for (size_t i = 0; i < sample.size(); ++i) sample[i] = static_cast<int64_t>(i);
  const torch::Tensor x = imagesOf(setup.train, sample);
  const torch::Tensor y = torch::one_hot(labelsOf(setup.train, sample), classes).to(torch::kFloat32);
  const auto& w = runs.front();
  const int64_t n = static_cast<int64_t>(w[0].size());
  auto gradAt = [&](const std::vector<float>& flat) {
    torch::Tensor params = torch::from_blob(const_cast<float*>(flat.data()), {n}, torch::kFloat32);
    torch::Tensor weight = params.narrow(0, 0, classes * inputs).view({classes, inputs});
    torch::Tensor bias = params.narrow(0, classes * inputs, classes);
    torch::Tensor err = torch::softmax(torch::addmm(bias, x, weight.t()), 1) - y;
    const double rows = static_cast<double>(x.size(0));
    return torch::cat({torch::mm(err.t(), x).flatten(), err.sum(0)}).div(rows).to(torch::kFloat64);
  };
  // E W(t) and E grad(W(t)) over the runs (same initial model, independent batches and step
  // times): the expectations Theorem 1 speaks of. One run leaves the minibatch noise in V(t), which
  // pulls a towards 0 (a noisy regressor) and gives its weight to the gradient.
  const double share = 1.0 / static_cast<double>(runs.size());
  auto meanW = [&](size_t t) {
    torch::Tensor m = torch::zeros({n}, torch::kFloat64);
    for (auto& r : runs) m.add_(torch::from_blob(r[t].data(), {n}, torch::kFloat32).to(torch::kFloat64), share);
    return m;
  };
  auto meanGrad = [&](size_t t) {
    torch::Tensor m = torch::zeros({n}, torch::kFloat64);
    for (auto& r : runs) m.add_(gradAt(r[t]), share);
    return m;
  };
  FitSums f;
  // Instrumental variables: the gradient at the model before, grad(W(t-1)), is independent of the
  // noise that the runs leave in V(t) and V(t+1), so the fit on it is not pulled towards a = 0.
  torch::Tensor before = meanW(burnIn), now = meanW(burnIn + 1);
  torch::Tensor prev = now - before, prevGrad = meanGrad(burnIn).neg();
  for (size_t t = burnIn; t + 2 < w.size(); ++t) {
    torch::Tensor after = meanW(t + 2);
    torch::Tensor v = prev, next = after - now, g = meanGrad(t + 1).neg();
    f.sxx += v.dot(v).item<double>();
    f.sxg += v.dot(g).item<double>();
    f.sgg += g.dot(g).item<double>();
    f.sxy += v.dot(next).item<double>();
    f.sgy += g.dot(next).item<double>();
    f.syy += next.dot(next).item<double>();
    f.szx += prevGrad.dot(v).item<double>();
    f.szg += prevGrad.dot(g).item<double>();
    f.szy += prevGrad.dot(next).item<double>();
    prev = next;
    now = after;
    prevGrad = g;
  }
  return f;
}

// a and b from the sums: least squares, its R^2, and the instrumental-variable estimate.
void solveFit(const FitSums& f, ImplicitMomentumResult& result) {
  const double det = f.sxx * f.sgg - f.sxg * f.sxg;
  if (!(std::abs(det) > 0)) throw Error("the implicit-momentum fit is degenerate (no variation in the updates)");
  result.a = (f.sxy * f.sgg - f.sgy * f.sxg) / det;
  result.b = (f.sgy * f.sxx - f.sxy * f.sxg) / det;
  const double ssRes = f.syy - 2 * result.a * f.sxy - 2 * result.b * f.sgy + result.a * result.a * f.sxx +
                       2 * result.a * result.b * f.sxg + result.b * result.b * f.sgg;
  result.r2 = f.syy > 0 ? 1 - ssRes / f.syy : 0;
  // [z.V  z.g] [a]   [z.V(t+1)]
  // [g.V  g.g] [b] = [g.V(t+1)]
  const double ivDet = f.szx * f.sgg - f.szg * f.sxg;
  if (std::abs(ivDet) > 0) {
    result.aIv = (f.szy * f.sgg - f.szg * f.sgy) / ivDet;
    result.bIv = (f.szx * f.sgy - f.sxg * f.szy) / ivDet;
  }
}

// The exact race: the runs, then the fit and the comparison on their mean.
void measureExactRace(Setup& setup, ImplicitMomentumResult& result) {
  const ImplicitMomentumOptions& o = setup.o;
  const int64_t rows = std::min<int64_t>(o.fitSample, setup.train.count);
  std::vector<int64_t> idx(static_cast<size_t>(rows));
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int64_t>(i);
  setup.sample = imagesOf(setup.train, idx);
  setup.targets = torch::one_hot(labelsOf(setup.train, idx), setup.classes).to(torch::kFloat32);
  // The fit keeps every run's X and Y rows (the bootstrap resamples runs): say so before running.
  const int64_t updates = o.steps * o.groups - 1, floats = setup.classes * (setup.inputs + 1);
  const double bytes = 2.0 * o.runs * static_cast<double>(updates) * static_cast<double>(floats) * sizeof(float);
  if (bytes > 8.0 * (1 << 30)) {
    throw InvalidArgument(strCat("the exact race would keep ", bytes / (1 << 30), " GiB of updates (2 x --runs ",
                                 o.runs, " x ", updates, " updates x ", floats,
                                 " floats); the limit is 8 GiB: lower --runs or --steps"));
  }
  const fit::LeastSquares ls(setup.sample, setup.targets);
  result.lambdaMax = ls.lambdaMax();
  setup.lr = o.lr > 0 ? o.lr : o.lrCurvature / result.lambdaMax;
  result.lr = setup.lr;
  fit::RaceSums sums;
  sums.total = static_cast<size_t>(o.runs);
  for (int run = 0; run < o.runs; ++run) {
    std::vector<std::vector<float>> w = runOnce(setup, run, result.staleness);
    result.updates = static_cast<int64_t>(w.size()) - 1;
    if (result.updates < 3) throw Error("the exact race recorded fewer than three updates");
    sums.add(ls, setup.lr, run, w);
  }
  fit::fitConstrained(sums, o, result);
  fit::compareTrajectories(sums, ls, setup.lr, o.groups, result);
  result.predictedB = setup.lr / o.groups;
}

}  // namespace

ImplicitMomentumResult measureImplicitMomentum(const ImplicitMomentumOptions& o) {
  if (o.groups < 1 || o.workers < 1 || o.workers % o.groups != 0) {
    throw InvalidArgument(strCat("--groups ", o.groups, " must divide the ", o.workers, " workers"));
  }
  if (o.steps < 3) throw InvalidArgument("--steps must be at least 3");
  if (o.exactRace && o.runs < 2)
    throw InvalidArgument("the exact race needs at least 2 runs (its interval resamples them)");
  const std::string dir = o.dataDir.empty() ? data::kDefaultFashionMnistDir : o.dataDir;
  const data::Dataset train = data::loadFashionMnist(dir, true);
  torch::set_num_threads(1);
  torch::manual_seed(static_cast<int64_t>(o.seed));
  Setup setup{o, train};
  setup.inputs = static_cast<int64_t>(train.rows) * train.cols;
  setup.init = torch::nn::Linear(setup.inputs, setup.classes);

  ImplicitMomentumResult result;
  result.groups = o.groups;
  result.predictedA = 1.0 - 1.0 / o.groups;
  if (o.exactRace) {
    measureExactRace(setup, result);
    summarizeStaleness(result);
    return result;
  }
  setup.lr = o.lr;
  result.lr = o.lr;
  std::vector<std::vector<std::vector<float>>> runs;
  for (int run = 0; run < o.runs; ++run) {
    runs.push_back(runOnce(setup, run, result.staleness));
    if (runs.back().size() != runs.front().size()) throw Error("the runs recorded different numbers of updates");
  }
  result.updates = static_cast<int64_t>(runs.front().size()) - 1;
  summarizeStaleness(result);
  // The first updates all come from groups that started on W(0) together: no stationary queue yet.
  const size_t burnIn = static_cast<size_t>(std::min<int64_t>(o.burnIn, result.updates - 3));
  solveFit(fitSums(setup, runs, burnIn), result);
  result.predictedB = o.lr / o.groups;
  return result;
}

}  // namespace poseidon::pt
