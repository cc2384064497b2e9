// MergedFc: merged FC (Omnivore section V-A, Fig. 5a) for a DistributedModel, as `poseidon train
// --merged-fc` and the Python package's fc_server= use it.
//
//   DistributedModel dist(featureParts, options);   // the conv layers only: compute groups sync them
//   MergedFc fc(dist, classifier, classifierParams, momentum, weightDecay);  // every rank
//   for (...) {
//     dist.beginForward();
//     torch::Tensor h = features(x);                // rows x cols
//     dist.endForward(h);
//     auto reply = fc.exchange(h, y, lr);           // the FC server's loss and d loss / d h
//     h.backward(reply.gradient);                   // the conv layers' gradients, pushed as they land
//     dist.step(optimizer);
//   }
//   dist.pullLatest(); fc.broadcastClassifier();    // every rank: the whole model as it stands
//   fc.stop(); dist.finish();
//
// Rank 0 (kFcServerRank) starts the FC server (fc_server.h) on its own thread; it owns the
// classifier's parameters from then on (withModel() reads them quietly). The other ranks' copies of
// those parameters are only refreshed by broadcastClassifier(). The loss is the cross-entropy of the
// classifier's output (log-softmax and negative log-likelihood, each member's mean over its rows).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <vector>

#include "poseidon/torch/distributed.h"
#include "poseidon/torch/fc_server.h"

namespace poseidon::pt {

class MergedFc {
 public:
  // After `features` joined its job, which must run compute groups (settings.groups >= 1). The FC
  // server runs SGD with `momentum` and `weightDecay` (the job's, as the shards run for the conv
  // layers) from `momentumBuffers` (a resumed checkpoint's, one per classifier parameter; empty:
  // zeros). Throws InvalidArgument without compute groups or classifier parameters.
  MergedFc(DistributedModel& features, std::function<torch::Tensor(torch::Tensor)> classifier,
           std::vector<torch::Tensor> classifierParams, double momentum, double weightDecay,
           const std::vector<torch::Tensor>& momentumBuffers = {});
  ~MergedFc();  // stop()
  MergedFc(const MergedFc&) = delete;
  MergedFc& operator=(const MergedFc&) = delete;

  struct Reply {
    double loss = 0;         // this worker's mean loss over its rows
    torch::Tensor gradient;  // d loss / d features, rows x cols
  };
  // A worker's round: sends this step's features (a 2-D float tensor) and labels (int64, one per row)
  // with the round's learning rate; waits for the FC server's answer. InvalidArgument for tensors of
  // the wrong shape or type; the job's error (TimeoutError naming the FC server) otherwise.
  Reply exchange(const torch::Tensor& features, const torch::Tensor& labels, float lr);
  // Every rank at the same point, after a barrier that leaves no FC update in flight (pullLatest(),
  // groupState()): the classifier's parameters from the FC server to every rank.
  void broadcastClassifier();
  // Ends the FC server's thread after the last round every worker sent (no-op on other ranks).
  void stop();

  FcServer* server() { return server_.get(); }  // rank 0's, or nullptr
  const std::vector<torch::Tensor>& classifierParams() const { return params_; }

 private:
  DistributedModel& dist_;
  std::vector<torch::Tensor> params_;
  std::unique_ptr<FcServer> server_;
};

}  // namespace poseidon::pt
