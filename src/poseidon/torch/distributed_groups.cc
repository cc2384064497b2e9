// DistributedModel::GroupSync, the compute-group strategy (Omnivore; docs/omnivore.md): the shards
// hold the model and run SGD; each round pulls the model before its forward and pushes each layer's
// gradient as its backward ends. The BSP path is distributed.cc; the overlapped step
// distributed_overlap.cc.
#include <cmath>

#include "poseidon/common/error.h"
#include "poseidon/core/cost_model.h"
#include "poseidon/torch/device_staging.h"
#include "poseidon/torch/distributed.h"
#include "poseidon/torch/distributed_layer.h"
#include "poseidon/torch/finite.h"

namespace poseidon::pt {

void DistributedModel::GroupSync::start() {
  const DistributedOptions& options = m_.options_;
  Node& node = *m_.node_;
  if (!(options.learningRate >= 0) || !std::isfinite(options.learningRate)) {
    throw InvalidArgument("compute groups: the shards run SGD and need DistributedOptions::learningRate >= 0");
  }
  lr_ = options.learningRate;
  // The shards hold the model from here on: they start from rank 0's parameters (just broadcast,
  // so every rank sends the same). Each round's pull lands in host buffers, one per layer, and is
  // copied into the parameters before the forward (pulledIntoParameters; a device model's goes up
  // to the device): the next round's pull is asked during this round's backward (layerReady), and
  // its replies must not overwrite what the backward, the optimizer's step or the caller still read.
  std::vector<LayerBuffer> params;
  for (auto& l : m_.layers_) {
    torch::NoGradGuard guard;
    l.pulled = m_.staging_ ? m_.staging_->hostTensor(l.spec->numel()) : torch::empty({l.spec->numel()});
    const auto views = perParameter(l.pulled, l.params);
    for (size_t i = 0; i < views.size(); ++i) views[i].copy_(l.params[i]);
    params.push_back(LayerBuffer::contiguous(l.pulled.data_ptr<float>(), l.pulled.numel()));
  }
  node.groups().setModel(params);
  if (node.rank() == node.book().workerRanks().front()) {
    const int64_t start = node.book().settings().startIteration;
    std::vector<LayerBuffer> momentum;
    std::vector<torch::Tensor> buffers;  // on the host (a checkpoint may have loaded them onto the device)
    for (const auto& b : options.groupMomentum) buffers.push_back(b.defined() ? b.to(torch::kCPU) : b);
    if (!buffers.empty()) {
      size_t i = 0;
      for (auto& l : m_.layers_) {
        std::vector<FloatSpan> spans;
        for (auto& p : l.params) {
          if (i >= buffers.size() || !buffers[i].defined() || buffers[i].numel() != p.numel() ||
              buffers[i].scalar_type() != torch::kFloat32 || !buffers[i].is_contiguous()) {
            throw InvalidArgument(strCat("groupMomentum: parameter ", i, " has no matching float32 buffer"));
          }
          spans.push_back({buffers[i].data_ptr<float>(), p.numel()});
          ++i;
        }
        momentum.emplace_back(spans);
      }
    }
    node.groups().initModel(momentum, options.groupVersion,
                            std::vector<int64_t>(static_cast<size_t>(node.book().settings().groups), start));
  }
}

void DistributedModel::GroupSync::pull(int64_t round) {
  // The round's model, from the shards (every pair asked at once; the first layers arrive first).
  awaitPrefetch();  // the puller takes one round at a time
  m_.node_->groups().startPull(round);
  m_.node_->groups().waitPulled();
  pulledRound_ = round;
  pulledIntoParameters();
}

void DistributedModel::GroupSync::pulledIntoParameters() {
  for (size_t l = 0; l < m_.layers_.size(); ++l) layerIntoParameters(l);
}

void DistributedModel::GroupSync::layerIntoParameters(size_t layer) {
  Layer& l = m_.layers_[layer];
  const auto pulled = perParameter(l.pulled, l.params);
  if (m_.staging_) {
    for (size_t i = 0; i < pulled.size(); ++i) DeviceStaging::fromHost(l.params[i], pulled[i]);
    return;
  }
  torch::NoGradGuard guard;
  for (size_t i = 0; i < pulled.size(); ++i) l.params[i].copy_(pulled[i]);
}

void DistributedModel::GroupSync::prefetch() {
  const int64_t next = m_.iteration_ + 1;
  if (prefetching_ && pulledRound_ == next) return;  // asked during the backward already
  m_.node_->groups().startPull(next);
  pulledRound_ = next;
  prefetching_ = true;
  arrived_.assign(m_.layers_.size(), false);
}

bool DistributedModel::GroupSync::awaitLayer(int layer) {
  if (!prefetching_ || arrived_[static_cast<size_t>(layer)]) return false;
  m_.node_->groups().waitPulled(layer);
  layerIntoParameters(static_cast<size_t>(layer));
  arrived_[static_cast<size_t>(layer)] = true;
  return true;
}

void DistributedModel::GroupSync::awaitPrefetch() {
  if (!prefetching_) return;
  m_.node_->groups().waitPulled();
  for (size_t l = 0; l < arrived_.size(); ++l)
    if (!arrived_[l]) layerIntoParameters(l);
  prefetching_ = false;
}

void DistributedModel::GroupSync::beginForward() {
  if (pulledRound_ == m_.iteration_ && !prefetching_) return;  // pullLatest() took it
  if (pulledRound_ == m_.iteration_) {
    awaitPrefetch();  // the gated forward took the layers it reached
  } else {
    pull(m_.iteration_);
  }
  m_.nonFiniteLayer_ = m_.firstNonFinite(false);  // thrown at this round's step, once its push is out
}

void DistributedModel::GroupSync::beginAccumulation() {
  m_.misuse("noSync() is not available with compute groups: the shards apply every pass");
}

void DistributedModel::GroupSync::synchronize() {
  for (int l = static_cast<int>(m_.layers_.size()) - 1; l >= 0; --l) {
    Layer& layer = m_.layers_[l];
    if (layer.submitted) continue;
    if (!layer.used()) {
      torch::NoGradGuard guard;
      for (auto& p : layer.params)
        if (p.grad().defined()) p.mutable_grad().zero_();
    }
    layerReady(l);
  }
  m_.node_->waitIteration();  // this round's pushes are out; the shards apply them
  if (m_.staging_) m_.staging_->drain();
  m_.inIteration_ = false;
  m_.throwIfDiverged(m_.nonFiniteLayer_, "the model pulled from the shards");
}

std::pair<std::vector<torch::Tensor>, int64_t> DistributedModel::GroupSync::state() {
  Node& node = *m_.node_;
  // Mid-round the first worker's parameters are its forward's inputs: the fetch would overwrite what
  // the backward still reads. Every rank is at the same point, so every rank refuses alike.
  if (m_.inIteration_) {
    throw InvalidArgument(
        "a compute-group checkpoint between a forward and its step: save it after step(), "
        "before the next forward");
  }
  awaitPrefetch();  // the fetch writes into the same parameters
  node.settleBarrier();
  if (node.rank() != node.book().workerRanks().front()) return {};
  std::vector<torch::Tensor> buffers;
  std::vector<LayerBuffer> momentum;
  for (auto& l : m_.layers_) {
    std::vector<FloatSpan> spans;
    for (auto& p : l.params) {
      buffers.push_back(torch::zeros(p.sizes()));  // on the host: the node writes them
      spans.push_back({buffers.back().data_ptr<float>(), p.numel()});
    }
    momentum.emplace_back(spans);
  }
  auto [version, clocks] = node.groups().fetchModelState(momentum);
  pulledIntoParameters();
  for (size_t i = 0; !m_.device_.is_cpu() && i < buffers.size(); ++i) buffers[i] = buffers[i].to(m_.device_);
  return {std::move(buffers), version};
}

void DistributedModel::GroupSync::pullLatest() {
  Node& node = *m_.node_;
  node.settleBarrier();  // every shard has applied every push sent so far
  // Between a forward and its step this rank's round is not pushed: the next round's model will not
  // come (a loop that ended after a forward, then finish()); the model stays the round's.
  if (m_.inIteration_) return;
  awaitPrefetch();
  const int64_t next = m_.iteration_ < 0 ? node.book().settings().startIteration : m_.iteration_ + 1;
  if (pulledRound_ != next) {
    pull(next);
    return;
  }
  // The next round's pull was asked with this round's first push (wait-free) and answered once this
  // group's update was applied: with g > 1 another group's later update may be missing from it.
  if (node.book().settings().groups > 1) refreshFromShards();
}

void DistributedModel::GroupSync::refreshFromShards() {
  // Every rank is here and nothing is in flight (settleBarrier), so the first worker reads the
  // shards' model as it stands (the checkpoint's fetch; its momentum is not needed) and every rank
  // takes it from there: all end on one model, with every group's updates. The shards still count
  // the next round's staleness from the version they answered, which overstates it by the updates
  // that landed in between.
  Node& node = *m_.node_;
  const int first = node.book().workerRanks().front();
  if (node.rank() == first) {
    std::vector<torch::Tensor> scratch;
    std::vector<LayerBuffer> momentum;
    for (auto& l : m_.layers_) {
      scratch.push_back(torch::empty({l.spec->numel()}));
      momentum.push_back(LayerBuffer::contiguous(scratch.back().data_ptr<float>(), scratch.back().numel()));
    }
    node.groups().fetchModelState(std::move(momentum));  // the parameters into the pull buffers
  }
  for (auto& l : m_.layers_) {
    node.broadcast(first, LayerBuffer::contiguous(l.pulled.data_ptr<float>(), l.pulled.numel()));
  }
  pulledIntoParameters();
}

void DistributedModel::GroupSync::layerReady(int layer) {
  // Wait-free pulls: the next round's model is asked with the round's first push, not after its
  // step. The shard answers each pair as soon as this group's update of it is applied, so the
  // replies of the pairs already summed leave the server while the later pushes still arrive, where
  // a pull asked after the step queued behind every push of the round (docs/omnivore.md).
  prefetch();
  Layer& l = m_.layers_[layer];
  l.submitted = true;
  l.scheme = Scheme::kPS;
  std::vector<FloatSpan> spans;
  for (auto& p : l.params) {
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);  // unused this round: zero
    if (m_.staging_) continue;  // a device model: the gradient goes down to the host first
    if (!p.grad().is_contiguous()) p.mutable_grad() = p.grad().contiguous();
    spans.push_back({p.grad().data_ptr<float>(), p.grad().numel()});
  }
  Node& node = *m_.node_;
  if (m_.staging_) {
    const float lr = lr_;
    m_.stageGradient(layer,
                     [this, layer, lr](LayerBuffer host) { m_.node_->submitGroupPush(layer, std::move(host), lr); });
  } else {
    node.submitGroupPush(layer, LayerBuffer(spans), lr_);
  }
  m_.predictedPs_ +=
      psCostNode(costInputs(*l.spec, node.book().settings().batch, m_.workers(), node.book().numServers()),
                 node.isWorker(), node.isServer());
  m_.lastSchemes_[layer] = Scheme::kPS;
}

void DistributedModel::GroupSync::step(torch::optim::Optimizer& optimizer) {
  // The shards applied the update; the optimizer only tells the learning rate.
  auto* sgd = dynamic_cast<torch::optim::SGD*>(&optimizer);
  if (!sgd) {
    m_.misuse("compute groups run SGD (momentum, weight decay) on the shards; this optimizer is not SGD");
  }
  const auto& o = static_cast<const torch::optim::SGDOptions&>(sgd->param_groups().at(0).options());
  const JobSettings& s = m_.node_->book().settings();
  if (o.nesterov() || o.dampening() != 0 || static_cast<float>(o.momentum()) != s.momentum ||
      static_cast<float>(o.weight_decay()) != s.weightDecay) {
    m_.misuse(strCat("compute groups: the shards run SGD with momentum ", s.momentum, " and weight decay ",
                     s.weightDecay, "; the optimizer has momentum ", o.momentum(), ", weight decay ", o.weight_decay(),
                     o.nesterov() ? ", nesterov" : "", o.dampening() != 0 ? ", dampening" : ""));
  }
  lr_ = static_cast<float>(o.lr());
}

void DistributedModel::GroupSync::setLearningRate(float lr) {
  if (!(lr >= 0) || !std::isfinite(lr)) {
    throw InvalidArgument(strCat("compute groups: the learning rate must be finite and >= 0, got ", lr));
  }
  lr_ = lr;
}

// DistributedModel's compute-group calls.

DistributedModel::GroupSync& DistributedModel::groupSync(const char* caller) {
  GroupSync* groups = sync_->groups();
  if (!groups) throw InvalidArgument(strCat(caller, ": this job has no compute groups"));
  return *groups;
}

bool DistributedModel::computeGroups() const { return sync_->groups() != nullptr; }

std::pair<std::vector<torch::Tensor>, int64_t> DistributedModel::groupState() {
  return groupSync("groupState").state();
}

void DistributedModel::pullLatest() {
  if (computeGroups()) sync_->groups()->pullLatest();
}

void DistributedModel::setGroupLearningRate(float lr) { groupSync("setGroupLearningRate").setLearningRate(lr); }

}  // namespace poseidon::pt
