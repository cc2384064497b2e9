// IterationBarrier: a worker's BSP barrier (paper section 4.1). One bit per
// layer for the current iteration, set when the layer's synchronized result
// is in its output buffer; wait() returns when every bit is set, so the
// optimizer never reads a gradient that is still being synchronized.
//
// Threads: begin() and wait() on the user's thread; layerDone() from the pool
// (SFB reconstruction) or the receive loop (PS, Adam); wake() from whoever
// records the job's failure. mutex_ is a leaf lock.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

#include "poseidon/common/sticky_error.h"

namespace poseidon {

class IterationBarrier {
 public:
  IterationBarrier(int layers, const StickyError& error);

  // Opens `iteration` with every layer pending. Throws InvalidArgument while
  // the previous iteration still has pending layers.
  void begin(int64_t iteration);
  // The layer's result for `iteration` is in. False when that cannot be (a
  // layer done twice, or for another iteration): the caller reports it.
  bool layerDone(int layer, int64_t iteration);
  // Waits until every layer is done (returns an empty list) or the timeout
  // passes (returns the pending layers). Rethrows the job's sticky error as
  // soon as there is one.
  std::vector<int> wait(std::chrono::milliseconds timeout);
  // Waits for one layer: true once it is done, false when the timeout passes.
  // Rethrows the job's sticky error as soon as there is one.
  bool waitLayer(int layer, std::chrono::milliseconds timeout);
  bool isDone(int layer);
  // Wakes wait() to look at the sticky error again.
  void wake();

 private:
  const StickyError& error_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int64_t iteration_ = 0;
  std::vector<bool> done_;
  int left_ = 0;
};

}  // namespace poseidon
