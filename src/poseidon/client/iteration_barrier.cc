#include "poseidon/client/iteration_barrier.h"

#include "poseidon/common/error.h"

namespace poseidon {

IterationBarrier::IterationBarrier(int layers, const StickyError& error)
    : error_(error), done_(static_cast<size_t>(layers), true) {}

void IterationBarrier::begin(int64_t iteration) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (left_ != 0) {
    throw InvalidArgument(strCat("beginIteration(", iteration, ") before waitIteration() finished iteration ",
                                 iteration_));
  }
  iteration_ = iteration;
  std::fill(done_.begin(), done_.end(), false);
  left_ = static_cast<int>(done_.size());
}

bool IterationBarrier::layerDone(int layer, int64_t iteration) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (iteration != iteration_ || layer < 0 || layer >= static_cast<int>(done_.size()) || done_[layer]) return false;
    done_[layer] = true;
    --left_;
  }
  cv_.notify_all();
  return true;
}

std::vector<int> IterationBarrier::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait_for(lock, timeout, [&] { return error_.failed() || left_ == 0; });
  if (error_.failed()) {
    lock.unlock();
    error_.check();
  }
  std::vector<int> pending;
  for (size_t l = 0; l < done_.size(); ++l)
    if (!done_[l]) pending.push_back(static_cast<int>(l));
  return pending;
}

bool IterationBarrier::waitLayer(int layer, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (layer < 0 || layer >= static_cast<int>(done_.size())) {
    throw InvalidArgument(strCat("waitLayer: layer ", layer, " outside 0..", done_.size() - 1));
  }
  const bool done = cv_.wait_for(lock, timeout, [&] { return error_.failed() || done_[layer]; });
  if (error_.failed()) {
    lock.unlock();
    error_.check();
  }
  return done && done_[layer];
}

bool IterationBarrier::isDone(int layer) {
  std::lock_guard<std::mutex> lock(mutex_);
  return layer >= 0 && layer < static_cast<int>(done_.size()) && done_[layer];
}

void IterationBarrier::wake() {
  // Taking the mutex orders this after a waiter's predicate check, so the
  // notification cannot be lost between its check and its sleep.
  { std::lock_guard<std::mutex> lock(mutex_); }
  cv_.notify_all();
}

}  // namespace poseidon
