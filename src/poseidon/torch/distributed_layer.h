// DistributedModel's per-layer state (distributed.h), shared by its three source files: the BSP
// path (distributed.cc), compute groups (distributed_groups.cc) and the overlapped step
// (distributed_overlap.cc). Not installed API.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "poseidon/torch/distributed.h"

namespace poseidon::pt {

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
  torch::Tensor staging;  // SFB result: weight then bias, flat
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

}  // namespace poseidon::pt
