// --groups G [--staleness S]: Omnivore's compute groups (docs/omnivore.md). The shards hold the model
// and its momentum and run SGD; each group pushes its gradients during the backward and pulls the
// model before its next forward (--overlap-forward: as soon as its pushes are out, each layer awaited
// just before it runs), at most S rounds ahead of the slowest group.
#include <algorithm>
#include <cstdio>

#include "poseidon/common/error.h"
#include "poseidon/torch/compat.h"
#include "poseidon/torch/train/modes.h"

namespace poseidon::pt {

void GroupMode::resumed(const Resumed& r) {
  // The shards start from this state: model.pt's parameters, optimizer.pt's momentum.
  momentum_ = resumedMomentum(sgdMomentumBuffers(stateOptimizer()));
  version_ = r.meta.groupVersion;
}

DistributedOptions GroupMode::groupOptions() const {
  DistributedOptions d = c_.jobOptions();
  d.node.settings.groups = c_.o.groups;
  d.node.settings.staleness = c_.o.staleness;
  d.groupMomentum = momentum_;
  d.groupVersion = version_;
  return d;
}

void GroupMode::connect() {
  c_.dist = std::make_unique<DistributedModel>(c_.net.module, c_.net.name, groupOptions(), c_.net.forward);
}

void GroupMode::beginStep(double lr) {
  // The groups push during the backward, so the shards are told the step's learning rate before the
  // round (step() would tell them for the next round's pushes).
  c_.dist->setGroupLearningRate(static_cast<float>(lr));
  c_.optimizer->zero_grad();
}

TrainMode::Forward GroupMode::forward(const torch::Tensor& x) {
  return c_.o.overlapForward ? gatedForward(x) : TrainMode::forward(x);
}

void GroupMode::update(int64_t iteration) {
  // --overlap-forward: the next round's pull starts now and the next forward awaits it layer by layer.
  if (c_.o.overlapForward) {
    c_.dist->stepOverlapped(*c_.optimizer);
  } else {
    TrainMode::update(iteration);
  }
}

void GroupMode::gatherModel() {
  // The model as it stands once every group's updates so far are in (pullLatest's barrier leaves
  // every push sent before it applied).
  c_.dist->pullLatest();
}

void GroupMode::beforeCheckpoint(CheckpointMeta& meta) {
  // The shards hold the model and its momentum: every rank stops at this round (a barrier), then the
  // first worker takes their state into the model and the optimizer's buffers. No rank goes on
  // before it has (afterCheckpoint's barrier): a group that did would update the shards (and the FC
  // server) while their state is read.
  auto [buffers, version] = c_.dist->groupState();
  if (!c_.lead) return;
  setSgdMomentumBuffers(stateOptimizer(), checkpointMomentum(std::move(buffers)));
  meta.groupVersion = version;
}

void GroupMode::afterCheckpoint() { c_.dist->node().barrier(); }

const char* GroupMode::afterDivergence() const {
  return c_.o.groups > 1 ? "this group skips the rest of the epoch, the job stops at its end" : "the job stops here";
}

void GroupMode::report() {
  // Every shard's count of updates by staleness, in buckets 0..kBuckets-1 and the rest; the largest
  // lead of a group over the slowest (per rank, then the maximum); the early pulls and the pushes
  // that waited for a reply (NodeOptions::groupPushWindow), summed.
  constexpr int kBuckets = 64;
  const int world = c_.world;
  Node& node = c_.dist->node();
  std::vector<double> mine(kBuckets + 3 + world, 0.0);
  for (const auto& [s, n] : node.stalenessHistogram()) mine[std::min<int64_t>(s, kBuckets)] += static_cast<double>(n);
  mine[kBuckets + 1 + c_.rank] = static_cast<double>(node.maxGroupLead());
  mine[kBuckets + 1 + world] = static_cast<double>(node.groupEarlyPulls());
  mine[kBuckets + 2 + world] = static_cast<double>(node.groupPacedPushes());
  auto all = node.allSum(mine);
  earlyPulls_ = static_cast<int64_t>(all[kBuckets + 1 + world]);
  pacedPushes_ = static_cast<int64_t>(all[kBuckets + 2 + world]);
  stalenessHistogram_ = nlohmann::json::object();
  double updates = 0, weighted = 0;
  for (int s = 0; s <= kBuckets; ++s) {
    if (all[s] == 0) continue;
    stalenessHistogram_[s < kBuckets ? std::to_string(s) : ">=" + std::to_string(kBuckets)] = all[s];
    updates += all[s];
    weighted += s * all[s];
  }
  maxGroupLead_ = 0;
  for (int r = 0; r < world; ++r) {
    maxGroupLead_ = std::max<int64_t>(maxGroupLead_, static_cast<int64_t>(all[kBuckets + 1 + r]));
  }
  if (c_.lead && updates > 0) {  // none: resumed where the job had ended, nothing trained
    std::printf("compute groups: %d groups of %d workers; staleness of %.0f pair updates (mean %.2f):", c_.o.groups,
                world / c_.o.groups, updates, updates > 0 ? weighted / updates : 0.0);
    for (auto it = stalenessHistogram_.begin(); it != stalenessHistogram_.end(); ++it) {
      std::printf(" %s: %.0f", it.key().c_str(), it.value().get<double>());
    }
    std::printf("; largest lead of a group over the slowest: %lld\n", static_cast<long long>(maxGroupLead_));
  }
}

void GroupMode::addSummary(nlohmann::json& summary) const {
  summary["staleness_histogram"] = stalenessHistogram_;
  summary["max_group_lead"] = maxGroupLead_;
  summary["early_pulls"] = earlyPulls_;
  summary["paced_pushes"] = pacedPushes_;
}

}  // namespace poseidon::pt
