// Puller: a worker's pulls of the model from the shards (compute-group mode,
// kvstore/model_shard.h). At the start of each of its group's rounds the
// worker asks every shard for each KV pair of every layer; the replies are
// written straight into the layers' parameter memory (like PS aggregates into
// gradients, without staging copies), and a layer can be waited for on its
// own, so the first layers' forward may start while later ones arrive.
//
// Threads: start() and wait*() on the user's thread; onReply() on the receive
// loop; wake() from whoever records the job's failure. mutex_ is a leaf lock;
// the parameter memory is written under it (the user's thread only reads it
// after waitLayer/waitAll returned).
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <vector>

#include "poseidon/client/layer_buffer.h"
#include "poseidon/common/sticky_error.h"
#include "poseidon/coordinator/book.h"
#include "poseidon/transport/van.h"

namespace poseidon {

class Puller {
 public:
  using Send = std::function<void(int dest, const FrameHeader&, const std::vector<Van::Part>&)>;
  Puller(const InformationBook& book, Send send, const StickyError& error);

  // Where each layer's parameters live (once, before the first start()).
  void setTargets(std::vector<LayerBuffer> params);
  const std::vector<LayerBuffer>& targets() const { return targets_; }  // user thread
  // Asks for every pair of the model for `round`. The previous round's pulls must be complete.
  void start(int64_t round);
  // Receive loop: a pull-reply. ProtocolError when it does not fit; nothing changes then.
  void onReply(Message& msg);
  // Checkpoints (the first worker, every rank past a barrier): asks every shard for its pairs'
  // whole state; the parameters go to the targets, the momentum buffers to `momentum` (same
  // layout). Wait with waitAll(); then stateVersion()/stateClocks() hold what the shards had.
  void startState(std::vector<LayerBuffer> momentum);
  void onStateReply(Message& msg);
  int64_t stateVersion() const;
  std::vector<int64_t> stateClocks() const;
  // Wait until the layer (or every layer) is in; false on timeout. Rethrow the sticky error.
  bool waitLayer(int layer, std::chrono::milliseconds timeout);
  // Waits until the pull of `round` has the layer's pair; at once where another pull (or none) is
  // open. False on timeout. Rethrows the sticky error.
  bool waitPair(int layer, int pair, int64_t round, std::chrono::milliseconds timeout);
  int64_t pairWaits() const;  // waitPair calls that had to wait
  bool waitAll(std::chrono::milliseconds timeout);
  // The layers still missing (for a timeout's message), and the version each layer's first pair had.
  std::vector<int> missing() const;
  std::vector<int64_t> versions() const;
  void wake();

 private:
  const KvPair& pairOf(const FrameHeader& h, const char* what) const;
  void expectEveryPairLocked();  // mutex_ held

  const InformationBook& book_;
  Send send_;
  const StickyError& error_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<LayerBuffer> targets_;
  int64_t round_ = -1;
  bool open_ = false;
  std::vector<std::vector<bool>> got_;  // by layer, by pair
  std::vector<int> left_;               // pairs missing, by layer
  int layersLeft_ = 0;
  int pairWaiters_ = 0;  // waitPair callers: every reply wakes them
  int64_t pairWaits_ = 0;
  std::vector<int64_t> versions_;
  // State fetches (startState).
  bool stateMode_ = false;
  std::vector<LayerBuffer> momentum_;
  int64_t stateVersion_ = -1;
  std::vector<int64_t> stateClocks_;
};

}  // namespace poseidon
