// DistributedModel: Poseidon for an ordinary LibTorch training loop (the
// Python package wraps the same class).
//
//   auto net = std::make_shared<MyNet>();
//   torch::optim::SGD opt(net->parameters(), ...);
//   auto options = poseidon::pt::DistributedOptions::fromEnvironment();  // rank, world, master, secret
//   options.node.settings.batch = 64;                                     // per-worker batch K
//   poseidon::pt::DistributedModel dist(net, "mynet", options);           // joins the job
//   for (...) {
//     opt.zero_grad();
//     auto loss = loss_fn(dist.forward(x), y);   // forward through the wrapper
//     loss.backward();                           // syncs start during backward (WFBP)
//     dist.step(opt);                            // BSP barrier, mean grads, opt.step()
//   }
//   dist.finish();
//
// What it does (paper section 4, "150 lines into Caffe", for LibTorch):
// - On construction it describes the model to the coordinator (one layer per
//   module that owns parameters), joins the job, and broadcasts rank 0's
//   parameters and buffers so every replica starts identical.
// - Wait-free backpropagation: a post hook on every parameter's gradient
//   accumulator (the hooks c10d's Reducer uses) fires the moment that
//   parameter's gradient is final; when all of a layer's parameters are in,
//   the layer's sync is queued on the node's thread pool and backward goes on.
// - Sufficient factors from real Linear layers without touching the model:
//   after forward, the autograd graph is searched for the addmm/mm node that
//   consumes each Linear weight; its saved input is V, and a pre-hook on that
//   node receives dL/dy = U during backward. When BestScheme picks SFB, U and
//   V are broadcast as soon as U exists (even before the weight gradient is
//   computed), and the rebuilt mean gradient replaces the local one at step().
//   Linear layers whose factors cannot be captured (input of rank > 2, weight
//   used twice) go by PS.
// DDP's semantics (docs/torch.md):
// - Unused parameters, at any step and on any subset of the ranks: a layer
//   that got no gradient contributes zero by its layer's scheme (zero factors
//   for SFB, zeros for PS), so the mean is over all workers and nothing stalls.
// - Buffers (BatchNorm running statistics): rank 0's are broadcast after every
//   synchronized step (and at the start), so every rank holds the same
//   (broadcastBuffers; DDP's broadcast_buffers).
// - Gradient accumulation: forward/backward passes under noSync() accumulate
//   locally (SFB layers keep their factors); the next synchronized pass sends
//   the accumulated gradient once (DDP's no_sync).
// - Misuse on one rank (forward twice before step, step without backward or
//   without forward) stops every rank at once with that rank's reason; one
//   worker checks the same.
// - Divergence: a mean gradient that is not finite throws DivergenceError on
//   every rank at that step (DistributedOptions::checkFinite).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "poseidon/client/node.h"
#include "poseidon/common/trace.h"
#include "poseidon/launch/env.h"
#include "poseidon/torch/models.h"

namespace poseidon::pt {

struct DistributedOptions {
  NodeOptions node;       // rank, world size, coordinator, timeout, settings (batch K, scheme policy)
  bool overlap = true;    // wait-free backprop; false syncs every layer after the whole backward
  bool captureFactors = true;
  // Rank 0's buffers go to every rank after each synchronized step (DDP's broadcast_buffers).
  bool broadcastBuffers = true;
  // Divergence is an error: a step whose mean gradient is not finite (a NaN or an infinity) throws
  // DivergenceError from synchronize()/step() before the optimizer runs, on every rank at that step
  // (they hold the same mean). The overlapped step throws it at the end of the step (finishStep(),
  // applyPending()), once every layer is in. Compute groups: a round whose pulled model is not finite
  // throws it from that round's step, after its push (the round stays whole for the shards). false:
  // nothing is checked (a NaN trains on).
  bool checkFinite = true;
  // Run a CPU model's gradients through the host buffers and the staging thread a CUDA model uses
  // (torch/device_staging.h) instead of handing the node .grad() itself: the tests run the GPU's data
  // path this way on machines without one. A CUDA model always takes that path.
  bool stageOnHost = false;
  // Compute-group mode (node.settings.groups > 0): the shards run SGD; this is its learning rate
  // until step(optimizer) reports the optimizer's (whose lr may follow a schedule).
  float learningRate = 0;
  // Compute-group mode, resuming a checkpoint: the shards' momentum buffers (one per trainable
  // parameter, in the model's order; empty: zeros) and version clock. The parameters are the model's.
  std::vector<torch::Tensor> groupMomentum;
  int64_t groupVersion = 0;

  // What the launcher said: rank and world size (poseidon launch, torchrun's variables, mpirun,
  // Slurm), MASTER_ADDR resolved, MASTER_PORT, this rank's data endpoint on the interface that
  // routes to the master, and the job secret (POSEIDON_SECRET or POSEIDON_SECRET_FILE). Without a
  // launcher: rank 0 of 1 on a free local port. Throws InvalidArgument for malformed variables.
  static DistributedOptions fromEnvironment();
  // The same from an already-read environment (the trainer reads it once for all its uses).
  static DistributedOptions fromEnvironment(const RankEnv& env, const std::string& secret);
};

struct LayerPlan {
  std::string name;
  LayerType type;
  std::string shape;
  Scheme scheme;        // BestScheme at the nominal batch (ps if factors cannot be captured)
  double floatsPerIteration;  // Table 1 cost for this node under that scheme
};

class DeviceStaging;

class DistributedModel {
 public:
  // From a module holder (LeNet, torch::nn::Linear, ...): forward(x) calls its forward.
  template <typename ModuleHolder,
            typename = std::enable_if_t<std::is_base_of_v<torch::detail::ModuleHolderIndicator, ModuleHolder>>>
  DistributedModel(ModuleHolder module, const std::string& name, DistributedOptions options)
      : DistributedModel(module.ptr(), name, std::move(options), [module](torch::Tensor x) mutable {
          return module->forward(x);
        }) {}
  // From a module: `forward` runs it (or use forwardWith for other signatures).
  DistributedModel(std::shared_ptr<torch::nn::Module> module, const std::string& name, DistributedOptions options,
                   std::function<torch::Tensor(torch::Tensor)> forward = nullptr);
  // From the parts of a model built elsewhere (the Python package): the caller
  // runs the model between beginForward() and endForward().
  DistributedModel(ModelParts parts, DistributedOptions options);
  ~DistributedModel();
  DistributedModel(const DistributedModel&) = delete;
  DistributedModel& operator=(const DistributedModel&) = delete;

  // Forward through the wrapper. In training mode with grad enabled this
  // starts the iteration and instruments the graph for factor capture.
  torch::Tensor forward(torch::Tensor x);
  // For modules with other signatures: run = [&] { return net->forward(a, b); }.
  torch::Tensor forwardWith(const std::function<torch::Tensor()>& run);
  // The two halves of a training forward, for callers that run the model
  // themselves: beginForward() before (it starts the iteration, or an
  // accumulation pass under noSync), endForward(output) after.
  void beginForward();
  // A forward in eval mode or under no_grad went past (forwardWith notes its own; the Python package
  // notes its): a step() after it says to call train().
  void noteEvaluationForward() { lastForwardUntracked_ = true; }
  void endForward(const torch::Tensor& output) { endForward(std::vector<torch::Tensor>{output}); }
  void endForward(const std::vector<torch::Tensor>& outputs);  // a forward with several outputs

  // After loss.backward(): BSP barrier; every .grad() then holds the mean
  // gradient over all workers.
  void synchronize();
  void step(torch::optim::Optimizer& optimizer);

  // The overlapped step (docs/scheduling.md; the Python package's overlap_forward): synchronize()
  // split so that the next forward runs layer by layer as the results land. submitStep() sends what
  // backward did not, broadcasts rank 0's buffers and returns at once; finishLayer(l) waits for layer
  // l's mean gradient and puts it into its .grad() (once per step); finishStep() finishes every layer
  // not yet finished and ends the step. BSP jobs only (no compute groups, no straggler dropping).
  // A loop: forward, backward, submitStep(); then run the model with finishLayer(l) and the optimizer
  // on layer l's parameters before each layer l, finishStep(), beginForward(), endForward(output).
  // forward()/beginForward() and step() refuse while a step is pending; synchronize() finishes it.
  void submitStep();
  void finishLayer(int layer);
  void finishStep();
  bool stepPending() const { return stepPending_; }

  // The overlapped step for a torch::nn::Sequential, whose children run in the order of its layers
  // (issue 14; the same as the Python package's overlap_forward). stepOverlapped(optimizer) after
  // backward submits the step and returns at once. forwardOverlapped(sequence, x) then runs the
  // children in turn; before each, it waits for the mean gradient of the layers the child holds and
  // steps `optimizer` on their parameters alone (every other gradient hidden for the call: SGD, Adam
  // and the like skip a parameter without one), then clears their gradients. The optimizer's
  // parameters outside the model are stepped once the children are through, the step ends and this
  // forward begins. Bit-identical to forward/backward/step (tests/torch/distributed_test.cc).
  // The optimizer's options (learning rate, momentum, ...) are those at stepOverlapped(): a scheduler
  // may change them before the next forward, as it may between step() and the next forward (LibTorch's
  // optimizers keep their options objects, so references to them stay valid). Do not
  // zero the gradients in between: the pending step still uses them. applyPending() (and finish(),
  // and an evaluation forwardOverlapped) applies a pending step at once, e.g. before saving the model.
  // Compute groups: the shards apply the update, so stepOverlapped is step() followed by the next
  // round's pull, and the next forward awaits each layer of the pulled model just before it runs
  // (zero_grad() between them is fine: the pushes are out); pullLatest(), groupState(), finish() and
  // an evaluation forward wait for the whole pull.
  void stepOverlapped(torch::optim::Optimizer& optimizer);
  torch::Tensor forwardOverlapped(torch::nn::Sequential& sequence, torch::Tensor x);
  // The same for a model whose layer order the caller declares (poseidon train's models): run(gate)
  // runs the model and calls gate(l) just before layer l's parameters are first used (layer indices
  // as in description(): the modules that own parameters, in registration order). gate(l) applies
  // layer l's pending update once (later calls do nothing); layers never gated are applied when
  // run returns, so a layer the model uses without its gate computes with its old parameters:
  // gate every layer the forward uses. Without a pending step, gate does nothing and this is
  // forwardWith(run); an evaluation (module in eval mode, or no grad) applies the pending step first.
  torch::Tensor forwardGated(const std::function<torch::Tensor(const LayerGate& gate)>& run);
  void applyPending();
  // Layer updates forwardOverlapped() applied just before the child that needed them (compute
  // groups: layers of the pulled model awaited there).
  int64_t updatesInForward() const { return updatesInForward_; }

  // Gradient accumulation (DDP's no_sync): while the guard lives, forward and
  // backward accumulate gradients locally; the next forward/backward outside it
  // synchronizes the accumulated gradients once, at the following step().
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedModel& model) : model_(&model) { model_->setSyncEnabled(false); }
    ~NoSyncGuard() {
      if (model_) model_->setSyncEnabled(true);
    }
    NoSyncGuard(NoSyncGuard&& o) noexcept : model_(o.model_) { o.model_ = nullptr; }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(NoSyncGuard&&) = delete;

   private:
    DistributedModel* model_;
  };
  NoSyncGuard noSync() { return NoSyncGuard(*this); }
  void setSyncEnabled(bool enabled) { syncEnabled_ = enabled; }
  bool syncEnabled() const { return syncEnabled_; }

  // Straggler dropping (settings.dropStragglers > 0): call before each
  // step's forward. When the others already finished this iteration without
  // this worker, it takes their result, runs optimizer.step() and returns
  // true; the caller skips the step's forward and backward. Otherwise false.
  bool skipIfBehind(torch::optim::Optimizer& optimizer);
  // The same for callers whose optimizer lives elsewhere (Python): the mean
  // gradients are in .grad() when it returns true; the caller runs its step.
  bool skipIfBehind();

  // Compute-group mode: every rank calls it at the same point; after a barrier that leaves every
  // push applied (Node::settleBarrier), it pulls the model as it stands, e.g. to evaluate it; the
  // next step's forward uses it without pulling again (between a forward and its step it only
  // takes part in the barrier). Without compute groups it does nothing.
  void pullLatest();
  // Compute-group mode: the learning rate of this rank's pushes from now on (step(optimizer) sets it
  // from an SGD optimizer; the Python package sets it before each round's forward, so a schedule's
  // rate applies to the round it was set for; a warm-up may start at 0). Finite and >= 0.
  void setGroupLearningRate(float lr);
  // Compute-group mode, for a checkpoint; every rank calls it at the same round. After a barrier
  // (Node::settleBarrier: every shard then holds every update sent), the first worker fetches the
  // shards' state: the parameters into the model, and returns the momentum buffers (one per
  // trainable parameter) and the version clock; the other ranks get an empty list.
  std::pair<std::vector<torch::Tensor>, int64_t> groupState();

  // Final barrier; servers stay until every rank is done.
  void finish();

  Node& node() { return *node_; }
  // Where the model's parameters live (the CPU, or one CUDA device; docs/gpu.md).
  c10::Device device() const { return device_; }
  const ModelDesc& description() const { return desc_; }
  int rank() const { return node_->rank(); }
  int workers() const { return node_->book().numWorkers(); }
  std::vector<LayerPlan> plan(int64_t batch) const;
  // Scheme each layer actually used in the last synchronized iteration.
  const std::vector<Scheme>& lastSchemes() const { return lastSchemes_; }
  // Floats Table 1 predicts this node moved so far, by scheme (ps, sfb).
  std::pair<double, double> predictedFloats() const { return {predictedPs_, predictedSfb_}; }
  bool factorsCaptured(int layer) const;
  // Whether this job trains in compute groups (the shards hold the model; merged FC builds on it).
  bool computeGroups() const;
  void setTracer(Tracer* tracer) { tracer_ = tracer; }

 private:
  struct Layer;
  class FactorHook;
  void init(ModelParts parts);
  void onGradReady(int layer, int param);
  void onFactors(int layer, const torch::Tensor& u, const torch::Tensor& v, bool accumulating);
  void submitDense(int layer);
  void submitFactors(int layer);
  void instrument(const std::vector<torch::Tensor>& outputs, bool accumulating);
  void checkStep();                 // misuse checks before a step's synchronization
  void submitRemaining();           // layers backward did not send (unused, no-overlap, accumulated)
  void applyLayer(Layer& layer);    // the layer's result into .grad() (SFB from staging); step bookkeeping
  void endStep(int64_t traceStartUs, bool broadcast);
  void applyPendingLayer(int layer);                        // finishLayer, its optimizer step, clear
  void stepOnly(const std::vector<torch::Tensor>& params);  // the pending optimizer on these alone
  void beginIteration();
  void broadcastBuffers();
  // Rank 0's values of these tensors on every rank: in place for host tensors, through host copies
  // for a device model's (or under stageOnHost).
  void broadcastTensors(const std::vector<torch::Tensor>& tensors);
  // A device model's layer gradient goes down to the layer's host buffer on the side stream; `submit`
  // gets that buffer on the staging thread once the bytes are there (distributed_device.cc).
  void stageGradient(int layer, std::function<void(LayerBuffer)> submit);
  void submitFactorsStaged(int layer, const std::shared_ptr<void>& keep);
  // How a step synchronizes, chosen once in init() (distributed_layer.h): GradientSync (every
  // worker's mean gradient by PS or SFB: BSP and straggler dropping) or GroupSync (compute groups:
  // rounds against the shards that hold the model, distributed_groups.cc).
  class Sync;
  class GradientSync;
  class GroupSync;
  GroupSync& groupSync(const char* caller);  // throws InvalidArgument without compute groups
  // A misuse found on this rank: every rank stops with this reason; throws InvalidArgument.
  [[noreturn]] void misuse(const std::string& why);
  // checkFinite: whether layer l's gradients (or parameters) are all finite; the first layer whose are
  // not (-1: none, or checkFinite is off).
  bool layerFinite(size_t l, bool gradients) const;
  int firstNonFinite(bool gradients) const;
  // Throws DivergenceError for this step when `layer` >= 0; `what` says what was not finite there.
  void throwIfDiverged(int layer, const char* what);

  std::shared_ptr<torch::nn::Module> module_;  // when built from a C++ module
  std::function<torch::Tensor(torch::Tensor)> forward_;
  DistributedOptions options_;
  ModelDesc desc_;
  std::unique_ptr<Node> node_;
  std::unique_ptr<Sync> sync_;
  std::vector<Layer> layers_;
  std::vector<torch::Tensor> buffers_;
  // Kept alive (our hooks live on them), with the keys of our hooks, removed again when the
  // wrapper goes: the module may outlive it and run backward without it.
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, uintptr_t>> accumulators_;
  bool solo_ = false;
  bool syncEnabled_ = true;
  bool inIteration_ = false;
  bool forwarded_ = false;     // the current iteration's synchronized forward has run
  // The last forward ran in eval mode or under no_grad (not tracked): what step()'s misuse says.
  bool lastForwardUntracked_ = false;
  bool accumulating_ = false;  // noSync passes ran since the last step
  bool stepPending_ = false;   // submitStep() ran; finishStep() has not
  std::vector<bool> finishedLayers_;  // this pending step's layers already in .grad()
  torch::optim::Optimizer* pendingOptimizer_ = nullptr;  // stepOverlapped(): applies the pending step
  // Each parameter group's options at stepOverlapped(), which the pending step's per-layer steps use.
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> pendingOptions_;
  int64_t updatesInForward_ = 0;
  int64_t iteration_ = -1;
  // checkFinite: the overlapped step's first layer whose mean gradient was not finite (-1: none);
  // compute groups: the first layer of this round's pulled model that is not finite (-1: none).
  int nonFiniteLayer_ = -1;
  int64_t lastReadyUs_ = 0;
  std::vector<Scheme> lastSchemes_;
  double predictedPs_ = 0, predictedSfb_ = 0;
  Tracer* tracer_ = nullptr;
  c10::Device device_ = c10::Device(c10::kCPU);
  // A device model's copies to the host (null: the node reads and writes .grad() in place). Last, so
  // that it goes first: its thread calls the node and reads the layers.
  std::unique_ptr<DeviceStaging> staging_;
};

}  // namespace poseidon::pt
