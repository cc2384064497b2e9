#include "poseidon/torch/distributed.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/generated/Functions.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include <cmath>
#include <unordered_map>
#include <unordered_set>

#include "poseidon/common/error.h"
#include "poseidon/common/log.h"
#include "poseidon/core/cost_model.h"
#include "poseidon/torch/distributed_layer.h"
#include "poseidon/torch/finite.h"

namespace poseidon::pt {

namespace autograd = torch::autograd;

namespace {
// A layer's mean from its flat host buffer into each parameter's .grad() (made where missing), after
// the work queued so far on the device (DeviceStaging::fromHost).
void gradsFromHost(std::vector<torch::Tensor>& params, const torch::Tensor& flat) {
  const auto from = perParameter(flat, params);
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].grad().defined()) params[i].mutable_grad() = torch::empty_like(params[i]);
    DeviceStaging::fromHost(params[i].grad(), from[i]);
  }
}
}  // namespace

// Pre-hook on the addmm/mm node of a Linear layer: receives dL/dy (U).
class DistributedModel::FactorHook : public autograd::FunctionPreHook {
 public:
  FactorHook(DistributedModel* owner, int layer, torch::Tensor v, bool accumulating)
      : owner_(owner), layer_(layer), v_(std::move(v)), accumulating_(accumulating) {}
  autograd::variable_list operator()(const autograd::variable_list& grads) override {
    if (!grads.empty() && grads[0].defined()) owner_->onFactors(layer_, grads[0], v_, accumulating_);
    return grads;
  }

 private:
  DistributedModel* owner_;
  int layer_;
  torch::Tensor v_;
  bool accumulating_;  // instrumented in a noSync pass
};

DistributedOptions DistributedOptions::fromEnvironment() {
  return fromEnvironment(rankFromEnvironment(), jobSecretFromEnvironment());
}

DistributedOptions DistributedOptions::fromEnvironment(const RankEnv& env, const std::string& secret) {
  DistributedOptions d;
  d.node.rank = env.rank;
  d.node.worldSize = env.worldSize;
  d.node.masterAddr = resolveHost(env.masterAddr);
  // A process started on its own is a world of one: any free port will do, and two such
  // programs on one machine must not collide on the default port.
  d.node.masterPort = env.present || env.masterPortSet ? env.masterPort : freePort(d.node.masterAddr);
  d.node.masterPortChosen = env.masterPortSet;
  d.node.van.bindHost = localAddressToward(d.node.masterAddr);
  d.node.secret = secret;
  d.node.security = transportSecurityFromEnvironment();
  return d;
}

DistributedModel::DistributedModel(std::shared_ptr<torch::nn::Module> module, const std::string& name,
                                   DistributedOptions options, std::function<torch::Tensor(torch::Tensor)> forward)
    : module_(std::move(module)), forward_(std::move(forward)), options_(std::move(options)) {
  init(partsOf(*module_, name));
}

DistributedModel::DistributedModel(ModelParts parts, DistributedOptions options) : options_(std::move(options)) {
  init(std::move(parts));
}

void DistributedModel::init(ModelParts parts) {
  desc_ = describe(parts);
  if (desc_.layers.empty()) throw InvalidArgument("model '" + parts.name + "' has no trainable parameters");
  device_ = modelDevice(parts);
  const bool staged = !device_.is_cpu() || options_.stageOnHost;
  tracer_ = options_.node.tracer;
  // A CUDA model's SFB reconstruction is a GEMM on its GPU: after the backward, not in its way. With
  // local ranks the leader rebuilds on the host's cores (LocalGroup), beside the backward: not held.
  if (!device_.is_cpu() && options_.node.settings.localRanks <= 1) options_.node.deferReconstruction = true;
  node_ = Node::start(options_.node, desc_);
  if (node_->book().settings().groupMode())
    sync_ = std::make_unique<GroupSync>(*this);
  else
    sync_ = std::make_unique<GradientSync>(*this);
  // One worker has nothing to synchronize, unless the shards hold the model (compute groups).
  // (Several local ranks on one machine are one worker on the network, but still have their mean to take.)
  solo_ = node_->book().numWorkers() == 1 && node_->book().numServers() == 1 && node_->book().localRanks() == 1 &&
          !sync_->shardsHoldModel();
  if (staged) {
    staging_ = std::make_unique<DeviceStaging>(device_, [this](std::exception_ptr e) { node_->failJob(e); });
    staging_->setTracer(tracer_);
  }
  for (auto& b : parts.buffers)
    if (broadcastable(b, staged)) buffers_.push_back(b);

  // Every replica starts from rank 0's parameters and buffers.
  {
    std::vector<torch::Tensor> all;
    for (const auto& l : parts.layers)
      for (const auto& p : l.params) all.push_back(p);
    for (const auto& t : parts.frozen)
      if (broadcastable(t, staged)) all.push_back(t);
    all.insert(all.end(), buffers_.begin(), buffers_.end());
    broadcastTensors(all);
  }

  layers_.resize(desc_.layers.size());
  for (size_t l = 0; l < layers_.size(); ++l) {
    Layer& layer = layers_[l];
    layer.spec = &desc_.layers[l];
    layer.params = parts.layers[l].params;
    layer.ready.assign(layer.params.size(), false);
    if (layer.spec->type == LayerType::kFC) {
      layer.staging =
          staging_ ? staging_->hostTensor(layer.spec->numel()).zero_() : torch::zeros({layer.spec->numel()});
    }
    if (staging_) layer.host = staging_->hostTensor(layer.spec->numel());
    // With local ranks the leader sends each member the rebuilt mean itself (client/local_group.h), so a
    // CUDA layer's mean comes through the host staging buffer.
    if (layer.spec->type == LayerType::kFC && !device_.is_cpu() && node_->book().localRanks() == 1) {
      layer.rebuilt.result = torch::empty({layer.spec->numel()}, torch::TensorOptions().device(device_));
    }
  }
  lastSchemes_.assign(layers_.size(), Scheme::kPS);

  sync_->start();

  // The hooks also run with one worker: they tell a step without backward from one with it.
  for (size_t l = 0; l < layers_.size(); ++l) {
    for (size_t i = 0; i < layers_[l].params.size(); ++i) {
      auto acc = autograd::impl::grad_accumulator(layers_[l].params[i]);
      POSEIDON_ENFORCE(acc, "parameter without a gradient accumulator");
      int li = static_cast<int>(l), pi = static_cast<int>(i);
      uintptr_t key = acc->add_post_hook(std::make_unique<autograd::utils::LambdaPostHook>(
          [this, li, pi](const autograd::variable_list& outputs, const autograd::variable_list&) {
            onGradReady(li, pi);
            return outputs;
          }));
      accumulators_.emplace_back(std::move(acc), key);
    }
  }
}

DistributedModel::~DistributedModel() {
  for (auto& [acc, key] : accumulators_) acc->del_post_hook(key);
}

bool DistributedModel::factorsCaptured(int layer) const { return layers_.at(layer).captured; }

void DistributedModel::misuse(const std::string& why) {
  // Every rank stops now with this reason, instead of waiting out its timeout for this one.
  node_->failJob(std::make_exception_ptr(InvalidArgument(strCat("rank ", rank(), ": ", why))));
  throw InvalidArgument(why);
}

bool DistributedModel::layerFinite(size_t l, bool gradients) const {
  for (const auto& p : layers_[l].params) {
    if (!allFinite(gradients ? p.grad() : p)) return false;
  }
  return true;
}

int DistributedModel::firstNonFinite(bool gradients) const {
  if (!options_.checkFinite) return -1;
  for (size_t l = 0; l < layers_.size(); ++l)
    if (!layerFinite(l, gradients)) return static_cast<int>(l);
  return -1;
}

void DistributedModel::throwIfDiverged(int layer, const char* what) {
  if (layer < 0) return;
  nonFiniteLayer_ = -1;
  // Not misuse(): every rank finds it by itself (BSP: the same mean; groups: the shards' model).
  const std::string subject = sync_->divergenceSubject(layers_[layer].spec->name, what);
  throw DivergenceError(strCat("step ", iteration_ + 1, ": ", subject,
                               " is not finite (a NaN or an infinity): the training diverged. Lower the learning "
                               "rate or warm it up (checkFinite = false / check_finite=False trains on instead)"),
                        iteration_ + 1, subject);
}

void DistributedModel::beginIteration() {
  iteration_ = iteration_ < 0 ? node_->book().settings().startIteration : iteration_ + 1;
  if (!solo_) node_->beginIteration(iteration_);
  for (auto& l : layers_) {
    std::fill(l.ready.begin(), l.ready.end(), false);
    l.readyCount = 0;
    l.submitted = false;
    l.captured = false;
    l.u = torch::Tensor();
    l.v = torch::Tensor();
  }
  inIteration_ = true;
  forwarded_ = false;
  lastReadyUs_ = 0;
}

bool DistributedModel::skipIfBehind() {
  if (solo_ || !node_->book().settings().stragglerMode()) return false;
  if (!inIteration_) beginIteration();
  if (!node_->alreadyComplete()) return false;
  std::vector<LayerBuffer> outputs;
  for (auto& layer : layers_) {
    if (staging_) {  // the node writes host memory: the layer's host buffer, taken up to .grad() below
      outputs.push_back(LayerBuffer::contiguous(layer.host.data_ptr<float>(), layer.host.numel()));
      continue;
    }
    std::vector<FloatSpan> spans;
    for (auto& p : layer.params) {
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      spans.push_back({p.grad().data_ptr<float>(), p.grad().numel()});
    }
    outputs.emplace_back(spans);
  }
  node_->skipIteration(outputs);
  node_->waitIteration();
  if (staging_) {
    torch::NoGradGuard guard;
    for (auto& layer : layers_) gradsFromHost(layer.params, layer.host);
    // Those copies read the host buffers asynchronously, and a rank still behind has the node write the
    // next step's means into the same buffers at once (the step's own copies down are ordered by an
    // event; a skip has none).
    DeviceStaging::waitForCurrentStream(device_);
  }
  inIteration_ = false;
  broadcastBuffers();
  throwIfDiverged(firstNonFinite(true), "the mean gradient");
  return true;
}

bool DistributedModel::skipIfBehind(torch::optim::Optimizer& optimizer) {
  if (!skipIfBehind()) return false;
  optimizer.step();
  return true;
}

torch::Tensor DistributedModel::forward(torch::Tensor x) {
  if (!forward_) throw InvalidArgument("this DistributedModel was built without a forward; use forwardWith()");
  return forwardWith([&] { return forward_(x); });
}

torch::Tensor DistributedModel::forwardWith(const std::function<torch::Tensor()>& run) {
  const bool training = (!module_ || module_->is_training()) && torch::GradMode::is_enabled();
  lastForwardUntracked_ = !training;  // a step() after an evaluation forward says to call train()
  if (!training) return run();
  int64_t t0 = tracer_ ? Tracer::nowMicros() : 0;
  beginForward();
  torch::Tensor out = run();
  endForward(out);
  if (tracer_) tracer_->span("forward", "compute", 0, t0, Tracer::nowMicros(), iteration_);
  return out;
}

void DistributedModel::beginForward() {
  if (node_->finished()) {  // not misuse(): the job is over, no one to tell (evaluations never get here)
    throw InvalidArgument("a training forward after finish(): this rank's job is over (an evaluation forward, in "
                          "eval mode or under no_grad, still runs)");
  }
  node_->checkError();
  lastForwardUntracked_ = false;
  if (stepPending_) {
    throw InvalidArgument("forward while an overlapped step is pending: run the model (finishLayer(l) and the "
                          "optimizer before each layer l), then finishStep(), then beginForward()/endForward()");
  }
  if (inIteration_ && forwarded_) {
    misuse(syncEnabled_ ? "forward() twice before step(): Poseidon synchronizes one forward/backward per step "
                          "(accumulate micro-batches under noSync())"
                        : "forward() under noSync() after this step's synchronized forward: run the "
                          "accumulation passes first, then the synchronized one, then step()");
  }
  if (!syncEnabled_) {
    sync_->beginAccumulation();
    accumulating_ = true;
    return;
  }
  if (!inIteration_) beginIteration();
  forwarded_ = true;
  sync_->beginForward();
}

void DistributedModel::endForward(const std::vector<torch::Tensor>& outputs) {
  if (options_.captureFactors && !solo_ && sync_->capturesFactors()) instrument(outputs, !syncEnabled_);
}

// Finds, for each FC layer, the addmm (with bias) or mm (without) node that
// consumes weight.t(), and hooks it. A weight reached from more than one place
// (weight tying, several calls) cannot be factored and stays on PS.
void DistributedModel::instrument(const std::vector<torch::Tensor>& outputs, bool accumulating) {
  std::vector<autograd::Node*> stack;
  for (const auto& o : outputs)
    if (o.defined() && o.grad_fn()) stack.push_back(o.grad_fn().get());
  if (stack.empty()) return;
  std::unordered_map<const autograd::Node*, std::pair<int, int>> accOwner;  // accumulator -> (layer, param)
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (layers_[l].spec->type != LayerType::kFC) continue;
    for (size_t i = 0; i < layers_[l].params.size(); ++i) {
      auto acc = autograd::impl::try_get_grad_accumulator(layers_[l].params[i]);
      if (acc) accOwner[acc.get()] = {static_cast<int>(l), static_cast<int>(i)};
    }
  }
  std::unordered_map<int, int> uses;  // layer -> edges into its weight accumulator
  struct Candidate {
    autograd::Node* node;
    int layer;
    torch::Tensor v;
  };
  std::vector<Candidate> candidates;
  std::unordered_set<autograd::Node*> seen;
  while (!stack.empty()) {
    autograd::Node* n = stack.back();
    stack.pop_back();
    if (!n || !seen.insert(n).second) continue;
    for (const auto& e : n->next_edges()) {
      auto own = accOwner.find(e.function.get());
      if (own != accOwner.end() && own->second.second == 0) ++uses[own->second.first];
      stack.push_back(e.function.get());
    }
    const std::string name = n->name();
    bool addmm = name == "AddmmBackward0", mm = name == "MmBackward0";
    if (!addmm && !mm) continue;
    const auto& edges = n->next_edges();
    const size_t mat2 = addmm ? 2 : 1;
    if (edges.size() <= mat2 || !edges[mat2].function || edges[mat2].function->name() != "TBackward0") continue;
    const auto& tEdges = edges[mat2].function->next_edges();
    if (tEdges.empty()) continue;
    auto own = accOwner.find(tEdges[0].function.get());
    if (own == accOwner.end() || own->second.second != 0) continue;
    int layer = own->second.first;
    // With bias, addmm's first input must be this layer's bias.
    bool hasBias = layers_[layer].params.size() > 1;
    if (addmm != hasBias) continue;
    if (addmm) {
      auto b = accOwner.find(edges[0].function.get());
      if (b == accOwner.end() || b->second != std::make_pair(layer, 1)) continue;
    }
    torch::Tensor v = addmm ? static_cast<autograd::generated::AddmmBackward0*>(n)->mat1_.unpack()
                            : static_cast<autograd::generated::MmBackward0*>(n)->self_.unpack();
    if (!v.defined() || v.dim() != 2 || v.size(1) != layers_[layer].spec->n) continue;
    candidates.push_back({n, layer, v});
  }
  // TBackward0 -> accumulator counts once per use of weight.t().
  for (auto& c : candidates) {
    if (uses[c.layer] != 1) continue;
    c.node->add_pre_hook(std::make_unique<FactorHook>(this, c.layer, c.v, accumulating));
  }
}

void DistributedModel::onFactors(int layer, const torch::Tensor& u, const torch::Tensor& v, bool accumulating) {
  Layer& l = layers_[layer];
  if (u.dim() != 2 || u.size(0) != v.size(0) || u.size(1) != l.spec->m) return;
  if (accumulating) {  // a noSync pass: keep them for the step's synchronized pass
    if (inIteration_) return;
    l.stashU.push_back(u.detach().contiguous());
    l.stashV.push_back(v.detach().contiguous());
    return;
  }
  if (!inIteration_ || l.submitted || l.captured) return;
  if (l.accumulatedPasses > 0 && !l.stashComplete()) {
    // Some accumulation pass gave a gradient but no factors: only the dense sum is complete.
    return;
  }
  // The sum over the accumulation passes and this one is the product of the stacked factors.
  torch::Tensor uu = u.detach().contiguous(), vv = v.detach().contiguous();
  if (!l.stashU.empty()) {
    l.stashU.push_back(uu);
    l.stashV.push_back(vv);
    uu = torch::cat(l.stashU, 0);
    vv = torch::cat(l.stashV, 0);
  }
  l.captured = true;
  l.u = uu;
  l.v = vv;
  Scheme scheme = node_->schemeFor(layer);
  if (scheme == Scheme::kPS) return;
  l.scheme = scheme;  // SFB, or Adam when forced
  if (options_.overlap) submitFactors(layer);
}

void DistributedModel::submitFactors(int layer) {
  Layer& l = layers_[layer];
  l.submitted = true;
  struct Keep {
    torch::Tensor u, v;
  };
  auto keep = std::make_shared<Keep>(Keep{l.u, l.v});
  const int64_t rows = l.u.size(0);
  if (staging_)
    submitFactorsStaged(layer, keep);
  else
    node_->submitFactors(layer, l.u.data_ptr<float>(), l.v.data_ptr<float>(), rows,
                         LayerBuffer::contiguous(l.staging.data_ptr<float>(), l.staging.numel()), keep);
  // Table 1 per network node: a machine's leader sends its ranks' stacked rows; its members, nothing.
  if (!node_->isLocalMember()) {
    CostInputs c = costInputs(*l.spec, rows * node_->book().localRanks(), workers(), node_->book().numServers());
    predictedSfb_ += l.scheme == Scheme::kAdam ? adamCostBoth(c) : sfbCost(c);
  }
  lastSchemes_[layer] = l.scheme;
  if (tracer_) {
    int64_t now = Tracer::nowMicros();
    tracer_->span("backward " + l.spec->name + " (factors ready)", "compute", 0, lastReadyUs_ ? lastReadyUs_ : now, now,
                  iteration_);
    lastReadyUs_ = now;
  }
}

void DistributedModel::onGradReady(int layer, int param) {
  Layer& l = layers_[layer];
  if (const torch::Tensor& g = l.params[param].grad(); g.defined() && g.layout() != torch::kStrided) {
    misuse(strCat("layer '", l.spec->name, "' has a sparse gradient (an Embedding with sparse=True?): Poseidon "
                  "synchronizes dense gradients; build it with sparse=False"));
  }
  if (!inIteration_) {
    if (accumulating_ && param == 0) ++l.accumulatedPasses;  // a noSync pass
    return;
  }
  if (l.ready[param]) return;
  l.ready[param] = true;
  ++l.readyCount;
  if (solo_ || l.readyCount < static_cast<int>(l.params.size())) return;
  if (l.submitted) return;  // SFB already took this layer
  if (l.captured && l.scheme != Scheme::kPS) return;  // no-overlap: factors wait for synchronize()
  if (options_.overlap) sync_->layerReady(layer);
}

void DistributedModel::submitDense(int layer) {
  Layer& l = layers_[layer];
  l.submitted = true;
  l.scheme = Scheme::kPS;
  std::vector<FloatSpan> spans;
  for (auto& p : l.params) {
    torch::Tensor g = p.grad();
    if (!g.defined()) {
      p.mutable_grad() = torch::zeros_like(p);  // unused this iteration: contribute zero
      g = p.grad();
    } else if (!g.is_contiguous() && !staging_) {
      p.mutable_grad() = g.contiguous();
      g = p.grad();
    }
    if (!staging_) spans.push_back({g.data_ptr<float>(), g.numel()});
  }
  if (staging_) {
    l.meanOnHost = true;  // the mean comes back into the host buffer; applyLayer copies it up
    stageGradient(layer, [this, layer](LayerBuffer host) { node_->submitDense(layer, std::move(host)); });
  } else {
    node_->submitDense(layer, LayerBuffer(spans));
  }
  if (!node_->isLocalMember()) {
    predictedPs_ +=
        psCostNode(costInputs(*l.spec, node_->book().settings().batch, workers(), node_->book().numServers()),
                   node_->isWorker(), node_->isServer());
  }
  lastSchemes_[layer] = Scheme::kPS;
  if (tracer_) {
    int64_t now = Tracer::nowMicros();
    tracer_->span("backward " + l.spec->name, "compute", 0, lastReadyUs_ ? lastReadyUs_ : now, now, iteration_);
    lastReadyUs_ = now;
  }
}

void DistributedModel::checkStep() {
  if (node_->finished()) throw InvalidArgument("synchronize()/step() after finish(): this rank's job is over");
  if (!inIteration_ || !forwarded_) {
    misuse(accumulating_ ? "synchronize()/step() after forward passes that all ran under noSync(): run the last "
                           "forward/backward of the step outside noSync()"
                         : lastForwardUntracked_
                             ? "synchronize()/step() after a forward() in eval mode or under no_grad (not tracked): "
                               "call train() on the model (model.train() in Python) before the training forward"
                             : "synchronize()/step() without a training forward() through the DistributedModel");
  }
  bool anyGradient = false;
  for (const auto& l : layers_) anyGradient = anyGradient || l.used();
  if (!anyGradient) {
    misuse("step() after forward() without loss.backward(): no parameter received a gradient this step");
  }
}

void DistributedModel::synchronize() {
  if (stepPending_) {
    finishStep();
    return;
  }
  checkStep();
  sync_->synchronize();
}

void DistributedModel::GradientSync::synchronize() {
  m_.submitRemaining();
  if (!m_.solo_) m_.node_->waitIteration();
  if (m_.staging_) m_.staging_->drain();
  int64_t t0 = m_.tracer_ ? Tracer::nowMicros() : 0;
  for (auto& layer : m_.layers_) m_.applyLayer(layer);
  m_.endStep(t0, true);
  m_.throwIfDiverged(m_.firstNonFinite(true), "the mean gradient");
}

void DistributedModel::submitRemaining() {
  if (solo_) return;
  // Layers not yet submitted: no-overlap mode, gradients that never came (unused
  // parameters), or accumulated ones. Backward order, as WFBP would have sent them.
  for (int l = static_cast<int>(layers_.size()) - 1; l >= 0; --l) {
    Layer& layer = layers_[l];
    if (layer.submitted) continue;
    const bool sfbLayer = layer.spec->type == LayerType::kFC && node_->schemeFor(l) != Scheme::kPS;
    if (!layer.captured && layer.readyCount == 0 && layer.stashComplete() && sfbLayer) {
      // Used only in accumulation passes: their stacked factors carry the sum.
      layer.u = torch::cat(layer.stashU, 0);
      layer.v = torch::cat(layer.stashV, 0);
      layer.captured = true;
      layer.scheme = node_->schemeFor(l);
    } else if (!layer.used() && sfbLayer && !layer.uncapturable) {
      // Unused: contribute zero by the layer's scheme, as every other rank expects.
      layer.u = torch::zeros({1, layer.spec->m}, device_);
      layer.v = torch::zeros({1, layer.spec->n}, device_);
      layer.captured = true;
      layer.scheme = node_->schemeFor(l);
    } else if (!layer.used()) {
      torch::NoGradGuard guard;
      for (auto& p : layer.params)
        if (p.grad().defined()) p.mutable_grad().zero_();  // contribute zero, not a stale gradient
    }
    if (layer.captured && layer.scheme != Scheme::kPS) submitFactors(l);
    else submitDense(l);
  }
}

void DistributedModel::applyLayer(Layer& layer) {
  torch::NoGradGuard guard;
  if (layer.spec->type == LayerType::kFC && layer.used()) layer.uncapturable = !layer.captured;
  layer.accumulatedPasses = 0;
  layer.stashU.clear();
  layer.stashV.clear();
  const bool psMean = layer.scheme == Scheme::kPS;
  if (psMean && !layer.meanOnHost) return;  // the node wrote the mean into .grad() itself
  layer.meanOnHost = false;
  if (!psMean && layer.rebuilt.fresh) {  // rebuilt on the device
    std::vector<torch::Tensor> grads;
    for (auto& p : layer.params) {
      if (!p.grad().defined()) p.mutable_grad() = torch::empty_like(p);
      grads.push_back(p.grad());
    }
    DeviceStaging::takeRebuilt(layer.rebuilt, grads);
    layer.scheme = Scheme::kPS;
    return;
  }
  gradsFromHost(layer.params, psMean ? layer.host : layer.staging);
  layer.scheme = Scheme::kPS;  // the default for the next iteration
}

void DistributedModel::endStep(int64_t traceStartUs, bool broadcast) {
  inIteration_ = false;
  accumulating_ = false;
  if (broadcast) broadcastBuffers();
  if (tracer_) {
    tracer_->span("apply (sfb results into .grad)", "compute", 0, traceStartUs, Tracer::nowMicros(), iteration_);
  }
}

void DistributedModel::step(torch::optim::Optimizer& optimizer) {
  if (stepPending_) throw InvalidArgument("step() while an overlapped step is pending: finishStep() ends it");
  synchronize();
  sync_->step(optimizer);
}

void DistributedModel::GradientSync::step(torch::optim::Optimizer& optimizer) {
  int64_t t0 = m_.tracer_ ? Tracer::nowMicros() : 0;
  optimizer.step();
  if (m_.tracer_) m_.tracer_->span("apply (optimizer step)", "compute", 0, t0, Tracer::nowMicros(), m_.iteration_);
}

void DistributedModel::finish() {
  applyPending();
  // An overlapped step's pull writes into the parameters: it lands before the caller reads them (the
  // model then holds this group's last update).
  if (sync_->groups()) sync_->groups()->awaitPrefetch();
  node_->finish();
}

std::vector<LayerPlan> DistributedModel::plan(int64_t batch) const {
  std::vector<LayerPlan> out;
  const InformationBook& book = node_->book();
  for (size_t l = 0; l < desc_.layers.size(); ++l) {
    const LayerSpec& s = desc_.layers[l];
    LayerPlan p{s.name, s.type, s.shapeString(), book.bestScheme(static_cast<int>(l), batch), 0};
    CostInputs c = costInputs(s, batch * book.localRanks(), book.numWorkers(), book.numServers());
    p.floatsPerIteration = p.scheme == Scheme::kSFB ? sfbCost(c) : p.scheme == Scheme::kAdam ? adamCostBoth(c) : psCostBoth(c);
    out.push_back(p);
  }
  return out;
}

}  // namespace poseidon::pt
