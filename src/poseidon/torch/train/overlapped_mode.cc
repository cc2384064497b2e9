// --overlap-forward (docs/scheduling.md): step() returns at once, and the next forward applies each
// layer's update just before that layer runs (the models declare their layer order: LayerGate), so
// the early layers compute while later layers' updates still arrive. Bit-identical to BSP.
#include <chrono>
#include <thread>

#include "poseidon/torch/train/modes.h"

namespace poseidon::pt {

std::string OverlappedMode::describe() const { return TrainMode::describe() + ", overlapped step"; }

void OverlappedMode::beginStep(double /*lr*/) {
  // A pending step still uses its gradients; each layer's are cleared once its update is applied
  // (DistributedModel::forwardGated), which zero_grad() would do.
  if (!c_.dist->stepPending()) c_.optimizer->zero_grad();
}

TrainMode::Forward OverlappedMode::forward(const torch::Tensor& x) { return gatedForward(x); }

TrainMode::Forward TrainMode::gatedForward(const torch::Tensor& x) {
  Forward f;
  double gateMs = 0;           // waits for the last step's layers: network time, not compute
  std::vector<double> realMs;  // each gated layer's real forward time, this step
  int current = -1;
  Clock::time_point layerStart;
  auto start = Clock::now();
  f.out = c_.dist->forwardGated([&](const LayerGate& gate) {
    return c_.net.gated(x, [&](int layer) {
      auto t = Clock::now();
      if (current >= 0)
        realMs[static_cast<size_t>(current)] += 1000 * std::chrono::duration<double>(t - layerStart).count();
      gate(layer);
      gateMs += msSince(t);
      if (static_cast<size_t>(layer) >= realMs.size()) realMs.resize(static_cast<size_t>(layer) + 1, 0.0);
      // --pad-ms: the modeled forward, spent layer by layer right after each gate (ComputePad).
      const double ms = c_.pad.layerForwardMs(layer);
      if (ms > 0) {
        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
        f.modeledMs += ms;
      }
      current = layer;
      layerStart = Clock::now();
    });
  });
  if (current >= 0) {
    realMs[static_cast<size_t>(current)] += msSince(layerStart);
    c_.pad.measuredForward(realMs);
  }
  f.ms = msSince(start) - gateMs;
  return f;
}

void OverlappedMode::update(int64_t /*iteration*/) {
  c_.dist->stepOverlapped(*c_.optimizer);  // the next forward applies it, layer by layer
}

void OverlappedMode::settle() {
  c_.dist->applyPending();  // the model with its last update
}

}  // namespace poseidon::pt
