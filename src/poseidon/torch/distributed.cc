#include "poseidon/torch/distributed.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/generated/Functions.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include <unordered_map>
#include <unordered_set>

#include "poseidon/common/error.h"
#include "poseidon/common/log.h"
#include "poseidon/core/best_scheme.h"
#include "poseidon/core/cost_model.h"
#include "poseidon/torch/models.h"

namespace poseidon::pt {

namespace autograd = torch::autograd;

struct DistributedModel::Layer {
  const LayerSpec* spec = nullptr;
  std::vector<torch::Tensor> params;
  std::vector<bool> ready;
  int readyCount = 0;
  bool submitted = false;
  Scheme scheme = Scheme::kPS;
  bool captured = false;     // the graph gave us this layer's factors this iteration
  torch::Tensor u, v;        // factors captured this iteration
  torch::Tensor staging;     // SFB result: weight then bias, flat
};

// Pre-hook on the addmm/mm node of a Linear layer: receives dL/dy (U).
class DistributedModel::FactorHook : public autograd::FunctionPreHook {
 public:
  FactorHook(DistributedModel* owner, int layer, torch::Tensor v) : owner_(owner), layer_(layer), v_(std::move(v)) {}
  autograd::variable_list operator()(const autograd::variable_list& grads) override {
    if (!grads.empty() && grads[0].defined()) owner_->onFactors(layer_, grads[0], v_);
    return grads;
  }

 private:
  DistributedModel* owner_;
  int layer_;
  torch::Tensor v_;
};

DistributedModel::DistributedModel(std::shared_ptr<torch::nn::Module> module, const std::string& name,
                                   DistributedOptions options, std::function<torch::Tensor(torch::Tensor)> forward)
    : module_(std::move(module)), forward_(std::move(forward)), options_(std::move(options)) {
  desc_ = describeModule(*module_, name);
  if (desc_.layers.empty()) throw InvalidArgument("module '" + name + "' has no trainable parameters");
  for (const auto& p : module_->parameters()) {
    if (p.scalar_type() != torch::kFloat32 || !p.device().is_cpu()) {
      throw InvalidArgument("Poseidon synchronizes float32 CPU parameters; module '" + name + "' has a " +
                            std::string(c10::toString(p.scalar_type())) + " parameter on " + p.device().str());
    }
  }
  tracer_ = options_.node.tracer;
  node_ = Node::start(options_.node, desc_);

  // Every replica starts from rank 0's parameters and buffers.
  {
    torch::NoGradGuard guard;
    std::vector<FloatSpan> spans;
    std::vector<torch::Tensor> keep;
    for (auto& p : module_->parameters()) spans.push_back({p.data_ptr<float>(), p.numel()});
    for (auto& b : module_->buffers()) {
      if (b.scalar_type() == torch::kFloat32 && b.is_contiguous()) spans.push_back({b.data_ptr<float>(), b.numel()});
    }
    node_->broadcast(0, LayerBuffer(spans));
  }

  solo_ = node_->book().numWorkers() == 1 && node_->book().numServers() == 1;
  // Map the module's parameters onto the layer table (same walk as describeModule).
  std::unordered_map<std::string, int> layerIndex;
  for (size_t l = 0; l < desc_.layers.size(); ++l) layerIndex[desc_.layers[l].name] = static_cast<int>(l);
  layers_.resize(desc_.layers.size());
  for (const auto& item : module_->named_modules()) {
    std::string lname = item.key().empty() ? name : item.key();
    auto it = layerIndex.find(lname);
    if (it == layerIndex.end()) continue;
    Layer& layer = layers_[it->second];
    layer.spec = &desc_.layers[it->second];
    for (const auto& p : item.value()->named_parameters(/*recurse=*/false))
      if (p.value().requires_grad()) layer.params.push_back(p.value());
    layer.ready.assign(layer.params.size(), false);
    if (layer.spec->type == LayerType::kFC) layer.staging = torch::zeros({layer.spec->numel()});
  }
  lastSchemes_.assign(layers_.size(), Scheme::kPS);
  if (solo_) return;  // one worker: the local gradient is already the mean

  for (size_t l = 0; l < layers_.size(); ++l) {
    for (size_t i = 0; i < layers_[l].params.size(); ++i) {
      auto acc = autograd::impl::grad_accumulator(layers_[l].params[i]);
      POSEIDON_ENFORCE(acc, "parameter without a gradient accumulator");
      int li = static_cast<int>(l), pi = static_cast<int>(i);
      acc->add_post_hook(std::make_unique<autograd::utils::LambdaPostHook>(
          [this, li, pi](const autograd::variable_list& outputs, const autograd::variable_list&) {
            onGradReady(li, pi);
            return outputs;
          }));
      accumulators_.push_back(std::move(acc));
    }
  }
}

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
  d.node.bindHost = localAddressToward(d.node.masterAddr);
  d.node.secret = secret;
  return d;
}

DistributedModel::~DistributedModel() = default;

bool DistributedModel::factorsCaptured(int layer) const { return layers_.at(layer).captured; }

void DistributedModel::beginIteration() {
  iteration_ = iteration_ < 0 ? node_->book().settings().startIteration : iteration_ + 1;
  node_->beginIteration(iteration_);
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

bool DistributedModel::skipIfBehind(torch::optim::Optimizer& optimizer) {
  if (solo_ || !node_->book().settings().stragglerMode()) return false;
  if (!inIteration_) beginIteration();
  if (!node_->alreadyComplete()) return false;
  std::vector<LayerBuffer> outputs;
  for (auto& layer : layers_) {
    std::vector<FloatSpan> spans;
    for (auto& p : layer.params) {
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      spans.push_back({p.grad().data_ptr<float>(), p.grad().numel()});
    }
    outputs.emplace_back(spans);
  }
  node_->skipIteration(outputs);
  node_->waitIteration();
  inIteration_ = false;
  optimizer.step();
  return true;
}

torch::Tensor DistributedModel::forward(torch::Tensor x) {
  if (!forward_) throw InvalidArgument("this DistributedModel was built without a forward; use forwardWith()");
  return forwardWith([&] { return forward_(x); });
}

torch::Tensor DistributedModel::forwardWith(const std::function<torch::Tensor()>& run) {
  bool training = module_->is_training() && torch::GradMode::is_enabled();
  if (!training || solo_) return run();
  if (inIteration_ && forwarded_) {
    throw InvalidArgument("forward() twice before step(): Poseidon synchronizes one forward/backward per step");
  }
  node_->checkError();
  int64_t t0 = tracer_ ? Tracer::nowMicros() : 0;
  if (!inIteration_) beginIteration();
  forwarded_ = true;
  torch::Tensor out = run();
  if (options_.captureFactors) instrument(out);
  if (tracer_) tracer_->span("forward", "compute", 0, t0, Tracer::nowMicros(), iteration_);
  return out;
}

// Finds, for each FC layer, the addmm (with bias) or mm (without) node that
// consumes weight.t(), and hooks it. A weight reached from more than one place
// (weight tying, several calls) cannot be factored and stays on PS.
void DistributedModel::instrument(const torch::Tensor& output) {
  if (!output.grad_fn()) return;
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
  std::vector<autograd::Node*> stack{output.grad_fn().get()};
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
    c.node->add_pre_hook(std::make_unique<FactorHook>(this, c.layer, c.v));
  }
}

void DistributedModel::onFactors(int layer, const torch::Tensor& u, const torch::Tensor& v) {
  Layer& l = layers_[layer];
  if (!inIteration_ || l.submitted || l.captured) return;
  if (u.dim() != 2 || u.size(0) != v.size(0) || u.size(1) != l.spec->m) return;
  l.captured = true;
  l.u = u.detach().contiguous();
  l.v = v.detach().contiguous();
  Scheme scheme = node_->schemeFor(layer, l.u.size(0));
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
  node_->submitFactors(layer, l.u.data_ptr<float>(), l.v.data_ptr<float>(), rows,
                       LayerBuffer::contiguous(l.staging.data_ptr<float>(), l.staging.numel()), keep);
  CostInputs c = costInputs(*l.spec, rows, workers(), node_->book().numServers());
  predictedSfb_ += l.scheme == Scheme::kAdam ? adamCostBoth(c) : sfbCost(c);
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
  if (!inIteration_ || l.ready[param]) return;
  l.ready[param] = true;
  ++l.readyCount;
  if (l.readyCount < static_cast<int>(l.params.size())) return;
  if (l.submitted) return;  // SFB already took this layer
  if (l.captured && l.scheme != Scheme::kPS) return;  // no-overlap: factors wait for synchronize()
  if (options_.overlap) submitDense(layer);
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
    } else if (!g.is_contiguous()) {
      p.mutable_grad() = g.contiguous();
      g = p.grad();
    }
    spans.push_back({g.data_ptr<float>(), g.numel()});
  }
  node_->submitDense(layer, LayerBuffer(spans));
  predictedPs_ += psCostBoth(costInputs(*l.spec, node_->book().settings().batch, workers(), node_->book().numServers()));
  lastSchemes_[layer] = Scheme::kPS;
  if (tracer_) {
    int64_t now = Tracer::nowMicros();
    tracer_->span("backward " + l.spec->name, "compute", 0, lastReadyUs_ ? lastReadyUs_ : now, now, iteration_);
    lastReadyUs_ = now;
  }
}

void DistributedModel::synchronize() {
  if (solo_) return;
  if (!inIteration_) {
    throw InvalidArgument("synchronize()/step() without a training forward() through the DistributedModel");
  }
  // Layers not yet submitted: no-overlap mode, or gradients that never came
  // (unused parameters). Backward order, as WFBP would have sent them.
  for (int l = static_cast<int>(layers_.size()) - 1; l >= 0; --l) {
    Layer& layer = layers_[l];
    if (layer.submitted) continue;
    if (layer.captured && layer.scheme != Scheme::kPS) submitFactors(l);
    else submitDense(l);
  }
  node_->waitIteration();
  int64_t t0 = tracer_ ? Tracer::nowMicros() : 0;
  torch::NoGradGuard guard;
  for (auto& layer : layers_) {
    if (layer.scheme == Scheme::kPS) continue;
    int64_t off = 0;
    for (auto& p : layer.params) {
      torch::Tensor src = layer.staging.narrow(0, off, p.numel()).view(p.sizes());
      if (p.grad().defined()) p.mutable_grad().copy_(src);
      else p.mutable_grad() = src.clone();
      off += p.numel();
    }
    layer.scheme = Scheme::kPS;  // the default for the next iteration
  }
  inIteration_ = false;
  if (tracer_) tracer_->span("apply (sfb results into .grad)", "compute", 0, t0, Tracer::nowMicros(), iteration_);
}

void DistributedModel::step(torch::optim::Optimizer& optimizer) {
  synchronize();
  int64_t t0 = tracer_ ? Tracer::nowMicros() : 0;
  optimizer.step();
  if (tracer_) tracer_->span("apply (optimizer step)", "compute", 0, t0, Tracer::nowMicros(), iteration_);
}

void DistributedModel::finish() { node_->finish(); }

std::vector<LayerPlan> DistributedModel::plan(int64_t batch) const {
  std::vector<LayerPlan> out;
  const InformationBook& book = node_->book();
  for (size_t l = 0; l < desc_.layers.size(); ++l) {
    const LayerSpec& s = desc_.layers[l];
    LayerPlan p;
    p.name = s.name;
    p.type = s.type;
    p.shape = s.shapeString();
    p.scheme = book.bestScheme(static_cast<int>(l), batch);
    CostInputs c = costInputs(s, batch, book.numWorkers(), book.numServers());
    p.floatsPerIteration = p.scheme == Scheme::kSFB ? sfbCost(c) : p.scheme == Scheme::kAdam ? adamCostBoth(c) : psCostBoth(c);
    out.push_back(p);
  }
  return out;
}

}  // namespace poseidon::pt
