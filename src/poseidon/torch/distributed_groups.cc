// DistributedModel's compute-group mode (Omnivore; docs/omnivore.md): the shards hold the model and
// run SGD; each round pulls the model before its forward and pushes each layer's gradient as its
// backward ends. The BSP path is distributed.cc; the overlapped step distributed_overlap.cc.
#include <cmath>

#include "poseidon/common/error.h"
#include "poseidon/core/cost_model.h"
#include "poseidon/torch/distributed.h"
#include "poseidon/torch/distributed_layer.h"
#include "poseidon/torch/finite.h"

namespace poseidon::pt {

void DistributedModel::initGroups() {
  if (!(options_.learningRate >= 0) || !std::isfinite(options_.learningRate)) {
    throw InvalidArgument("compute groups: the shards run SGD and need DistributedOptions::learningRate >= 0");
  }
  groupLr_ = options_.learningRate;
  // The shards hold the model from here on: they start from rank 0's parameters (just broadcast,
  // so every rank sends the same), and each round's pull writes the model into them.
  std::vector<LayerBuffer> params;
  for (auto& l : layers_) {
    std::vector<FloatSpan> spans;
    for (auto& p : l.params) spans.push_back({p.data_ptr<float>(), p.numel()});
    params.emplace_back(spans);
  }
  node_->groups().setModel(params);
  if (node_->rank() == node_->book().workerRanks().front()) {
    const int64_t start = node_->book().settings().startIteration;
    std::vector<LayerBuffer> momentum;
    if (!options_.groupMomentum.empty()) {
      size_t i = 0;
      for (auto& l : layers_) {
        std::vector<FloatSpan> spans;
        for (auto& p : l.params) {
          if (i >= options_.groupMomentum.size() || options_.groupMomentum[i].numel() != p.numel() ||
              options_.groupMomentum[i].scalar_type() != torch::kFloat32 ||
              !options_.groupMomentum[i].is_contiguous()) {
            throw InvalidArgument(strCat("groupMomentum: parameter ", i, " has no matching float32 buffer"));
          }
          spans.push_back({options_.groupMomentum[i].data_ptr<float>(), p.numel()});
          ++i;
        }
        momentum.emplace_back(spans);
      }
    }
    node_->groups().initModel(momentum, options_.groupVersion,
                              std::vector<int64_t>(static_cast<size_t>(node_->book().settings().groups), start));
  }
}

void DistributedModel::synchronizeGroup() {
  for (int l = static_cast<int>(layers_.size()) - 1; l >= 0; --l) {
    Layer& layer = layers_[l];
    if (layer.submitted) continue;
    if (!layer.used()) {
      torch::NoGradGuard guard;
      for (auto& p : layer.params)
        if (p.grad().defined()) p.mutable_grad().zero_();
    }
    submitGroupPush(l);
  }
  node_->waitIteration();  // this round's pushes are out; the shards apply them
  inIteration_ = false;
  throwIfDiverged(nonFiniteLayer_, "the model pulled from the shards");
}

std::pair<std::vector<torch::Tensor>, int64_t> DistributedModel::groupState() {
  if (!groupMode()) throw InvalidArgument("groupState: this job has no compute groups");
  // Mid-round the first worker's parameters are its forward's inputs: the fetch would overwrite what
  // the backward still reads. Every rank is at the same point, so every rank refuses alike.
  if (inIteration_) {
    throw InvalidArgument(
        "a compute-group checkpoint between a forward and its step: save it after step(), "
        "before the next forward");
  }
  node_->settleBarrier();
  if (node_->rank() != node_->book().workerRanks().front()) return {};
  std::vector<torch::Tensor> buffers;
  std::vector<LayerBuffer> momentum;
  for (auto& l : layers_) {
    std::vector<FloatSpan> spans;
    for (auto& p : l.params) {
      buffers.push_back(torch::zeros_like(p));
      spans.push_back({buffers.back().data_ptr<float>(), p.numel()});
    }
    momentum.emplace_back(spans);
  }
  auto [version, clocks] = node_->groups().fetchModelState(momentum);
  return {std::move(buffers), version};
}

void DistributedModel::pullLatest() {
  if (!groupMode()) return;
  node_->settleBarrier();  // every shard has applied every push sent so far
  // Between a forward and its step this rank's round is not pushed: the next round's model will not
  // come (a loop that ended after a forward, then finish()); the model stays the round's.
  if (inIteration_) return;
  const int64_t next = iteration_ < 0 ? node_->book().settings().startIteration : iteration_ + 1;
  if (pulledRound_ == next) return;
  node_->groups().startPull(next);
  node_->groups().waitPulled();
  pulledRound_ = next;
}

void DistributedModel::submitGroupPush(int layer) {
  Layer& l = layers_[layer];
  l.submitted = true;
  l.scheme = Scheme::kPS;
  std::vector<FloatSpan> spans;
  for (auto& p : l.params) {
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);  // unused this round: zero
    if (!p.grad().is_contiguous()) p.mutable_grad() = p.grad().contiguous();
    spans.push_back({p.grad().data_ptr<float>(), p.grad().numel()});
  }
  node_->submitGroupPush(layer, LayerBuffer(spans), groupLr_);
  predictedPs_ +=
      psCostBoth(costInputs(*l.spec, node_->book().settings().batch, workers(), node_->book().numServers()));
  lastSchemes_[layer] = Scheme::kPS;
}

void DistributedModel::takeGroupOptimizer(torch::optim::Optimizer& optimizer) {
  auto* sgd = dynamic_cast<torch::optim::SGD*>(&optimizer);
  if (!sgd) {
    misuse("compute groups run SGD (momentum, weight decay) on the shards; this optimizer is not SGD");
  }
  const auto& o = static_cast<const torch::optim::SGDOptions&>(sgd->param_groups().at(0).options());
  const JobSettings& s = node_->book().settings();
  if (o.nesterov() || o.dampening() != 0 || static_cast<float>(o.momentum()) != s.momentum ||
      static_cast<float>(o.weight_decay()) != s.weightDecay) {
    misuse(strCat("compute groups: the shards run SGD with momentum ", s.momentum, " and weight decay ", s.weightDecay,
                  "; the optimizer has momentum ", o.momentum(), ", weight decay ", o.weight_decay(),
                  o.nesterov() ? ", nesterov" : "", o.dampening() != 0 ? ", dampening" : ""));
  }
  groupLr_ = static_cast<float>(o.lr());
}

void DistributedModel::setGroupLearningRate(float lr) {
  if (!groupMode()) throw InvalidArgument("setGroupLearningRate: this job has no compute groups");
  if (!(lr >= 0) || !std::isfinite(lr)) {
    throw InvalidArgument(strCat("compute groups: the learning rate must be finite and >= 0, got ", lr));
  }
  groupLr_ = lr;
}

}  // namespace poseidon::pt
