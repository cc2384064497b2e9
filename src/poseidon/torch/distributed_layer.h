// DistributedModel's per-layer state and its synchronization strategies (distributed.h), shared by
// its three source files: the BSP path (distributed.cc), compute groups (distributed_groups.cc) and
// the overlapped step (distributed_overlap.cc). Not installed API.
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "poseidon/common/error.h"
#include "poseidon/torch/device_staging.h"
#include "poseidon/torch/distributed.h"

namespace poseidon::pt {

// The one device every parameter lives on (distributed_device.cc). InvalidArgument for parameters that
// are not float32 (autocast keeps float32 parameters), parameters on several devices, and devices other
// than the CPU and CUDA.
c10::Device modelDevice(const ModelParts& parts);
// Whether a buffer or frozen tensor is broadcast from rank 0: in place (staged false), a contiguous CPU
// tensor of whole floats' worth of bytes; through host copies, any tensor of whole floats' worth.
bool broadcastable(const torch::Tensor& t, bool staged);
// A flat buffer laid out as `params` (one after the other) as one view per parameter, shaped like it.
inline std::vector<torch::Tensor> perParameter(const torch::Tensor& flat, const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> views;
  int64_t off = 0;
  for (const auto& p : params) {
    views.push_back(flat.narrow(0, off, p.numel()).view(p.sizes()));
    off += p.numel();
  }
  return views;
}

struct DistributedModel::Layer {
  const LayerSpec* spec = nullptr;
  std::vector<torch::Tensor> params;
  // This step's synchronized pass.
  std::vector<bool> ready;
  int readyCount = 0;
  bool submitted = false;
  Scheme scheme = Scheme::kPS;
  bool captured = false;  // the graph gave us this layer's factors this step
  torch::Tensor u, v;     // factors sent this step
  torch::Tensor staging;  // SFB result: weight then bias, flat (on the host)
  // A device model (DeviceStaging): the layer's gradient on the host, flat, weight then bias; the node
  // writes the PS mean into it, which applyLayer() copies back into .grad().
  torch::Tensor host;
  bool meanOnHost = false;  // this step's PS mean is in `host`
  DeviceRebuild rebuilt;    // a CUDA FC layer: its SFB mean, rebuilt on the device
  torch::Tensor pulled;     // compute groups: the model pulled from the shards, on the host
  // Accumulation passes (noSync) since the last step.
  int accumulatedPasses = 0;                  // passes in which the layer's first parameter got a gradient
  std::vector<torch::Tensor> stashU, stashV;  // factors of those passes
  // A used FC layer whose factors were not captured the last time it was used
  // (3-D input, weight used twice): when unused it contributes zeros by PS, as
  // its used steps do on every rank.
  bool uncapturable = false;
  bool used() const { return readyCount > 0 || captured || accumulatedPasses > 0; }
  bool stashComplete() const { return !stashU.empty() && static_cast<int>(stashU.size()) == accumulatedPasses; }
};

// How a step synchronizes: one strategy per job, chosen once when the model joins (init()), so no
// step path asks which mode the job runs in. The strategies are nested classes: they work on the
// model's layers and its node as the model's own methods do.
class DistributedModel::Sync {
 public:
  explicit Sync(DistributedModel& model) : m_(model) {}
  virtual ~Sync() = default;
  // The shards hold the model: even one worker has to talk to them.
  virtual bool shardsHoldModel() const { return false; }
  // After rank 0's parameters reached every rank, before the first forward.
  virtual void start() {}
  // A synchronized forward begins (its iteration has begun); an accumulation pass (noSync) begins.
  virtual void beginForward() {}
  virtual void beginAccumulation() {}
  // Whether forward instruments the graph to capture FC layers' sufficient factors.
  virtual bool capturesFactors() const { return true; }
  // Every parameter of `layer` has its gradient (wait-free backpropagation sends it now).
  virtual void layerReady(int layer) = 0;
  // After backward: send what backward did not, wait for the result, put it into place.
  virtual void synchronize() = 0;
  // After synchronize(): the update. `optimizer` is the caller's.
  virtual void step(torch::optim::Optimizer& optimizer) = 0;
  // Names what was not finite at `layer` in the divergence error.
  virtual std::string divergenceSubject(const std::string& layer, const char* what) const {
    return strCat(what, " of layer '", layer, "'");
  }
  virtual GroupSync* groups() { return nullptr; }

 protected:
  DistributedModel& m_;
};

// Every worker's mean gradient, per layer by PS or SFB (BSP; straggler dropping adds skipIfBehind).
class DistributedModel::GradientSync final : public Sync {
 public:
  using Sync::Sync;
  void layerReady(int layer) override { m_.submitDense(layer); }
  void synchronize() override;
  void step(torch::optim::Optimizer& optimizer) override;
};

// Compute groups (Omnivore; docs/omnivore.md): the shards hold the model and run SGD; each round
// pulls the model before its forward and pushes each layer's gradient as its backward ends.
class DistributedModel::GroupSync final : public Sync {
 public:
  using Sync::Sync;
  bool shardsHoldModel() const override { return true; }
  void start() override;  // the shards take the model (and a resumed state)
  void beginForward() override;
  void beginAccumulation() override;
  bool capturesFactors() const override { return false; }
  void layerReady(int layer) override;
  void synchronize() override;
  // The optimizer must be SGD with the job's momentum and weight decay (the shards apply it); its
  // learning rate is taken for the next round.
  void step(torch::optim::Optimizer& optimizer) override;
  std::string divergenceSubject(const std::string& layer, const char* what) const override {
    return strCat("layer '", layer, "' of ", what);
  }
  GroupSync* groups() override { return this; }

  // DistributedModel's public compute-group calls (distributed.h says what they do).
  std::pair<std::vector<torch::Tensor>, int64_t> state();
  void pullLatest();
  void setLearningRate(float lr);

  // The next round's pull, asked with this round's first push (layerReady; stepOverlapped asks it
  // if nothing did): the shard answers each pair once this group's update of it is applied, as it
  // would the pull at the forward. The forward awaits it (the gated forward, layer by layer).
  void prefetch();
  bool prefetching() const { return prefetching_; }
  // That layer of the prefetched model is in the parameters; true when this call brought it.
  bool awaitLayer(int layer);
  void awaitPrefetch();        // every layer is; no pull is pending after it

 private:
  void pull(int64_t round);
  // pullLatest with g > 1: the model as the shards hold it now, read by the first worker, on every rank.
  void refreshFromShards();
  // The pulled model from the host buffers into the parameters (one layer, or all).
  void pulledIntoParameters();
  void layerIntoParameters(size_t layer);
  int64_t pulledRound_ = -1;  // the round whose model the parameters hold (or will: prefetching_)
  bool prefetching_ = false;
  std::vector<bool> arrived_;  // prefetching_: the layers awaited so far
  float lr_ = 0;
};

}  // namespace poseidon::pt
