#include "poseidon/torch/experiments.h"

#include <torch/torch.h>

#include <condition_variable>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include "poseidon/common/error.h"
#include "poseidon/data/fashion_mnist.h"
#include "poseidon/launch/env.h"
#include "poseidon/torch/distributed.h"

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

// What every run shares: the options, the data and the initial softmax regression.
struct Setup {
  const ImplicitMomentumOptions& o;
  const data::Dataset& train;
  int64_t classes = 10, inputs = 0;
  torch::nn::Linear init{nullptr};
};

// One worker of run `run`: a real node in compute-group mode, training the shared initial model on
// the fit's sample with padded step times.
WorkerResult runWorker(const Setup& setup, int rank, int run, int port, Latch& ready) {
  const ImplicitMomentumOptions& o = setup.o;
  WorkerResult out;
  torch::nn::Linear net(setup.inputs, setup.classes);
  {
    torch::NoGradGuard guard;
    net->weight.copy_(setup.init->weight);
    net->bias.copy_(setup.init->bias);
  }
  DistributedOptions d;
  d.node.rank = rank;
  d.node.worldSize = o.workers;
  d.node.masterPort = port;
  d.node.timeout = std::chrono::milliseconds(o.timeoutMs);
  d.node.threads = 1;
  d.node.settings.batch = o.batch;
  d.node.settings.groups = o.groups;
  d.node.settings.momentum = 0;
  d.learningRate = static_cast<float>(o.lr);
  DistributedModel dist(net, "softmax", d);
  const bool recorder = dist.node().recordModelUpdates(0, 0);
  ready.arriveAndWait();
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(o.lr));
  // A group's members draw the same step times (one stream per group): the group's step time is
  // then the drawn one, exponential under A2. Batches: uniform with replacement (A0), per worker.
  const int group = rank / (o.workers / o.groups);
  const uint64_t stream = o.seed + 1000003ull * static_cast<uint64_t>(run);
  std::mt19937_64 timeRng(stream * 7919 + static_cast<uint64_t>(group));
  std::mt19937_64 dataRng(stream * 104729 + static_cast<uint64_t>(rank));
  std::exponential_distribution<double> expo(1.0 / o.stepMs);
  // The batches come from the fit's sample: its gradient is then the exact expectation of theirs.
  std::uniform_int_distribution<int64_t> pick(0, std::min<int64_t>(o.fitSample, setup.train.count) - 1);
  for (int64_t s = 0; s < o.steps; ++s) {
    std::vector<int64_t> idx(static_cast<size_t>(o.batch));
    for (auto& i : idx) i = pick(dataRng);
    const double padMs = o.exponential ? expo(timeRng) : o.stepMs;
    opt.zero_grad();
    auto loss =
        torch::nn::functional::cross_entropy(dist.forward(imagesOf(setup.train, idx)), labelsOf(setup.train, idx));
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(padMs));  // the padded compute
    loss.backward();
    dist.step(opt);
  }
  dist.finish();
  if (recorder) out.recorded = dist.node().recordedModel();
  out.staleness = dist.node().stalenessHistogram();
  return out;
}

// One run: every worker a thread with a real node; returns the recorded W(0), W(1), ... of the
// whole model (softmax regression has one layer: one pair holds it) and adds the staleness.
std::vector<std::vector<float>> runOnce(const Setup& setup, int run, std::map<int64_t, int64_t>& staleness) {
  const int port = freePort("127.0.0.1");
  Latch ready(setup.o.workers);
  std::vector<std::future<WorkerResult>> futures;
  for (int r = 0; r < setup.o.workers; ++r) {
    futures.push_back(std::async(std::launch::async, runWorker, std::cref(setup), r, run, port, std::ref(ready)));
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

}  // namespace

ImplicitMomentumResult measureImplicitMomentum(const ImplicitMomentumOptions& o) {
  if (o.groups < 1 || o.workers < 1 || o.workers % o.groups != 0) {
    throw InvalidArgument(strCat("--groups ", o.groups, " must divide the ", o.workers, " workers"));
  }
  if (o.steps < 3) throw InvalidArgument("--steps must be at least 3");
  const std::string dir = o.dataDir.empty() ? data::kDefaultFashionMnistDir : o.dataDir;
  const data::Dataset train = data::loadFashionMnist(dir, true);
  torch::set_num_threads(1);
  torch::manual_seed(static_cast<int64_t>(o.seed));
  Setup setup{o, train};
  setup.inputs = static_cast<int64_t>(train.rows) * train.cols;
  setup.init = torch::nn::Linear(setup.inputs, setup.classes);

  ImplicitMomentumResult result;
  result.groups = o.groups;
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
  result.predictedA = 1.0 - 1.0 / o.groups;
  result.predictedB = o.lr / o.groups;
  return result;
}

}  // namespace poseidon::pt
