// DistributedModel's overlapped step (docs/scheduling.md): step() returns once every layer is
// submitted, and the next forward applies each layer's update just before that layer runs. The
// barrier path is distributed.cc.
#include <unordered_set>

#include "poseidon/common/error.h"
#include "poseidon/torch/distributed.h"
#include "poseidon/torch/distributed_layer.h"
#include "poseidon/torch/finite.h"

namespace poseidon::pt {

void DistributedModel::submitStep() {
  if (stepPending_) misuse("step() twice without a forward between them");
  if (sync_->groups() || node_->book().settings().stragglerMode()) {
    throw InvalidArgument("the overlapped step is for BSP jobs (not with compute groups or straggler dropping)");
  }
  checkStep();
  submitRemaining();
  // Rank 0's buffers as the barrier path sends them: nothing between here and its broadcast changes them.
  broadcastBuffers();
  finishedLayers_.assign(layers_.size(), false);
  stepPending_ = true;
}

void DistributedModel::finishLayer(int layer) {
  if (!stepPending_) throw InvalidArgument("finishLayer: no overlapped step is pending");
  if (layer < 0 || layer >= static_cast<int>(layers_.size())) {
    throw InvalidArgument(strCat("finishLayer: layer index ", layer, " out of range"));
  }
  if (finishedLayers_[layer]) return;
  if (!solo_) node_->waitLayer(layer);
  applyLayer(layers_[layer]);
  finishedLayers_[layer] = true;
  // Thrown at the end of the step (finishStep), where the step's state is whole again.
  if (options_.checkFinite && nonFiniteLayer_ < 0 && !layerFinite(static_cast<size_t>(layer), true)) {
    nonFiniteLayer_ = layer;
  }
}

void DistributedModel::finishStep() {
  if (!stepPending_) throw InvalidArgument("finishStep: no overlapped step is pending");
  if (!solo_) node_->waitIteration();
  if (staging_) staging_->drain();
  int64_t t0 = tracer_ ? Tracer::nowMicros() : 0;
  for (size_t l = 0; l < layers_.size(); ++l)
    if (!finishedLayers_[l]) finishLayer(static_cast<int>(l));
  stepPending_ = false;
  endStep(t0, false);
  throwIfDiverged(nonFiniteLayer_, "the mean gradient");
}

void DistributedModel::stepOverlapped(torch::optim::Optimizer& optimizer) {
  if (GroupSync* groups = sync_->groups()) {
    // Compute groups: the shards apply the update; what overlaps the next forward is the pull.
    step(optimizer);
    groups->prefetch();
    return;
  }
  submitStep();
  pendingOptimizer_ = &optimizer;
  pendingOptions_.clear();
  for (auto& group : optimizer.param_groups()) pendingOptions_.push_back(group.options().clone());
}

namespace {

template <typename T>
bool assignAs(torch::optim::OptimizerOptions& to, const torch::optim::OptimizerOptions& from) {
  auto* t = dynamic_cast<T*>(&to);
  const auto* f = dynamic_cast<const T*>(&from);
  if (!t || !f) return false;
  *t = *f;
  return true;
}

// Sets a parameter group's options to `from`'s values, in place for LibTorch's optimizers (so that
// references to group.options() stay valid); other option types are replaced by a copy.
void assignOptions(torch::optim::OptimizerParamGroup& group, const torch::optim::OptimizerOptions& from) {
  namespace o = torch::optim;
  auto& to = group.options();
  if (assignAs<o::SGDOptions>(to, from) || assignAs<o::AdamOptions>(to, from) || assignAs<o::AdamWOptions>(to, from) ||
      assignAs<o::RMSpropOptions>(to, from) || assignAs<o::AdagradOptions>(to, from) ||
      assignAs<o::LBFGSOptions>(to, from)) {
    return;
  }
  group.set_options(from.clone());
}

}  // namespace

void DistributedModel::stepOnly(const std::vector<torch::Tensor>& params) {
  std::unordered_set<const void*> visible;
  for (const auto& p : params) visible.insert(p.unsafeGetTensorImpl());
  std::vector<std::pair<torch::Tensor, torch::Tensor>> hidden;
  for (auto& group : pendingOptimizer_->param_groups()) {
    for (auto& p : group.params()) {
      if (!visible.count(p.unsafeGetTensorImpl()) && p.grad().defined()) {
        hidden.emplace_back(p, p.grad());
        p.mutable_grad() = torch::Tensor();
      }
    }
  }
  // The options as they were at stepOverlapped(), whatever a scheduler set since; the current ones
  // go back afterwards (copied into the same objects: a reference a scheduler holds stays valid).
  auto& groups = pendingOptimizer_->param_groups();
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> current;
  auto restore = [&] {
    for (auto& [p, grad] : hidden) p.mutable_grad() = grad;
    for (size_t i = 0; i < current.size(); ++i) assignOptions(groups[i], *current[i]);
  };
  try {
    if (groups.size() != pendingOptions_.size()) {
      throw InvalidArgument(strCat("the optimizer has ", groups.size(), " parameter groups, ", pendingOptions_.size(),
                                   " at stepOverlapped(): do not add groups while a step is pending"));
    }
    for (size_t i = 0; i < groups.size(); ++i) {
      current.push_back(groups[i].options().clone());
      assignOptions(groups[i], *pendingOptions_[i]);
    }
    pendingOptimizer_->step();
  } catch (...) {
    restore();
    throw;
  }
  restore();
}

void DistributedModel::applyPendingLayer(int layer) {
  finishLayer(layer);
  stepOnly(layers_[layer].params);
  for (auto& p : layers_[layer].params) p.mutable_grad() = torch::Tensor();  // applied: the next backward starts anew
}

void DistributedModel::applyPending() {
  if (!pendingOptimizer_) return;
  for (size_t l = 0; l < layers_.size(); ++l)
    if (!finishedLayers_[l]) applyPendingLayer(static_cast<int>(l));
  // Parameters the optimizer holds outside the model (a learnable loss): once, now.
  std::unordered_set<const void*> ours;
  for (const auto& layer : layers_)
    for (const auto& p : layer.params) ours.insert(p.unsafeGetTensorImpl());
  std::vector<torch::Tensor> others;
  for (auto& group : pendingOptimizer_->param_groups())
    for (auto& p : group.params())
      if (!ours.count(p.unsafeGetTensorImpl())) others.push_back(p);
  if (!others.empty()) stepOnly(others);
  pendingOptimizer_ = nullptr;
  pendingOptions_.clear();
  finishStep();
}

torch::Tensor DistributedModel::forwardOverlapped(torch::nn::Sequential& sequence, torch::Tensor x) {
  GroupSync* groups = sync_->groups();
  const bool prefetching = groups && groups->prefetching();
  if ((pendingOptimizer_ || prefetching) && !sequence->is_training()) {  // an evaluation sees every update
    applyPending();
    if (prefetching) groups->awaitPrefetch();
    return sequence->forward(x);
  }
  // A declared order (forwardGated): the children in turn, each gating the layers it holds. A layer
  // belongs to the child that holds its first parameter (however deep).
  std::unordered_map<const void*, int> layerOf;
  if (pendingOptimizer_ || prefetching) {
    for (size_t l = 0; l < layers_.size(); ++l) {
      if (!layers_[l].params.empty()) layerOf[layers_[l].params[0].unsafeGetTensorImpl()] = static_cast<int>(l);
    }
  }
  return forwardGated([&](const LayerGate& gate) {
    for (auto& child : *sequence) {
      for (const auto& p : child.ptr()->parameters()) {
        auto it = layerOf.find(p.unsafeGetTensorImpl());
        if (it != layerOf.end()) gate(it->second);
      }
      x = child.forward(x);
    }
    return x;
  });
}

torch::Tensor DistributedModel::forwardGated(const std::function<torch::Tensor(const LayerGate& gate)>& run) {
  const LayerGate none = [](int) {};
  GroupSync* groups = sync_->groups();
  const bool prefetching = groups && groups->prefetching();
  if (!pendingOptimizer_ && !prefetching) return forwardWith([&] { return run(none); });
  if ((module_ && !module_->is_training()) || !torch::GradMode::is_enabled()) {  // an evaluation sees every update
    applyPending();
    if (prefetching) groups->awaitPrefetch();
    return run(none);
  }
  // Each layer's part of the last step, just before the layer runs: BSP applies its update, compute
  // groups await its pulled parameters.
  const LayerGate gate = [this, groups, prefetching](int layer) {
    if (layer < 0 || layer >= static_cast<int>(layers_.size())) {
      throw InvalidArgument(strCat("forwardGated: layer index ", layer, " out of range (", layers_.size(), " layers)"));
    }
    if (prefetching) {
      if (groups->awaitLayer(layer)) ++updatesInForward_;
      return;
    }
    if (finishedLayers_[layer]) return;
    applyPendingLayer(layer);
    ++updatesInForward_;
  };
  torch::Tensor x = run(gate);
  applyPending();
  beginForward();
  endForward(x);
  return x;
}

}  // namespace poseidon::pt
