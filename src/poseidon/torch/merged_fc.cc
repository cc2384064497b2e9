#include "poseidon/torch/merged_fc.h"

#include "poseidon/common/error.h"

namespace poseidon::pt {

MergedFc::MergedFc(DistributedModel& features, std::function<torch::Tensor(torch::Tensor)> classifier,
                   std::vector<torch::Tensor> classifierParams, double momentum, double weightDecay,
                   const std::vector<torch::Tensor>& momentumBuffers, std::vector<torch::Tensor> serverParams)
    : dist_(features), params_(std::move(classifierParams)) {
  if (!features.computeGroups()) {
    throw InvalidArgument("merged FC runs the conv layers in compute groups: the job needs groups >= 1");
  }
  if (params_.empty()) throw InvalidArgument("merged FC: the classifier has no trainable parameters");
  for (const auto& p : params_) {
    if (p.scalar_type() != torch::kFloat32 || !p.is_contiguous()) {
      throw InvalidArgument("merged FC: the classifier's parameters must be contiguous float32 tensors");
    }
  }
  if (!momentumBuffers.empty() && momentumBuffers.size() != params_.size()) {
    throw InvalidArgument(strCat("merged FC: ", momentumBuffers.size(), " momentum buffers for the classifier's ",
                                 params_.size(), " parameters"));
  }
  if (!serverParams.empty()) {
    if (serverParams.size() != params_.size()) {
      throw InvalidArgument(
          strCat("merged FC: ", serverParams.size(), " server parameters for the classifier's ", params_.size()));
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!serverParams[i].sizes().equals(params_[i].sizes()) || serverParams[i].scalar_type() != torch::kFloat32 ||
          !serverParams[i].is_contiguous()) {
        throw InvalidArgument(strCat("merged FC: server parameter ", i, " does not match the classifier's"));
      }
    }
  }
  if (dist_.node().rank() == kFcServerRank) {
    serverParams_ = std::move(serverParams);
    server_ =
        std::make_unique<FcServer>(dist_.node(), std::move(classifier), serverParams_.empty() ? params_ : serverParams_,
                                   momentum, weightDecay, momentumBuffers);
  }
  broadcastClassifier();  // every rank starts from rank 0's classifier
}

MergedFc::~MergedFc() { stop(/*abandon=*/true); }

void MergedFc::stop(bool abandon) {
  if (server_) server_->stop(abandon);
}

void MergedFc::takeServerClassifier() {
  if (!server_ || serverParams_.empty()) return;
  server_->withModel([&] {
    torch::NoGradGuard guard;
    for (size_t i = 0; i < params_.size(); ++i) params_[i].copy_(serverParams_[i]);
  });
}

MergedFc::Reply MergedFc::exchange(const torch::Tensor& features, const torch::Tensor& labels, float lr) {
  if (features.dim() != 2 || features.scalar_type() != torch::kFloat32) {
    throw InvalidArgument(strCat("merged FC: the features must be a 2-D float32 tensor (rows x features), got ",
                                 features.dim(), "-D ", c10::toString(features.scalar_type())));
  }
  if (labels.dim() != 1 || labels.scalar_type() != torch::kLong || labels.size(0) != features.size(0)) {
    throw InvalidArgument(strCat("merged FC: the labels must be an int64 tensor of one class per row (",
                                 features.size(0), "), got ", labels.dim(), "-D ", c10::toString(labels.scalar_type()),
                                 " with ", labels.numel(), " elements"));
  }
  // The request and the reply travel through host memory: a CUDA model's features come down here and
  // their gradient goes back up (on the CPU both copies are the same tensors, no copy).
  torch::Tensor h = features.detach().to(torch::kCPU).contiguous();
  torch::Tensor y = labels.to(torch::kCPU).contiguous();
  const int64_t rows = h.size(0), cols = h.size(1);
  std::vector<uint8_t> reply = dist_.node().fc().exchange(
      dist_.node().iteration(), encodeFcForward(lr, rows, cols, h.data_ptr<float>(), y.data_ptr<int64_t>()));
  FcBackwardView v = decodeFcBackward(reply);
  if (v.rows != rows || v.cols != cols) {
    throw ProtocolError(
        strCat("the FC server answered ", v.rows, " x ", v.cols, " for a ", rows, " x ", cols, " request"));
  }
  Reply r;
  r.loss = v.loss;
  // A copy either way: the reply's bytes go when this returns.
  r.gradient = torch::from_blob(const_cast<float*>(v.gradient), {rows, cols}, torch::kFloat32)
                   .to(torch::TensorOptions().device(features.device()), /*non_blocking=*/false, /*copy=*/true);
  return r;
}

void MergedFc::broadcastClassifier() {
  torch::NoGradGuard guard;
  std::vector<torch::Tensor> source = params_;
  // The server's classifier between two updates (a group that already has its copy may start its
  // next round while the root still sends to the others): into the module's when the server has
  // its own, else a snapshot.
  if (server_ && serverParams_.empty()) {
    server_->withModel([&] {
      for (size_t i = 0; i < params_.size(); ++i) source[i] = params_[i].clone();
    });
  }
  takeServerClassifier();
  for (auto& p : source) {
    // The network reads and writes host memory: a CUDA classifier goes through a host copy.
    torch::Tensor host = p.device().is_cpu() ? p : p.to(torch::kCPU).contiguous();
    dist_.node().broadcast(kFcServerRank, LayerBuffer::contiguous(host.data_ptr<float>(), host.numel()));
    if (!p.device().is_cpu()) p.copy_(host.view(p.sizes()));
  }
}

}  // namespace poseidon::pt
