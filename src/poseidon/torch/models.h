// The trainer's models, as ordinary torch::nn modules (nothing Poseidon-
// specific inside: the integration wraps any module), and the layer table
// that describes a module to the coordinator.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "poseidon/model/layer.h"

namespace poseidon::pt {

// Called with a layer's index (the modules that own parameters, in registration order) just before
// the forward first uses that layer's parameters: the overlapped step applies the layer's pending
// update there (DistributedModel::forwardGated, poseidon train --overlap-forward).
using LayerGate = std::function<void(int layer)>;

// Caffe's LeNet (conv 20@5x5, max-pool, conv 50@5x5, max-pool, ip1 500, ReLU,
// ip2 10): 431,080 parameters, FC-heavy.
// forward(x) = classifier(features(x)): the conv part (to the flattened pooled map) and the FC part,
// the split merged FC runs on different processes (Omnivore's Fig. 5a; docs/omnivore.md).
struct LeNetImpl : torch::nn::Module {
  LeNetImpl();
  torch::Tensor forward(torch::Tensor x);
  torch::Tensor features(torch::Tensor x, const LayerGate& gate = nullptr);    // gates 0, 1
  torch::Tensor classifier(torch::Tensor h, const LayerGate& gate = nullptr);  // gates 2, 3
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::Linear ip1{nullptr}, ip2{nullptr};
};
TORCH_MODULE(LeNet);

// Caffe's cifar10_quick adapted to 28x28 gray images (1 input channel; the
// pooled feature map is 4x4 as in the original): 143,978 parameters.
struct Cifar10QuickImpl : torch::nn::Module {
  Cifar10QuickImpl();
  torch::Tensor forward(torch::Tensor x);  // classifier(features(x)), as LeNet's
  torch::Tensor features(torch::Tensor x, const LayerGate& gate = nullptr);    // gates 0-2
  torch::Tensor classifier(torch::Tensor h, const LayerGate& gate = nullptr);  // gates 3, 4
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr};
  torch::nn::Linear ip1{nullptr}, ip2{nullptr};
};
TORCH_MODULE(Cifar10Quick);

// A 784-1024-512-10 perceptron: all FC, the case SFB was made for.
struct MlpImpl : torch::nn::Module {
  MlpImpl();
  torch::Tensor forward(torch::Tensor x, const LayerGate& gate = nullptr);  // gates 0-2
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(Mlp);

// A model behind one forward signature, for the trainer. Models with a conv part and an FC part
// also give the two halves (forward(x) == classifier(features(x))) and the FC part's layers (module
// paths, as partsOf names them), for merged FC; the all-FC mlp has none.
struct AnyNet {
  std::string name;
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(torch::Tensor)> forward;
  std::function<torch::Tensor(torch::Tensor)> features, classifier;
  std::vector<std::string> classifierLayers;
  // forward with a gate before each layer (LayerGate): the same computation as forward.
  std::function<torch::Tensor(torch::Tensor, const LayerGate&)> gated;
};

AnyNet makeModel(const std::string& name);              // throws InvalidArgument

// A model as Poseidon sees it, whatever built it: its layers (one per module
// that owns trainable parameters, in registration order: each is one sync
// unit) and its buffers. partsOf() reads a C++ module; the Python package
// builds the same from a Python module's parameters.
struct LayerTensors {
  std::string name;  // module path ("ip1", "features.0"); the model's name for the root module
  LayerType type = LayerType::kOther;  // kFC: a Linear (weight M x N [+ bias]); kConv: a ConvNd
  std::vector<std::string> paramNames;
  std::vector<torch::Tensor> params;  // requires_grad
};
struct ModelParts {
  std::string name;
  std::vector<LayerTensors> layers;
  std::vector<torch::Tensor> buffers;  // running statistics and the like (BatchNorm)
  std::vector<torch::Tensor> frozen;   // parameters that do not require grad: copied from rank 0 at the start
};
ModelParts partsOf(const torch::nn::Module& module, const std::string& name);

// The layer table the coordinator checks: FC layers get M x N from the
// weight (a kFC layer without a 2-D first parameter named "weight" is
// described as OTHER), the rest their parameter shapes.
ModelDesc describe(const ModelParts& parts);
// describe(partsOf(module, name)).
ModelDesc describeModule(const torch::nn::Module& module, const std::string& name);

}  // namespace poseidon::pt
