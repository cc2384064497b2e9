// --plain: the plain LibTorch loop with no Poseidon at all, the overhead baseline of one worker.
#include "poseidon/common/error.h"
#include "poseidon/torch/finite.h"
#include "poseidon/torch/train/modes.h"

namespace poseidon::pt {

std::string PlainMode::describe() const { return ", plain LibTorch (no Poseidon)"; }

TrainMode::Forward PlainMode::forward(const torch::Tensor& x) {
  Forward f;
  auto start = Clock::now();
  f.out = c_.net.forward(x);
  f.ms = msSince(start);
  return f;
}

void PlainMode::update(int64_t iteration) {
  // The check DistributedModel makes, on the one worker's gradient.
  for (const auto& p : c_.optimizer->param_groups().at(0).params()) {
    if (!allFinite(p.grad())) {
      throw DivergenceError("a gradient is not finite (a NaN or an infinity): the training diverged", iteration + 1,
                            "a gradient");
    }
  }
  c_.optimizer->step();
}

}  // namespace poseidon::pt
