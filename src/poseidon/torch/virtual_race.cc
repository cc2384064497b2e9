#include "poseidon/torch/virtual_race.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "poseidon/common/error.h"
#include "poseidon/data/fashion_mnist.h"

namespace poseidon::pt {

namespace {
constexpr int kParams = 4;  // W1 [H, 784], b1 [H], W2 [10, H], b2 [10]
using Params = std::vector<torch::Tensor>;

Params cloneAll(const Params& p) {
  Params out;
  for (const auto& t : p) out.push_back(t.clone());
  return out;
}
}  // namespace

struct VirtualRace::State {
  Params params, buffers;  // the model; PyTorch SGD's momentum buffers (buf)
};

struct VirtualRace::Data {
  VirtualRaceOptions o;
  torch::Tensor images, labels;          // the training set, normalized, [N, 784] and [N]
  torch::Tensor evalImages, evalLabels;  // the fixed sample
  StatePtr initial;
};

VirtualRace::VirtualRace(const VirtualRaceOptions& options) : d_(std::make_unique<Data>()) {
  d_->o = options;
  const VirtualRaceOptions& o = d_->o;
  if (o.batch < 1 || o.hidden < 1 || o.evalSamples < 1)
    throw InvalidArgument("virtual race: batch, hidden and eval samples must be >= 1");
  if (!(o.computeSeconds >= 0) || !(o.computeExpSeconds >= 0) || o.computeSeconds + o.computeExpSeconds <= 0)
    throw InvalidArgument("virtual race: a round must take some compute time");
  const data::Dataset train =
      data::loadFashionMnist(o.dataDir.empty() ? data::kDefaultFashionMnistDir : o.dataDir, true);
  const int64_t n = train.count, px = static_cast<int64_t>(train.rows) * train.cols;
  if (o.evalSamples > n)
    throw InvalidArgument(strCat("virtual race: ", o.evalSamples, " eval samples of ", n, " images"));
  d_->images = torch::empty({n, px});
  d_->labels = torch::empty({n}, torch::kLong);
  for (int64_t i = 0; i < n; ++i) {
    data::normalizeInto(train, i, d_->images.data_ptr<float>() + i * px);
    d_->labels.data_ptr<int64_t>()[i] = train.labels[i];
  }
  const torch::Tensor idx = torch::arange(o.evalSamples, torch::kLong) * (n / o.evalSamples);
  d_->evalImages = d_->images.index_select(0, idx);
  d_->evalLabels = d_->labels.index_select(0, idx);
  // PyTorch's nn.Linear initialization (uniform within 1 / sqrt(fan_in), weights and biases), drawn
  // from the seed here so that every thread builds the same model.
  std::mt19937_64 rng(o.modelSeed);
  auto uniform = [&](std::vector<int64_t> shape, int64_t fanIn) {
    torch::Tensor t = torch::empty(shape);
    const float bound = 1.0f / std::sqrt(static_cast<float>(fanIn));
    std::uniform_real_distribution<float> u(-bound, bound);
    float* p = t.data_ptr<float>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = u(rng);
    return t;
  };
  auto s = std::make_shared<State>();
  s->params = {uniform({o.hidden, px}, px), uniform({o.hidden}, px),
               uniform({data::kFashionMnistClasses, o.hidden}, o.hidden),
               uniform({data::kFashionMnistClasses}, o.hidden)};
  for (const auto& p : s->params) s->buffers.push_back(torch::zeros_like(p));
  d_->initial = s;
}

VirtualRace::~VirtualRace() = default;

const VirtualRaceOptions& VirtualRace::options() const { return d_->o; }

void VirtualRace::setIntraOpThreads(int threads) { torch::set_num_threads(threads); }

double VirtualRace::commSeconds(int groups) const {
  const auto it = d_->o.commSeconds.find(groups);
  if (it == d_->o.commSeconds.end())
    throw InvalidArgument(strCat("virtual race: no communication time for g = ", groups));
  return it->second;
}

namespace {

// The mean cross-entropy of the MLP `p` on (x, y), and with `grads` its gradient (by hand: the two
// layers' backward, so that no autograd graph is built per update).
double forwardBackward(const Params& p, const torch::Tensor& x, const torch::Tensor& y, Params* grads) {
  const torch::Tensor a1 = torch::addmm(p[1], x, p[0].t());
  const torch::Tensor h = torch::relu(a1);
  const torch::Tensor z = torch::addmm(p[3], h, p[2].t());
  const torch::Tensor logp = torch::log_softmax(z, 1);
  const double loss = -logp.gather(1, y.unsqueeze(1)).mean().item<double>();
  if (grads == nullptr) return loss;
  torch::Tensor dz = logp.exp();
  dz.scatter_add_(1, y.unsqueeze(1), torch::full({y.size(0), 1}, -1.0f));
  dz.div_(static_cast<double>(y.size(0)));
  const torch::Tensor dh = dz.mm(p[2]).mul_(a1.gt(0));
  *grads = {dh.t().mm(x), dh.sum(0), dz.t().mm(h), dz.sum(0)};
  return loss;
}

}  // namespace

VirtualRace::Result VirtualRace::run(const Run& r) const {
  const VirtualRaceOptions& o = d_->o;
  if (r.groups < 1) throw InvalidArgument("virtual race: groups must be >= 1");
  if (!(r.lr > 0) || !(r.momentum >= 0 && r.momentum < 1))
    throw InvalidArgument("virtual race: the learning rate must be > 0 and the momentum in [0, 1)");
  if ((r.steps > 0) == (r.untilSeconds > 0))
    throw InvalidArgument("virtual race: give a run steps or a time, not both");
  const double comm = commSeconds(r.groups);
  torch::NoGradGuard noGrad;
  const StatePtr from = r.from ? r.from : d_->initial;
  Params w = cloneAll(from->params), buf = cloneAll(from->buffers);

  // Separate streams for the step times and the batches: the same seed races alike at any lr.
  std::mt19937_64 timeRng(r.seed * 0x9E3779B97F4A7C15ull + 1),
      batchRng((r.batchSeed ? r.batchSeed : r.seed) * 0xD1B54A32D192ED03ull + 2);
  std::exponential_distribution<double> expTime(o.computeExpSeconds > 0 ? 1 / o.computeExpSeconds : 1);
  auto roundTime = [&] { return o.computeSeconds + (o.computeExpSeconds > 0 ? expTime(timeRng) : 0) + comm; };
  std::uniform_int_distribution<int64_t> pick(0, d_->images.size(0) - 1);
  torch::Tensor idx = torch::empty({o.batch}, torch::kLong);

  struct Group {
    Params model;  // the model it pulled, which its gradient is computed on
    int64_t pulledAt = 0, rounds = 0;
    double finish = 0;
  };
  std::vector<Group> groups(r.groups);
  for (auto& g : groups) {
    g.model = cloneAll(w);
    g.finish = roundTime();
  }

  Result res;
  int64_t updates = 0;
  double now = 0;
  // Evaluations every evalEverySeconds, counted (k x every: no drift from adding it up); in a timed
  // run the last is at untilSeconds when it is a multiple.
  int64_t evals = 0;
  auto nextEval = [&] {
    return r.evalEverySeconds > 0 ? static_cast<double>(evals + 1) * r.evalEverySeconds
                                  : std::numeric_limits<double>::infinity();
  };
  const double until = r.steps > 0 ? std::numeric_limits<double>::infinity() : r.untilSeconds * (1 + 1e-12);
  Params average;  // the tail average (Polyak's) of the models after updates averageAfter + 1, ...
  int64_t averaged = 0;
  auto evaluate = [&](double at) {
    res.points.push_back(
        {at, updates, forwardBackward(w, d_->evalImages, d_->evalLabels, nullptr),
         averaged > 0 ? forwardBackward(average, d_->evalImages, d_->evalLabels, nullptr) : std::nan("")});
  };
  std::vector<int64_t> evalAt = r.evalAtUpdates;
  std::sort(evalAt.begin(), evalAt.end());
  size_t nextAt = 0;
  Params grads;
  for (;;) {
    int next = -1;
    for (int i = 0; i < r.groups; ++i) {
      if (r.steps > 0 && groups[i].rounds >= r.steps) continue;
      if (next < 0 || groups[i].finish < groups[next].finish) next = i;
    }
    if (next < 0 || (r.steps == 0 && groups[next].finish > r.untilSeconds)) break;
    Group& g = groups[next];
    // The model is constant between pushes: the evaluations due before this one see it as it is.
    for (; nextEval() <= g.finish && nextEval() <= until; ++evals) evaluate(nextEval());
    now = g.finish;
    int64_t* p = idx.data_ptr<int64_t>();
    for (int64_t i = 0; i < o.batch; ++i) p[i] = pick(batchRng);
    const double loss =
        forwardBackward(g.model, d_->images.index_select(0, idx), d_->labels.index_select(0, idx), &grads);
    if (!std::isfinite(loss)) {
      res.divergedAtUpdate = updates;
      break;
    }
    for (int k = 0; k < kParams; ++k) {  // ModelShard's update: buf <- mu buf + grad, W <- W - eta buf
      buf[k].mul_(r.momentum).add_(grads[k]);
      w[k].add_(buf[k], -r.lr);
    }
    ++res.staleness[updates - g.pulledAt];
    ++updates;
    if (r.averageAfter >= 0 && updates > r.averageAfter) {
      if (averaged++ == 0) {
        average = cloneAll(w);
      } else {
        for (int k = 0; k < kParams; ++k) average[k].add_(w[k] - average[k], 1.0 / static_cast<double>(averaged));
      }
    }
    ++g.rounds;
    for (int k = 0; k < kParams; ++k) g.model[k].copy_(w[k]);
    g.pulledAt = updates;
    g.finish = now + roundTime();
    for (; nextAt < evalAt.size() && evalAt[nextAt] <= updates; ++nextAt)
      if (evalAt[nextAt] == updates) evaluate(now);
  }
  if (r.steps == 0 && res.divergedAtUpdate < 0) {
    for (; nextEval() <= until; ++evals) evaluate(nextEval());
    now = r.untilSeconds;
  }
  res.seconds = now;
  res.updates = updates;
  if (res.divergedAtUpdate >= 0) {
    res.points.push_back({now, updates, std::nan(""), std::nan("")});
  } else if (res.points.empty() || res.points.back().updates != updates ||
             std::fabs(res.points.back().seconds - now) > 1e-9 * std::max(1.0, now)) {
    evaluate(now);  // the end model, unless the last evaluation was it
  }
  auto end = std::make_shared<State>();
  end->params = std::move(w);
  end->buffers = std::move(buf);
  res.end = end;
  return res;
}

}  // namespace poseidon::pt
