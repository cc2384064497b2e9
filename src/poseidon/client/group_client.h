// GroupClient: a compute-group worker's side of the server-held model
// (Omnivore; JobSettings::groups > 0; docs/omnivore.md). The shards hold the
// model; a worker pulls it at the start of each of its group's rounds (written
// into the buffers given to setModel) and pushes its gradient with
// Node::submitGroupPush instead of submitDense. Node::beginIteration and
// waitIteration keep their meaning: the round's pushes are out.
//
// It turns the Puller's waits into the job's errors: a timeout names the
// layers still missing and fails the job, and every call rethrows the job's
// error first (the node's throwIfFailed, which stops every use of the
// caller's buffers before it throws).
//
// Threads: the user's thread for the API; onPullReply/onStateReply on the
// receive loop; wake() from whoever records the job's failure.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <utility>
#include <vector>

#include "poseidon/client/layer_buffer.h"
#include "poseidon/client/puller.h"
#include "poseidon/common/sticky_error.h"
#include "poseidon/coordinator/book.h"
#include "poseidon/transport/van.h"

namespace poseidon {

class GroupClient {
 public:
  // fail records the job's failure (Node::fail); throwIfFailed rethrows it (Node::throwIfFailed).
  GroupClient(Van& van, const InformationBook& book, int rank, const StickyError& error,
              std::function<void(std::exception_ptr)> fail, std::function<void()> throwIfFailed,
              std::chrono::milliseconds waitTimeout);

  int group() const { return book_.groupOf(book_.workerIndex(rank_)); }
  // Where each layer's parameters live; pulls write into them.
  void setModel(std::vector<LayerBuffer> params);
  // The first worker: sends each shard its pairs' starting state: the parameters in setModel's
  // buffers, the momentum (empty: zeros), the version and one clock per group (a resume gives all).
  void initModel(const std::vector<LayerBuffer>& momentum, int64_t version, const std::vector<int64_t>& clocks);
  // Asks for the model of the group's `round`; waitPulled(layer) / waitPulled() wait for it
  // (TimeoutError naming the layers still missing, or the job's error).
  void startPull(int64_t round);
  void waitPulled(int layer);
  void waitPulled();
  // Waits until the pull of `round` has the layer's pair (at once where that pull is not the one
  // open); a timeout fails the job (TimeoutError naming the pair), as does the job's error.
  void waitPairPulled(int layer, int pair, int64_t round);
  int64_t pacedPushes() const { return puller_.pairWaits(); }  // pushes that waited for a reply
  // The version (updates applied) each layer's first pair had when this round's pull was answered.
  std::vector<int64_t> pulledVersions() const { return puller_.versions(); }
  // The first worker, after every rank's barrier: the shards' whole state (the parameters into
  // setModel's buffers, the momentum buffers into `momentum`), for a checkpoint. Returns the
  // version clock and the group clocks.
  std::pair<int64_t, std::vector<int64_t>> fetchModelState(std::vector<LayerBuffer> momentum);

  // Receive loop: a pull-reply or a state-reply (ProtocolError when it does not fit).
  void onPullReply(Message& msg) { puller_.onReply(msg); }
  void onStateReply(Message& msg) { puller_.onStateReply(msg); }
  void wake() { puller_.wake(); }

 private:
  bool firstWorker() const { return rank_ == book_.workerRanks().front(); }

  Van& van_;
  const InformationBook& book_;
  const int rank_;
  std::function<void(std::exception_ptr)> fail_;
  std::function<void()> throwIfFailed_;
  const std::chrono::milliseconds waitTimeout_;
  Puller puller_;
};

}  // namespace poseidon
