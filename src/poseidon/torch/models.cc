#include "poseidon/torch/models.h"

#include "poseidon/common/error.h"

namespace poseidon::pt {

LeNetImpl::LeNetImpl() {
  conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 20, 5)));
  conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(20, 50, 5)));
  ip1 = register_module("ip1", torch::nn::Linear(800, 500));
  ip2 = register_module("ip2", torch::nn::Linear(500, 10));
}

torch::Tensor LeNetImpl::forward(torch::Tensor x) { return classifier(features(x)); }

namespace {
void pass(const LayerGate& gate, int layer) {
  if (gate) gate(layer);
}
}  // namespace

torch::Tensor LeNetImpl::features(torch::Tensor x, const LayerGate& gate) {
  pass(gate, 0);
  x = torch::max_pool2d(conv1->forward(x), 2);
  pass(gate, 1);
  return torch::max_pool2d(conv2->forward(x), 2).flatten(1);
}

torch::Tensor LeNetImpl::classifier(torch::Tensor h, const LayerGate& gate) {
  pass(gate, 2);
  h = torch::relu(ip1->forward(h));
  pass(gate, 3);
  return ip2->forward(h);
}

Cifar10QuickImpl::Cifar10QuickImpl() {
  conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 5).padding(2)));
  conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 32, 5).padding(2)));
  conv3 = register_module("conv3", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 5).padding(2)));
  ip1 = register_module("ip1", torch::nn::Linear(64 * 4 * 4, 64));
  ip2 = register_module("ip2", torch::nn::Linear(64, 10));
}

torch::Tensor Cifar10QuickImpl::forward(torch::Tensor x) { return classifier(features(x)); }

torch::Tensor Cifar10QuickImpl::classifier(torch::Tensor h, const LayerGate& gate) {
  pass(gate, 3);
  h = ip1->forward(h);
  pass(gate, 4);
  return ip2->forward(h);
}

torch::Tensor Cifar10QuickImpl::features(torch::Tensor x, const LayerGate& gate) {
  // Pooling 3/2 with padding 1 keeps the original 4x4 final map: 28 -> 14 -> 7 -> 4.
  auto pool = [](torch::Tensor t, bool maxPool) {
    return maxPool ? torch::max_pool2d(t, 3, 2, 1, 1, /*ceil_mode=*/false)
                   : torch::avg_pool2d(t, 3, 2, 1, /*ceil_mode=*/false);
  };
  pass(gate, 0);
  x = torch::relu(pool(conv1->forward(x), true));
  pass(gate, 1);
  x = pool(torch::relu(conv2->forward(x)), false);
  pass(gate, 2);
  return pool(torch::relu(conv3->forward(x)), false).flatten(1);
}

MlpImpl::MlpImpl() {
  fc1 = register_module("fc1", torch::nn::Linear(784, 1024));
  fc2 = register_module("fc2", torch::nn::Linear(1024, 512));
  fc3 = register_module("fc3", torch::nn::Linear(512, 10));
}

torch::Tensor MlpImpl::forward(torch::Tensor x, const LayerGate& gate) {
  pass(gate, 0);
  x = torch::relu(fc1->forward(x.flatten(1)));
  pass(gate, 1);
  x = torch::relu(fc2->forward(x));
  pass(gate, 2);
  return fc3->forward(x);
}

namespace {
// A model with features() and classifier() halves; its FC part is ip1 and ip2.
template <typename Holder>
AnyNet splitNet(const std::string& name, Holder m) {
  AnyNet net{name,
             m.ptr(),
             [m](torch::Tensor x) mutable { return m->forward(x); },
             [m](torch::Tensor x) mutable { return m->features(x); },
             [m](torch::Tensor h) mutable { return m->classifier(h); },
             {"ip1", "ip2"},
             {}};
  net.gated = [m](torch::Tensor x, const LayerGate& gate) mutable { return m->classifier(m->features(x, gate), gate); };
  return net;
}
}  // namespace

AnyNet makeModel(const std::string& name) {
  if (name == "lenet") return splitNet(name, LeNet());
  if (name == "cifar10-quick") return splitNet(name, Cifar10Quick());
  if (name == "mlp") {
    Mlp m;
    AnyNet net{name, m.ptr(), [m](torch::Tensor x) mutable { return m->forward(x); }, nullptr, nullptr, {}, {}};
    net.gated = [m](torch::Tensor x, const LayerGate& gate) mutable { return m->forward(x, gate); };
    return net;
  }
  throw InvalidArgument("unknown model '" + name + "' (expected lenet, cifar10-quick or mlp)");
}

ModelParts partsOf(const torch::nn::Module& module, const std::string& name) {
  ModelParts parts;
  parts.name = name;
  for (const auto& item : module.named_modules()) {
    const torch::nn::Module& m = *item.value();
    LayerTensors l;
    for (const auto& p : m.named_parameters(/*recurse=*/false)) {
      if (!p.value().requires_grad()) {
        parts.frozen.push_back(p.value());
        continue;
      }
      l.paramNames.push_back(p.key());
      l.params.push_back(p.value());
    }
    if (l.params.empty()) continue;
    l.name = item.key().empty() ? name : item.key();
    if (dynamic_cast<const torch::nn::LinearImpl*>(&m)) {
      l.type = LayerType::kFC;
    } else if (dynamic_cast<const torch::nn::Conv1dImpl*>(&m) || dynamic_cast<const torch::nn::Conv2dImpl*>(&m) ||
               dynamic_cast<const torch::nn::Conv3dImpl*>(&m)) {
      l.type = LayerType::kConv;
    }
    parts.layers.push_back(std::move(l));
  }
  for (const auto& b : module.buffers()) parts.buffers.push_back(b);
  return parts;
}

ModelDesc describe(const ModelParts& parts) {
  ModelDesc desc;
  desc.name = parts.name;
  for (const auto& lt : parts.layers) {
    LayerSpec l;
    l.name = lt.name;
    for (size_t i = 0; i < lt.params.size(); ++i) l.params.push_back({lt.paramNames.at(i), lt.params[i].sizes().vec()});
    l.type = lt.type;
    if (l.type == LayerType::kFC) {
      if (l.params[0].name == "weight" && l.params[0].shape.size() == 2) {
        l.m = l.params[0].shape[0];
        l.n = l.params[0].shape[1];
      } else {
        l.type = LayerType::kOther;
      }
    }
    desc.layers.push_back(std::move(l));
  }
  return desc;
}

ModelDesc describeModule(const torch::nn::Module& module, const std::string& name) {
  return describe(partsOf(module, name));
}

}  // namespace poseidon::pt
