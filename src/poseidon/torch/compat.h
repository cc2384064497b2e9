// What differs between the LibTorch lines Poseidon builds against: Debian's 1.13 (CI) and pip's
// torch 2.x (GPU machines). Every difference is handled here, so no other file names a version.
//
// - The optimizer's per-parameter state: 1.13 keys it by the parameter's TensorImpl address printed
//   as a string; 2.x by the pointer itself. The key type is read off the optimizer.
// - c10::guts::to_string is gone in 2.x (the 1.13 key above was built with it).
// - c10::Event::synchronize() exists only in 2.x; 1.13 polls query() (eventSynchronize).
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <sstream>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace poseidon::pt {

using OptimizerStateKey = typename std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;

// The key under which LibTorch's optimizers keep `p`'s state (a template only so that the branch
// for the other line is discarded, not compiled).
template <typename Key = OptimizerStateKey>
Key optimizerStateKey(const torch::Tensor& p) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream s;
    s << p.unsafeGetTensorImpl();
    return s.str();
  } else {
    return p.unsafeGetTensorImpl();
  }
}

// SGD's momentum buffers, one per parameter of the optimizer's first group (zeros where SGD has
// none yet). Compute groups and the FC server keep their servers' momentum there, so a checkpoint
// saves it in optimizer.pt and a resume reads it back.
inline std::vector<torch::Tensor> sgdMomentumBuffers(torch::optim::SGD& optimizer) {
  std::vector<torch::Tensor> out;
  for (const auto& p : optimizer.param_groups().at(0).params()) {
    auto it = optimizer.state().find(optimizerStateKey(p));
    out.push_back(it == optimizer.state().end()
                      ? torch::zeros_like(p)
                      : static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer().contiguous());
  }
  return out;
}

// Sets them (buffers[i] for the i-th parameter, any shape of the same size; viewed, not copied).
inline void setSgdMomentumBuffers(torch::optim::SGD& optimizer, const std::vector<torch::Tensor>& buffers) {
  const auto& params = optimizer.param_groups().at(0).params();
  TORCH_CHECK(params.size() == buffers.size(), "momentum buffers: ", buffers.size(), " for ", params.size(),
              " parameters");
  for (size_t i = 0; i < params.size(); ++i) {
    auto state = std::make_unique<torch::optim::SGDParamState>();
    state->momentum_buffer(buffers[i].view(params[i].sizes()));
    optimizer.state()[optimizerStateKey(params[i])] = std::move(state);
  }
}

namespace compat_detail {
template <typename E, typename = void>
struct HasSynchronize : std::false_type {};
template <typename E>
struct HasSynchronize<E, std::void_t<decltype(std::declval<const E&>().synchronize())>> : std::true_type {};
}  // namespace compat_detail

// Blocks until the work the event recorded is done (a device-to-host copy, say).
template <typename E = c10::Event>
void eventSynchronize(const E& event) {
  if constexpr (compat_detail::HasSynchronize<E>::value) {
    event.synchronize();
  } else {
    // 1.13: no blocking wait on an event through the device-generic API. A copy's wait is short
    // (it was queued behind one layer's backward), so a poll that backs off to 50 us costs little.
    auto pause = std::chrono::microseconds(1);
    while (!event.query()) {
      std::this_thread::sleep_for(pause);
      if (pause < std::chrono::microseconds(50)) pause *= 2;
    }
  }
}

}  // namespace poseidon::pt
