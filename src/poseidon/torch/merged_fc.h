// MergedFc: merged FC (Omnivore section V-A, Fig. 5a) for a DistributedModel, as `poseidon train
// --merged-fc` and the Python package's merged_fc= use it.
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
// Rank 0 (kFcServerRank) starts the FC server (fc_server.h) on its own thread. The server trains
// `serverParams` when given (a copy of the classifier that only the server touches: the module's
// own classifier on rank 0 then stays as the last broadcastClassifier() left it, as on every other
// rank), else the module's classifier parameters themselves (the trainer, whose rank 0 reads them
// only through server()->withModel() or while every rank waits in a collective). Construction
// broadcasts rank 0's classifier, so every rank starts from the same one. The loss is the
// cross-entropy of the classifier's output (log-softmax and negative log-likelihood, each member's
// mean over its rows).
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
  // `classifier` computes with `serverParams` when those are given (rank 0 only; one per classifier
  // parameter, the same shapes).
  MergedFc(DistributedModel& features, std::function<torch::Tensor(torch::Tensor)> classifier,
           std::vector<torch::Tensor> classifierParams, double momentum, double weightDecay,
           const std::vector<torch::Tensor>& momentumBuffers = {}, std::vector<torch::Tensor> serverParams = {});
  ~MergedFc();  // stop(/*abandon=*/true): a job that did not stop() is leaving after an error
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
  // Every rank at the same point (a collective): the FC server's classifier, as it stands between two
  // updates, into every rank's module. After pullLatest() it holds every group's rounds so far.
  void broadcastClassifier();
  // Rank 0, with separate server parameters: copies the server's classifier into the module's (between
  // two updates). Does nothing elsewhere.
  void takeServerClassifier();
  // Ends the FC server's thread after the last round every worker sent (no-op on other ranks); a
  // round left unserved fails the job unless `abandon`.
  void stop(bool abandon = false);

  FcServer* server() { return server_.get(); }  // rank 0's, or nullptr
  const std::vector<torch::Tensor>& classifierParams() const { return params_; }

 private:
  DistributedModel& dist_;
  std::vector<torch::Tensor> params_;        // the module's classifier parameters
  std::vector<torch::Tensor> serverParams_;  // rank 0: what the server trains, when not params_
  std::unique_ptr<FcServer> server_;
};

}  // namespace poseidon::pt
