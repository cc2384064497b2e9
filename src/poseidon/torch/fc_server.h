// Merged FC's server (Omnivore section V-A, Fig. 5a): the model's fully-connected layers run on one
// process, model-parallel, while the conv layers train in compute groups.
//
// Rank 0 (kFcServerRank) owns the FC layers' parameters and runs this server on its own thread
// next to its worker. Every worker sends it, each step, the output of its conv layers and its labels
// (FcLink::exchange, client/fc_link.h). Once all k members of a group sent the same round, the server runs the FC
// layers forward on their rows together, the loss (the mean of the members' mean losses, so the
// FC gradient is the group's mean gradient as in data parallelism), backward, one SGD step (the
// learning rate the members sent, the job's momentum and weight decay, as the shards apply to the
// conv layers), and answers each member with its own mean loss and that loss's gradient with
// respect to its rows; the member then runs its conv backward and pushes the conv gradients to the
// shards. Groups are served in the order their last member arrives, one at a time: the FC layers see
// every update before the next forward, so their staleness is 0 whatever g (the conv layers keep
// the groups' staleness).
//
// Threads: the server's thread runs the FC layers (autograd on their parameters only); the rank's
// own worker thread never touches them while training. withModel() runs a function with the FC
// parameters quiet (no update in flight), for copies and evaluation.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "poseidon/client/node.h"

namespace poseidon::pt {

class FcServer {
 public:
  // `momentumBuffers`: one per parameter (a resumed checkpoint's), or empty for none yet.
  FcServer(Node& node, std::function<torch::Tensor(torch::Tensor)> classifier, std::vector<torch::Tensor> params,
           double momentum, double weightDecay, const std::vector<torch::Tensor>& momentumBuffers = {});
  ~FcServer();  // stop()
  FcServer(const FcServer&) = delete;
  FcServer& operator=(const FcServer&) = delete;

  // Ends the thread, after the last round every worker sent (a round left half-served fails the job,
  // unless `abandon`: the rank is leaving after an error, and its peers learn that from the node).
  void stop(bool abandon = false);
  void withModel(const std::function<void()>& fn);
  // The optimizer's momentum buffers, one per parameter (zeros before the first update), for a
  // checkpoint; call it with no update in flight (after a barrier of every rank).
  std::vector<torch::Tensor> momentumBuffers();
  // Updates applied (one per group round) and the seconds the server spent computing them.
  int64_t updates() const { return updates_.load(); }
  double busySeconds() const;

 private:
  void loop();
  void serve(std::vector<FcChannel::Request>& members);

  Node& node_;
  std::function<torch::Tensor(torch::Tensor)> classifier_;
  std::vector<torch::Tensor> params_;
  std::unique_ptr<torch::optim::SGD> optimizer_;
  const int groupSize_;
  // Requests of rounds not yet complete, by (group, round); rounds complete in arrival order.
  std::map<std::pair<int, int64_t>, std::vector<FcChannel::Request>> pending_;
  std::map<int, int64_t> lastServed_;  // each group's last round served
  std::mutex modelMutex_;  // held while an update runs and by withModel()
  std::atomic<int64_t> updates_{0};
  std::atomic<int64_t> busyMicros_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> abandon_{false};
  std::thread thread_;
};

}  // namespace poseidon::pt
