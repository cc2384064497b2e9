// --merged-fc (with --groups): Omnivore's merged FC (V-A, Fig. 5a; docs/omnivore.md). The conv layers
// train in compute groups; the FC layers run on rank 0's FC server (torch/merged_fc.h),
// model-parallel: each step a worker sends it its features and gets their gradient back.
#include <algorithm>
#include <cstdio>

#include "poseidon/common/error.h"
#include "poseidon/torch/train/modes.h"

namespace poseidon::pt {

void checkMergedFcModel(const AnyNet& net, const std::string& model) {
  if (!net.classifier) {
    throw InvalidArgument(
        "--merged-fc needs a model with conv features and an FC classifier (lenet, "
        "cifar10-quick); " +
        model + " is all FC");
  }
}

MergedFcMode::MergedFcMode(RankContext& c) : GroupMode(c) {
  const AnyNet& net = c_.net;
  checkMergedFcModel(net, c_.o.model);
  for (const auto& l : partsOf(*net.module, net.name).layers) {
    if (onFcServer(l.name)) classifierParams_.insert(classifierParams_.end(), l.params.begin(), l.params.end());
  }
}

bool MergedFcMode::onFcServer(const std::string& layer) const {
  return std::count(c_.net.classifierLayers.begin(), c_.net.classifierLayers.end(), layer) > 0;
}

ModelParts MergedFcMode::featureParts() const {
  ModelParts parts = partsOf(*c_.net.module, c_.net.name);
  parts.layers.erase(std::remove_if(parts.layers.begin(), parts.layers.end(),
                                    [&](const LayerTensors& l) { return onFcServer(l.name); }),
                     parts.layers.end());
  return parts;
}

bool MergedFcMode::isClassifierParam(const torch::Tensor& p) const {
  return std::any_of(classifierParams_.begin(), classifierParams_.end(),
                     [&](const torch::Tensor& c) { return c.unsafeGetTensorImpl() == p.unsafeGetTensorImpl(); });
}

std::vector<torch::Tensor> MergedFcMode::trainedParameters() {
  std::vector<torch::Tensor> trained;
  for (const auto& l : featureParts().layers) trained.insert(trained.end(), l.params.begin(), l.params.end());
  return trained;
}

void MergedFcMode::optimizerBuilt(const torch::optim::SGDOptions& sgd) {
  checkpointOptimizer_ = std::make_unique<torch::optim::SGD>(c_.net.module->parameters(), sgd);
}

std::vector<torch::Tensor> MergedFcMode::resumedMomentum(std::vector<torch::Tensor> all) {
  // The FC layers' momentum goes to the FC server, the rest to the shards.
  std::vector<torch::Tensor> shards;
  const auto& params = stateOptimizer().param_groups().at(0).params();
  for (size_t i = 0; i < params.size(); ++i) (isClassifierParam(params[i]) ? fcMomentum_ : shards).push_back(all[i]);
  return shards;
}

std::vector<torch::Tensor> MergedFcMode::checkpointMomentum(std::vector<torch::Tensor> shards) {
  FcServer* server = mergedFc_->server();
  if (!server) return shards;
  // The conv layers' momentum from the shards, the FC layers' from the FC server (idle: every rank is
  // between the checkpoint's two barriers), in the order of every parameter.
  std::vector<torch::Tensor> fc = server->momentumBuffers(), all;
  size_t conv = 0, fcIndex = 0;
  for (const auto& p : stateOptimizer().param_groups().at(0).params()) {
    all.push_back(isClassifierParam(p) ? fc.at(fcIndex++) : shards.at(conv++));
  }
  return all;
}

void MergedFcMode::connect() {
  c_.dist = std::make_unique<DistributedModel>(featureParts(), groupOptions());
  mergedFc_ = std::make_unique<MergedFc>(*c_.dist, c_.net.classifier, classifierParams_, c_.o.momentum,
                                         c_.o.weightDecay, fcMomentum_);
}

void MergedFcMode::printPlanNotes() const {
  int64_t n = 0;
  for (const auto& p : classifierParams_) n += p.numel();
  std::string names;
  for (const auto& l : c_.net.classifierLayers) names += (names.empty() ? "" : ", ") + l;
  std::printf(
      "merged FC: %s (%lld params) on the FC server (rank %d), model-parallel; each step a worker sends "
      "it its features and gets their gradient back\n",
      names.c_str(), static_cast<long long>(n), kFcServerRank);
}

torch::Tensor MergedFcMode::compute(const torch::Tensor& x, const torch::Tensor& y, StepTimes& times) {
  c_.dist->beginForward();  // the step's conv model from the shards
  auto stepStart = Clock::now();
  torch::Tensor h = c_.net.features(x);
  c_.dist->endForward(h);
  times.forwardMs = msSince(stepStart);
  // The modeled device time (here the conv layers' forward and backward; the FC layers run on the
  // FC server) before anything is sent.
  c_.pad.beforeBackward(times.forwardMs);
  // The optimizer's learning rate, as the shards take it for the conv layers (GroupSync::step).
  const double lr = static_cast<torch::optim::SGDOptions&>(c_.optimizer->param_groups().at(0).options()).lr();
  MergedFc::Reply reply = mergedFc_->exchange(h, y, static_cast<float>(lr));
  auto backwardStart = Clock::now();
  h.backward(reply.gradient);
  times.backwardMs = msSince(backwardStart);
  c_.slowDown();  // after the backward's clock, unlike the other modes (as before the modes were split)
  return torch::tensor(reply.loss, torch::kFloat64);
}

void MergedFcMode::gatherModel() {
  GroupMode::gatherModel();
  mergedFc_->broadcastClassifier();
}

std::vector<torch::Tensor> MergedFcMode::modelCopy() {
  FcServer* server = mergedFc_->server();
  if (!server) return GroupMode::modelCopy();
  std::vector<torch::Tensor> params;
  server->withModel([&] { params = GroupMode::modelCopy(); });  // the FC layers as of a finished update
  return params;
}

void MergedFcMode::report() {
  GroupMode::report();
  if (FcServer* server = mergedFc_->server()) {
    fcUpdates_ = server->updates();
    fcBusySeconds_ = server->busySeconds();
    std::printf("merged FC: the FC server applied %lld updates (staleness 0), busy %.1f s (%.1f ms per update)\n",
                static_cast<long long>(fcUpdates_), fcBusySeconds_,
                fcUpdates_ ? 1000 * fcBusySeconds_ / fcUpdates_ : 0.0);
  }
}

void MergedFcMode::addSummary(nlohmann::json& summary) const {
  GroupMode::addSummary(summary);
  summary["fc_server_updates"] = fcUpdates_;
  summary["fc_server_busy_seconds"] = fcBusySeconds_;
}

void MergedFcMode::finish() {
  // Every worker's last round was served before the collectives of report().
  if (mergedFc_) mergedFc_->stop();
  GroupMode::finish();
}

}  // namespace poseidon::pt
